"""The ``xpu_kernels`` impls of ``rms_norm`` and (in place) ``fused_add_rms_norm``.

Each impl has the op's native signature and calls one opaque op of
:mod:`vllm_ir_xpu.ops`. ``supports_args`` accepts what the vllm-xpu-kernels
kernels compute without any copy:

* fp32, fp16 and bf16 activations, with a weight of the same dtype (or none:
  the impls pass ones), on ``xpu`` tensors;
* no ``variance_size`` (the kernels normalize over the whole last dimension);
* ``rms_norm``: ``x`` flattens to ``(-1, hidden)`` as a view with unit-stride
  rows (the kernel takes the row stride); a flatten that would copy the
  tensor costs more than the kernel saves;
* ``fused_add_rms_norm``: ``x`` as such rows, ``x_residual`` contiguous (the
  kernel indexes it densely), with the same rank.

Layout is judged by :mod:`vllm_ir.layout`, from strides without guarding on
them, so a compiled graph never specializes on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.layout import contiguous, rows_flatten_free
from vllm_ir.logger import get_logger

from vllm_ir_xpu import availability, ops

__all__ = [
    "contiguous",
    "fused_add_rms_norm",
    "register_kernels",
    "rms_norm",
    "rows_flatten_free",
    "supports_args_for",
]


def _weight(weight: Tensor | None, x: Tensor) -> Tensor:
    # the kernels always multiply by a weight
    if weight is None:
        return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    return weight


def _no_variance_size(op: str, variance_size: int | None) -> None:
    if variance_size is not None:
        raise ValueError(
            f"the xpu_kernels impl of {op} got variance_size={variance_size}, which the XPU "
            "kernels do not support; its supports_args declines such calls"
        )


def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """``_C.rms_norm`` on ``x``'s rows; a new tensor laid out as the native one."""
    _no_variance_size("rms_norm", variance_size)
    out = ops.rms_norm(x, _weight(weight, x), epsilon)
    if rows_flatten_free(x):
        return out
    # Declined by supports_args (dispatch never sends it here), but the impl
    # is a public function: the op copied x to contiguous rows; lay the
    # result out like the native function would.
    return torch.empty_like(x).copy_(out)


def fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """In place (``_C.fused_add_rms_norm``): returns ``(x, x_residual)``, which it wrote.

    ``x_residual`` becomes ``x + x_residual`` (rounded to the dtype), ``x``
    its RMSNorm times ``weight``.
    """
    _no_variance_size("fused_add_rms_norm", variance_size)
    ops.fused_add_rms_norm(x, x_residual, _weight(weight, x), epsilon)
    return x, x_residual


def supports_args_for(
    device_type: str,
) -> tuple[Callable[..., bool], Callable[..., bool]]:
    """``(rms_norm_supports, fused_add_rms_norm_supports)`` for tensors on ``device_type``.

    The registered predicates use ``xpu``; the CPU tests use ``cpu`` with
    stand-in ``_C`` kernels.
    """

    def tensors_ok(x: Tensor, weight: Tensor | None) -> bool:
        return (
            x.dtype in ops.DTYPES
            and x.device.type == device_type
            and x.layout == torch.strided
            and x.dim() >= 1
            and (weight is None or (weight.dtype == x.dtype and weight.dim() == 1))
        )

    def rms_norm_supports(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> bool:
        return variance_size is None and tensors_ok(x, weight) and rows_flatten_free(x)

    def fused_add_rms_norm_supports(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> bool:
        return (
            variance_size is None
            and tensors_ok(x, weight)
            and x_residual.dtype == x.dtype
            and x_residual.dim() == x.dim()
            and x_residual.layout == torch.strided
            and rows_flatten_free(x)
            and contiguous(x_residual)
        )

    return rms_norm_supports, fused_add_rms_norm_supports


def _log_availability(provider: str, found: availability.Availability) -> None:
    logger = get_logger(f"vllm_ir.providers.{provider}")
    if found.supported:
        logger.debug(
            "provider %r: vllm-xpu-kernels %s found; impls registered for %s tensors",
            provider,
            found.vendor_version or "(version unknown)",
            found.device_type,
        )
        return
    # with an Intel GPU, missing or broken kernels are worth a warning; elsewhere
    # an unsupported vendor provider is the normal case
    level = logging.WARNING if found.hardware else logging.INFO
    logger.log(level, "provider %r registered as unsupported: %s", provider, found.reason)


def register_kernels(provider: str = "xpu_kernels") -> availability.Availability:
    """Register both impls, ``supported`` as :func:`availability.current` says; returns it."""
    found = availability.current()
    _log_availability(provider, found)
    rms_supports, fused_supports = supports_args_for(found.device_type)
    ir.ops.rms_norm.register_impl(
        provider,
        supported=found.supported,
        supports_args=rms_supports,
        unsupported_reason=found.reason,
    )(rms_norm)
    ir.ops.fused_add_rms_norm.register_impl(
        provider,
        supported=found.supported,
        supports_args=fused_supports,
        inplace=True,
        unsupported_reason=found.reason,
    )(fused_add_rms_norm)
    return found
