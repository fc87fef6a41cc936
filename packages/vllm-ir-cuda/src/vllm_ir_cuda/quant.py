"""The ``vllm_c`` impls of ``silu_and_mul`` and the four FP8 ops.

Each impl has the op's native signature and maps it onto a kernel op of
:mod:`vllm_ir_cuda.ops`. As in :mod:`vllm_ir_cuda.layernorm`, inputs not
contiguous in their last dimension are copied first, and ``supports_args``
looks only at dtype, device, rank and layout (what the dispatch cache keys
on). Sizes are not in that key, so the rare calls whose sizes the kernels do
not take (a scale of more than one element, a weight of another length, rows
of no elements) are computed by the native function inside the impl.

Numerics (``vllm_ir.tolerances``): ``silu_and_mul``, ``static_scaled_fp8_quant``
and ``dynamic_per_token_fp8_quant`` give native's CUDA bits; the norm + quant
ops quantize the value :func:`vllm_ir_cuda.layernorm.rms_norm` computes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import vllm_ir as ir
from torch import Tensor

from vllm_ir_cuda import ops

__all__ = [
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "register_kernels",
    "rms_norm_static_fp8_quant",
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "supports_args_for",
]

FP8 = torch.float8_e4m3fn


def _rows_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _one_element(scale: Tensor | None) -> bool:
    return scale is None or scale.numel() == 1


def _weight_fits(x: Tensor, weight: Tensor | None) -> bool:
    return weight is None or weight.shape == (x.shape[-1],)


def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` into a new contiguous tensor."""
    if x.shape[-1] % 2:  # native's halves do not match: its error
        return ir.ops.silu_and_mul.native(x)
    x = _rows_contiguous(x)
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    ops.silu_and_mul(out, x)
    return out


def static_scaled_fp8_quant(x: Tensor, scale: Tensor) -> Tensor:
    """FP8 ``x / scale`` (one float32 scale) into a new contiguous tensor."""
    if not _one_element(scale):
        return ir.ops.static_scaled_fp8_quant.native(x, scale)
    x = _rows_contiguous(x)
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    ops.static_scaled_fp8_quant(out, x, scale)
    return out


def dynamic_per_token_fp8_quant(x: Tensor, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-row scales ``(..., 1)`` and FP8 values, as native computes them on CUDA."""
    if x.shape[-1] == 0 or not _one_element(scale_ub):
        return ir.ops.dynamic_per_token_fp8_quant.native(x, scale_ub)
    x = _rows_contiguous(x)
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    ops.dynamic_per_token_fp8_quant(out, scales, x, scale_ub)
    return out, scales


def rms_norm_static_fp8_quant(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    """FP8 of ``rms_norm(x, weight, epsilon) / scale`` into a new contiguous tensor."""
    if not _one_element(scale) or not _weight_fits(x, weight):
        return ir.ops.rms_norm_static_fp8_quant.native(x, weight, epsilon, scale)
    x = _rows_contiguous(x)
    if weight is not None:
        weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    ops.rms_norm_static_fp8_quant(out, x, weight, epsilon, scale)
    return out


def fused_add_rms_norm_static_fp8_quant(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> tuple[Tensor, Tensor]:
    """In place: ``x_residual += x`` (rounded); returns (FP8 of its norm, ``x_residual``).

    ``x`` is only read; the FP8 output is a new tensor.
    """
    if not _one_element(scale) or not _weight_fits(x, weight) or x_residual.shape != x.shape:
        return ir.ops.fused_add_rms_norm_static_fp8_quant.native(
            x, x_residual, weight, epsilon, scale
        )
    if weight is not None:
        weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    x_rows = _rows_contiguous(x)
    if x_residual.stride(-1) == 1:
        ops.fused_add_rms_norm_static_fp8_quant(out, x_rows, x_residual, weight, epsilon, scale)
    else:
        residual_rows = x_residual.contiguous()
        ops.fused_add_rms_norm_static_fp8_quant(out, x_rows, residual_rows, weight, epsilon, scale)
        x_residual.copy_(residual_rows)
    return out, x_residual


def supports_args_for(device_type: str) -> dict[str, Callable[..., bool]]:
    """``supports_args`` of each impl (by op name) for tensors on ``device_type``.

    The impls use ``"cuda"``; tests run their wiring on CPU stand-ins with ``"cpu"``.
    Only dtype, device, rank and layout: never sizes or values.
    """

    def x_ok(x: Tensor) -> bool:
        return (
            x.device.type == device_type
            and x.dtype in ops.DTYPES
            and x.layout == torch.strided
            and x.ndim >= 1
        )

    def scale_ok(x: Tensor, scale: Tensor | None) -> bool:
        return scale is None or (
            scale.dtype == torch.float32
            and scale.device == x.device
            and scale.layout == torch.strided
        )

    def weight_ok(x: Tensor, weight: Tensor | None) -> bool:
        return weight is None or (
            weight.dtype == x.dtype
            and weight.device == x.device
            and weight.ndim == 1
            and weight.layout == torch.strided
        )

    def silu(x: Tensor) -> bool:
        return x_ok(x)

    def static(x: Tensor, scale: Tensor) -> bool:
        return x_ok(x) and scale_ok(x, scale)

    def dynamic(x: Tensor, scale_ub: Tensor | None = None) -> bool:
        return x_ok(x) and scale_ok(x, scale_ub)

    def rms_quant(x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor) -> bool:
        return x_ok(x) and weight_ok(x, weight) and scale_ok(x, scale)

    def fused_quant(
        x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
    ) -> bool:
        return (
            x_ok(x)
            and x_residual.dtype == x.dtype
            and x_residual.device == x.device
            and x_residual.ndim == x.ndim
            and x_residual.layout == torch.strided
            and weight_ok(x, weight)
            and scale_ok(x, scale)
        )

    return {
        "silu_and_mul": silu,
        "static_scaled_fp8_quant": static,
        "dynamic_per_token_fp8_quant": dynamic,
        "rms_norm_static_fp8_quant": rms_quant,
        "fused_add_rms_norm_static_fp8_quant": fused_quant,
    }


IMPLS: dict[str, Callable[..., object]] = {
    "silu_and_mul": silu_and_mul,
    "static_scaled_fp8_quant": static_scaled_fp8_quant,
    "dynamic_per_token_fp8_quant": dynamic_per_token_fp8_quant,
    "rms_norm_static_fp8_quant": rms_norm_static_fp8_quant,
    "fused_add_rms_norm_static_fp8_quant": fused_add_rms_norm_static_fp8_quant,
}
"""Each op's impl, by op name."""

INPLACE = frozenset({"fused_add_rms_norm_static_fp8_quant"})
"""Ops whose impl writes into an activation (the new residual into ``x_residual``)."""


def register_kernels(
    provider: str = "vllm_c", *, supported: bool, device_type: str = "cuda"
) -> None:
    """Register the five impls. Every kernel computes a row (or element) alone, with a
    launch configuration fixed by the row length and dtype: all are batch invariant."""
    supports = supports_args_for(device_type)
    for name, impl in IMPLS.items():
        ir.get_op(name).register_impl(
            provider,
            supported=supported,
            supports_args=supports[name],
            inplace=name in INPLACE,
            batch_invariant=True,
        )(impl)
