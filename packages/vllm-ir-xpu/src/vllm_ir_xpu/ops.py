"""vllm-xpu-kernels' RMSNorm kernels behind opaque torch ops of our own, with fake impls.

``torch.ops.vllm_ir_xpu.rms_norm`` and ``torch.ops.vllm_ir_xpu.fused_add_rms_norm``
are what the impls call: the vllm-ir lowering sees one opaque node per call,
FakeTensors get their metadata from the fake impls below (vllm-xpu-kernels
registers its ``_C`` ops without any), and the vendor extension is imported
only when a kernel first runs.

Argument mapping (vllm-xpu-kernels ``csrc/torch_bindings.cpp`` and
``csrc/layernorm.cpp``; the ops live in the ``torch.ops._C`` namespace once
``vllm_xpu_kernels._C`` is imported):

* ``rms_norm(x, weight, epsilon)`` -> ``_C.rms_norm(result, input, weight, epsilon)``
  with ``result`` a new contiguous tensor of ``x``'s shape (viewed as rows) and
  ``input`` ``x`` viewed as rows ``(-1, hidden)``, each contiguous (the kernel
  takes the row stride, so a slice of wider rows is read in place);
* ``fused_add_rms_norm(x, x_residual, weight, epsilon)`` ->
  ``_C.fused_add_rms_norm(input, residual, weight, epsilon)``, in place:
  ``residual = x + residual`` (rounded to the dtype), then
  ``x = rms_norm(residual) * weight``; ``input`` as rows (row stride taken),
  ``residual`` contiguous.

Inputs in other layouts still compute the right result here (copied to
contiguous rows, in-place results copied back), but the impls'
``supports_args`` declines them. Empty inputs never reach the kernels.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch
from torch import Tensor
from vllm_ir.kits.vendor import VendorNorm
from vllm_ir.provider import contiguous, rows_flatten_free

from vllm_ir_xpu.availability import EXTENSION

__all__ = ["DTYPES", "KIT", "NAMESPACE", "fused_add_rms_norm", "rms_norm"]

NAMESPACE = "vllm_ir_xpu"

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes the kernels take (``VLLM_DISPATCH_FLOATING_TYPES``); the weight must match."""


def _fused_layout(x: Tensor, x_residual: Tensor) -> bool:
    # the kernel takes x's row stride and indexes x_residual densely
    return rows_flatten_free(x) and contiguous(x_residual)


KIT = VendorNorm(
    provider="xpu_kernels",
    library="vllm-xpu-kernels",
    lacks="the XPU kernels do not support",
    dtypes=DTYPES,
    fused_layout=_fused_layout,
    namespace=NAMESPACE,
    takes="the XPU kernels take",
)
"""The vendor-wrapper table; the wiring around the kernels is core's :class:`VendorNorm`."""


def _kernels() -> Any:
    # a dict lookup on the hot path; the import runs once (at registration,
    # through vllm_ir_xpu.availability, on a supported machine)
    if EXTENSION not in sys.modules:
        importlib.import_module(EXTENSION)
    return torch.ops._C


def _rms_rows(rows: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    # the kernel writes a result of its own: a fresh contiguous one
    out = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
    _kernels().rms_norm(out, rows, weight, epsilon)
    return out


def _fused_rows(x_rows: Tensor, residual_rows: Tensor, weight: Tensor, epsilon: float) -> None:
    _kernels().fused_add_rms_norm(x_rows, residual_rows, weight, epsilon)


rms_norm, fused_add_rms_norm = KIT.define_ops(_rms_rows, _fused_rows)
