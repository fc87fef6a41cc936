"""The backend end to end through Inductor. Compiles are costly: few, shared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import stand_in_kernels as kernels
import torch
import vllm_ir as ir
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor import metrics
from torch._inductor.custom_graph_pass import CustomGraphPass
from vllm_ir.testing import TinyDecoder, inductor_caches_off

HIDDEN, LAYERS = 32, 3


no_cache = inductor_caches_off


class Decoder(TinyDecoder):
    """rms_norm, then per layer a linear and fused_add_rms_norm.maybe_inplace."""

    def __init__(self, use_ir: bool = True) -> None:
        super().__init__(HIDDEN, LAYERS, use_ir=use_ir)


@pytest.fixture(scope="module", autouse=True)
def _stand_ins() -> Iterator[None]:
    kernels.register()
    yield
    kernels.unregister()


@pytest.fixture(scope="module")
def inplace_compiled() -> tuple[Decoder, Any, ir.VllmIRBackend]:
    """The decoder compiled with the opaque in-place kernel and opaque rms_norm.

    Compiled here, with Inductor's caches off: a cache hit would skip the
    passes whose records these tests read.
    """
    torch._dynamo.reset()
    model = Decoder().eval()
    backend = ir.VllmIRBackend(
        priority={"fused_add_rms_norm": [kernels.INPLACE], "rms_norm": [kernels.OPAQUE]}
    )
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with no_cache(), torch.no_grad():
        compiled(torch.randn(5, HIDDEN))
    assert not backend.pass_contexts[0].from_cache
    return model, compiled, backend


def test_eager_equals_compiled_with_inplace_kernel(inplace_compiled) -> None:  # type: ignore[no-untyped-def]
    model, compiled, backend = inplace_compiled
    x = torch.randn(5, HIDDEN)
    with torch.no_grad():
        with ir.IrOpPriorityConfig(fused_add_rms_norm=[kernels.INPLACE]).scope():
            eager = model(x.clone())
        got = compiled(x.clone())
    tol = ir.ops.fused_add_rms_norm.tolerance(torch.float32)
    torch.testing.assert_close(got, eager, atol=tol.atol, rtol=tol.rtol)
    assert backend.lowering_pass.selected_impls == {
        "rms_norm": {"rms_norm": kernels.OPAQUE},
        "fused_add_rms_norm": {
            name: kernels.INPLACE
            for name in ("fused_add_rms_norm", "fused_add_rms_norm_1", "fused_add_rms_norm_2")
        },
    }


def test_zero_clones_left_for_donated_inputs(inplace_compiled) -> None:  # type: ignore[no-untyped-def]
    _, compiled, backend = inplace_compiled
    with torch.no_grad():
        compiled(torch.randn(5, HIDDEN))
    ctx = backend.pass_contexts[0]
    assert ctx.functionalized == LAYERS
    assert ctx.clones_inserted == 2 * LAYERS
    assert ctx.clones_removed == 2 * LAYERS, ctx.clones_kept
    assert [d.graph_input for d in ctx.donations][:2] == [False, True]  # linear out, input x


@pytest.fixture(scope="module")
def kernel_counts() -> dict[str, int]:
    """Kernels generated for the IR model (compile defaults) and the plain-torch one."""
    result = {}
    for label, use_ir in (("ir", True), ("plain", False)):
        torch._dynamo.reset()
        metrics.reset()
        model = Decoder(use_ir).eval()
        backend = ir.VllmIRBackend() if use_ir else "inductor"
        with no_cache(), torch.no_grad():
            torch.compile(model, backend=backend)(torch.randn(4, HIDDEN))
        result[label] = metrics.generated_kernel_count
    return result


def test_ir_model_generates_no_more_kernels_than_plain_torch(kernel_counts) -> None:  # type: ignore[no-untyped-def]
    assert kernel_counts["plain"] > 0
    assert kernel_counts["ir"] == kernel_counts["plain"], kernel_counts


class RecordingPass(CustomGraphPass):
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.calls += 1

    def uuid(self) -> str:
        return "recording-pass"


def test_dynamic_batch_no_recompile_and_user_hooks_compose() -> None:
    torch._dynamo.reset()
    user_pass = RecordingPass()
    backend = ir.VllmIRBackend()
    calls = []

    def counting_backend(gm, example_inputs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return backend(gm, example_inputs)

    fn = torch.compile(
        lambda x, w: ir.ops.rms_norm(x, w, 1e-6), backend=counting_backend, dynamic=True
    )
    w = torch.rand(HIDDEN)
    with inductor_config.patch(post_grad_custom_post_pass=user_pass), no_cache():
        for batch in (3, 7, 64):
            x = torch.randn(batch, HIDDEN)
            torch.testing.assert_close(fn(x, w), ir.ops.rms_norm(x, w, 1e-6))
    assert len(calls) == 1  # one graph serves every batch size
    assert user_pass.calls == 1  # the user's hook ran after ours
    assert inductor_config.post_grad_custom_post_pass is None


def test_supports_args_guarding_on_batch_size_is_refused() -> None:
    torch._dynamo.reset()
    op = ir.ops.rms_norm

    def batch_dependent(x, weight, epsilon, variance_size=None):  # type: ignore[no-untyped-def]
        return x.shape[0] > 1

    @op.register_impl("batch_guard", supports_args=batch_dependent)
    def impl(
        x: torch.Tensor,
        weight: torch.Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> torch.Tensor:
        return op.native(x, weight, epsilon, variance_size)

    try:
        fn = torch.compile(
            lambda x: op(x, None, 1e-6),
            backend=ir.VllmIRBackend(priority={"rms_norm": ["batch_guard"]}),
            dynamic=True,
        )
        with pytest.raises(Exception, match=r"returned SymBool.*would guard the compiled graph"):
            fn(torch.randn(4, HIDDEN))
    finally:
        op.unregister_impl("batch_guard")


def test_donated_input_read_after_is_a_compile_error() -> None:
    torch._dynamo.reset()

    def bad(x, r, w):  # type: ignore[no-untyped-def]
        h, _ = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
        return h + x

    fn = torch.compile(bad, backend=ir.VllmIRBackend())
    with pytest.raises(Exception, match=r"donates activation 'x'.*reads it after the call"):
        fn(torch.randn(2, HIDDEN), torch.randn(2, HIDDEN), torch.ones(HIDDEN))


def _compile_once(priority: dict[str, list[str]]) -> ir.VllmIRBackend:
    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority=priority)
    fn = torch.compile(lambda x: ir.ops.rms_norm(x, None, 1e-6), backend=backend)
    fn(torch.randn(2, 8))
    return backend


def test_fx_graph_cache_keys_on_priority(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with inductor_config.patch(fx_graph_cache=True, fx_graph_remote_cache=False):
        counters.clear()
        assert not _compile_once({"rms_norm": ["native"]}).pass_contexts[0].from_cache
        assert _compile_once({"rms_norm": ["native"]}).pass_contexts[0].from_cache
        assert counters["inductor"]["fxgraph_cache_hit"] == 1
        _compile_once({"rms_norm": [kernels.OPAQUE]})
        assert counters["inductor"]["fxgraph_cache_miss"] == 2
        assert counters["inductor"]["fxgraph_cache_hit"] == 1


def test_a_cache_hit_reports_the_selection_it_was_compiled_with(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with inductor_config.patch(fx_graph_cache=True, fx_graph_remote_cache=False):
        first = _compile_once({"rms_norm": ["native"]})
        counters.clear()  # as in a new process: only the cached graph knows
        again = _compile_once({"rms_norm": ["native"]})
    assert not first.pass_contexts[0].from_cache
    ctx = again.pass_contexts[0]
    assert ctx.from_cache
    assert counters["inductor"]["fxgraph_cache_hit"] == 1
    assert again.lowering_pass.selected_impls == first.lowering_pass.selected_impls
    assert ctx.selected_impls == {"rms_norm": {"rms_norm": "native"}}
    assert ctx.selected_impls is again.lowering_pass.selected_impls


def test_uuid_covers_priorities_and_impl_sources() -> None:
    a = ir.VllmIRBackend(priority={"rms_norm": ["native"]}).lowering_pass.pre.uuid()
    b = ir.VllmIRBackend(priority={"rms_norm": ["native"]}).lowering_pass.pre.uuid()
    c = ir.VllmIRBackend(priority={"rms_norm": [kernels.OPAQUE]}).lowering_pass.pre.uuid()
    assert a == b != c
    # a changed impl source changes the key too
    impl = ir.ops.rms_norm.registered_impls[kernels.OPAQUE]
    original = impl.impl_fn
    object.__setattr__(impl, "impl_fn", kernels.fused_add_rms_norm_inplace)
    try:
        d = ir.VllmIRBackend(priority={"rms_norm": [kernels.OPAQUE]}).lowering_pass.pre.uuid()
    finally:
        object.__setattr__(impl, "impl_fn", original)
    assert d != c


def test_string_backend_is_registered() -> None:
    torch._dynamo.reset()
    fn = torch.compile(lambda x: ir.ops.rms_norm(x, None, 1e-6), backend="vllm_ir")
    torch.testing.assert_close(fn(torch.ones(2, 8)), torch.ones(2, 8))


def test_cache_never_serves_a_donating_graph_to_a_non_donating_program(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # after functionalization both programs have the same graph; only the
    # donation record (node meta) differs, and it must reach the cache key
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    fused = ir.ops.fused_add_rms_norm
    priority = {"fused_add_rms_norm": [kernels.INPLACE]}

    def donating(x, r, w):  # type: ignore[no-untyped-def]
        return fused.maybe_inplace(x, r, w, 1e-6)

    def keeping(x, r, w):  # type: ignore[no-untyped-def]
        return fused(x, r, w, 1e-6)

    x, r, w = torch.randn(4, HIDDEN), torch.randn(4, HIDDEN), torch.rand(HIDDEN)
    with inductor_config.patch(fx_graph_cache=True, fx_graph_remote_cache=False):
        counters.clear()
        torch._dynamo.reset()
        torch.compile(donating, backend=ir.VllmIRBackend(priority=priority))(
            x.clone(), r.clone(), w
        )
        torch._dynamo.reset()
        x2, r2 = x.clone(), r.clone()
        torch.compile(keeping, backend=ir.VllmIRBackend(priority=priority))(x2, r2, w)
    assert counters["inductor"]["fxgraph_cache_hit"] == 0
    torch.testing.assert_close((x2, r2), (x, r), atol=0, rtol=0)
