"""Kernel launches on real tensors, and the launch configurations.

Two configurations of the norm kernels, both one program per row:

* ``fast`` (provider ``triton``): the whole row in one block when it fits
  (``BLOCK = next_power_of_2(hidden)`` up to :data:`MAX_FUSED_BYTES` of
  input), read once and kept in registers; longer rows loop over blocks of
  that maximum. ``num_warps`` grows with the block.
* ``batch_invariant`` (provider ``triton_batch_invariant``): a fixed block of
  :data:`BATCH_INVARIANT_BLOCK` columns and :data:`BATCH_INVARIANT_WARPS`
  warps whatever the shapes, so the reduction order of a row depends on its
  length alone.

Rows are addressed with a row and a column stride, so any input whose
leading dimensions collapse into one (every contiguous tensor, strided rows,
a slice of the hidden dimension, even a transposed last dimension) is read
in place. Others (e.g. a permuted 3-D view) are copied to contiguous rows,
and for the in-place kernel the results are copied back.

The other kernels (``silu_and_mul``, FP8 quantization) use the fast
configuration (for ``silu_and_mul``, of the output row). Their results do not
depend on it: they are elementwise, or reduce with a maximum, which is exact.
FP8 outputs are new contiguous ``float8_e4m3fn`` tensors, written by the
kernels through a ``uint8`` view (see :mod:`vllm_ir_triton.kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from torch import Tensor
from vllm_ir.ops.activation import check_gated_width

from vllm_ir_triton.direct import Launcher
from vllm_ir_triton.kernels import (
    INTERPRETED,
    dynamic_per_token_fp8_quant_kernel,
    fused_add_rms_norm_kernel,
    gelu_and_mul_kernel,
    rms_norm_kernel,
    rotary_embedding_kernel,
    silu_and_mul_kernel,
    static_scaled_fp8_quant_kernel,
    vllm_fused_add_rms_norm_kernel,
)

__all__ = [
    "BATCH_INVARIANT_BLOCK",
    "BATCH_INVARIANT_WARPS",
    "FP8",
    "MAX_FUSED_BYTES",
    "MIN_SCALE",
    "LaunchConfig",
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm_",
    "fused_add_rms_norm_static_fp8_quant_",
    "launch_config",
    "rms_norm",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding_",
    "static_scaled_fp8_quant",
]

__vllm_ir_caches__ = ("_CONFIGS",)
"""Launch configurations computed on first use: not part of the impls' code fingerprint."""

FP8 = torch.float8_e4m3fn

MIN_SCALE = float(torch.tensor(1.0 / (torch.finfo(FP8).max * 512.0), dtype=torch.float32))
"""The lower bound of a dynamic scale, as float32 (native clamps its float32 scales
with the Python float ``1 / (448 * 512)``, which torch rounds to the tensor's dtype)."""

INV_FP8_MAX = float(torch.tensor(1.0, dtype=torch.float32) / torch.finfo(FP8).max)
"""float32 ``1 / 448``: ATen's CUDA division by a Python scalar multiplies by this
(so native's dynamic scales on CUDA are ``amax * INV_FP8_MAX``)."""

MAX_FUSED_BYTES = 65536
"""The longest row (in bytes of input) read in a single block by the fast configuration."""

BATCH_INVARIANT_BLOCK = 1024
"""Block (columns) of the batch-invariant configuration, as vLLM's batch-invariant RMSNorm."""

BATCH_INVARIANT_WARPS = 4


@dataclass(frozen=True)
class LaunchConfig:
    """How one row is processed: block width, single pass or loop, warps."""

    block: int
    single_pass: bool
    num_warps: int


def launch_config(
    hidden: int, element_size: int, *, batch_invariant: bool, max_block: int | None = None
) -> LaunchConfig:
    """The configuration for rows of ``hidden`` elements of ``element_size`` bytes.

    Depends on the row, never on the number of rows. ``max_block`` caps the
    block (tests use it to exercise the loop on short rows). Computed once
    per argument tuple (the hot path looks it up in a dict).
    """
    key = (hidden, element_size, batch_invariant, max_block)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        cfg = _CONFIGS[key] = _launch_config(hidden, element_size, batch_invariant, max_block)
    return cfg


_CONFIGS: dict[tuple[int, int, bool, int | None], LaunchConfig] = {}


def _launch_config(
    hidden: int, element_size: int, batch_invariant: bool, max_block: int | None
) -> LaunchConfig:
    if batch_invariant:
        block = BATCH_INVARIANT_BLOCK if max_block is None else max_block
        return LaunchConfig(block, hidden <= block, BATCH_INVARIANT_WARPS)
    cap = MAX_FUSED_BYTES // element_size if max_block is None else max_block
    block = min(triton.next_power_of_2(max(hidden, 1)), cap)
    num_warps = min(max(block // 256, 1), 8)
    return LaunchConfig(block, hidden <= block, num_warps)


_rms_norm = Launcher(rms_norm_kernel, interpreted=INTERPRETED)
_fused_add_rms_norm = Launcher(fused_add_rms_norm_kernel, interpreted=INTERPRETED)
_vllm_fused_add_rms_norm = Launcher(vllm_fused_add_rms_norm_kernel, interpreted=INTERPRETED)
_silu_and_mul = Launcher(silu_and_mul_kernel, interpreted=INTERPRETED)
_gelu_and_mul = Launcher(gelu_and_mul_kernel, interpreted=INTERPRETED)
# No FMA contraction: native rounds each product to the dtype before the add; an FMA
# skips that rounding (in float16 LLVM narrows the float32 products and sum to half
# operations, which it then fuses into fma.rn.f16: one ulp off native)
_rotary_embedding = Launcher(
    rotary_embedding_kernel, interpreted=INTERPRETED, options={"enable_fp_fusion": False}
)
_static_scaled_fp8_quant = Launcher(static_scaled_fp8_quant_kernel, interpreted=INTERPRETED)
_dynamic_per_token_fp8_quant = Launcher(dynamic_per_token_fp8_quant_kernel, interpreted=INTERPRETED)
"""One :class:`~vllm_ir_triton.direct.Launcher` per kernel: after a kernel's first call
with given dtypes, alignments, strides and row length, the same call relaunches the
compiled kernel without Triton's per-call binding (:mod:`vllm_ir_triton.direct`)."""


_MAX_COLUMN_OFFSET = 2**31 - 1
"""Column offsets are 32-bit in the kernels (row offsets are 64-bit)."""


def _rows(t: Tensor) -> Tensor | None:
    """A 2-D view (rows, hidden) of ``t`` sharing its memory that the kernels can
    address, or None (then the caller works on a contiguous copy)."""
    if t.dim() == 1:
        rows: Tensor | None = t.unsqueeze(0)
    elif t.dim() == 2:
        rows = t
    else:
        try:
            rows = t.view(-1, t.shape[-1])
        except RuntimeError:  # the leading dimensions do not collapse into one stride
            rows = None
    if rows is not None and (rows.shape[1] - 1) * abs(rows.stride(1)) > _MAX_COLUMN_OFFSET:
        return None
    return rows


def _checked_weight(x: Tensor, weight: Tensor | None, op: str) -> Tensor | None:
    """``weight``, checked to be a 1-D tensor of ``hidden`` elements on ``x``'s device."""
    if weight is None:
        return None
    if weight.device != x.device:
        raise ValueError(f"{op}: weight is on {weight.device} but x is on {x.device}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op}: weight of shape {tuple(weight.shape)} does not match rows of "
            f"{x.shape[-1]} elements"
        )
    return weight


def _checked_scale(x: Tensor, scale: Tensor, op: str, what: str = "scale") -> Tensor:
    """``scale``, checked to be one float32 element on ``x``'s device."""
    if scale.device != x.device or scale.dtype != torch.float32 or scale.numel() != 1:
        raise ValueError(
            f"{op}: {what} must be one float32 element on {x.device}, got "
            f"{scale.dtype} of shape {tuple(scale.shape)} on {scale.device}"
        )
    return scale


def _input_rows(x: Tensor) -> Tensor:
    """``x`` as (rows, hidden) the kernels can address: a view, else a contiguous copy."""
    rows = _rows(x)
    return rows if rows is not None else x.contiguous().view(-1, x.shape[-1])


def _fp8_rows(q: Tensor) -> Tensor:
    """The (rows, hidden) ``uint8`` view of a new contiguous FP8 tensor, as the kernels write it."""
    return q.view(torch.uint8).view(-1, q.shape[-1])


def _launch_on_rows(
    kernel: Launcher,
    rows: Tensor,
    out_rows: Tensor,
    max_block: int | None,
    *args: object,
    single_pass: bool = False,
) -> None:
    """Launch a row kernel, one program per row of ``rows`` writing the same row of
    ``out_rows`` (both 2-D): the kernel takes the two tensors with their strides, then
    ``args``, then the block size (and with ``single_pass``, whether a row fits in one
    block). The configuration is sized for ``out_rows``' rows in ``rows``' dtype."""
    cfg = launch_config(
        out_rows.shape[1], rows.element_size(), batch_invariant=False, max_block=max_block
    )
    kernel(
        rows.shape[0],
        cfg.num_warps,
        rows,
        rows.stride(0),
        rows.stride(1),
        out_rows,
        out_rows.stride(0),
        out_rows.stride(1),
        *args,
        cfg.block,
        *((cfg.single_pass,) if single_pass else ()),
    )


def _launch_norm(
    kernel: Launcher,
    inputs: tuple[Tensor, ...],
    weight: Tensor | None,
    out_rows: Tensor,
    scale: Tensor | None,
    epsilon: float,
    batch_invariant: bool,
    max_block: int | None,
) -> None:
    """Launch a norm kernel, one program per row: it takes the 2-D ``inputs`` (``x``, and
    for the fused kernel the residual) with their strides, the weight, ``out_rows`` (the
    result; FP8 bits with ``scale``), the scale, the row length, ``epsilon``, then its
    flags. An absent weight or scale is a placeholder pointer the kernel never reads."""
    rows = inputs[0]
    hidden = rows.shape[1]
    cfg = launch_config(
        hidden, rows.element_size(), batch_invariant=batch_invariant, max_block=max_block
    )
    kernel(
        rows.shape[0],
        cfg.num_warps,
        *(arg for t in inputs for arg in (t, t.stride(0), t.stride(1))),
        weight if weight is not None else rows,
        weight.stride(0) if weight is not None else 0,
        out_rows,
        out_rows.stride(0),
        out_rows.stride(1),
        scale if scale is not None else rows,
        hidden,
        epsilon,
        weight is not None,
        scale is not None,
        cfg.block,
        cfg.single_pass,
    )


def rms_norm(
    x: Tensor,
    weight: Tensor | None,
    epsilon: float,
    *,
    scale: Tensor | None = None,
    batch_invariant: bool = False,
    max_block: int | None = None,
) -> Tensor:
    """RMSNorm of ``x`` into a new contiguous tensor of ``x``'s dtype.

    With ``scale``: that result quantized to a new ``float8_e4m3fn`` tensor
    (``rms_norm_static_fp8_quant``).
    """
    quant = scale is not None
    out = torch.empty(x.shape, dtype=FP8 if quant else x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    hidden = x.shape[-1]
    weight = _checked_weight(x, weight, "rms_norm")
    if scale is not None:
        scale = _checked_scale(x, scale, "rms_norm_static_fp8_quant")
    out_rows = _fp8_rows(out) if quant else out.view(-1, hidden)
    _launch_norm(
        _rms_norm, (_input_rows(x),), weight, out_rows, scale, epsilon, batch_invariant, max_block
    )
    return out


def fused_add_rms_norm_(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    *,
    batch_invariant: bool = False,
    max_block: int | None = None,
    vllm: bool = False,
) -> None:
    """In place: ``x_residual += x`` (rounded to the dtype), then ``x = rms_norm(x_residual)``.

    ``x`` and ``x_residual`` must have the same shape (the caller checks). With
    ``vllm``, vLLM's numerics (``vllm_fused_add_rms_norm``): ``x`` gets the RMSNorm of
    the float32 sum, not of the rounded one.
    """
    _fused_add(x, x_residual, weight, epsilon, None, batch_invariant, max_block, vllm=vllm)


def fused_add_rms_norm_static_fp8_quant_(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    scale: Tensor,
    *,
    batch_invariant: bool = False,
    max_block: int | None = None,
) -> Tensor:
    """``x_residual += x`` (rounded, in place), then ``rms_norm(x_residual)`` quantized with
    ``scale`` into a new ``float8_e4m3fn`` tensor, which is returned; ``x`` is only read."""
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    _fused_add(x, x_residual, weight, epsilon, q, batch_invariant, max_block, scale)
    return q


def _fused_add(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    q: Tensor | None,
    batch_invariant: bool,
    max_block: int | None,
    scale: Tensor | None = None,
    vllm: bool = False,
) -> None:
    op = "fused_add_rms_norm_" if q is None else "fused_add_rms_norm_static_fp8_quant_"
    op = f"vllm_{op}" if vllm else op
    if x_residual.shape != x.shape or x_residual.device != x.device:
        raise ValueError(
            f"{op}: x_residual {tuple(x_residual.shape)} on {x_residual.device} "
            f"must have the shape and device of x {tuple(x.shape)} on {x.device}"
        )
    if scale is not None:
        scale = _checked_scale(x, scale, op)
    if x.numel() == 0:
        return
    hidden = x.shape[-1]
    weight = _checked_weight(x, weight, op)
    x_rows, r_rows = _rows(x), _rows(x_residual)
    copy_back = x_rows is None or r_rows is None
    if x_rows is None or r_rows is None:
        x_rows = x.contiguous().view(-1, hidden)
        r_rows = x_residual.contiguous().view(-1, hidden)
    q_rows = _fp8_rows(q) if q is not None else x_rows
    _launch_norm(
        _vllm_fused_add_rms_norm if vllm else _fused_add_rms_norm,
        (x_rows, r_rows),
        weight,
        q_rows,
        scale,
        epsilon,
        batch_invariant,
        max_block,
    )
    if copy_back:
        if q is None:
            x.copy_(x_rows.view(x.shape))
        x_residual.copy_(r_rows.view(x_residual.shape))


def silu_and_mul(x: Tensor, *, max_block: int | None = None) -> Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` into a new contiguous tensor; the last
    dimension of ``x`` must be even (``2 * d``)."""
    return _act_and_mul("silu_and_mul", _silu_and_mul, x, (), max_block)


def gelu_and_mul(x: Tensor, approximate: str, *, max_block: int | None = None) -> Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` into a new contiguous tensor."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _act_and_mul("gelu_and_mul", _gelu_and_mul, x, (approximate == "tanh",), max_block)


def _act_and_mul(
    op: str, kernel: Launcher, x: Tensor, options: tuple[bool, ...], max_block: int | None
) -> Tensor:
    """A gated activation's launch: ``x`` (``(..., 2 * d)``) into a new ``(..., d)`` tensor;
    ``options`` are the kernel's arguments between ``d`` and the block size."""
    check_gated_width(op, x)  # the op's own error for an odd width
    d = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    _launch_on_rows(kernel, _input_rows(x), out.view(-1, d), max_block, d, *options)
    return out


def _rotate_(x: Tensor, cos: Tensor, sin: Tensor, is_neox: bool, max_block: int | None) -> None:
    """RoPE of ``x`` (``(..., heads, head_size)``) in place, cos/sin ``(..., rotary_dim)``."""
    heads, head_size = x.shape[-2], x.shape[-1]
    rot = cos.shape[-1]
    if rot % 2 or rot > head_size or sin.shape != cos.shape:
        raise ValueError(
            f"rotary_embedding: cos and sin must share a shape whose last dim (rotary_dim, "
            f"got {rot}) is even and at most head_size {head_size}"
        )
    if x.numel() == 0:
        return
    try:
        rows = x.view(-1, heads, head_size)
    except RuntimeError:  # leading dims that do not collapse: a copy, written back
        rows = None
    if rows is None or (head_size > 1 and rows.stride(2) != 1):
        work = x.contiguous()
        _rotate_(work, cos, sin, is_neox, max_block)
        x.copy_(work)
        return
    # cos/sin broadcast over the heads and size-1 token dims, as native does
    tokens_shape = (*x.shape[:-2], rot)
    c = cos.expand(tokens_shape).reshape(-1, rot).contiguous()
    s = sin.expand(tokens_shape).reshape(-1, rot).contiguous()
    half = rot // 2
    cfg = launch_config(half, x.element_size(), batch_invariant=False, max_block=max_block)
    _rotary_embedding(
        rows.shape[0] * heads,
        cfg.num_warps,
        rows,
        rows.stride(0),
        rows.stride(1),
        c,
        s,
        c.stride(0),
        heads,
        half,
        is_neox,
        cfg.block,
    )


def rotary_embedding_(
    query: Tensor,
    key: Tensor,
    cos: Tensor,
    sin: Tensor,
    is_neox: bool,
    *,
    max_block: int | None = None,
) -> None:
    """RoPE of ``query`` and ``key`` in place (the channels past ``rotary_dim`` untouched)."""
    for t in (key, cos, sin):
        if t.device != query.device:
            raise ValueError(f"rotary_embedding: tensors on {t.device} and {query.device}")
    _rotate_(query, cos, sin, is_neox, max_block)
    _rotate_(key, cos, sin, is_neox, max_block)


def static_scaled_fp8_quant(x: Tensor, scale: Tensor, *, max_block: int | None = None) -> Tensor:
    """``x / scale`` clamped to the FP8 range, into a new ``float8_e4m3fn`` tensor."""
    scale = _checked_scale(x, scale, "static_scaled_fp8_quant")
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    if q.numel() == 0:
        return q
    _launch_on_rows(
        _static_scaled_fp8_quant, _input_rows(x), _fp8_rows(q), max_block, scale, x.shape[-1]
    )
    return q


def dynamic_per_token_fp8_quant(
    x: Tensor,
    scale_ub: Tensor | None,
    *,
    max_block: int | None = None,
    reciprocal_scale: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Each row quantized with its own scale ``max(min(amax, scale_ub) / 448, MIN_SCALE)``.

    ``amax / 448`` is computed as native does on ``x``'s device (CUDA: times
    :data:`INV_FP8_MAX`); ``reciprocal_scale`` overrides that (tests).

    Returns ``(q, scales)``: a new ``float8_e4m3fn`` tensor of ``x``'s shape and
    the float32 scales of shape ``(..., 1)``. Rows must not be empty.
    """
    hidden = x.shape[-1]
    if hidden == 0:
        raise ValueError("dynamic_per_token_fp8_quant: rows of no elements have no amax")
    if scale_ub is not None:
        scale_ub = _checked_scale(x, scale_ub, "dynamic_per_token_fp8_quant", "scale_ub")
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if q.numel() == 0:
        return q, scales
    _launch_on_rows(
        _dynamic_per_token_fp8_quant,
        _input_rows(x),
        _fp8_rows(q),
        max_block,
        scales,
        scale_ub if scale_ub is not None else scales,
        hidden,
        MIN_SCALE,
        INV_FP8_MAX,
        scale_ub is not None,
        (x.device.type == "cuda" if reciprocal_scale is None else reciprocal_scale),
        single_pass=True,
    )
    return q, scales
