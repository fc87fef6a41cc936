// Building blocks shared by the cpu_c kernels (layernorm.cpp, quant.cpp,
// activation.cpp): rounding fp32 lanes to the input dtype, FP8 quantization,
// row layouts, dtype dispatch and argument checks.
//
// Everything here is `inline` (one definition whatever the translation unit);
// each .cpp file registers its own ops with TORCH_LIBRARY_IMPL.

#pragma once

#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>

namespace vllm_ir_cpu {

using at::vec::Vectorized;
using fVec = Vectorized<float>;

// Below this many elements in total, one thread does the whole call: waking
// the OpenMP team costs more than it saves. ATen's grain size; on a 2-core
// AVX-512 machine two threads start to pay off from about 8 x 4096 elements.
constexpr int64_t kParallelMinElements = 32768;

inline bool run_parallel(int64_t rows, int64_t elements) {
  return rows > 1 && elements >= kParallelMinElements;
}

// The sum of the lanes. The x86 specializations have reduce_add(); at::vec's
// portable Vectorized<T>::reduce_add does not compile in torch 2.13 (it hands a
// binary lambda to the unary reduce), so other builds add the lanes in order.
inline float lane_sum(const fVec& v) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return v.reduce_add();
#else
  alignas(64) float lanes[fVec::size()];
  v.store(lanes);
  float sum = 0.0f;
  for (int64_t j = 0; j < fVec::size(); ++j) sum += lanes[j];
  return sum;
#endif
}

// ---------------------------------------------------------------------------
// Rounding fp32 lanes to the precision of scalar_t (nearest, ties to even),
// keeping them as fp32: what `.to(scalar_t)` followed by a product in fp32 sees.

#if defined(CPU_CAPABILITY_AVX512)
// bf16 rounding done in the fp32 domain, as c10::BFloat16 rounds (7 instructions
// per 16 lanes, against ~12 for at::vec's convert_from_float + convert_to_float).
inline fVec round_to_bf16(const fVec& v) {
  const __m512 f = v;
  const __m512i bits = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  rounded = _mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  // a NaN stays a NaN (any one: the final conversion makes every NaN torch's)
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(f, f, _CMP_ORD_Q), f, _mm512_castsi512_ps(rounded));
}

// Lanes already holding bf16 values, packed to bf16 without rounding again.
inline Vectorized<at::BFloat16> pack_exact_bf16(const fVec& a, const fVec& b) {
  const __m256i lo = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(a), 16));
  const __m256i hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(b), 16));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
#endif

template <typename scalar_t>
inline std::tuple<fVec, fVec> round_to(const fVec& a, const fVec& b) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    return {round_to_bf16(a), round_to_bf16(b)};
  }
#endif
  return at::vec::convert_to_float<scalar_t>(at::vec::convert_from_float<scalar_t>(a, b));
}

// Walks x[0:n] one vector of scalar_t (a 16-bit type) at a time: calls
// f(i, count, a0, a1) with the `count` elements at i (at most 2 * fVec::size())
// converted to two fp32 vectors, the lanes past `count` zero.
template <typename scalar_t, typename F>
inline void for_each_vec(const scalar_t* x, int64_t n, F&& f) {
  using bVec = Vectorized<scalar_t>;
  constexpr int64_t V = bVec::size();
  static_assert(V == 2 * fVec::size(), "a vector of scalar_t converts to two fp32 vectors");
  for (int64_t i = 0; i < n; i += V) {
    const int64_t count = std::min<int64_t>(V, n - i);
    auto [a0, a1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(x + i, count));
    f(i, count, a0, a1);
  }
}

// Lanes already holding scalar_t values, as a vector of scalar_t.
template <typename scalar_t>
inline Vectorized<scalar_t> pack_exact(const fVec& a, const fVec& b) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
    return pack_exact_bf16(a, b);
  }
#endif
  return at::vec::convert_from_float<scalar_t>(a, b);  // rounding is exact here
}

// ---------------------------------------------------------------------------
// FP8 (float8_e4m3fn) quantization, as vllm_ir/ops/quant.py's _quantize:
// y / scale in fp32 (a true division, as ATen's), clamped to +-448 (a NaN
// stays a NaN), rounded to nearest even by c10's fp32 -> e4m3fn conversion.

using fp8_t = at::Float8_e4m3fn;
constexpr float kFp8Max = 448.0f;  // torch.finfo(torch.float8_e4m3fn).max

// dst[0:count] <- fp8(clamp(y / scale)), count <= fVec::size().
inline void quantize_store(fp8_t* dst, const fVec& y, const fVec& scale, int64_t count) {
  const fVec q = at::vec::clamp(y / scale, fVec(-kFp8Max), fVec(kFp8Max));
#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
  // at::vec's AVX-512 conversion: bit-identical to c10::Float8_e4m3fn(float)
  const __m128i bytes = at::vec::cvtfp32_fp8e4m3(q);
  if (count == fVec::size()) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), bytes);
  } else {
    _mm_mask_storeu_epi8(dst, static_cast<__mmask16>((1u << count) - 1u), bytes);
  }
#else
  alignas(64) float lanes[fVec::size()];
  q.store(lanes);
  for (int64_t j = 0; j < count; ++j) dst[j] = fp8_t(lanes[j]);
#endif
}

// ---------------------------------------------------------------------------
// Argument checks and layouts.

// The distance between consecutive rows when `t` is viewed as
// (numel / hidden, hidden) with a contiguous last dimension, if it can be.
inline std::optional<int64_t> row_stride(const at::Tensor& t) {
  const int64_t hidden = t.size(-1);
  const int64_t rows = t.numel() / hidden;
  const std::array<int64_t, 2> shape{rows, hidden};
  auto strides = at::detail::computeStride(t.sizes(), t.strides(), at::IntArrayRef(shape));
  if (!strides.has_value() || (hidden > 1 && (*strides)[1] != 1)) return std::nullopt;
  return rows > 1 ? (*strides)[0] : hidden;
}

// A tensor whose rows the kernels can walk, and the distance between its rows.
struct Rows {
  at::Tensor tensor;
  int64_t stride;
};

// `t` itself, or a contiguous copy when its rows do not have one stride.
inline Rows rows_of(const at::Tensor& t) {
  if (const auto stride = row_stride(t)) return {t, *stride};
  return {t.contiguous(), t.size(-1)};
}

template <typename F>
void dispatch_dtype(const char* op, at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat:
      f(float{});
      break;
    case at::kBFloat16:
      f(at::BFloat16{});
      break;
    case at::kHalf:
      f(at::Half{});
      break;
    default:
      TORCH_CHECK(
          false, "vllm_ir_cpu::", op, " supports float32, bfloat16 and float16, got ", dtype);
  }
}

inline void check_cpu_strided(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(
      t.device().is_cpu(), "vllm_ir_cpu::", op, ": ", name, " must be a CPU tensor, got ",
      t.device());
  TORCH_CHECK(
      t.layout() == at::kStrided, "vllm_ir_cpu::", op, ": ", name, " must be strided, got ",
      t.layout());
}

// `t` is a CPU strided tensor of `x`'s dtype; `x_name` names `x` in the message.
inline void check_tensor(
    const char* op, const char* name, const at::Tensor& t, const at::Tensor& x,
    const char* x_name = "x") {
  check_cpu_strided(op, name, t);
  TORCH_CHECK(
      t.scalar_type() == x.scalar_type(), "vllm_ir_cpu::", op, ": ", name, " has dtype ",
      t.scalar_type(), " but ", x_name, " has ", x.scalar_type());
}

inline void check_same_shape(
    const char* op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  TORCH_CHECK(
      t.sizes() == x.sizes(), "vllm_ir_cpu::", op, ": ", name, " has shape ", t.sizes(),
      " but x has ", x.sizes());
}

inline void check_input(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, "vllm_ir_cpu::", op, ": x must have at least one dimension");
  check_cpu_strided(op, "x", x);
}

// The value of a one-element fp32 tensor (a quantization scale or its bound).
inline float scalar_of(const char* op, const char* name, const at::Tensor& t) {
  check_cpu_strided(op, name, t);
  TORCH_CHECK(
      t.scalar_type() == at::kFloat, "vllm_ir_cpu::", op, ": ", name,
      " must be float32, got ", t.scalar_type());
  TORCH_CHECK(
      t.numel() == 1, "vllm_ir_cpu::", op, ": ", name, " must have one element, got shape ",
      t.sizes());
  return *t.const_data_ptr<float>();
}

inline at::TensorOptions fp8_options(const at::Tensor& x) {
  return x.options().dtype(at::kFloat8_e4m3fn);
}

// ---------------------------------------------------------------------------
// Walking rows: the frame every row kernel shares.

// x viewed as rows of its last dimension, in x's dtype: calls
// f(tag, data, stride, rows, width), where `tag` is a scalar_t{} (recover the
// type with decltype(tag)) and `data` the first element of rows `stride`
// apart (rows_of: x itself, or a contiguous copy). x must not be empty.
template <typename F>
void dispatch_rows(const char* op, const at::Tensor& x, F&& f) {
  const int64_t width = x.size(-1);
  const int64_t rows = x.numel() / width;
  const Rows src = rows_of(x);
  dispatch_dtype(op, x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    f(tag, src.tensor.const_data_ptr<scalar_t>(), src.stride, rows, width);
  });
}

// A new contiguous float8_e4m3fn tensor of x's shape, filled row by row by
// f(tag, q, data, stride, rows, hidden) (dispatch_rows' arguments after the
// output); an empty x gives an empty result without calling f.
template <typename F>
at::Tensor fp8_of_rows(const char* op, const at::Tensor& x, F&& f) {
  at::Tensor q = at::empty(x.sizes(), fp8_options(x));
  if (x.numel() == 0) return q;
  dispatch_rows(op, x, [&](auto tag, const auto* data, int64_t stride, int64_t rows, int64_t hidden) {
    f(tag, q.data_ptr<fp8_t>(), data, stride, rows, hidden);
  });
  return q;
}

}  // namespace vllm_ir_cpu
