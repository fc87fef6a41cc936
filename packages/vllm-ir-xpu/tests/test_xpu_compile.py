"""The ``xpu_kernels`` impls through ``torch.compile``: opaque ops, in place without clones."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import vllm_ir as ir
from vllm_ir.testing import TinyDecoder, inductor_caches_off
from vllm_ir_xpu import PROVIDER
from xpu_stand_ins import StandInXpuKernels

HIDDEN, LAYERS = 64, 3
DTYPE = torch.bfloat16


_no_cache = inductor_caches_off


@pytest.fixture(scope="module")
def compiled(xpu_stand_in: StandInXpuKernels) -> tuple[TinyDecoder, Any, ir.VllmIRBackend]:
    torch._dynamo.reset()
    model = TinyDecoder(HIDDEN, LAYERS, dtype=DTYPE).eval()
    backend = ir.VllmIRBackend(priority={"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]})
    fn = torch.compile(model, backend=backend, dynamic=False)
    with _no_cache(), torch.no_grad():
        fn(torch.randn(5, HIDDEN, dtype=DTYPE))
    assert not backend.pass_contexts[0].from_cache
    return model, fn, backend


def test_every_node_lowered_to_xpu_kernels(
    compiled: tuple[TinyDecoder, Any, ir.VllmIRBackend],
) -> None:
    selected = compiled[2].lowering_pass.selected_impls
    assert set(selected) == {"rms_norm", "fused_add_rms_norm"}
    assert {p for nodes in selected.values() for p in nodes.values()} == {PROVIDER}
    assert len(selected["fused_add_rms_norm"]) == LAYERS


def test_compiled_graph_calls_the_wrapped_kernels(
    compiled: tuple[TinyDecoder, Any, ir.VllmIRBackend], kernels: StandInXpuKernels
) -> None:
    model, fn, _ = compiled
    x = torch.randn(5, HIDDEN, dtype=DTYPE)
    with torch.no_grad():
        got = fn(x.clone())
    assert [c.name for c in kernels.calls] == ["rms_norm"] + ["fused_add_rms_norm"] * LAYERS
    kernels.calls.clear()
    with (
        torch.no_grad(),
        ir.IrOpPriorityConfig(rms_norm=[PROVIDER], fused_add_rms_norm=[PROVIDER]).scope(),
    ):
        want = model(x.clone())
    tol = ir.ops.rms_norm.tolerance(DTYPE)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


def test_no_clones_left_for_the_in_place_kernel(
    compiled: tuple[TinyDecoder, Any, ir.VllmIRBackend],
) -> None:
    ctx = compiled[2].pass_contexts[0]
    assert ctx.functionalized == LAYERS
    assert ctx.clones_inserted == 2 * LAYERS
    assert ctx.clones_removed == 2 * LAYERS, ctx.clones_kept


def test_compiled_defaults_on_xpu_keep_native(
    xpu_stand_in: StandInXpuKernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "xpu")
    ir.invalidate_caches()
    x, w = torch.randn(4, HIDDEN, dtype=DTYPE), torch.ones(HIDDEN, dtype=DTYPE)
    assert ir.ops.rms_norm.select(x, w, 1e-6, mode="compiled").impl.provider == "native"
    assert ir.ops.rms_norm.select(x, w, 1e-6, mode="eager").impl.provider == PROVIDER
