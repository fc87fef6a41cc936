"""The Triton kernels, one program per row: RMSNorm and fused residual-add + RMSNorm
(each optionally followed by static FP8 quantization), ``silu_and_mul``, and static
and dynamic per-token FP8 quantization.

The norms follow the native semantics of ``vllm_ir.ops.layernorm`` exactly:

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

FP8 (``float8_e4m3fn``) quantization follows ``vllm_ir.ops.quant``: ``x / scale``
in float32 (IEEE division, :func:`triton.language.math.div_rn`: Triton's ``/``
is an approximate division on NVIDIA GPUs), clamped to +-448, rounded to
nearest even. The rounding is done by :func:`_fp8_bits` with integer
arithmetic, exactly as torch's ``c10::Float8_e4m3fn`` does, and the kernels
store the bit pattern through a ``uint8`` view of the output: Triton's
interpreter converts float32 to ``fp8e4nv`` wrongly (ties away from zero; a
mantissa carry into an odd exponent halves the value: 31.5 becomes 16;
magnitudes from 480 wrap instead of becoming NaN: 1e4 becomes 320; NaN
becomes 384; subnormal results are truncated), and a ``uint8`` store needs
no FP8 support from the GPU backend.
The fused norm + quant kernels quantize exactly the value the plain norm
kernels store (rounded to the input dtype, times the weight, rounded again).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "FP8_MAX",
    "INTERPRETED",
    "dynamic_per_token_fp8_quant_kernel",
    "fused_add_rms_norm_kernel",
    "vllm_fused_add_rms_norm_kernel",
    "gelu_and_mul_kernel",
    "rms_norm_kernel",
    "rotary_embedding_kernel",
    "silu_and_mul_kernel",
    "static_scaled_fp8_quant_kernel",
]

FP8_MAX = tl.constexpr(448.0)
"""The largest finite ``float8_e4m3fn``; quantized values are clamped to +-FP8_MAX."""


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
def _fp8_bits(value, scale):
    """float32 ``value / scale`` -> ``float8_e4m3fn`` bits (uint8), as torch quantizes.

    IEEE division, clamp to +-448 (NaN stays NaN), then torch's
    ``fp8e4m3fn_from_fp32_value``: round to nearest even with integer
    arithmetic for normals, through a float32 addition of 2**14 (whose ulp is
    the FP8 subnormal step 2**-9) for magnitudes below 2**-6, and 0x7F (NaN)
    for NaN and magnitudes of 480 and more.
    """
    v = tl.math.div_rn(value, scale)
    v = tl.where(v > FP8_MAX, FP8_MAX, tl.where(v < -FP8_MAX, -FP8_MAX, v))
    bits = v.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # rebias the exponent (127 -> 7, i.e. minus 120 << 23), round the 20 dropped bits
    normal = (mag - 0x3C000000 + 0x7FFFF + ((mag >> 20) & 1)) >> 20
    # below 2**-6 (121 << 23): v + 2**14 rounds v to a multiple of 2**-9; 141 << 23 is 2**14
    tiny = (mag.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True) - 0x46800000
    small = tl.where(mag < 0x3C800000, tiny, normal)
    out = tl.where(mag >= 0x43F00000, 0x7F, small)  # 0x43F00000 is 480.0 (1087 << 20)
    return (out | sign).to(tl.uint8)


@triton.jit
def _scaled(normed, w_ptr, w_stride, cols, mask, HAS_WEIGHT: tl.constexpr, dtype: tl.constexpr):
    """``normed`` (float32) rounded to dtype, then times the weight, rounded again."""
    out = _round_to(normed, dtype)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0)
        out = _round_to(out.to(tl.float32) * w.to(tl.float32), dtype)
    return out


@triton.jit
def _rstd(sum_of_squares, n_cols, epsilon):
    """``1 / sqrt(mean(x * x) + epsilon)`` of a row, from its sum of squares."""
    return tl.rsqrt(sum_of_squares / n_cols + epsilon)


@triton.jit
def _load_f32(row_ptr, c, col_stride, mask):
    """The columns ``c`` of a row, in float32 (zeros where masked off)."""
    return tl.load(row_ptr + c * col_stride, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _add_residual(x_row, x_col_stride, r_row, r_col_stride, c, mask, dtype: tl.constexpr):
    """``r = x + r`` rounded to dtype, stored; returns the sum in float32."""
    x = _load_f32(x_row, c, x_col_stride, mask)
    r = _load_f32(r_row, c, r_col_stride, mask)
    total = _round_to(x + r, dtype)
    tl.store(r_row + c * r_col_stride, total, mask=mask)
    return total.to(tl.float32)


@triton.jit
def _row_values(
    x_row, x_col_stride, src_row, src_col_stride, c, mask, ADD: tl.constexpr, dtype: tl.constexpr
):
    """The row's columns ``c`` in float32: ``src``'s, or with ``ADD`` the rounded
    ``x + src``, which is stored into ``src`` (the residual) first."""
    if ADD:
        return _add_residual(x_row, x_col_stride, src_row, src_col_stride, c, mask, dtype)
    return _load_f32(src_row, c, src_col_stride, mask)


@triton.jit
def _normalize_row(
    x_row,
    x_col_stride,
    src_row,
    src_col_stride,
    w_ptr,
    w_stride,
    scale_ptr,
    dst_row,
    dst_col_stride,
    n_cols,
    epsilon,
    dtype: tl.constexpr,
    ADD: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """One row of ``rms_norm`` of ``src`` (times the weight) into ``dst``; with ``ADD``,
    ``src = x + src`` (rounded) first (:func:`_row_values`). With ``QUANT`` ``dst``
    receives the FP8 bits of the result under the scale at ``scale_ptr``.

    ``SINGLE_PASS``: the row fits in one ``BLOCK`` and stays in registers; otherwise
    a pass sums the squares and a second pass reads the row (``src``) again."""
    cols = tl.arange(0, BLOCK)
    if SINGLE_PASS:
        mask = cols < n_cols
        x = _row_values(x_row, x_col_stride, src_row, src_col_stride, cols, mask, ADD, dtype)
        rstd = _rstd(tl.sum(x * x, axis=0), n_cols, epsilon)
        out = _scaled(x * rstd, w_ptr, w_stride, cols, mask, HAS_WEIGHT, dtype)
        if QUANT:
            out = _fp8_bits(out.to(tl.float32), tl.load(scale_ptr))
        tl.store(dst_row + cols * dst_col_stride, out, mask=mask)
    else:
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = _row_values(x_row, x_col_stride, src_row, src_col_stride, c, mask, ADD, dtype)
            squares += x * x
        rstd = _rstd(tl.sum(squares, axis=0), n_cols, epsilon)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = _load_f32(src_row, c, src_col_stride, mask)
            out = _scaled(x * rstd, w_ptr, w_stride, c, mask, HAS_WEIGHT, dtype)
            if QUANT:
                out = _fp8_bits(out.to(tl.float32), tl.load(scale_ptr))
            tl.store(dst_row + c * dst_col_stride, out, mask=mask)


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
    scale_ptr,
    n_cols,
    epsilon,
    HAS_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """``out[row] = rms_norm(x[row]) * weight`` for the row of this program.

    With ``QUANT``, ``out`` is the uint8 view of a ``float8_e4m3fn`` tensor and
    receives that value quantized with the scale at ``scale_ptr``.
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    _normalize_row(
        x_row,
        x_col_stride,
        x_row,
        x_col_stride,
        w_ptr,
        w_stride,
        scale_ptr,
        out_ptr + row * out_row_stride,
        out_col_stride,
        n_cols,
        epsilon,
        x_ptr.dtype.element_ty,
        False,
        HAS_WEIGHT,
        QUANT,
        BLOCK,
        SINGLE_PASS,
    )


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
    q_ptr,
    q_row_stride,
    q_col_stride,
    scale_ptr,
    n_cols,
    epsilon,
    HAS_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """In place: ``r[row] = x[row] + r[row]`` (rounded), then ``x[row] = rms_norm(r[row])``.

    With ``QUANT``, ``x`` is only read: the normalized row is quantized with
    the scale at ``scale_ptr`` into ``q`` (the uint8 view of a
    ``float8_e4m3fn`` tensor).
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    if QUANT:
        dst_row = q_ptr + row * q_row_stride
        dst_col_stride = q_col_stride
    else:
        dst_row = x_row
        dst_col_stride = x_col_stride
    _normalize_row(
        x_row,
        x_col_stride,
        r_ptr + row * r_row_stride,
        r_col_stride,
        w_ptr,
        w_stride,
        scale_ptr,
        dst_row,
        dst_col_stride,
        n_cols,
        epsilon,
        x_ptr.dtype.element_ty,
        True,
        HAS_WEIGHT,
        QUANT,
        BLOCK,
        SINGLE_PASS,
    )


@triton.jit
def vllm_fused_add_rms_norm_kernel(
    x_ptr,
    x_row_stride,
    x_col_stride,
    r_ptr,
    r_row_stride,
    r_col_stride,
    w_ptr,
    w_stride,
    q_ptr,
    q_row_stride,
    q_col_stride,
    scale_ptr,
    n_cols,
    epsilon,
    HAS_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """In place, vLLM's numerics: ``r[row] = x[row] + r[row]`` (rounded), ``x[row]`` = the
    RMSNorm of the float32 sum. The arguments are ``fused_add_rms_norm_kernel``'s
    (``q_ptr``, ``scale_ptr`` and ``QUANT`` unused). Over two passes the second reads
    ``x`` and ``r`` again before it writes either column: the float32 sum is recomputed,
    never re-read rounded."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    r_row = r_ptr + row * r_row_stride
    dtype = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    if SINGLE_PASS:
        mask = cols < n_cols
        total = _load_f32(x_row, cols, x_col_stride, mask) + _load_f32(
            r_row, cols, r_col_stride, mask
        )
        tl.store(r_row + cols * r_col_stride, _round_to(total, dtype), mask=mask)
        rstd = _rstd(tl.sum(total * total, axis=0), n_cols, epsilon)
        out = _scaled(total * rstd, w_ptr, w_stride, cols, mask, HAS_WEIGHT, dtype)
        tl.store(x_row + cols * x_col_stride, out, mask=mask)
    else:
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            total = _load_f32(x_row, c, x_col_stride, mask) + _load_f32(
                r_row, c, r_col_stride, mask
            )
            squares += total * total
        rstd = _rstd(tl.sum(squares, axis=0), n_cols, epsilon)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            total = _load_f32(x_row, c, x_col_stride, mask) + _load_f32(
                r_row, c, r_col_stride, mask
            )
            tl.store(r_row + c * r_col_stride, _round_to(total, dtype), mask=mask)
            out = _scaled(total * rstd, w_ptr, w_stride, c, mask, HAS_WEIGHT, dtype)
            tl.store(x_row + c * x_col_stride, out, mask=mask)


SILU: tl.constexpr = tl.constexpr(0)
GELU: tl.constexpr = tl.constexpr(1)
GELU_TANH: tl.constexpr = tl.constexpr(2)


@triton.jit
def _activation(gate, ACT: tl.constexpr):
    """``ACT`` (:data:`SILU`, :data:`GELU`, :data:`GELU_TANH`) of float32 ``gate``, by torch's
    formulas in float32 (see the kernels)."""
    if ACT == SILU:
        return tl.math.div_rn(gate, 1.0 + tl.exp(-gate))
    if ACT == GELU_TANH:
        inner = 0.7978845608028654 * (gate + 0.044715 * (gate * gate * gate))
        tanh = 1.0 - tl.math.div_rn(2.0, tl.exp(2.0 * inner) + 1.0)
        return 0.5 * gate * (1.0 + tanh)
    return gate * 0.5 * (1.0 + tl.math.erf(gate * 0.7071067811865476))


@triton.jit
def _act_and_mul_row(
    x_ptr,
    x_row_stride,
    x_col_stride,
    out_ptr,
    out_row_stride,
    out_col_stride,
    d,
    ACT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``out[row] = act(x[row, :d]) * x[row, d:]`` for the row of this program: the
    activation rounded to the dtype, then the product rounded again, as torch does."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    out_row = out_ptr + row * out_row_stride
    dtype = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    for start in range(0, d, BLOCK):
        c = start + cols
        mask = c < d
        gate = _load_f32(x_row, c, x_col_stride, mask)
        up = _load_f32(x_row, c + d, x_col_stride, mask)
        act = _round_to(_activation(gate, ACT), dtype)
        out = _round_to(act.to(tl.float32) * up, dtype)
        tl.store(out_row + c * out_col_stride, out, mask=mask)


@triton.jit
def silu_and_mul_kernel(
    x_ptr,
    x_row_stride,
    x_col_stride,
    out_ptr,
    out_row_stride,
    out_col_stride,
    d,
    BLOCK: tl.constexpr,
):
    """``out[row] = silu(x[row, :d]) * x[row, d:]``, each rounded to the dtype as torch does.

    ``silu(g) = g / (1 + exp(-g))`` in float32 (torch's formula), rounded to
    the dtype; the product of the two dtype values is rounded again.
    """
    _act_and_mul_row(
        x_ptr, x_row_stride, x_col_stride, out_ptr, out_row_stride, out_col_stride, d, SILU, BLOCK
    )


@triton.jit
def gelu_and_mul_kernel(
    x_ptr,
    x_row_stride,
    x_col_stride,
    out_ptr,
    out_row_stride,
    out_col_stride,
    d,
    TANH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``out[row] = gelu(x[row, :d]) * x[row, d:]``, rounded to the dtype as torch does.

    torch's formulas in float32: ``g * 0.5 * (1 + erf(g / sqrt(2)))``, or with
    ``TANH`` ``0.5 * g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 * g^3)))``, with
    ``tanh(y) = 1 - 2 / (exp(2y) + 1)`` (saturating; an fp32 ulp or so from
    libm's, within the op's tolerance); the GELU rounded to the dtype, then the
    product rounded again.
    """
    act: tl.constexpr = GELU_TANH if TANH else GELU
    _act_and_mul_row(
        x_ptr, x_row_stride, x_col_stride, out_ptr, out_row_stride, out_col_stride, d, act, BLOCK
    )


@triton.jit
def rotary_embedding_kernel(
    x_ptr,
    x_token_stride,
    x_head_stride,
    cos_ptr,
    sin_ptr,
    cs_token_stride,
    heads,
    half,
    IS_NEOX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """RoPE of one (token, head) row of ``x`` in place, on its first ``2 * half`` channels.

    neox pairs channel ``i`` with ``i + half``, GPT-J ``2i`` with ``2i + 1``:
    ``a' = round(round(a * cos_a) - round(b * sin_a))``, ``b' = round(round(b *
    cos_b) + round(a * sin_b))``, as native's separate multiplies and adds round.
    Launch it with ``enable_fp_fusion=False`` (:mod:`vllm_ir_triton.launch` does):
    with fusion on, a product and the add become one FMA, which skips the
    product's rounding. The float16 casts below do not prevent that: LLVM
    narrows ``fp16(fp32(a) * fp32(c))`` and the float32 sum of two rounded
    products into half multiplies and a half add (exact rewrites), then fuses
    one multiply and the add into ``fma.rn.f16``: one ulp off native. The last
    dimension is contiguous; cos and sin are ``(tokens, 2 * half)`` rows.
    """
    pid = tl.program_id(0).to(tl.int64)
    token = pid // heads
    head = pid % heads
    x_row = x_ptr + token * x_token_stride + head * x_head_stride
    cos_row = cos_ptr + token * cs_token_stride
    sin_row = sin_ptr + token * cs_token_stride
    dtype = x_ptr.dtype.element_ty
    i = tl.arange(0, BLOCK)
    for start in range(0, half, BLOCK):
        j = start + i
        mask = j < half
        if IS_NEOX:
            ia = j
            ib = j + half
        else:
            ia = 2 * j
            ib = 2 * j + 1
        a = tl.load(x_row + ia, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x_row + ib, mask=mask, other=0.0).to(tl.float32)
        ca = tl.load(cos_row + ia, mask=mask, other=0.0).to(tl.float32)
        cb = tl.load(cos_row + ib, mask=mask, other=0.0).to(tl.float32)
        sa = tl.load(sin_row + ia, mask=mask, other=0.0).to(tl.float32)
        sb = tl.load(sin_row + ib, mask=mask, other=0.0).to(tl.float32)
        a_cos = _round_to(a * ca, dtype).to(tl.float32)
        b_sin = _round_to(b * sa, dtype).to(tl.float32)
        b_cos = _round_to(b * cb, dtype).to(tl.float32)
        a_sin = _round_to(a * sb, dtype).to(tl.float32)
        tl.store(x_row + ia, _round_to(a_cos - b_sin, dtype), mask=mask)
        tl.store(x_row + ib, _round_to(b_cos + a_sin, dtype), mask=mask)


@triton.jit
def static_scaled_fp8_quant_kernel(
    x_ptr,
    x_row_stride,
    x_col_stride,
    q_ptr,
    q_row_stride,
    q_col_stride,
    scale_ptr,
    n_cols,
    BLOCK: tl.constexpr,
):
    """``q[row] = fp8(clamp(x[row] / scale))``; ``q`` is the uint8 view of the FP8 output."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    q_row = q_ptr + row * q_row_stride
    scale = tl.load(scale_ptr)
    cols = tl.arange(0, BLOCK)
    for start in range(0, n_cols, BLOCK):
        c = start + cols
        mask = c < n_cols
        x = tl.load(x_row + c * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        tl.store(q_row + c * q_col_stride, _fp8_bits(x, scale), mask=mask)


@triton.jit
def dynamic_per_token_fp8_quant_kernel(
    x_ptr,
    x_row_stride,
    x_col_stride,
    q_ptr,
    q_row_stride,
    q_col_stride,
    scales_ptr,
    ub_ptr,
    n_cols,
    min_scale,
    inv_fp8_max,
    HAS_UB: tl.constexpr,
    RECIPROCAL_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """Per row: ``scale = max(min(amax, ub) / 448, min_scale)`` into ``scales[row]``,
    then ``q[row] = fp8(clamp(x[row] / scale))``.

    As torch: a NaN in the row (or a NaN ``ub``) makes the scale NaN. The
    maximum is exact, so the result does not depend on the block size.
    ``amax / 448`` is computed as native computes it on the tensors' device
    (``vllm_ir.kits.quant.FP8_DYNAMIC_SCALE``): with ``RECIPROCAL_SCALE`` (CUDA)
    as ``amax * inv_fp8_max``, the float32 reciprocal ATen multiplies by, else
    with IEEE division (CPU, i.e. the interpreter).
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    q_row = q_ptr + row * q_row_stride
    cols = tl.arange(0, BLOCK)
    if SINGLE_PASS:
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
        nans = tl.max((x != x).to(tl.int32), axis=0)
    else:
        running = tl.zeros([BLOCK], dtype=tl.float32)
        seen_nan = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            running = tl.maximum(running, tl.abs(x))
            seen_nan = tl.maximum(seen_nan, (x != x).to(tl.int32))
        amax = tl.max(running, axis=0)
        nans = tl.max(seen_nan, axis=0)
    # GPU max reductions drop NaN (maxnum); torch's amax propagates it
    amax = tl.where(nans > 0, float("nan"), amax)
    if HAS_UB:
        ub = tl.load(ub_ptr)
        amax = tl.where((amax > ub) | (ub != ub), ub, amax)
    if RECIPROCAL_SCALE:  # noqa: SIM108 (a constexpr branch, resolved at compile time)
        scale = amax * inv_fp8_max
    else:
        scale = tl.math.div_rn(amax, FP8_MAX)
    scale = tl.where(scale < min_scale, min_scale, scale)
    tl.store(scales_ptr + row, scale)
    if SINGLE_PASS:
        tl.store(q_row + cols * q_col_stride, _fp8_bits(x, scale), mask=mask)
    else:
        for start in range(0, n_cols, BLOCK):
            c = start + cols
            mask = c < n_cols
            x = tl.load(x_row + c * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_row + c * q_col_stride, _fp8_bits(x, scale), mask=mask)


def _is_interpreted(kernel: object) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every Triton 3 has it
        return False
    return isinstance(kernel, InterpretedFunction)


INTERPRETED: bool = _is_interpreted(rms_norm_kernel)
"""The kernels were decorated under ``TRITON_INTERPRET=1``: they run on CPU tensors."""
