"""The ``cpu_c`` impls of the IR ops, and when they apply.

Each impl has exactly its op's native signature (``register_impl`` checks).
They call the kernel ops of :mod:`vllm_ir_cpu.library`, building the C++
library on the first call: a real call, or the lowering tracing the impl on
FakeTensors, so a compiled model has its kernels before it first runs.

``supports_args`` may only look at argument metadata that dispatch caches on
(dtype, ndim, device, layout, non-tensor arguments), never at sizes or
strides. So the kernels take any layout: rows may be strided as long as the
last dimension is contiguous, and any other layout goes through contiguous
copies inside the kernel. What they decline, falling back to the next
provider (``native`` at the latest):

* ``variance_size`` (the partial-variance variant);
* dtypes other than float32, bfloat16, float16; non-CPU or non-strided tensors;
* a weight whose dtype differs from ``x``'s (native promotes the product;
  the kernels write the input dtype), or that is not 1-D;
* for ``fused_add_rms_norm``: an ``x_residual`` whose dtype or rank differs
  from ``x``'s (native broadcasts or promotes; in place, the sum must fit
  ``x_residual``);
* any call, when this machine has no C++ compiler or ninja and the library
  is not loaded yet (logged once).
"""

from __future__ import annotations

import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.logger import get_logger
from vllm_ir.platform import current_platform

from vllm_ir_cpu import PROVIDER, build
from vllm_ir_cpu.library import kernel_ops

__all__ = ["DTYPES", "fused_add_rms_norm", "register_impls", "rms_norm"]

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
"""The dtypes the kernels compute in."""

logger = get_logger("vllm_ir.cpu_c")

_OPS = kernel_ops()
_rms_norm_kernel = _OPS["rms_norm_functional"]
_fused_add_rms_norm_kernel = _OPS["fused_add_rms_norm"]

_built = False


def _ensure_built() -> None:
    global _built
    build.build()
    _built = True


def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    if not _built:
        _ensure_built()
    return _rms_norm_kernel(x, weight, epsilon)


def fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    # In place: the rounded sum goes into x_residual, the normalized output into x.
    if not _built:
        _ensure_built()
    _fused_add_rms_norm_kernel(x, x_residual, weight, epsilon)
    return x, x_residual


_warned_toolchain = False


def _buildable() -> bool:
    if build.is_loaded():
        return True
    problem = build.toolchain_problem()
    if problem is None:
        return True
    global _warned_toolchain
    if not _warned_toolchain:
        _warned_toolchain = True
        logger.warning("%s kernels cannot be built, so they are skipped: %s", PROVIDER, problem)
    return False


def _kernel_can_run(x: Tensor, weight: Tensor | None) -> bool:
    return (
        x.device.type == "cpu"
        and x.layout == torch.strided
        and x.dtype in DTYPES
        and x.ndim >= 1
        and (weight is None or (weight.dtype == x.dtype and weight.ndim == 1))
        and _buildable()
    )


def _rms_norm_supported(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    return variance_size is None and _kernel_can_run(x, weight)


def _fused_add_rms_norm_supported(
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
        and _kernel_can_run(x, weight)
    )


def register_impls() -> None:
    """Register every ``cpu_c`` impl; called by vllm-ir through the ProviderSpec."""
    # C++ CPU kernels: offered where CPU is the platform whose defaults apply
    supported = current_platform() == "cpu"
    # each row is computed alone, by the same code whatever the batch: batch invariant
    ir.ops.rms_norm.register_impl(
        PROVIDER,
        supported=supported,
        supports_args=_rms_norm_supported,
        batch_invariant=True,
    )(rms_norm)
    ir.ops.fused_add_rms_norm.register_impl(
        PROVIDER,
        inplace=True,
        supported=supported,
        supports_args=_fused_add_rms_norm_supported,
        batch_invariant=True,
    )(fused_add_rms_norm)
