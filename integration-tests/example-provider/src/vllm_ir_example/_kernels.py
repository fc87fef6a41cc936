"""The kernels: plain PyTorch, matching the native semantics of ``vllm_ir.ops.layernorm``.

Signatures must equal the ops' native ones exactly (names, defaults,
annotations); ``register_impl`` rejects any difference.
"""

from __future__ import annotations

import torch
from torch import Tensor
from vllm_ir.kits.norms import fused_add_in_place, register_norm_impls

from vllm_ir_example import PROVIDER

__all__ = ["fused_add_rms_norm", "register_kernels", "rms_norm"]


def _normalize(x: Tensor, weight: Tensor | None, epsilon: float) -> Tensor:
    # fp32 accumulation, cast back before the weight: the op's native contract
    x32 = x.to(torch.float32)
    inv_rms = torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + epsilon)
    out = (x32 * inv_rms).to(x.dtype)
    return out if weight is None else out * weight


def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return _normalize(x, weight, epsilon)


def _fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: object
) -> None:
    # x_residual is rounded to its dtype first, as the native function does
    x_residual.add_(x)
    x.copy_(_normalize(x_residual, weight, epsilon))


# the in-place impl, with the op's signature, over a function that writes both
fused_add_rms_norm = fused_add_in_place(
    _fused_add_rms_norm,
    module=__name__,
    doc="In place: the sum goes into ``x_residual``, the normalized output into ``x``.",
)


# supports_args takes the op's own parameters (names and defaults must match)
def _rms_norm_supported(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    # the partial-variance variant is left to native
    return variance_size is None


def _fused_add_rms_norm_supported(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> bool:
    return variance_size is None


def register_kernels() -> None:
    """Register every ``example`` impl; called by vllm-ir through the ProviderSpec."""
    register_norm_impls(
        PROVIDER,
        rms_norm,
        fused_add_rms_norm,
        supported=True,
        supports_args=(_rms_norm_supported, _fused_add_rms_norm_supported),
    )
