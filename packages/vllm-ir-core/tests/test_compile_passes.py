"""The passes on FX graphs, without Inductor: fast, and precise about counts."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator

import pytest
import stand_in_kernels as kernels
import torch
import vllm_ir as ir
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir.compilation import (
    CloneEliminationPass,
    InplaceFunctionalizationPass,
    LoweringPass,
    pass_context,
)
from vllm_ir.compilation._context import DONATED_META

H = 16
FUSED = ir.ops.fused_add_rms_norm


@pytest.fixture(autouse=True, scope="module")
def _stand_ins() -> Iterator[None]:
    kernels.register()
    yield
    kernels.unregister()


def trace(fn: Callable[..., object], *args: torch.Tensor) -> fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def count(gm: fx.GraphModule, target: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target)


def run_pipeline(gm: fx.GraphModule, priorities: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    lowering = LoweringPass(priorities)
    with pass_context() as ctx:
        InplaceFunctionalizationPass()(gm.graph)
        lowering.pre(gm.graph)
        lowering.post(gm.graph)
        CloneEliminationPass()(gm.graph)
    gm.recompile()
    return ctx, lowering


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(4, H, generator=g),
        torch.randn(4, H, generator=g),
        torch.rand(H, generator=g),
    )


# -- functionalization ----------------------------------------------------


def two_layers(x, r, w):  # type: ignore[no-untyped-def]
    h, r = FUSED.maybe_inplace(x, r, w, 1e-6)
    h2 = h * 2
    return FUSED.maybe_inplace(h2, r, w, 1e-6)


def test_functionalization_rewrites_and_records_donations() -> None:
    gm = trace(two_layers, *inputs())
    assert count(gm, FUSED.maybe_inplace.torch_op) == 2
    with pass_context() as ctx:
        InplaceFunctionalizationPass()(gm.graph)
    assert count(gm, FUSED.maybe_inplace.torch_op) == 0
    assert count(gm, FUSED.torch_op) == 2
    assert ctx.functionalized == 2
    marks = [n.meta["custom"][DONATED_META] for n in gm.graph.nodes if n.target is FUSED.torch_op]
    assert marks == [(0, 1), (0, 1)]
    assert ctx.donated_graph_inputs == ["x_1", "r_1"]


def read_after(x, r, w):  # type: ignore[no-untyped-def]
    h, _r2 = FUSED.maybe_inplace(x, r, w, 1e-6)
    return h + x


def read_view_taken_before(x, r, w):  # type: ignore[no-untyped-def]
    v = x[:, :4]
    h, _r2 = FUSED.maybe_inplace(x, r, w, 1e-6)
    return h, v.sum()


def read_view_taken_after(x, r, w):  # type: ignore[no-untyped-def]
    h, _r2 = FUSED.maybe_inplace(x, r, w, 1e-6)
    return h, r.view(-1)


def read_base_of_donated_view(x, r, w):  # type: ignore[no-untyped-def]
    h, _r2 = FUSED.maybe_inplace(x[:2], r[:2], w, 1e-6)
    return h, x


def return_donated(x, r, w):  # type: ignore[no-untyped-def]
    h, _r2 = FUSED.maybe_inplace(x, r, w, 1e-6)
    return h, r


def donate_twice(x, r, w):  # type: ignore[no-untyped-def]
    return FUSED.maybe_inplace(x, x, w, 1e-6)


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (read_after, r"donates activation 'x' \(x_1\), but add \(aten.add.Tensor\) reads it"),
        (read_view_taken_before, r"activation 'x' \(x_1\).*through its alias slice"),
        (read_view_taken_after, r"activation 'x_residual' \(r_1\).*view"),
        (read_base_of_donated_view, r"activation 'x' \(slice.*the graph output reads it"),
        (return_donated, r"'x_residual' \(r_1\), but the graph output reads it"),
        (donate_twice, r"x_1 is passed as both 'x' and 'x_residual'"),
    ],
)
def test_donated_activation_read_after_is_an_error(fn, match: str) -> None:  # type: ignore[no-untyped-def]
    gm = trace(fn, *inputs())
    with pass_context(), pytest.raises(ValueError, match=match):
        InplaceFunctionalizationPass()(gm.graph)


ROPE = ir.ops.rotary_embedding


def rope_then_v(qkv, cos, sin):  # type: ignore[no-untyped-def]
    """vLLM's attention inputs: RoPE donates q and k, v (a sibling slice) is read after."""
    q, k, v = qkv.split([16, 8, 8], dim=-1)
    q, k = ROPE.maybe_inplace(q.unflatten(-1, (2, 8)), k.unflatten(-1, (1, 8)), cos, sin, True)
    return q, k, v * 1, qkv[:, 24:] * 2  # v, and v again sliced after the call


def rope_then_overlap(qkv, cos, sin):  # type: ignore[no-untyped-def]
    q, k = qkv[:, :16], qkv[:, 24:]
    straddle = qkv[:, 8:24]  # overlaps q, but neither covers the other densely
    q, k = ROPE.maybe_inplace(q.unflatten(-1, (2, 8)), k.unflatten(-1, (1, 8)), cos, sin, True)
    return q, k, straddle * 1


def rope_then_base(qkv, cos, sin):  # type: ignore[no-untyped-def]
    q, k, _ = qkv.split([16, 8, 8], dim=-1)
    q, k = ROPE.maybe_inplace(q.unflatten(-1, (2, 8)), k.unflatten(-1, (1, 8)), cos, sin, True)
    return q, k, qkv * 1


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_donation_check_reads_elements_not_storages(mode: str) -> None:
    """A slice of the donated activation's buffer that is provably apart from it is
    no reader (compile-v4 r03: the qkv split was refused); one that may overlap
    declines that activation's donation; the buffer itself is still a reader."""
    args = torch.randn(6, 32), torch.randn(6, 8), torch.randn(6, 8)
    for fn, donated, declined in [
        (rope_then_v, ["query", "key"], []),
        (rope_then_overlap, ["key"], [("rotary_embedding", "query")]),
    ]:
        gm = make_fx(fn, tracing_mode=mode)(*args)
        with pass_context() as ctx:
            InplaceFunctionalizationPass()(gm.graph)
        assert [d.argument for d in ctx.donations] == donated, fn.__name__
        assert ctx.declined_activations == declined, fn.__name__
    gm = make_fx(rope_then_base, tracing_mode=mode)(*args)
    with pass_context(), pytest.raises(ValueError, match=r"'query'.*reads it through its alias"):
        InplaceFunctionalizationPass()(gm.graph)


# -- lowering ---------------------------------------------------------------


def mixed(x, r, w):  # type: ignore[no-untyped-def]
    a = ir.ops.rms_norm(x, w, 1e-6)
    b = ir.ops.rms_norm(x, w, 1e-6, 8)  # the opaque kernel declines variance_size
    return a + b, FUSED(a, r, w, 1e-6)


def test_lowering_selects_per_node_and_records() -> None:
    gm = trace(mixed, *inputs())
    ctx, lowering = run_pipeline(gm, {"rms_norm": [kernels.OPAQUE], "fused_add_rms_norm": []})
    assert lowering.selected_impls == {
        "rms_norm": {"rms_norm": kernels.OPAQUE, "rms_norm_1": "native"},
        "fused_add_rms_norm": {"fused_add_rms_norm": "native"},
    }
    assert ctx.selected_impls is lowering.selected_impls
    assert count(gm, torch.ops.vllm_ir_test.rms_norm.default) == 1
    assert not [n for n in gm.graph.nodes if str(n.target).startswith("vllm_ir.")]
    x, r, w = inputs()
    torch.testing.assert_close(gm(x, r, w), mixed(x, r, w))


def test_compiled_mode_defaults_apply_in_lowering() -> None:
    ir.priority.add_platform_defaults(
        "test-compiled",
        [
            ir.provider.PlatformDefaults(
                ir.provider.current_platform(),
                eager={"rms_norm": [kernels.OPAQUE]},
                compiled={"rms_norm": ["native"]},
            )
        ],
    )
    try:
        gm = trace(lambda x, w: ir.ops.rms_norm(x, w, 1e-6), *inputs()[::2])
        _, lowering = run_pipeline(gm, {})
        assert lowering.selected_impls == {"rms_norm": {"rms_norm": "native"}}
    finally:
        ir.priority.remove_platform_defaults("test-compiled")


def test_each_impl_and_metadata_traced_once() -> None:
    def layers(x, r, w):  # type: ignore[no-untyped-def]
        for _ in range(6):
            x, r = FUSED.maybe_inplace(x * 1.0, r, w, 1e-6)
        return x, r

    gm = trace(layers, *inputs())
    _, lowering = run_pipeline(gm, {"fused_add_rms_norm": [kernels.INPLACE]})
    assert len(lowering._traced) == 1
    assert len(lowering.selected_impls["fused_add_rms_norm"]) == 6


# -- lowering of in-place impls + clone elimination --------------------------------


def donated_chain(x, r, w):  # type: ignore[no-untyped-def]
    h, r = FUSED.maybe_inplace(x, r, w, 1e-6)
    h = h * 2
    return FUSED.maybe_inplace(h, r, w, 1e-6)


def not_donated(x, r, w):  # type: ignore[no-untyped-def]
    return FUSED(x, r, w, 1e-6)


def mixed_donation(x, r, w):  # type: ignore[no-untyped-def]
    h = x * 2  # an intermediate: its clone can go even without donation
    return FUSED(h, r, w, 1e-6)


def view_read_after(x, r, w):  # type: ignore[no-untyped-def]
    h = x * 2
    v = h[:, :4]
    out, res = FUSED(h, r, w, 1e-6)
    return out, res, v + 1  # reading a view of h after the write keeps h's clone


def donated_view(x, r, w):  # type: ignore[no-untyped-def]
    h = x * 2
    return FUSED.maybe_inplace(h.view(4, H), r, w, 1e-6)


def transposed_input(x, r, w):  # type: ignore[no-untyped-def]
    h = (x * 2).t().contiguous().t()  # non-contiguous rows
    return FUSED.maybe_inplace(h, r, w, 1e-6)


@pytest.mark.parametrize(
    ("fn", "inserted", "left", "kept_reason"),
    [
        (donated_chain, 4, 0, None),
        (not_donated, 2, 2, "graph input that was not donated"),
        (mixed_donation, 2, 1, "graph input that was not donated"),
        (view_read_after, 2, 2, "source read after the write"),
        (donated_view, 2, 0, None),
        (transposed_input, 2, 1, "changes layout"),  # the user's .contiguous() stays
    ],
)
def test_clone_counts(fn, inserted: int, left: int, kept_reason: str | None) -> None:  # type: ignore[no-untyped-def]
    gm = trace(fn, *inputs())
    ctx, _ = run_pipeline(gm, {"fused_add_rms_norm": [kernels.INPLACE]})
    assert ctx.clones_inserted == inserted
    assert count(gm, torch.ops.aten.clone.default) == left
    if kept_reason:
        assert any(kept_reason in reason for reason in ctx.clones_kept.values()), ctx.clones_kept
    x, r, w = inputs()
    want = fn(x.clone(), r.clone(), w)
    x2, r2 = x.clone(), r.clone()
    got = gm(x2, r2, w)
    torch.testing.assert_close(got, want)
    if fn in (not_donated, mixed_donation, view_read_after):
        torch.testing.assert_close((x2, r2), (x, r))  # non-donated inputs untouched


def test_inplace_kernel_writes_into_donated_inputs() -> None:
    gm = trace(donated_chain, *inputs())
    run_pipeline(gm, {"fused_add_rms_norm": [kernels.INPLACE]})
    x, r, w = inputs()
    _out, res = gm(x, r, w)
    assert res.data_ptr() == r.data_ptr()  # zero copies: the residual stream is reused


def test_ir_passes_see_ir_nodes_before_lowering() -> None:
    seen: list[list[str]] = []

    class FusionProbe(ir.compilation.VllmIRPass):
        name = "fusion_probe"

        def run(self, graph: fx.Graph) -> None:
            seen.append(
                [str(n.target) for n in graph.nodes if str(n.target).startswith("vllm_ir.")]
            )

    backend = ir.VllmIRBackend(ir_passes=[FusionProbe()])
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        torch.compile(two_layers, backend=backend)(*inputs())
    assert seen == [["vllm_ir.fused_add_rms_norm.default"] * 2]
    assert backend.pass_contexts[0].timings_ms["fusion_probe"] >= 0


def test_maybe_inplace_reaching_lowering_is_an_error() -> None:
    gm = trace(two_layers, *inputs())
    lowering = LoweringPass({})
    with pass_context(), pytest.raises(RuntimeError, match="InplaceFunctionalizationPass must"):
        lowering.pre(gm.graph)


def test_graphs_are_dumped_after_each_pass(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("VLLM_IR_DUMP_GRAPHS", str(tmp_path))
    gm = trace(donated_chain, *inputs())
    run_pipeline(gm, {"fused_add_rms_norm": [kernels.INPLACE]})
    names = sorted(p.name.split("_", 2)[2] for p in tmp_path.iterdir())
    assert names == [
        "clone_elimination.txt",
        "inplace_functionalization.txt",
        "lowering_functional.txt",
        "lowering_inplace.txt",
    ]
    final = next(p for p in tmp_path.iterdir() if "clone_elimination" in p.name).read_text()
    assert "vllm_ir_test.fused_add_rms_norm_" in final


def test_graph_dumps_never_follow_planted_links(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """Dump names are predictable: a link planted under the next one is not written through."""
    from vllm_ir.compilation import _pass_base as pass_base

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("precious\n")
    first = pass_base._dump_counter + 1
    (dumps / f"{os.getpid()}_{first:04d}_inplace_functionalization.txt").symlink_to(precious)
    stale = dumps / f"{os.getpid()}_{first + 1:04d}_lowering_functional.txt"
    stale.write_text("an older process with our pid")  # ours: replaced, not appended to
    monkeypatch.setenv("VLLM_IR_DUMP_GRAPHS", str(dumps))
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        run_pipeline(trace(donated_chain, *inputs()), {"fused_add_rms_norm": [kernels.INPLACE]})
    assert precious.read_text() == "precious\n"
    assert "graph not written" in caplog.text
    assert stale.read_text().startswith("graph():")
    assert len(list(dumps.iterdir())) == 4


def test_graph_dumps_refuse_a_directory_others_can_write(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone could plant links under our next names
    monkeypatch.setenv("VLLM_IR_DUMP_GRAPHS", str(shared))
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        run_pipeline(trace(donated_chain, *inputs()), {"fused_add_rms_norm": [kernels.INPLACE]})
    assert list(shared.iterdir()) == []
    assert caplog.text.count("not writing graphs there") == 1


def test_impls_that_allocate_trace_in_the_fake_mode() -> None:
    op = ir.ops.rms_norm

    @op.register_impl("allocating")
    def allocating(
        x: torch.Tensor,
        weight: torch.Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> torch.Tensor:
        out = torch.empty_like(x)  # a kernel's output buffer
        return out.copy_(op.native(x, weight, epsilon, variance_size))

    try:
        gm = trace(lambda x, w: op(x, w, 1e-6), *inputs()[::2])
        _, lowering = run_pipeline(gm, {"rms_norm": ["allocating"]})
        assert lowering.selected_impls == {"rms_norm": {"rms_norm": "allocating"}}
        x, _, w = inputs()
        torch.testing.assert_close(gm(x, w), op.native(x, w, 1e-6))
    finally:
        op.unregister_impl("allocating")


# -- the lowering walk -------------------------------------------------------


def _modules_lowering_visits(gm: fx.GraphModule, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The ``vllm_ir.compilation`` and ``vllm_ir._op`` modules whose code runs
    while the lowering pass lowers one node of ``gm`` (the selection beneath
    ``IrOp`` is the one selection path eager shares: not counted)."""
    visited: set[str] = set()
    lowering = LoweringPass({"rms_norm": ["native"]})
    lower_node = LoweringPass._lower_node

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith(("vllm_ir.compilation", "vllm_ir._op")):
            visited.add(module)

    def profiled(*args, **kwargs):  # type: ignore[no-untyped-def]
        sys.setprofile(profile)
        try:
            return lower_node(*args, **kwargs)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(LoweringPass, "_lower_node", profiled)
    with pass_context():
        lowering.post(gm.graph)
    assert lowering.selected_impls == {"rms_norm": {"rms_norm": "native"}}
    return visited


@pytest.mark.parametrize("tracing_mode", ["fake", "symbolic"])
def test_lowering_one_node_stays_in_three_modules(
    tracing_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lowering one node runs the lowering, the node helpers and the aliasing facts
    (checking the trace writes no constant), and asks the op which impl: the
    plan's collector, the bucket branches and the pass context stay out of it."""
    x, _, w = inputs()
    gm = make_fx(lambda x, w: ir.ops.rms_norm(x, w, 1e-6), tracing_mode=tracing_mode)(x, w)
    visited = _modules_lowering_visits(gm, monkeypatch)
    compilation = {m for m in visited if m.startswith("vllm_ir.compilation")}
    assert compilation <= {
        "vllm_ir.compilation._lowering",
        "vllm_ir.compilation.ir_nodes",
        "vllm_ir.compilation._aliasing",
    }
    assert visited - compilation == {"vllm_ir._op.op"}
