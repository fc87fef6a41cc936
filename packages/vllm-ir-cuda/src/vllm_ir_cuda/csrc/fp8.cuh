// FP8 (float8_e4m3fn) quantization as the native functions do it:
// `(float(x) / scale).clamp(-448, 448).to(float8_e4m3fn)`.
//
// The rounding is torch's own (c10::Float8_e4m3fn's fp8e4m3fn_from_fp32_value)
// in integer arithmetic: round to nearest even, NaN (0x7F) from 480 up, so the
// bits equal torch's on every GPU, including sm_80, which has no FP8
// conversion instruction.

#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace vllm_ir_cuda {

constexpr float kFp8Max = 448.0f;

// float32 1/448 as ATen computes it when a CUDA tensor is divided by a Python
// scalar (it multiplies by the scalar's reciprocal): native's dynamic scales
// on CUDA are `amax * kInvFp8Max`, not `amax / 448`.
constexpr float kInvFp8Max = 1.0f / 448.0f;

// The smallest dynamic scale, float32(1 / (448 * 512)) as native clamps to.
constexpr float kMinDynamicScale = 1.0f / (448.0f * 512.0f);

// An already-clamped float32 -> e4m3fn bits.
__device__ __forceinline__ uint8_t fp8_bits_of(float v) {
  const uint32_t bits = __float_as_uint(v);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t mag = bits & 0x7FFFFFFFu;
  uint32_t out;
  if (mag >= 0x43F00000u) {  // 480.0 and up, inf, NaN
    out = 0x7Fu;
  } else if (mag < 0x3C800000u) {  // below 2**-6: round to a multiple of 2**-9 via 2**14
    out = __float_as_uint(__uint_as_float(mag) + 16384.0f) - 0x46800000u;
  } else {  // rebias the exponent (127 -> 7), round the 20 dropped bits to nearest even
    out = (mag - 0x3C000000u + 0x7FFFFu + ((mag >> 20) & 1u)) >> 20;
  }
  return static_cast<uint8_t>(out | sign);
}

__device__ __forceinline__ bool is_normal(float v) {
  const uint32_t exponent = (__float_as_uint(v) >> 23) & 0xFFu;
  return exponent != 0u && exponent != 0xFFu;
}

// Division by one scale, many times: `x / scale` rounded as IEEE division
// (__fdiv_rn), bit for bit, for a fraction of its cost. The reciprocal y =
// RN(1 / scale) is taken once; each quotient is q = RN(x * y) corrected by
// one FMA step, RN(q + RN(x - q * scale) * y), which is the correctly rounded
// quotient when y is and nothing underflows (Markstein's theorem); outside
// that range (tiny, huge, inf or NaN operands or scale) it divides. Checked
// against IEEE division on 4e8 random pairs, scales over all exponents.
struct Fp8Scale {
  float scale;
  float inv;
  bool fast;

  __device__ __forceinline__ explicit Fp8Scale(float s) {
    scale = s;
    inv = __fdiv_rn(1.0f, s);
    fast = is_normal(s) && is_normal(inv);
  }

  __device__ __forceinline__ float divide(float x) const {
    if (fast) {
      const float q = __fmul_rn(x, inv);
      const float ax = fabsf(x);
      const float aq = fabsf(q);
      if (ax == 0.0f) {
        return q;  // +-0 with the sign IEEE division gives
      }
      if (ax >= 0x1p-100f && aq >= 0x1p-100f && aq <= 0x1p100f) {
        return __fmaf_rn(__fmaf_rn(-q, scale, x), inv, q);
      }
    }
    return __fdiv_rn(x, scale);
  }

  // `x / scale` clamped to +-448 (NaN stays NaN), as FP8 bits. sm_89 and later
  // convert with one saturating instruction (the same bits as fp8_bits_of for
  // every non-NaN float: checked on all 2**32 of them against the CUDA
  // headers' emulation); a NaN keeps its sign, as torch's conversion does.
  __device__ __forceinline__ uint8_t quantize(float x) const {
    const float v = divide(x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (v == v) {
      return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
    }
#endif
    return fp8_bits_of(v > kFp8Max ? kFp8Max : (v < -kFp8Max ? -kFp8Max : v));
  }
};

}  // namespace vllm_ir_cuda
