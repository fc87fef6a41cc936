"""Opaque stand-in kernels for the compile tests (not a test module of its own).

``vllm_ir_test::fused_add_rms_norm_`` is a ``torch.library`` op that writes
its results into its inputs, like a real in-place kernel: the compiler sees
only an opaque mutating call. ``vllm_ir_test::rms_norm`` is an opaque
functional kernel that declines ``variance_size``.
"""

from __future__ import annotations

import torch
import vllm_ir as ir
from torch import Tensor

INPLACE = "test_inplace"
OPAQUE = "test_opaque"


@torch.library.custom_op("vllm_ir_test::fused_add_rms_norm_", mutates_args=("x", "x_residual"))
def _fused_add_rms_norm_kernel(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
) -> None:
    x_residual.add_(x)
    x.copy_(ir.ops.rms_norm.native(x_residual, weight, epsilon))


@torch.library.custom_op("vllm_ir_test::rms_norm", mutates_args=())
def _rms_norm_kernel(x: Tensor, weight: Tensor | None, epsilon: float) -> Tensor:
    return ir.ops.rms_norm.native(x, weight, epsilon)


@_rms_norm_kernel.register_fake
def _(x: Tensor, weight: Tensor | None, epsilon: float) -> Tensor:
    return ir.ops.rms_norm.native(x, weight, epsilon)


def _no_variance_size(x, x_residual, weight, epsilon, variance_size=None):  # type: ignore[no-untyped-def]
    return variance_size is None


def _rms_no_variance_size(x, weight, epsilon, variance_size=None):  # type: ignore[no-untyped-def]
    return variance_size is None


def fused_add_rms_norm_inplace(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    torch.ops.vllm_ir_test.fused_add_rms_norm_(x, x_residual, weight, epsilon)
    return x, x_residual


def rms_norm_opaque(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return torch.ops.vllm_ir_test.rms_norm(x, weight, epsilon)


def register() -> None:
    """Register both stand-ins (idempotent)."""
    if INPLACE not in ir.ops.fused_add_rms_norm.registered_impls:
        ir.ops.fused_add_rms_norm.register_impl(
            INPLACE, inplace=True, supports_args=_no_variance_size
        )(fused_add_rms_norm_inplace)
    if OPAQUE not in ir.ops.rms_norm.registered_impls:
        ir.ops.rms_norm.register_impl(OPAQUE, supports_args=_rms_no_variance_size)(rms_norm_opaque)


def unregister() -> None:
    ir.ops.fused_add_rms_norm.unregister_impl(INPLACE)
    ir.ops.rms_norm.unregister_impl(OPAQUE)


@torch.library.custom_op("vllm_ir_test::scale_", mutates_args=("x",))
def scale_(x: Tensor, factor: float) -> None:
    """An opaque in-place kernel for the clone-elimination fuzzer."""
    x.mul_(factor)
