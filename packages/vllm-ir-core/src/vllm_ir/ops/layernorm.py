"""RMSNorm and fused residual-add + RMSNorm, in two numerics.

The native functions are the semantics. ``rms_norm`` and ``fused_add_rms_norm``:
fp32 compute, result cast back to the input dtype, then scaled by the optional
weight; ``variance_size`` computes the variance over the first
``variance_size`` channels only.

``vllm_rms_norm`` and ``vllm_fused_add_rms_norm`` are the numerics of vLLM's
``RMSNorm`` layer, for engines whose tokens must not change: the normalized
fp32 value is cast to the *weight's* dtype and multiplied there, then cast to
the input dtype; the fused form normalizes the fp32 sum ``x + x_residual``
(only the returned residual is rounded to the input dtype). With a weight of
the input's dtype, ``vllm_rms_norm`` equals ``rms_norm`` exactly; for an fp32
input, ``vllm_fused_add_rms_norm`` equals ``fused_add_rms_norm`` exactly.

>>> import torch, vllm_ir as ir
>>> x, r = torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(2, 8, dtype=torch.bfloat16)
>>> w = torch.ones(8, dtype=torch.bfloat16)
>>> torch.equal(ir.ops.vllm_rms_norm(x, w, 1e-6), ir.ops.rms_norm(x, w, 1e-6))
True
>>> out, residual = ir.ops.vllm_fused_add_rms_norm(x, r, w, 1e-6)
>>> torch.equal(residual, x + r)
True
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from vllm_ir._op.op import register_op
from vllm_ir._schema.samples import SampleInput
from vllm_ir._schema.tolerances import NORM_TOLERANCES

__all__ = ["fused_add_rms_norm", "rms_norm", "vllm_fused_add_rms_norm", "vllm_rms_norm"]


@register_op
def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """Weighted root-mean-square layer normalization."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x_var = x if variance_size is None else x[..., :variance_size]
    variance = x_var.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + epsilon)
    x = x.to(orig_dtype)
    if weight is not None:
        x = x * weight
    return x


@register_op(allow_inplace=True)
def fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Residual add, then RMSNorm: returns ``(rms_norm(x + x_residual), x + x_residual)``.

    The sum is rounded to the input dtype before normalization, as a kernel
    that stores the new residual and re-reads it does.
    """
    x_residual = x + x_residual
    return rms_norm.native(x_residual, weight, epsilon, variance_size), x_residual


def _normalize_vllm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None, dtype: torch.dtype
) -> Tensor:
    """vLLM's tail: ``x`` (fp32) normalized, multiplied in the weight's dtype, cast to ``dtype``."""
    x_var = x if variance_size is None else x[..., :variance_size]
    variance = x_var.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + epsilon)
    if weight is not None:
        x = x.to(weight.dtype) * weight
    return x.to(dtype)


@register_op
def vllm_rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """RMSNorm as vLLM computes it: the weight multiplies in its own dtype, then the input's."""
    return _normalize_vllm(x.to(torch.float32), weight, epsilon, variance_size, x.dtype)


@register_op(allow_inplace=True)
def vllm_fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Residual add, then RMSNorm, as vLLM computes them: the fp32 sum is normalized.

    Returns ``(vllm_rms_norm of the fp32 sum, the sum rounded to x's dtype)``.
    """
    total = x.to(torch.float32) + x_residual.to(torch.float32)
    return _normalize_vllm(total, weight, epsilon, variance_size, x.dtype), total.to(x.dtype)


# two ulps of the dtype: the reasoning is in vllm_ir._schema.tolerances
for _op in (rms_norm, fused_add_rms_norm, vllm_rms_norm, vllm_fused_add_rms_norm):
    _op.register_tolerances(NORM_TOLERANCES)


def _hidden(gen: torch.Generator, dtype: torch.dtype, device: torch.device, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


def _weight(gen: torch.Generator, dtype: torch.dtype, device: torch.device, hidden: int) -> Tensor:
    return (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype=dtype, device=device)


_SHAPES = ((1, 64), (7, 96), (16, 1000), (2, 3, 128))
"""One row; odd row count; hidden not a power of two; 3-D input."""

_ODD = (5, 33)
_ODD_NAME = "5x33-odd-hidden"
"""An odd hidden size, no multiple of any vector width: a kernel that assumes one
must decline it in ``supports_args``. Yielded last, so the other samples keep
their values."""


@rms_norm.register_input_generator
def _rms_norm_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    gen = torch.Generator().manual_seed(0)
    for shape in _SHAPES:
        hidden = shape[-1]
        tag = "x".join(map(str, shape))
        yield SampleInput(
            (_hidden(gen, dtype, device, *shape), _weight(gen, dtype, device, hidden), 1e-6), tag
        )
    yield SampleInput((_hidden(gen, dtype, device, 4, 64), None, 1e-5), "4x64-no-weight")
    yield SampleInput(
        (_hidden(gen, dtype, device, 4, 96), _weight(gen, dtype, device, 96), 1e-6, 64),
        "4x96-variance64",
    )
    strided = _hidden(gen, dtype, device, 4, 256)[:, :128]
    yield SampleInput((strided, _weight(gen, dtype, device, 128), 1e-6), "4x128-strided-rows")
    odd = _hidden(gen, dtype, device, *_ODD)
    yield SampleInput((odd, _weight(gen, dtype, device, _ODD[-1]), 1e-6), _ODD_NAME)


@fused_add_rms_norm.register_input_generator
def _fused_add_rms_norm_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    gen = torch.Generator().manual_seed(1)
    for shape in _SHAPES:
        hidden = shape[-1]
        tag = "x".join(map(str, shape))
        yield SampleInput(
            (
                _hidden(gen, dtype, device, *shape),
                _hidden(gen, dtype, device, *shape),
                _weight(gen, dtype, device, hidden),
                1e-6,
            ),
            tag,
        )
    yield SampleInput(
        (_hidden(gen, dtype, device, 4, 64), _hidden(gen, dtype, device, 4, 64), None, 1e-5),
        "4x64-no-weight",
    )
    yield SampleInput(
        (
            _hidden(gen, dtype, device, 4, 96),
            _hidden(gen, dtype, device, 4, 96),
            _weight(gen, dtype, device, 96),
            1e-6,
            64,
        ),
        "4x96-variance64",
    )
    odd = (_hidden(gen, dtype, device, *_ODD), _hidden(gen, dtype, device, *_ODD))
    yield SampleInput((*odd, _weight(gen, dtype, device, _ODD[-1]), 1e-6), _ODD_NAME)


@vllm_rms_norm.register_input_generator
def _vllm_rms_norm_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    yield from _rms_norm_inputs(dtype, device)
    gen = torch.Generator().manual_seed(2)
    # a weight of another dtype: multiplied in its own dtype (kernels decline it)
    other = torch.float32 if dtype != torch.float32 else torch.bfloat16
    yield SampleInput(
        (_hidden(gen, dtype, device, 4, 64), _weight(gen, other, device, 64), 1e-6),
        "4x64-weight-of-another-dtype",
    )


@vllm_fused_add_rms_norm.register_input_generator
def _vllm_fused_add_rms_norm_inputs(
    dtype: torch.dtype, device: torch.device
) -> Iterator[SampleInput]:
    yield from _fused_add_rms_norm_inputs(dtype, device)
    gen = torch.Generator().manual_seed(3)
    other = torch.float32 if dtype != torch.float32 else torch.bfloat16
    x, r = _hidden(gen, dtype, device, 4, 64), _hidden(gen, dtype, device, 4, 64)
    yield SampleInput((x, r, _weight(gen, other, device, 64), 1e-6), "4x64-weight-of-another-dtype")
