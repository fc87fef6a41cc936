"""FP8 (``float8_e4m3fn``) quantization, alone and fused with RMSNorm.

Quantization divides by the scale in fp32, clamps to the format's finite
range and rounds to FP8; a scale is fp32 of shape ``(1,)`` (static) or
``(..., 1)`` per token (dynamic).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from vllm_ir._op.op import register_op
from vllm_ir._schema.samples import SampleInput
from vllm_ir._schema.tolerances import FP8_ONE_STEP
from vllm_ir.ops.layernorm import fused_add_rms_norm, rms_norm

__all__ = [
    "FP8",
    "FP8_MAX",
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "rms_norm_static_fp8_quant",
    "static_scaled_fp8_quant",
]

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # keeps an all-zero row from dividing by zero


def _quantize(x: Tensor, scale: Tensor) -> Tensor:
    return (x.to(torch.float32) / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


@register_op
def static_scaled_fp8_quant(x: Tensor, scale: Tensor) -> Tensor:
    """Quantize ``x`` to FP8 with one precomputed fp32 ``scale``."""
    return _quantize(x, scale)


@register_op
def dynamic_per_token_fp8_quant(x: Tensor, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Quantize each token (row) with its own scale ``amax / FP8_MAX``.

    Returns ``(q, scales)``; ``scale_ub`` (usually one float32 element, of shape
    ``()`` or ``(1,)``) bounds each row's amax from above, as ``clamp(max=...)``
    does: a NaN bound makes the scales NaN. It may live on another device than
    ``x`` (a 0-d CPU tensor with CUDA ``x``): it is copied to ``x``'s device,
    without a host sync.
    """
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    if scale_ub is not None:
        # clamp takes no bound on another device, not even a 0-d CPU one. A copy to
        # an accelerator need not wait for it (no host sync); one to the host must
        ub = scale_ub.to(amax.device, non_blocking=amax.device.type != "cpu")
        amax = amax.clamp(max=ub)
    scales = (amax / FP8_MAX).clamp(min=_MIN_SCALE)
    return _quantize(x, scales), scales


@register_op
def rms_norm_static_fp8_quant(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    """``static_scaled_fp8_quant(rms_norm(x, weight, epsilon), scale)``."""
    return _quantize(rms_norm.native(x, weight, epsilon), scale)


@register_op(allow_inplace=True)
def fused_add_rms_norm_static_fp8_quant(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> tuple[Tensor, Tensor]:
    """``fused_add_rms_norm`` then FP8 quantization of the normalized output.

    Returns ``(q, x + x_residual)``; an inplace impl may write the new
    residual into ``x_residual`` (the FP8 output needs its own buffer).
    """
    out, residual = fused_add_rms_norm.native(x, x_residual, weight, epsilon)
    return _quantize(out, scale), residual


# At most one FP8 step against native: exact for the elementwise ops and the
# dynamic quant on kernels that follow native's arithmetic, one step where a norm
# precedes the quantization (vllm_ir._schema.tolerances explains both).
_FP8_TOLERANCE = {dtype: FP8_ONE_STEP for dtype in (torch.float32, torch.float16, torch.bfloat16)}
for _op in (
    static_scaled_fp8_quant,
    dynamic_per_token_fp8_quant,
    rms_norm_static_fp8_quant,
    fused_add_rms_norm_static_fp8_quant,
):
    _op.register_tolerances(_FP8_TOLERANCE)


def _scale(device: torch.device) -> Tensor:
    return torch.tensor([0.02], dtype=torch.float32, device=device)


@static_scaled_fp8_quant.register_input_generator
def _static_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    gen = torch.Generator().manual_seed(3)
    for shape in ((1, 64), (7, 96), (2, 3, 128), (5, 33)):  # 33: an odd width
        x = torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)
        yield SampleInput((x, _scale(device)), "x".join(map(str, shape)))


@dynamic_per_token_fp8_quant.register_input_generator
def _dynamic_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    gen = torch.Generator().manual_seed(4)
    for shape in ((1, 64), (7, 96), (2, 3, 128)):
        x = torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)
        yield SampleInput((x,), "x".join(map(str, shape)))
    x = torch.randn(4, 64, generator=gen).to(dtype=dtype, device=device)
    ub = torch.tensor([1.0], dtype=torch.float32, device=device)
    yield SampleInput((x, ub), "4x64-scale-ub")
    x = torch.randn(5, 33, generator=gen).to(dtype=dtype, device=device)
    yield SampleInput((x,), "5x33-odd-width")


@rms_norm_static_fp8_quant.register_input_generator
def _rms_quant_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    for sample in rms_norm.sample_inputs(dtype, device):
        if len(sample.args) == 3:  # no variance_size
            yield SampleInput((*sample.args, _scale(device)), sample.name)


@fused_add_rms_norm_static_fp8_quant.register_input_generator
def _fused_quant_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    for sample in fused_add_rms_norm.sample_inputs(dtype, device):
        if len(sample.args) == 4:
            yield SampleInput((*sample.args, _scale(device)), sample.name)
