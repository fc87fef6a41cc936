"""The ``vllm_c`` impls of ``rms_norm``, ``fused_add_rms_norm`` and their vLLM numerics
(``vllm_rms_norm`` on the ``rms_norm`` kernel, ``vllm_fused_add_rms_norm``).

Each impl has the op's native signature and maps it onto a kernel op of
:mod:`vllm_ir_cuda.ops`. The kernels read rows that are contiguous in their
last dimension; an input that is not (rare: e.g. a transposed view) is copied
first, so the impls accept every layout the native functions accept.
``supports_args`` declines what the kernels cannot compute at all, looking
only at dtype, device, rank, layout and non-tensor arguments (what the
dispatch cache keys on): never at sizes, strides or values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from vllm_ir.kits.norms import fused_add_in_place, norm_supports_args, register_norm_impls

from vllm_ir_cuda import ops

__all__ = [
    "fused_add_rms_norm",
    "fused_add_rms_norm_supports",
    "vllm_fused_add_rms_norm",
    "platform_supported",
    "register_kernels",
    "rms_norm",
    "rms_norm_supports",
    "supports_args_for",
]

_rms_norm_kernel = ops.rms_norm
_fused_add_rms_norm_kernel = ops.fused_add_rms_norm
_vllm_fused_add_rms_norm_kernel = ops.vllm_fused_add_rms_norm


def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """RMSNorm of ``x`` into a new tensor laid out like ``x`` (``variance_size`` is declined)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    out = torch.empty_like(x)
    _rms_norm_kernel(out, x, weight, epsilon)
    return out


def _fused_add_rows(
    kernel: Any, x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
) -> None:
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    if x.stride(-1) == 1 and x_residual.stride(-1) == 1:
        kernel(x, x_residual, weight, epsilon)
    else:
        x_rows, residual_rows = x.contiguous(), x_residual.contiguous()
        kernel(x_rows, residual_rows, weight, epsilon)
        x.copy_(x_rows)
        x_residual.copy_(residual_rows)


def _fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: object
) -> None:
    _fused_add_rows(_fused_add_rms_norm_kernel, x, x_residual, weight, epsilon)


def _vllm_fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: object
) -> None:
    _fused_add_rows(_vllm_fused_add_rms_norm_kernel, x, x_residual, weight, epsilon)


fused_add_rms_norm = fused_add_in_place(
    _fused_add_rms_norm,
    module=__name__,
    doc="""In place: ``x_residual += x`` (rounded to the dtype), then ``x = rms_norm(x_residual)``.

Returns ``(x, x_residual)``, the activations it wrote.
""",
)


vllm_fused_add_rms_norm = fused_add_in_place(
    _vllm_fused_add_rms_norm,
    module=__name__,
    name="vllm_fused_add_rms_norm",
    doc="""In place, vLLM's numerics: ``x_residual += x`` (rounded), ``x`` = the RMSNorm of
the float32 sum. Returns ``(x, x_residual)``.
""",
)


def supports_args_for(
    device_type: str,
) -> tuple[Callable[..., bool], Callable[..., bool]]:
    """``(rms_norm_supports, fused_add_rms_norm_supports)`` for tensors on ``device_type``.

    The impls' predicates use ``"cuda"``; tests that run the impls' wiring on
    CPU stand-in kernels use ``"cpu"``.
    """
    return norm_supports_args(device_type, ops.DTYPES)


rms_norm_supports, fused_add_rms_norm_supports = supports_args_for("cuda")


def platform_supported() -> bool:
    """An NVIDIA GPU is visible to a CUDA build of torch (ROCm builds are not CUDA).

    This is the hardware, not ``VLLM_IR_PLATFORM``, which only steers which
    platform's default priorities apply.
    """
    return (
        torch.version.cuda is not None and torch.version.hip is None and torch.cuda.is_available()
    )


def register_kernels(provider: str = "vllm_c") -> None:
    """Register both impls; vllm-ir calls this through the package's ProviderSpec."""
    supported = platform_supported()
    # One block per row, its block size fixed by the row length and dtype
    # alone: a row's result never depends on the rest of the batch.
    register_norm_impls(
        provider,
        rms_norm,
        fused_add_rms_norm,
        supported=supported,
        supports_args=(rms_norm_supports, fused_add_rms_norm_supports),
        vllm_fused_add_rms_norm=vllm_fused_add_rms_norm,
        batch_invariant=True,
    )
