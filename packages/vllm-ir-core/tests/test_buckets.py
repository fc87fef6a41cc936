"""Per-size (bucketed) priorities: validation, spellings, and eager == select() == compiled.

The differential tests register tagging impls of a fresh op: impl ``tK``
returns ``x * factor + K``, so the result says which impl ran, exactly (the
inputs are integer-valued floats), in eager mode and in a compiled graph.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from torch._dynamo.testing import CompileCounterWithBackend
from vllm_ir import priority
from vllm_ir._selection.buckets import (
    ALL_SIZES,
    BucketedPriority,
    SizePlan,
    as_priority,
    format_bucket_text,
    parse_bucket_text,
)
from vllm_ir.provider import PlatformDefaults

TAGS = {"t1": 1.0, "t2": 2.0, "t3": 3.0}
PROVIDERS = ["native", *TAGS]


def scaled(x: Tensor, factor: float) -> Tensor:
    """The op under test: ``x * factor``; impl ``tK`` adds K, so outputs name the impl."""
    return x * factor


def _tag_impl(k: float) -> Callable[[Tensor, float], Tensor]:
    def impl(x: Tensor, factor: float) -> Tensor:
        return x * factor + k

    return impl


def _rank2(x: Tensor, factor: float) -> bool:
    return x.dim() == 2


@pytest.fixture
def tagged(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    op = make_op(scaled)
    for name, k in TAGS.items():
        # t3 declines rank 3 inputs: selection must fall through within the bucket
        supports = _rank2 if name == "t3" else None
        op.register_impl(name, supports_args=supports)(_tag_impl(k))
    return op


def _tag_of(out: Tensor, x: Tensor, factor: float) -> str:
    offset = (out - x * factor).flatten()[0].item()
    return next((name for name, k in TAGS.items() if offset == k), "native")


def _random_table(rng: random.Random, max_bound: int = 48) -> list[dict[str, Any]]:
    bounds = sorted(rng.sample(range(2, max_bound), rng.randint(1, 3)))
    buckets: list[dict[str, Any]] = [
        {"max_tokens": b, "priority": rng.sample(PROVIDERS, rng.randint(0, 3))} for b in bounds
    ]
    buckets.append({"priority": rng.sample(PROVIDERS, rng.randint(0, 3))})
    return buckets


def _expected(table: list[dict[str, Any]], tokens: int, rank: int) -> str:
    """The first provider of the bucket's list that accepts (t3: rank 2 only)."""
    for bucket in table:
        if "max_tokens" not in bucket or tokens <= bucket["max_tokens"]:
            for p in bucket["priority"]:
                if p != "t3" or rank == 2:
                    return p
            return "native"
    raise AssertionError("no catch-all bucket")


def _lowered(backend: ir.VllmIRBackend, op_name: str) -> list[str]:
    """What each compiled graph lowered the op's nodes to."""
    return [v for c in backend.pass_contexts for v in c.selected_impls.get(op_name, {}).values()]


def _ints(*shape: int) -> Tensor:
    return torch.randint(-4, 5, shape).float()


# -- validation ---------------------------------------------------------------

BAD_TABLES = [
    ([{"max_tokens": 64, "priority": ["native"]}], "must have no max_tokens"),
    (
        [{"max_tokens": 64, "priority": []}, {"max_tokens": 8, "priority": []}, {"priority": []}],
        "is below",
    ),
    (
        [{"max_tokens": 8, "priority": []}, {"max_tokens": 8, "priority": []}, {"priority": []}],
        "repeats",
    ),
    ([{"priority": []}, {"priority": []}], "only the last bucket may omit"),
    ([{"max_tokens": 0, "priority": []}, {"priority": []}], "positive int"),
    ([{"max_tokens": -3, "priority": []}, {"priority": []}], "positive int"),
    ([{"max_tokens": 2.5, "priority": []}, {"priority": []}], "positive int"),
    ([{"max_tokens": True, "priority": []}, {"priority": []}], "positive int"),
    ([{"max_tokens": "64", "priority": []}, {"priority": []}], "positive int"),
    ([{"max_tokens": 4, "priority": [], "tokens": 3}, {"priority": []}], "unknown key"),
    ([{"max_tokens": 4}, {"priority": []}], "no priority list"),
    ([{"max_tokens": 4, "priority": "native"}, {"priority": []}], "list of provider names"),
    (["native", {"priority": []}], "mixes provider names and buckets"),
    ([3, {"priority": []}], "must be"),
]


@pytest.mark.parametrize(("table", "message"), BAD_TABLES)
def test_malformed_tables_are_refused_with_one_line(table: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        ir.IrOpPriorityConfig(rms_norm=table)
    text = str(info.value)
    assert message in text
    assert "rms_norm" in text
    assert "\n" not in text


def test_unknown_provider_in_a_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown provider.*'nope'"):
        ir.IrOpPriorityConfig(rms_norm=[{"max_tokens": 4, "priority": ["nope"]}, {"priority": []}])
    table = [{"max_tokens": 4, "priority": []}, {"priority": ["x"]}]
    with pytest.raises(ValueError, match="unknown provider"), ir.ops.rms_norm.set_priority(table):
        pass


def test_single_catch_all_is_the_plain_list() -> None:
    assert as_priority([{"priority": ["native"]}], "p") == ("native",)


# -- spellings and round trips ------------------------------------------------


def test_cli_spelling_parses_and_prints_back() -> None:
    text = "<=16:native;<=256:native;native"
    config = ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority.rms_norm={text}"])
    assert config.to_dict() == {
        "rms_norm": [
            {"max_tokens": 16, "priority": ["native"]},
            {"max_tokens": 256, "priority": ["native"]},
            {"priority": ["native"]},
        ]
    }
    spec = as_priority(parse_bucket_text(text, "flag"), "p")
    assert isinstance(spec, BucketedPriority)
    assert format_bucket_text(spec) == text
    # a plain list keeps its spelling
    plain = ir.IrOpPriorityConfig.from_cli_args(["--ir-op-priority.rms_norm=native"])
    assert plain.to_dict() == {"rms_norm": ["native"]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<=x:native;native", "is not an int"),
        ("<=16native;native", "needs ':'"),
        ("<=16:;native", "comma-separated"),
        ("<=16:native", "must have no max_tokens"),
        ("<=64:native;<=16:native;native", "is below"),
    ],
)
def test_cli_spelling_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority.rms_norm={text}"])


def test_json_file_and_dict_round_trip(tmp_path: Any) -> None:
    table = [{"max_tokens": 64, "priority": ["native"]}, {"priority": []}]
    config = ir.IrOpPriorityConfig.from_dict({"rms_norm": table})
    assert config.to_dict() == {"rms_norm": table}
    assert ir.IrOpPriorityConfig.from_json(json.dumps(config.to_dict())) == config
    path = tmp_path / "prio.json"
    path.write_text(json.dumps({"ir_op_priority": config.to_dict()}))
    assert ir.IrOpPriorityConfig.from_json(path) == config
    assert ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority=@{path}"]) == config
    assert hash(config) == hash(ir.IrOpPriorityConfig.from_dict(config.to_dict()))
    assert "<=64:native;" in repr(config)


# -- eager --------------------------------------------------------------------


def test_scope_apply_and_platform_defaults_resolve_per_bucket(tagged: ir.IrOp) -> None:
    name = tagged.name
    x_small, x_big = _ints(4, 8), _ints(40, 8)
    table = [{"max_tokens": 8, "priority": ["t1"]}, {"priority": ["t2"]}]
    with ir.IrOpPriorityConfig(**{name: table}).scope():
        assert tagged.bucket_bounds() == (8,)
        assert _tag_of(tagged(x_small, 2.0), x_small, 2.0) == "t1"
        assert _tag_of(tagged(x_big, 2.0), x_big, 2.0) == "t2"
        assert tagged.get_priority(tokens=4)[0] == "t1"
    assert tagged.bucket_bounds() == ()
    ir.IrOpPriorityConfig(**{name: table}).apply()
    assert _tag_of(tagged(x_small, 2.0), x_small, 2.0) == "t1"
    ir.clear_process_priority()
    # platform defaults: bucketed defaults under a plain user list; each source is
    # resolved for the call's size, then merged (the user's entries first)
    defaults = PlatformDefaults(
        "cpu", eager={name: [{"max_tokens": 16, "priority": ["t3"]}, {"priority": ["t1"]}]}
    )
    priority.add_platform_defaults("test_buckets", [defaults])
    try:
        assert tagged.bucket_bounds() == (16,)
        assert _tag_of(tagged(x_small, 2.0), x_small, 2.0) == "t3"
        assert _tag_of(tagged(x_big, 2.0), x_big, 2.0) == "t1"
        with tagged.set_priority(["t2"]):
            assert tagged.get_priority(tokens=4) == ["t2", "t3", "native"]
            assert tagged.get_priority(tokens=40) == ["t2", "t1", "native"]
        with tagged.set_priority([{"max_tokens": 4, "priority": ["t2"]}, {"priority": []}]):
            assert tagged.bucket_bounds() == (4, 16)  # the union of every source's bounds
            x5 = _ints(5, 8)
            assert _tag_of(tagged(x5, 2.0), x5, 2.0) == "t3"
    finally:
        priority.remove_platform_defaults("test_buckets")


def test_eager_differential_random_tables(tagged: ir.IrOp) -> None:
    """Random tables and sizes: the fast path (checked against select() on every call by
    the suite's VLLM_IR_CHECK_SELECTION), selected_impl() and select() agree with the table."""
    rng = random.Random(23)
    for _ in range(25):
        table = _random_table(rng)
        with tagged.set_priority(table):
            for _ in range(12):
                rows = rng.randint(0, 60)
                x = _ints(rows, 8) if rng.random() < 0.7 else _ints(2, max(1, rows // 2), 8)
                want = _expected(table, tagged.tokens(x, 2.0), x.dim())
                assert tagged.select(x, 2.0).impl.provider == want, (table, x.shape)
                assert tagged.selected_impl(x, 2.0).provider == want
                if x.numel():
                    assert _tag_of(tagged(x, 2.0), x, 2.0) == want
                # twice: the second call is a fast-path hit
                if x.numel():
                    assert _tag_of(tagged(x, 2.0), x, 2.0) == want


def test_selection_key_holds_the_bucket(tagged: ir.IrOp) -> None:
    table = [{"max_tokens": 3, "priority": ["t1"]}, {"priority": ["t2"]}]
    with tagged.set_priority(table):
        a, b = _ints(3, 8), _ints(4, 8)
        assert tagged.selection_key(a, 1.0) != tagged.selection_key(b, 1.0)
        assert tagged.selected_impl(a, 1.0).provider == "t1"
        assert tagged.selected_impl(b, 1.0).provider == "t2"  # same batch class, other bucket
    assert tagged.selection_key(a, 1.0) == tagged.selection_key(b, 1.0)


# -- compiled -----------------------------------------------------------------


@pytest.fixture
def no_recompile() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch.compiler.set_stance("default")
    torch._dynamo.reset()


@pytest.mark.parametrize("dispatch", ["graphs", "branches"])
def test_compiled_differential_dynamic_tokens(
    tagged: ir.IrOp, no_recompile: None, dispatch: Any
) -> None:
    """One compile with a dynamic token dim serves every bucket (a graph per size
    range, or torch.cond branches): compiled == eager == select() at random sizes,
    with recompiles refused."""
    rng = random.Random(7)
    table = [
        {"max_tokens": 5, "priority": ["t1"]},
        {"max_tokens": 12, "priority": ["native"]},
        {"max_tokens": 30, "priority": ["t3", "t2"]},
        {"priority": ["t2"]},
    ]
    backend = ir.VllmIRBackend(priority={tagged.name: table}, bucket_dispatch=dispatch)

    def fn(x: Tensor) -> Tensor:
        return tagged(x, 2.0) - 1.0

    compiled = torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)
    compiled(_ints(3, 8))
    described = list(backend.lowering_pass.selected_impls.get(tagged.name, {}).values())
    assert described in ([], ["<=5:t1;<=12:native;<=30:t3;t2"])  # [] on an FX cache hit
    if dispatch == "graphs":  # one graph per size range, each with its bucket's impl
        assert len(backend.pass_contexts) == 4
        assert _lowered(backend, tagged.name) in ([], ["t1", "native", "t3", "t2"])
    else:
        assert len(backend.pass_contexts) == 1
    torch.compiler.set_stance("fail_on_recompile")
    sizes = [2, 5, 6, 12, 13, 30, 31, 64, *rng.sample(range(2, 80), 12)]
    with tagged.set_priority(table):
        for rows in sizes:
            x = _ints(rows, 8)
            want = _expected(table, rows, 2)
            assert tagged.select(x, 2.0).impl.provider == want
            assert _tag_of(tagged(x, 2.0), x, 2.0) == want
            got = compiled(x)
            assert torch.equal(got, fn(x)), rows
            assert _tag_of(got + 1.0, x, 2.0) == want, rows


def _storage_reading(x: Tensor, factor: float) -> Tensor:
    # addresses x's storage, as a kernel handed a data pointer does; adds 1 (a t1 tag)
    return x.as_strided(x.size(), x.stride(), x.storage_offset()) * factor + 1.0


def _rope_tagged(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    q, k = ir.ops.rotary_embedding.native(query, key, cos, sin, is_neox)
    return q + 100.0, k - 100.0


BRANCH_PROGRAMS = {
    # token counts that are not a bare symbol: the branch needs the symbols passed in
    "row-slice": (lambda op, x: op(x[1:], 2.0), lambda n: _ints(n + 1, 8)),
    "every-other-row": (lambda op, x: op(x[::2], 2.0), lambda n: _ints(2 * n, 8)),
    "flattened-batch": (lambda op, x: op(x.flatten(0, 1), 2.0), lambda n: _ints(2, n, 8)),
    # an impl reading its argument's storage offset, on a row-slice graph input
    "storage-offset-input": (lambda op, x: op(x, 2.0) + 0, lambda n: _ints(n + 1, 8)[1:]),
}


@pytest.mark.parametrize("program", list(BRANCH_PROGRAMS))
def test_compiled_branches_of_awkward_sizes_and_layouts(
    make_op: Callable[..., ir.IrOp], no_recompile: None, program: str
) -> None:
    """torch.cond branches where a size is an expression of symbols, or where an
    impl addresses a row-slice input's storage: compiled == eager in both buckets
    (they crashed Inductor, or read from the storage's start)."""
    op = make_op(scaled)
    op.register_impl("t1")(_storage_reading)
    op.register_impl("t2")(_tag_impl(2.0))
    table = [{"max_tokens": 6, "priority": ["t1"]}, {"priority": ["t2"]}]
    fn, make = BRANCH_PROGRAMS[program]
    backend = ir.VllmIRBackend(priority={op.name: table}, bucket_dispatch="branches")
    compiled = torch.compile(lambda x: fn(op, x), backend=backend, dynamic=True)
    with op.set_priority(table):
        for n in (3, 5, 9, 20):
            x = make(n)
            assert torch.equal(compiled(x), fn(op, x)), n


def test_compiled_branches_return_rope_heads_of_symbolic_sizes(no_recompile: None) -> None:
    """Bucketed rotary_embedding on q, k views of a fused projection whose head
    count and size Dynamo makes symbols: the branches' outputs get strides
    torch.cond can merge (it refused ``Max(1, s1)``)."""
    rope = ir.ops.rotary_embedding
    rope.register_impl("test_tagged_rope")(_rope_tagged)
    table = [{"max_tokens": 8, "priority": ["test_tagged_rope"]}, {"priority": ["native"]}]

    def attention(heads: int, kv_heads: int, size: int) -> Callable[..., Any]:
        def f(x: Tensor, w: Tensor, cos: Tensor, sin: Tensor) -> Any:
            qkv = x @ w
            q = qkv[:, : heads * size].unflatten(-1, (heads, size))
            k = qkv[:, heads * size : (heads + kv_heads) * size].unflatten(-1, (kv_heads, size))
            return tuple(t * 1 for t in rope(q, k, cos, sin, True))

        return f

    f = attention(2, 1, 8)
    backend = ir.VllmIRBackend(priority={rope.name: table}, bucket_dispatch="branches")
    try:
        compiled = torch.compile(f, backend=backend, dynamic=True)
        with rope.set_priority(table):
            for n in (5, 9, 20):
                args = (
                    torch.randn(n, 16),
                    torch.randn(16, 32),
                    torch.randn(n, 8),
                    torch.randn(n, 8),
                )
                for got, want in zip(compiled(*args), f(*args), strict=True):
                    torch.testing.assert_close(got, want)
    finally:
        rope.unregister_impl("test_tagged_rope")


def test_compiled_static_and_single_impl_tables(tagged: ir.IrOp, no_recompile: None) -> None:
    """A static token count picks its one bucket; a table whose buckets all select one
    impl emits no branch."""
    table = [{"max_tokens": 4, "priority": ["t1"]}, {"priority": ["t2"]}]
    same = [{"max_tokens": 4, "priority": ["t1"]}, {"priority": ["t1"]}]
    backend = ir.VllmIRBackend(priority={tagged.name: table})
    x = _ints(3, 8)
    out = torch.compile(lambda t: tagged(t, 2.0), backend=backend, dynamic=False)(x)
    assert _tag_of(out, x, 2.0) == "t1"
    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority={tagged.name: same})
    compiled = torch.compile(lambda t: tagged(t, 2.0), backend=backend, dynamic=True)
    y = _ints(9, 8)
    assert _tag_of(compiled(y), y, 2.0) == "t1"
    lowered = [
        v for c in backend.pass_contexts for v in c.selected_impls.get(tagged.name, {}).values()
    ]
    assert lowered in ([], ["t1"])  # one impl: no branch ([] on an FX cache hit)


@pytest.mark.parametrize("dispatch", ["graphs", "branches"])
def test_compiled_inplace_impl_in_a_branch(no_recompile: None, dispatch: Any) -> None:
    """An in-place kernel in one bucket: its branch (or its size range's graph) runs
    it on copies (the default overload never writes its inputs), the other bucket
    runs native."""
    import stand_in_kernels as sk

    sk.register()
    op = ir.ops.fused_add_rms_norm
    table = [{"max_tokens": 4, "priority": [sk.INPLACE]}, {"priority": ["native"]}]

    def fn(x: Tensor, r: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        a, b = op(x, r, w, 1e-6)
        return a * 2, b + 1

    try:
        backend = ir.VllmIRBackend(priority={op.name: table}, bucket_dispatch=dispatch)
        compiled = torch.compile(fn, backend=backend, dynamic=True)
        w = torch.randn(8)
        compiled(torch.randn(3, 8), torch.randn(3, 8), w)
        described = list(backend.lowering_pass.selected_impls.get(op.name, {}).values())
        assert described in ([], [f"<=4:{sk.INPLACE};native"])
        torch.compiler.set_stance("fail_on_recompile")
        for rows in (2, 4, 5, 17):
            x, r = torch.randn(rows, 8), torch.randn(rows, 8)
            x0, r0 = x.clone(), r.clone()
            got = compiled(x, r, w)
            want = fn(x0.clone(), r0.clone(), w)
            for g, e in zip(got, want, strict=True):
                torch.testing.assert_close(g, e)
            assert torch.equal(x, x0)
            assert torch.equal(r, r0)
    finally:
        sk.unregister()


@pytest.mark.slow
def test_compiled_random_tables_and_programs(tagged: ir.IrOp, no_recompile: None) -> None:
    """Random tables, random programs over the op (2-D and 3-D activations, so the token
    count is one dim or a product), compiled once with a dynamic token dim per dispatch
    mode: at random sizes, compiled == eager under the table, recompiles refused."""
    from vllm_ir.testing import inductor_caches_off

    rng = random.Random(41)
    for case in range(2):  # each case costs up to 5 cold compiles
        table = _random_table(rng, max_bound=24)
        rank3 = case % 2 == 1
        factors = [rng.choice([0.5, 2.0, 3.0]) for _ in range(rng.randint(1, 3))]

        def fn(x: Tensor, factors: list[float] = factors) -> Tensor:
            for f in factors:
                x = tagged(x.relu() + 1.0, f) - f
            return x

        for dispatch in ("graphs", "branches"):
            torch._dynamo.reset()
            torch.compiler.set_stance("default")
            backend = ir.VllmIRBackend(priority={tagged.name: table}, bucket_dispatch=dispatch)
            compiled = torch.compile(fn, backend=backend, dynamic=True)
            shape = (lambda n: (2, n, 8)) if rank3 else (lambda n: (n, 8))
            with inductor_caches_off():  # each compile's passes run
                compiled(_ints(*shape(3)))
            torch.compiler.set_stance("fail_on_recompile")
            with tagged.set_priority(table):
                for rows in rng.sample(range(2, 40), 8):
                    x = _ints(*shape(rows))
                    assert torch.equal(compiled(x), fn(x)), (table, dispatch, x.shape, factors)


def test_ops_counting_different_sizes_branch_per_op(tagged: ir.IrOp, no_recompile: None) -> None:
    """Two token counts (two dynamic dims): no one cut serves both, so each op
    branches in one graph; results match eager at every pair of sizes."""
    table = [{"max_tokens": 4, "priority": ["t1"]}, {"priority": ["t2"]}]
    backend = ir.VllmIRBackend(priority={tagged.name: table})

    def fn(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return tagged(x, 2.0), tagged(y, 3.0)

    compiled = torch.compile(fn, backend=backend, dynamic=True)
    compiled(_ints(3, 8), _ints(7, 8))
    assert len(backend.pass_contexts) == 1
    torch.compiler.set_stance("fail_on_recompile")
    with tagged.set_priority(table):
        for rows_x, rows_y in ((2, 9), (9, 2), (4, 5), (30, 30)):
            x, y = _ints(rows_x, 8), _ints(rows_y, 8)
            for got, want in zip(compiled(x, y), fn(x, y), strict=True):
                assert torch.equal(got, want), (rows_x, rows_y)


def test_size_switch_reads_the_count_and_picks_the_piece() -> None:
    """The switch's reader and cut: a size argument or a tensor dim, times constants."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from vllm_ir.compilation._bucket_switch import SizeSwitch, _reader

    fake = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(
        torch.ones(5, 3, 8), static_shapes=False
    )
    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    gm.graph.placeholder("x").meta["example_value"] = fake
    s0, s1 = (d.node.expr for d in fake.shape[:2])
    read = _reader(2 * s0 * s1, gm, [fake])
    assert read is not None
    assert read([torch.ones(4, 3, 8)]) == 24
    switch = SizeSwitch(s0, ((2, 16), (17, 256), (257, 10**9)), lambda args: args[0])
    assert [switch.piece(t) for t in (2, 16, 17, 256, 257, 5000)] == [0, 0, 1, 1, 2, 2]


def test_bucket_dispatch_is_checked() -> None:
    with pytest.raises(ValueError, match="bucket_dispatch must be one of 'graphs', 'branches'"):
        ir.VllmIRBackend(bucket_dispatch="cond")  # type: ignore[arg-type]


# -- CLI ----------------------------------------------------------------------


def _cli(*args: str) -> Any:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    return subprocess.run(
        [sys.executable, "-m", "vllm_ir", *args], capture_output=True, text=True, env=env
    )


def test_explain_shows_the_bucket_table_and_the_call_bucket() -> None:
    flag = "--ir-op-priority.rms_norm=<=4:native;<=64:native;native"
    out = _cli("explain", "rms_norm", "--shape", "2,8,16", "--eager", flag)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("size buckets" in line and "this call: 16" in line for line in lines)
    marked = [line for line in lines if "<- this call" in line]
    assert len(marked) == 1
    assert "<= 64 tokens" in marked[0]
    assert any("> 64 tokens" in line for line in lines)
    assert "priority list (this call's bucket):" in out.stdout


def test_cli_refuses_a_malformed_table_in_one_line() -> None:
    out = _cli("explain", "rms_norm", "--ir-op-priority.rms_norm=<=64:native")
    assert out.returncode == 2
    assert "must have no max_tokens" in out.stderr
    assert "Traceback" not in out.stderr


# -- autotuning per bucket ----------------------------------------------------


def test_decide_or_refuse_keeps_the_priority_order_on_noise() -> None:
    from vllm_ir._base.timing import Timing, decide_or_refuse

    clear = {"a": Timing(10.0, 9.8, 10.2), "b": Timing(8.0, 7.9, 8.1)}
    assert decide_or_refuse(clear, ["a", "b"], "b").winner == "b"
    noisy = {"a": Timing(10.0, 6.0, 14.0), "b": Timing(8.0, 7.9, 8.1)}
    verdict = decide_or_refuse(noisy, ["a", "b"], "b")
    assert (verdict.winner, verdict.decided) == ("a", False)
    assert "too noisy to decide" in verdict.note
    # noisy but far apart: the ranking stands
    apart = {"a": Timing(10.0, 8.0, 12.0), "b": Timing(2.0, 1.9, 2.1)}
    assert decide_or_refuse(apart, ["a", "b"], "b").decided


def test_autotuner_measures_each_bucket_and_branches(tagged: ir.IrOp, no_recompile: None) -> None:
    """A fake timer with a crossover (t1 costs 1 us per token, t2 a flat 50 us):
    t1 wins the <=16 bucket, t2 the others; one compile runs each bucket's winner."""
    from vllm_ir.compilation._autotune import Autotuner

    seen: list[int] = []

    def impl_t1(x: Tensor, factor: float) -> Tensor:
        seen.append(tagged.tokens(x, factor))
        return x * factor + 1.0

    tagged.unregister_impl("t1")
    tagged.register_impl("t1")(impl_t1)

    def timer(provider: str, prepare: Any, device: torch.device) -> float:
        if provider == "native":
            return 1e-3  # never run: native would be compiled alone first
        prepare()()
        return seen[-1] * 1e-6 if provider == "t1" else 50e-6

    tuner = Autotuner(timer=timer, persist=False, rounds=3)
    backend = ir.VllmIRBackend(priority={tagged.name: ["t1", "t2"]}, autotune=tuner)

    def fn(x: Tensor) -> Tensor:
        return tagged(x, 2.0)

    compiled = torch.compile(fn, backend=backend, dynamic=True)
    # no FX cache: a hit would reuse an earlier run's choice and measure nothing
    with torch._inductor.config.patch(fx_graph_cache=False):
        compiled(_ints(3, 8))
    records = {r.bucket: r for r in tuner.records.values()}
    assert set(records) == {"<=16", "<=256", ">256"}
    assert [records[b].winner for b in ("<=16", "<=256", ">256")] == ["t1", "t2", "t2"]
    assert records[">256"].tokens == 1024
    for record in records.values():
        assert record.threads == torch.get_num_threads()
        assert record.decided
    assert set(records["<=16"].spread_s) == {"t1", "t2", "native"}
    torch.compiler.set_stance("fail_on_recompile")
    for rows in (2, 16, 17, 300):
        x = _ints(rows, 8)
        assert _tag_of(compiled(x), x, 2.0) == ("t1" if rows <= 16 else "t2"), rows


def test_autotuner_bucket_settings_are_checked() -> None:
    from vllm_ir.compilation._autotune import Autotuner

    with pytest.raises(ValueError, match="ascend strictly"):
        Autotuner(buckets=(256, 16))
    with pytest.raises(ValueError, match="positive ints"):
        Autotuner(buckets=(0,))
    with pytest.raises(ValueError, match="rounds"):
        Autotuner(rounds=0)


# -- vllm-ir tune per bucket --------------------------------------------------


def _fake_interleaved(noisy_at: int | None = None) -> Callable[..., dict[str, list[float]]]:
    """Samples (us) with a crossover: t1 costs 1 us per token, t2 a flat 50 us, native
    200 us; at ``noisy_at`` tokens t2's samples spread widely over t1's."""

    def fake(fns: dict[str, Any], device: str, rounds: int, warmup: int) -> dict[str, list[float]]:
        out = {}
        for name, fn in fns.items():
            tokens = fn.args[0].shape[0]
            base = {"t1": float(tokens), "t2": 50.0}.get(name, 200.0)
            if name == "t2" and tokens == noisy_at:
                out[name] = [base * f for f in (0.2, 0.5, 1.0, 6.0, 10.0)][:rounds]
            else:
                out[name] = [base] * rounds
        return out

    return fake


def _sampled(op: ir.IrOp) -> None:
    """An input generator, which ``vllm-ir tune`` builds its calls from."""
    from vllm_ir._schema.samples import SampleInput

    @op.register_input_generator
    def samples(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
        yield SampleInput((torch.ones(4, 8, dtype=dtype, device=device), 2.0), "ones")


def test_tune_buckets_writes_a_bucketed_table(
    tagged: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_ir._cli import tune_buckets

    monkeypatch.setattr(tune_buckets, "time_interleaved", _fake_interleaved())
    _sampled(tagged)
    with tagged.set_priority(["t1", "t2"]):
        priority, measured = tune_buckets.tune_buckets(
            [tagged], (16, 256), 8, torch.float32, "cpu", rounds=5
        )
    assert priority[tagged.name] == [
        {"max_tokens": 16, "priority": ["t1", "t2", "native"]},
        {"max_tokens": 256, "priority": ["t2", "native", "t1"]},  # t1: 256 us > 200
        {"priority": ["t2", "native", "t1"]},
    ]
    assert measured[tagged.name][">256"]["tokens"] == 1024
    assert measured[tagged.name]["<=16"]["times_us"] == {"t1": 16.0, "t2": 50.0, "native": 200.0}
    config = ir.IrOpPriorityConfig.from_dict(priority)  # loads as written
    x = _ints(100, 8)
    with config.scope():
        assert _tag_of(tagged(x, 2.0), x, 2.0) == "t2"


def test_tune_buckets_refuses_to_rank_on_noise(
    tagged: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_ir._cli import tune_buckets

    monkeypatch.setattr(tune_buckets, "time_interleaved", _fake_interleaved(noisy_at=256))
    _sampled(tagged)
    with tagged.set_priority(["t1", "t2"]):
        priority, measured = tune_buckets.tune_buckets(
            [tagged], (16, 256), 8, torch.float32, "cpu", rounds=5
        )
    result = measured[tagged.name]["<=256"]
    assert result["decided"] is False
    assert "too noisy to decide" in result["note"]
    assert priority[tagged.name][1] == {"max_tokens": 256, "priority": ["t1", "t2", "native"]}


def test_tune_cli_per_bucket_round_trips(tmp_path: Any) -> None:
    out = tmp_path / "tuned.json"
    args = ["tune", "--ops", "rms_norm", "--buckets", "2,8", "--hidden", "64", "--rounds", "2"]
    result = _cli(*args, "--dtype", "fp32", "--out", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["buckets"] == [2, 8]
    assert doc["threads"] == 1
    assert set(doc["measured"]["rms_norm"]) == {"<=2", "<=8", ">8"}
    assert doc["measured"]["rms_norm"][">8"]["shape"] == [32, 64]
    ir.IrOpPriorityConfig.from_json(out)  # loads, bucketed or not
    shown = _cli("explain", "rms_norm", "--shape", "4,64", "--eager", "--tuned", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "<=8 (8x64)" in shown.stdout
    bad = _cli("tune", "--ops", "rms_norm", "--buckets", "8,2", "--out", str(out))
    assert bad.returncode == 2
    assert "ascend strictly" in bad.stderr
    both = _cli("tune", "--buckets", "8", "--shapes", "a=4x64", "--out", str(out))
    assert both.returncode == 2
    assert "not both" in both.stderr


def test_symbolic_tokens_select_without_guards(tagged: ir.IrOp) -> None:
    """On FakeTensors with a symbolic token count: one reachable bucket selects it;
    several raise AmbiguousBucket (the lowering branches instead); neither adds a guard."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )
    from vllm_ir._selection.buckets import AmbiguousBucket

    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.randn(4, 8), symbolic_context=context, source=ConstantSource("x"))
    # a dynamic dim ranges over [2, inf): a bound of 1 leaves one reachable bucket
    with tagged.set_priority([{"max_tokens": 1, "priority": ["t1"]}, {"priority": ["t2"]}]):
        assert tagged.selected_impl(x, 2.0).provider == "t2"
    table = [{"max_tokens": 16, "priority": ["t1"]}, {"priority": ["t2"]}]
    with tagged.set_priority(table), pytest.raises(AmbiguousBucket, match=r"ranges over \[2, "):
        tagged.selected_impl(x, 2.0)
    assert not mode.shape_env.guards


@pytest.mark.parametrize("backend", ["aot_eager", "vllm_ir"])
def test_trace_through_guards_a_dynamic_count_to_its_bucket(tagged: ir.IrOp, backend: str) -> None:
    """Trace-through with a dynamic token count spanning buckets: the traced call
    guards on its bucket, as a Python branch on a size would, and a count in another
    bucket recompiles; each runs its bucket's impl (it raised AmbiguousBucket)."""
    table = [{"max_tokens": 8, "priority": ["t1"]}, {"priority": ["t2"]}]
    chosen: Any = "aot_eager" if backend == "aot_eager" else ir.VllmIRBackend()
    counter = CompileCounterWithBackend(chosen)
    torch._dynamo.reset()
    with tagged.set_priority(table), torch.no_grad(), ir.enable_torch_wrap(False):
        compiled = torch.compile(lambda t: tagged(t, 2.0) * 3, backend=counter, dynamic=True)
        for n, tag in ((4, "t1"), (8, "t1"), (9, "t2"), (30, "t2"), (3, "t1")):
            x = torch.randint(-4, 4, (n, 16)).float()
            assert _tag_of(compiled(x) / 3, x, 2.0) == tag, n
    assert counter.frame_count == 2, "one graph per bucket reached"


def test_kernel_config_autotune_buckets_flag() -> None:
    config = ir.KernelConfig.from_cli_args(["--ir-autotune", "--ir-autotune.buckets=8,64"])
    assert config.autotune_buckets == (8, 64)
    assert ir.VllmIRBackend.from_config(config).autotuner.buckets == (8, 64)
    assert ir.KernelConfig().autotune_buckets == (16, 256)
    with pytest.raises(ValueError, match="ascending positive token bounds"):
        ir.KernelConfig.from_cli_args(["--ir-autotune.buckets=64,8"])
    with pytest.raises(ValueError, match="ascending positive token bounds"):
        ir.KernelConfig(autotune_buckets=(0,))


def test_tokens_leave_out_the_feature_dims_an_op_declares() -> None:
    q = torch.zeros(2, 5, 4, 8)  # (batch, seq, heads, head_size)
    cos = torch.zeros(2, 5, 8)
    assert ir.ops.rotary_embedding.feature_dims == 2
    assert ir.ops.rotary_embedding.tokens(q, q, cos, cos, True) == 10
    assert ir.ops.rms_norm.tokens(torch.zeros(2, 5, 8), None, 1e-6) == 10
    with pytest.raises(TypeError, match="feature_dims must be an int of at least 1"):
        ir.register_op(name="bad_features", feature_dims=0)


# -- the size plan ------------------------------------------------------------------


def _naive_bucket(bounds: tuple[int, ...], tokens: int) -> int:
    """Bucket i holds counts in (bounds[i - 1], bounds[i]]; the last, the rest."""
    for i, bound in enumerate(bounds):
        if tokens <= bound:
            return i
    return len(bounds)


@pytest.mark.parametrize("seed", range(20))
def test_size_plan_agrees_with_the_bucket_rule(seed: int) -> None:
    """Random bounds and counts: every reading of a SizePlan against the rule itself."""
    rng = random.Random(seed)
    bounds = tuple(sorted(rng.sample(range(1, 400), rng.randint(0, 5))))
    plan = SizePlan(bounds)
    assert bool(plan) == bool(bounds)
    assert len(plan) == len(bounds) + 1 == len(plan.labels)
    for _ in range(50):
        low = rng.randint(0, 500)
        high = low + rng.randint(0, 300)
        tokens = rng.randint(low, high)
        i = _naive_bucket(bounds, tokens)
        assert plan.index(tokens) == i
        assert plan.label_of(tokens) == plan.labels[i]
        reached = sorted({_naive_bucket(bounds, t) for t in range(low, high + 1)})
        assert list(plan.indices(low, high)) == reached
        one = plan.labels[reached[0]] if len(reached) == 1 else ALL_SIZES
        assert plan.label_of_range(low, high) == one
        for j in reached:  # the representative is the smallest count of bucket j in range
            rep = plan.lowest(j, low)
            assert rep == min(t for t in range(low, high + 1) if _naive_bucket(bounds, t) == j)
            top = plan.upper(j)
            assert top is None or (
                _naive_bucket(bounds, top) == j != _naive_bucket(bounds, top + 1)
            )
    extra = rng.sample(range(1, 400), 2)
    assert plan.merged(extra).bounds == tuple(sorted({*bounds, *extra}))


def test_op_size_plan_select_and_candidates_at_a_token_count(scale_op: ir.IrOp) -> None:
    def small(x: Tensor, factor: float) -> Tensor:
        return x * factor

    scale_op.register_impl("small", supports_args=lambda x, factor: True)(small)
    table = [{"max_tokens": 8, "priority": ["small"]}, {"priority": ["native"]}]
    x = torch.ones(4, 3)
    assert not scale_op.size_plan()
    with scale_op.set_priority(table):
        plan = scale_op.size_plan()
        assert plan == SizePlan((8,))
        assert plan.bounds == scale_op.bucket_bounds()
        assert scale_op.select(x, 2.0).impl.provider == "small"
        assert scale_op.select(x, 2.0, tokens=9).impl.provider == "native"
        assert scale_op.candidates(x, 2.0, tokens=100).selected.provider == "native"
        assert scale_op.select(x, 2.0, tokens=8).impl.provider == "small"
        with pytest.raises(TypeError, match="tokens must be a non-negative int"):
            scale_op.select(x, 2.0, tokens=-1)
    assert scale_op.select(x, 2.0, tokens=100).impl.provider == "native"  # no buckets: as given
