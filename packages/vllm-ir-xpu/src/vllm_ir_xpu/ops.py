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

from vllm_ir_xpu.availability import EXTENSION

__all__ = ["DTYPES", "NAMESPACE", "fused_add_rms_norm", "rms_norm"]

NAMESPACE = "vllm_ir_xpu"

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes the kernels take (``VLLM_DISPATCH_FLOATING_TYPES``); the weight must match."""


def _kernels() -> Any:
    # a dict lookup on the hot path; the import runs once (at registration,
    # through vllm_ir_xpu.availability, on a supported machine)
    if EXTENSION not in sys.modules:
        importlib.import_module(EXTENSION)
    return torch.ops._C


def _check(op: str, x: Tensor, others: dict[str, Tensor]) -> None:
    """Dtype and device checks, valid for FakeTensors (no sizes or strides read)."""
    if x.dtype not in DTYPES:
        raise RuntimeError(
            f"{NAMESPACE}::{op}: x has dtype {x.dtype}; the XPU kernels take "
            f"{', '.join(map(str, DTYPES))}"
        )
    if x.dim() == 0:
        raise RuntimeError(f"{NAMESPACE}::{op}: x must have at least one dimension")
    for name, t in others.items():
        if t.dtype != x.dtype:
            raise RuntimeError(
                f"{NAMESPACE}::{op}: {name} has dtype {t.dtype} but x has dtype {x.dtype}"
            )
        if t.device != x.device:
            raise RuntimeError(f"{NAMESPACE}::{op}: {name} is on {t.device} but x is on {x.device}")


def _rows(t: Tensor) -> Tensor | None:
    """``t`` as a ``(-1, hidden)`` view with unit-stride rows, or ``None`` if that needs a copy."""
    hidden = t.shape[-1]
    if t.stride(-1) != 1 and hidden > 1:
        return None
    try:
        return t.view(-1, hidden)
    except RuntimeError:  # the leading dimensions do not flatten to one stride
        return None


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    """RMSNorm of ``x`` over its last dimension, times ``weight``: a new contiguous tensor."""
    _check("rms_norm", x, {"weight": weight})
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    hidden = x.shape[-1]
    rows = _rows(x)
    if rows is None:
        rows = x.reshape(-1, hidden).contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    _kernels().rms_norm(out.view(-1, hidden), rows, weight, epsilon)
    return out


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    _check("rms_norm", x, {"weight": weight})
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{NAMESPACE}::fused_add_rms_norm", mutates_args=("x", "x_residual"))
def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor, epsilon: float) -> None:
    """In place: ``x_residual += x`` (rounded to the dtype), then ``x = rms_norm(x_residual)``."""
    _check("fused_add_rms_norm", x, {"x_residual": x_residual, "weight": weight})
    if x.shape != x_residual.shape:
        raise RuntimeError(
            f"{NAMESPACE}::fused_add_rms_norm: x has shape {tuple(x.shape)} but x_residual has "
            f"{tuple(x_residual.shape)}; the in-place kernel needs equal shapes"
        )
    if x.numel() == 0:
        return
    if not weight.is_contiguous():
        weight = weight.contiguous()
    hidden = x.shape[-1]
    x_rows = _rows(x)
    if x_rows is not None and x_residual.is_contiguous():
        _kernels().fused_add_rms_norm(x_rows, x_residual.view(-1, hidden), weight, epsilon)
        return
    x_rows = x.contiguous().view(-1, hidden)
    residual_rows = x_residual.contiguous().view(-1, hidden)
    _kernels().fused_add_rms_norm(x_rows, residual_rows, weight, epsilon)
    x.copy_(x_rows.view(x.shape))
    x_residual.copy_(residual_rows.view(x.shape))


@fused_add_rms_norm.register_fake
def _fused_add_rms_norm_fake(x: Tensor, x_residual: Tensor, weight: Tensor, epsilon: float) -> None:
    _check("fused_add_rms_norm", x, {"x_residual": x_residual, "weight": weight})
