"""The impls through the whole compile pipeline: one compile, shared by the tests.

A small decoder donates its activations with ``maybe_inplace``. The lowering
inlines the functional ``triton`` rms_norm (one opaque kernel op) before
Inductor's passes, and the in-place fused kernel after them with clones of
its activations; clone elimination must remove every clone.

A second model (linear, ``fused_add_rms_norm.maybe_inplace``, static FP8
quantization) checks that vllm-ir's norm + quant fusion pass fires and that
the fused op lowers to the ``triton`` impl, bit for bit the eager kernels.
"""

from __future__ import annotations

import torch
import vllm_ir as ir
from triton_helpers import DEVICE
from vllm_ir.testing import inductor_caches_off
from vllm_ir.testing.compiled import CompiledDecoderChecks
from vllm_ir_triton import PROVIDER

HIDDEN, LAYERS = 64, 3
TRITON = {"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]}
NATIVE = {"rms_norm": ["native"], "fused_add_rms_norm": ["native"]}


no_cache = inductor_caches_off


class TestCompiledDecoder(CompiledDecoderChecks):
    """The decoder compiled once, for every batch size, with ``triton`` selected."""

    provider = PROVIDER
    device = DEVICE


class NormQuant(torch.nn.Module):
    """A linear, ``fused_add_rms_norm.maybe_inplace``, then static FP8 quantization:
    the pattern vllm-ir's ``fuse_norm_quant`` pass rewrites into one op."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(HIDDEN))
        self.register_buffer("scale", torch.tensor([0.02]))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = ir.ops.fused_add_rms_norm.maybe_inplace(
            self.linear(x), residual, self.weight, 1e-6
        )
        return ir.ops.static_scaled_fp8_quant(h, self.scale), residual


def test_norm_quant_fusion_lowers_to_triton() -> None:
    """The core fusion pass fires, the fused op lowers to ``triton``, and the compiled
    result is bit for bit the eager ``triton`` kernels' (fused_add_rms_norm, then the
    quantization): the fused kernel quantizes exactly what the norm kernel stores."""
    fused = "fused_add_rms_norm_static_fp8_quant"
    torch._dynamo.reset()
    model = NormQuant().to(DEVICE).eval()
    backend = ir.VllmIRBackend(priority={fused: [PROVIDER]})
    fn = torch.compile(model, backend=backend)
    x, residual = torch.randn(5, HIDDEN, device=DEVICE), torch.randn(5, HIDDEN, device=DEVICE)
    with no_cache(), torch.no_grad():
        q, new_residual = fn(x.clone(), residual.clone())
        eager_triton = {"fused_add_rms_norm": [PROVIDER], "static_scaled_fp8_quant": [PROVIDER]}
        with ir.IrOpPriorityConfig(**eager_triton).scope():
            want_q, want_residual = model(x.clone(), residual.clone())
        native_q, native_residual = model(x.clone(), residual.clone())
    (ctx,) = backend.pass_contexts
    assert not ctx.from_cache
    assert ctx.fusions["fuse_norm_quant"] == 1
    selected = backend.lowering_pass.selected_impls
    assert set(selected) == {fused}
    assert list(selected[fused].values()) == [PROVIDER]
    assert q.dtype == torch.float8_e4m3fn
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(new_residual, want_residual)
    assert torch.equal(new_residual, native_residual)
    tol = ir.ops.rms_norm_static_fp8_quant.tolerance(torch.float32)
    torch.testing.assert_close(q.float(), native_q.float(), atol=tol.atol, rtol=tol.rtol)
    # the donated residual's clone goes, and so does the copy of x the impl never writes
    assert ctx.clones_inserted == 2
    assert ctx.clones_removed == 2, ctx.clones_kept
