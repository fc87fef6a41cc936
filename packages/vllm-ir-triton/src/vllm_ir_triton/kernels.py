"""The Triton kernels: RMSNorm and fused residual-add + RMSNorm, one program per row.

Both follow the native semantics of ``vllm_ir.ops.layernorm`` exactly:

* the sum of squares is accumulated in float32 and divided by the row length
  (``mean``), then ``rsqrt(variance + epsilon)``;
* the normalized value is rounded to the input dtype *before* it is
  multiplied by the weight, and that product is rounded again;
* the fused kernel rounds ``x + x_residual`` to the input dtype, stores it,
  and normalizes the rounded sum.

Every rounding to a 16-bit type is round-to-nearest-even, done by
:func:`_round_to`: float16 with Triton's cast, bfloat16 with the same integer
rounding torch uses (``c10::BFloat16``'s ``round_to_nearest_even``). On a GPU
that equals the hardware's ``cvt.rn``; Triton's interpreter, however,
*truncates* float32 to bfloat16 in its cast, which would make interpreted
results differ from the GPU's and from torch's by one ulp. Products and sums
of 16-bit values are computed in float32 and rounded once, which is exact
for products (11- or 8-bit significands) and what torch does for sums.

A row is read in blocks of ``BLOCK`` columns. When the row fits one block
(``SINGLE_PASS``), it is loaded once and kept in registers; otherwise a first
loop accumulates the squares block by block (per lane, then one ``tl.sum``),
and a second loop re-reads the row and writes the result. In the fused kernel
the second loop re-reads the sum the first loop stored: each element is
stored and loaded by the same lane (same block layout), so it sees its own
write.

The reduction order is a function of ``BLOCK``, ``num_warps`` and the row
length alone, never of the number of rows: each program owns one row.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "fused_add_rms_norm_kernel", "rms_norm_kernel"]


@triton.jit
def _round_to(value, dtype: tl.constexpr):
    """float32 -> dtype, rounding to nearest even."""
    if dtype == tl.bfloat16:
        bits = value.to(tl.uint32, bitcast=True)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
        nan = tl.full(value.shape, 0x7FC0, tl.uint32)
        bits16 = tl.where(value != value, nan, rounded).to(tl.uint16)
        return bits16.to(tl.bfloat16, bitcast=True)
    elif dtype == tl.float32:
        return value
    else:
        return value.to(dtype)


@triton.jit
def _scaled(normed, w_ptr, w_stride, cols, mask, HAS_WEIGHT: tl.constexpr, dtype: tl.constexpr):
    """``normed`` (float32) rounded to dtype, then times the weight, rounded again."""
    out = _round_to(normed, dtype)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0)
        out = _round_to(out.to(tl.float32) * w.to(tl.float32), dtype)
    return out


@triton.jit
def rms_norm_kernel(
    x_ptr,
    x_row_stride,
    x_col_stride,
    w_ptr,
    w_stride,
    out_ptr,
    out_row_stride,
    out_col_stride,
    n_cols,
    epsilon,
    HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """``out[row] = rms_norm(x[row]) * weight`` for the row of this program."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    dtype = out_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    if SINGLE_PASS:
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + epsilon)
        out = _scaled(x * rstd, w_ptr, w_stride, cols, mask, HAS_WEIGHT, dtype)
        tl.store(out_row + cols * out_col_stride, out, mask=mask)
    else:
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            squares += x * x
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / n_cols + epsilon)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            out = _scaled(x * rstd, w_ptr, w_stride, c, mask, HAS_WEIGHT, dtype)
            tl.store(out_row + c * out_col_stride, out, mask=mask)


@triton.jit
def fused_add_rms_norm_kernel(
    x_ptr,
    x_row_stride,
    x_col_stride,
    r_ptr,
    r_row_stride,
    r_col_stride,
    w_ptr,
    w_stride,
    n_cols,
    epsilon,
    HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """In place: ``r[row] = x[row] + r[row]`` (rounded), then ``x[row] = rms_norm(r[row])``."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    r_row = r_ptr + row * r_row_stride
    dtype = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    if SINGLE_PASS:
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + cols * r_col_stride, mask=mask, other=0.0).to(tl.float32)
        total = _round_to(x + r, dtype)
        tl.store(r_row + cols * r_col_stride, total, mask=mask)
        s = total.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(s * s, axis=0) / n_cols + epsilon)
        out = _scaled(s * rstd, w_ptr, w_stride, cols, mask, HAS_WEIGHT, dtype)
        tl.store(x_row + cols * x_col_stride, out, mask=mask)
    else:
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(r_row + c * r_col_stride, mask=mask, other=0.0).to(tl.float32)
            total = _round_to(x + r, dtype)
            tl.store(r_row + c * r_col_stride, total, mask=mask)
            s = total.to(tl.float32)
            squares += s * s
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / n_cols + epsilon)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            s = tl.load(r_row + c * r_col_stride, mask=mask, other=0.0).to(tl.float32)
            out = _scaled(s * rstd, w_ptr, w_stride, c, mask, HAS_WEIGHT, dtype)
            tl.store(x_row + c * x_col_stride, out, mask=mask)


def _is_interpreted(kernel: object) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every Triton 3 has it
        return False
    return isinstance(kernel, InterpretedFunction)


INTERPRETED: bool = _is_interpreted(rms_norm_kernel)
"""The kernels were decorated under ``TRITON_INTERPRET=1``: they run on CPU tensors."""
