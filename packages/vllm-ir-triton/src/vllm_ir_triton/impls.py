"""The ``triton`` and ``triton_batch_invariant`` impls of the IR ops, and when they apply.

Each impl has exactly its op's native signature (``register_impl`` checks).
A plain eager call launches the kernel directly (:mod:`vllm_ir_triton.launch`);
any other call — under ``make_fx`` (the vllm-ir lowering), Dynamo, a
dispatch mode, or with tensor subclasses — goes through the opaque torch ops
of :mod:`vllm_ir_triton.library`, so tracers record one node and never launch
a kernel. The direct launch saves the custom op's dispatcher round trip
(about 5 us a call on the eager hot path).

``supports_args`` looks only at what dispatch caches on (dtype, ndim, device,
layout, non-tensor arguments), never at sizes or strides. It declines, so
that selection falls back to the next provider (``native`` at the latest):

* ``variance_size`` (the partial-variance variant);
* dtypes other than float32, float16, bfloat16; non-strided tensors;
* tensors on a device the kernels do not run on (see :mod:`vllm_ir_triton.support`);
* a weight whose dtype differs from ``x``'s (native promotes the product; the
  kernels write the input dtype), or that is not 1-D;
* for ``fused_add_rms_norm``: an ``x_residual`` whose dtype or rank differs
  from ``x``'s.

What it cannot see, the impls handle themselves, computing the native
function instead of launching: a weight whose length is not the row length
(broadcasting), and an ``x_residual`` whose shape differs from ``x``'s (a
broadcast sum cannot be written in place). Strides never matter: the kernels
take a row and a column stride, and inputs whose leading dimensions do not
collapse into rows are copied (:mod:`vllm_ir_triton.launch`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.logger import get_logger

from vllm_ir_triton import BATCH_INVARIANT_PROVIDER, PROVIDER, launch, library, support

__all__ = [
    "DTYPES",
    "fused_add_rms_norm",
    "fused_add_rms_norm_batch_invariant",
    "register_impls",
    "rms_norm",
    "rms_norm_batch_invariant",
    "supports_args_for",
]

DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
"""The dtypes the kernels compute in (every tensor of a call shares one)."""

logger = get_logger("vllm_ir.triton")

_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_rms_norm_op = library.rms_norm
_fused_add_rms_norm_op = library.fused_add_rms_norm_


def _plain_eager(x: Tensor) -> bool:
    """A real tensor outside any tracer or mode: launch the kernel directly."""
    return type(x) is Tensor and not _dispatch_stack_len() and not _is_compiling()


def _known_equal(a: int | torch.SymInt, b: int | torch.SymInt) -> bool:
    """``a == b`` for sizes, without guarding on symbolic ones (unknown -> False)."""
    if type(a) is int and type(b) is int:
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(a == b)


def _weight_fits(x: Tensor, weight: Tensor | None) -> bool:
    return weight is None or _known_equal(weight.shape[0], x.shape[-1])


def _same_shape(a: Tensor, b: Tensor) -> bool:
    return a.dim() == b.dim() and all(
        _known_equal(m, n) for m, n in zip(a.shape, b.shape, strict=True)
    )


def _rms_norm(
    x: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None,
    batch_invariant: bool,
) -> Tensor:
    if variance_size is not None or not _weight_fits(x, weight):
        return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)
    if _plain_eager(x):
        return launch.rms_norm(x, weight, epsilon, batch_invariant=batch_invariant)
    return _rms_norm_op(x, weight, epsilon, batch_invariant)


def _fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None,
    batch_invariant: bool,
) -> tuple[Tensor, Tensor]:
    if variance_size is not None or not _weight_fits(x, weight) or not _same_shape(x, x_residual):
        return ir.ops.fused_add_rms_norm.native(x, x_residual, weight, epsilon, variance_size)
    if _plain_eager(x):
        launch.fused_add_rms_norm_(x, x_residual, weight, epsilon, batch_invariant=batch_invariant)
    else:
        _fused_add_rms_norm_op(x, x_residual, weight, epsilon, batch_invariant)
    return x, x_residual


def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """``triton``: the row in one block when it fits, tuned per row length."""
    return _rms_norm(x, weight, epsilon, variance_size, False)


def fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``triton``, in place: the rounded sum into ``x_residual``, the result into ``x``."""
    return _fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size, False)


def rms_norm_batch_invariant(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """``triton_batch_invariant``: fixed block and warps, whatever the shapes."""
    return _rms_norm(x, weight, epsilon, variance_size, True)


def fused_add_rms_norm_batch_invariant(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``triton_batch_invariant``, in place, with the fixed configuration."""
    return _fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size, True)


def supports_args_for(
    device_types: frozenset[str],
) -> tuple[Callable[..., bool], Callable[..., bool]]:
    """``(rms_norm_supports, fused_add_rms_norm_supports)`` for tensors on ``device_types``."""

    def tensors_ok(x: Tensor, weight: Tensor | None) -> bool:
        return (
            x.device.type in device_types
            and x.dtype in DTYPES
            and x.layout == torch.strided
            and x.ndim >= 1
            and (weight is None or (weight.dtype == x.dtype and weight.ndim == 1))
        )

    def rms_norm_supports(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> bool:
        return variance_size is None and tensors_ok(x, weight)

    def fused_add_rms_norm_supports(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> bool:
        return (
            variance_size is None
            and x_residual.dtype == x.dtype
            and x_residual.ndim == x.ndim
            and tensors_ok(x, weight)
        )

    return rms_norm_supports, fused_add_rms_norm_supports


def register_impls() -> None:
    """Register both providers' impls; vllm-ir calls this through the ProviderSpec."""
    reason = support.unsupported_reason()
    if reason is not None:
        logger.debug("%s impls registered as unsupported: %s", PROVIDER, reason)
    supported = reason is None
    rms_supports, fused_supports = supports_args_for(support.device_types())
    variants = (
        (PROVIDER, rms_norm, fused_add_rms_norm, False),
        (
            BATCH_INVARIANT_PROVIDER,
            rms_norm_batch_invariant,
            fused_add_rms_norm_batch_invariant,
            True,
        ),
    )
    for provider, rms_fn, fused_fn, invariant in variants:
        ir.ops.rms_norm.register_impl(
            provider, supported=supported, supports_args=rms_supports, batch_invariant=invariant
        )(rms_fn)
        ir.ops.fused_add_rms_norm.register_impl(
            provider,
            supported=supported,
            supports_args=fused_supports,
            inplace=True,
            batch_invariant=invariant,
        )(fused_fn)
