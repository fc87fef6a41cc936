"""AITER's RMSNorm entry points as opaque torch ops, with fake impls.

``torch.ops.vllm_ir_rocm.rms_norm`` and ``torch.ops.vllm_ir_rocm.fused_add_rms_norm``
wrap the AITER calls so that tracing, ``torch.compile`` and the vllm-ir
lowering see one opaque node per call (AITER's own wrappers call kernels
through ``data_ptr()``, which must not be traced), and FakeTensors get their
metadata from the fake impls below, on any machine.

Argument mapping (AITER's Python API, ``ROCm/aiter``, ``aiter/ops/rmsnorm.py``):

* ``rms_norm(x, weight, epsilon)`` -> ``aiter.rmsnorm2d_fwd(x2d, weight, epsilon)``,
  which returns a new tensor; ``x2d`` is ``x`` viewed as rows
  ``(-1, hidden)``, each contiguous (the row stride may be larger than
  ``hidden``, e.g. a ``torch.split`` slice: AITER reads it without a copy).
* ``fused_add_rms_norm(x, x_residual, weight, epsilon)`` ->
  ``aiter.fused_add_rms_norm_cu(x2d, residual2d, weight, epsilon)``, in place:
  ``residual = x + residual`` (rounded to the dtype), then
  ``x = rms_norm(residual) * weight``. Both must be contiguous.

Inputs in other layouts still compute the right result here (they are
copied to contiguous rows, and in-place results copied back), but the impls'
``supports_args`` declines them, so those calls go to another provider.
Empty inputs never reach AITER.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import torch
from torch import Tensor
from vllm_ir.kits.vendor import VendorNorm
from vllm_ir.provider import contiguous

from vllm_ir_rocm.availability import MODULE

__all__ = ["DTYPES", "KIT", "NAMESPACE", "fused_add_rms_norm", "rms_norm"]

NAMESPACE = "vllm_ir_rocm"

DTYPES = (torch.float16, torch.bfloat16)
"""The activation dtypes the impls hand to AITER (the weight must match)."""


def _fused_layout(x: Tensor, x_residual: Tensor) -> bool:
    # AITER's in-place kernel takes no strides: both contiguous
    return contiguous(x) and contiguous(x_residual)


KIT = VendorNorm(
    provider="aiter",
    library="AITER",
    lacks="AITER does not support",
    dtypes=DTYPES,
    fused_layout=_fused_layout,
    namespace=NAMESPACE,
    takes="AITER's RMSNorm takes",
)
"""The vendor-wrapper table; the wiring around AITER is core's :class:`VendorNorm`."""


def _aiter() -> ModuleType:
    # a dict lookup on the hot path; the import runs once (at registration,
    # through vllm_ir_rocm.availability, on a supported machine)
    module = sys.modules.get(MODULE)
    return module if module is not None else importlib.import_module(MODULE)


def _rms_rows(rows: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    out: Tensor = _aiter().rmsnorm2d_fwd(rows, weight, epsilon)
    return out


def _fused_rows(x_rows: Tensor, residual_rows: Tensor, weight: Tensor, epsilon: float) -> None:
    _aiter().fused_add_rms_norm_cu(x_rows, residual_rows, weight, epsilon)


rms_norm, fused_add_rms_norm = KIT.define_ops(_rms_rows, _fused_rows)
