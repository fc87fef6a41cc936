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

from vllm_ir_rocm.availability import MODULE

__all__ = ["DTYPES", "NAMESPACE", "fused_add_rms_norm", "rms_norm"]

NAMESPACE = "vllm_ir_rocm"

DTYPES = (torch.float16, torch.bfloat16)
"""The activation dtypes the impls hand to AITER (the weight must match)."""


def _aiter() -> ModuleType:
    # a dict lookup on the hot path; the import runs once (at registration,
    # through vllm_ir_rocm.availability, on a supported machine)
    module = sys.modules.get(MODULE)
    return module if module is not None else importlib.import_module(MODULE)


def _check(op: str, x: Tensor, others: dict[str, Tensor]) -> None:
    """Dtype and device checks, valid for FakeTensors (no sizes or strides read)."""
    if x.dtype not in DTYPES:
        raise RuntimeError(
            f"{NAMESPACE}::{op}: x has dtype {x.dtype}; AITER's RMSNorm takes "
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
    rows = _rows(x)
    if rows is None:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
    if rows.numel() == 0:
        return x.new_empty(x.shape)
    if not weight.is_contiguous():
        weight = weight.contiguous()
    out = _aiter().rmsnorm2d_fwd(rows, weight, epsilon)
    return out.reshape(x.shape).contiguous()


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
    if x.is_contiguous() and x_residual.is_contiguous():
        _aiter().fused_add_rms_norm_cu(
            x.view(-1, hidden), x_residual.view(-1, hidden), weight, epsilon
        )
        return
    x_rows = x.contiguous().view(-1, hidden)
    residual_rows = x_residual.contiguous().view(-1, hidden)
    _aiter().fused_add_rms_norm_cu(x_rows, residual_rows, weight, epsilon)
    x.copy_(x_rows.view(x.shape))
    x_residual.copy_(residual_rows.view(x.shape))


@fused_add_rms_norm.register_fake
def _fused_add_rms_norm_fake(x: Tensor, x_residual: Tensor, weight: Tensor, epsilon: float) -> None:
    _check("fused_add_rms_norm", x, {"x_residual": x_residual, "weight": weight})
