// RMSNorm and fused residual-add + RMSNorm for CPU tensors, alone and followed
// by static FP8 quantization: the "cpu_c" kernels.
//
// Semantics are exactly those of the native functions in vllm_ir/ops/layernorm.py
// and vllm_ir/ops/quant.py:
//   * the sum of squares is accumulated in fp32 and the variance is its mean;
//   * x * rsqrt(variance + epsilon) is computed in fp32 and rounded to the
//     input dtype BEFORE the weight is applied;
//   * the weight product is computed in fp32 and rounded to the input dtype
//     (for bf16/fp16 the product of two 16-bit floats is exact in fp32, so
//     this equals ATen's `x.to(orig_dtype) * weight` bit for bit);
//   * fused_add_rms_norm rounds x + x_residual to the input dtype, stores it
//     into x_residual, and normalizes that rounded sum into x;
//   * vllm_fused_add_rms_norm (vLLM's numerics) stores the same rounded sum
//     into x_residual but normalizes the fp32 sum, kept per row in a buffer
//     (for fp32 inputs the two are the same computation);
//   * the *_static_fp8_quant variants quantize that normalized value, as
//     rounded to the input dtype, to FP8 (common.h: quantize_store) into a new
//     tensor; the fused-add one stores the rounded sum into x_residual and
//     leaves x alone.
//
// Layout: any leading shape (rows are flattened); rows may be strided as long
// as the last dimension is contiguous and the leading dimensions collapse into
// one row stride. Other layouts are handled through contiguous copies.
//
// Schemas are defined in Python (vllm_ir_cpu/library.py), so tracing works
// before this library is built; this file only registers CPU kernels.

#include "common.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace vllm_ir_cpu {
namespace {

// ---------------------------------------------------------------------------
// Per-row building blocks, vectorized with at::vec (plus AVX-512 bf16 rounding).

// Sum of squares of one row, accumulated in fp32.
template <typename scalar_t>
inline float sum_of_squares(const scalar_t* x, int64_t n) {
  fVec acc0(0.0f), acc1(0.0f), acc2(0.0f), acc3(0.0f);
  if constexpr (std::is_same_v<scalar_t, float>) {
    constexpr int64_t V = fVec::size();
    int64_t i = 0;
    for (; i + 4 * V <= n; i += 4 * V) {
      fVec a0 = fVec::loadu(x + i), a1 = fVec::loadu(x + i + V);
      fVec a2 = fVec::loadu(x + i + 2 * V), a3 = fVec::loadu(x + i + 3 * V);
      acc0 = at::vec::fmadd(a0, a0, acc0);
      acc1 = at::vec::fmadd(a1, a1, acc1);
      acc2 = at::vec::fmadd(a2, a2, acc2);
      acc3 = at::vec::fmadd(a3, a3, acc3);
    }
    for (; i + V <= n; i += V) {
      fVec a = fVec::loadu(x + i);
      acc0 = at::vec::fmadd(a, a, acc0);
    }
    if (i < n) {
      fVec a = fVec::loadu(x + i, n - i);  // zero-filled past the end
      acc1 = at::vec::fmadd(a, a, acc1);
    }
  } else {
    using bVec = Vectorized<scalar_t>;
    constexpr int64_t V = bVec::size();
    int64_t i = 0;
    for (; i + 2 * V <= n; i += 2 * V) {
      auto [a0, a1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(x + i));
      auto [a2, a3] = at::vec::convert_to_float<scalar_t>(bVec::loadu(x + i + V));
      acc0 = at::vec::fmadd(a0, a0, acc0);
      acc1 = at::vec::fmadd(a1, a1, acc1);
      acc2 = at::vec::fmadd(a2, a2, acc2);
      acc3 = at::vec::fmadd(a3, a3, acc3);
    }
    for (; i < n; i += V) {
      const int64_t count = std::min<int64_t>(V, n - i);
      auto [a0, a1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(x + i, count));
      acc0 = at::vec::fmadd(a0, a0, acc0);
      acc1 = at::vec::fmadd(a1, a1, acc1);
    }
  }
  return lane_sum((acc0 + acc1) + (acc2 + acc3));
}

// x_residual <- round(x + x_residual); returns the sum of squares of the
// rounded sums (what the native function normalizes).
template <typename scalar_t>
inline float add_residual(const scalar_t* x, scalar_t* residual, int64_t n) {
  fVec acc0(0.0f), acc1(0.0f);
  if constexpr (std::is_same_v<scalar_t, float>) {
    constexpr int64_t V = fVec::size();
    for (int64_t i = 0; i < n; i += V) {
      const int64_t count = std::min<int64_t>(V, n - i);
      fVec s = fVec::loadu(x + i, count) + fVec::loadu(residual + i, count);
      s.store(residual + i, count);
      acc0 = at::vec::fmadd(s, s, acc0);
    }
  } else {
    for_each_vec(x, n, [&](int64_t i, int64_t count, const fVec& x0, const fVec& x1) {
      using bVec = Vectorized<scalar_t>;
      auto [r0, r1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(residual + i, count));
      auto [s0, s1] = round_to<scalar_t>(x0 + r0, x1 + r1);
      pack_exact<scalar_t>(s0, s1).store(residual + i, count);
      acc0 = at::vec::fmadd(s0, s0, acc0);
      acc1 = at::vec::fmadd(s1, s1, acc1);
    });
  }
  return lane_sum(acc0 + acc1);
}

// x_residual <- round(x + x_residual), sum <- the fp32 sums (unrounded);
// returns the sum of squares of those fp32 sums. For 16-bit types only.
template <typename scalar_t>
inline float add_residual_fp32(const scalar_t* x, scalar_t* residual, float* sum, int64_t n) {
  constexpr int64_t fV = fVec::size();
  fVec acc0(0.0f), acc1(0.0f);
  for_each_vec(x, n, [&](int64_t i, int64_t count, const fVec& x0, const fVec& x1) {
    using bVec = Vectorized<scalar_t>;
    auto [r0, r1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(residual + i, count));
    const fVec s0 = x0 + r0, s1 = x1 + r1;  // lanes past count: 0 + 0
    at::vec::convert_from_float<scalar_t>(s0, s1).store(residual + i, count);
    s0.store(sum + i, std::min<int64_t>(count, fV));
    if (count > fV) s1.store(sum + i + fV, count - fV);
    acc0 = at::vec::fmadd(s0, s0, acc0);
    acc1 = at::vec::fmadd(s1, s1, acc1);
  });
  return lane_sum(acc0 + acc1);
}

// out <- round(round(sum * inv_rms) * weight), or round(sum * inv_rms) without
// weight: `normalize` over fp32 values (vLLM's numerics for 16-bit types).
template <typename scalar_t>
inline void normalize_fp32_sum(
    scalar_t* out, const float* sum, const float* weight, float inv_rms, int64_t n) {
  const fVec scale(inv_rms);
  constexpr int64_t fV = fVec::size();
  for (int64_t i = 0; i < n; i += 2 * fV) {
    const int64_t count = std::min<int64_t>(2 * fV, n - i);
    const int64_t count_lo = std::min<int64_t>(count, fV);
    const int64_t count_hi = std::max<int64_t>(count - fV, 0);
    fVec a0 = fVec::loadu(sum + i, count_lo) * scale;
    fVec a1 = fVec::loadu(sum + i + fV, count_hi) * scale;
    if (weight != nullptr) {
      auto [y0, y1] = round_to<scalar_t>(a0, a1);
      a0 = y0 * fVec::loadu(weight + i, count_lo);
      a1 = y1 * fVec::loadu(weight + i + fV, count_hi);
    }
    at::vec::convert_from_float<scalar_t>(a0, a1).store(out + i, count);
  }
}

// out <- round(round(x * inv_rms) * weight), or round(x * inv_rms) without
// weight; `weight` is the weight converted to fp32 (exactly) once per call.
template <typename scalar_t>
inline void normalize(
    scalar_t* out, const scalar_t* x, const float* weight, float inv_rms, int64_t n) {
  const fVec scale(inv_rms);
  constexpr int64_t fV = fVec::size();
  if constexpr (std::is_same_v<scalar_t, float>) {
    int64_t i = 0;
    for (; i + fV <= n; i += fV) {
      fVec y = fVec::loadu(x + i) * scale;
      if (weight != nullptr) y = y * fVec::loadu(weight + i);
      y.store(out + i);
    }
    if (i < n) {
      const int64_t count = n - i;
      fVec y = fVec::loadu(x + i, count) * scale;
      if (weight != nullptr) y = y * fVec::loadu(weight + i, count);
      y.store(out + i, count);
    }
  } else {
    for_each_vec(x, n, [&](int64_t i, int64_t count, fVec a0, fVec a1) {
      a0 = a0 * scale;
      a1 = a1 * scale;
      if (weight != nullptr) {
        // the weight applies to the value already rounded to the input dtype
        auto [y0, y1] = round_to<scalar_t>(a0, a1);
        const int64_t count_hi = std::max<int64_t>(count - fV, 0);
        a0 = y0 * fVec::loadu(weight + i, std::min<int64_t>(count, fV));
        a1 = y1 * fVec::loadu(weight + i + fV, count_hi);
      }
      at::vec::convert_from_float<scalar_t>(a0, a1).store(out + i, count);
    });
  }
}

// The weight as fp32: the tensor's own data for fp32, else a converted copy.
template <typename scalar_t>
const float* weight_as_float(const at::Tensor& w, std::vector<float>& buffer) {
  if (!w.defined()) return nullptr;
  if constexpr (std::is_same_v<scalar_t, float>) {
    return w.const_data_ptr<float>();
  } else {
    const int64_t n = w.numel();
    buffer.resize(n);
    at::vec::convert(w.const_data_ptr<scalar_t>(), buffer.data(), n);
    return buffer.data();
  }
}

inline float inv_rms_of(float sum_sq, int64_t n, float epsilon) {
  const float variance = sum_sq / static_cast<float>(n);
  return 1.0f / std::sqrt(variance + epsilon);
}

// q <- fp8(round(round(x * inv_rms) * weight) / qscale), or without the weight
// round(x * inv_rms): the output of rms_norm (as `normalize` writes it, in the
// input dtype) quantized to FP8.
template <typename scalar_t>
inline void normalize_quant(
    fp8_t* q, const scalar_t* x, const float* weight, float inv_rms, const fVec& qscale,
    int64_t n) {
  const fVec scale(inv_rms);
  constexpr int64_t fV = fVec::size();
  if constexpr (std::is_same_v<scalar_t, float>) {
    for (int64_t i = 0; i < n; i += fV) {
      const int64_t count = std::min<int64_t>(fV, n - i);
      fVec y = fVec::loadu(x + i, count) * scale;
      if (weight != nullptr) y = y * fVec::loadu(weight + i, count);
      quantize_store(q + i, y, qscale, count);
    }
  } else {
    for_each_vec(x, n, [&](int64_t i, int64_t count, const fVec& a0, const fVec& a1) {
      const int64_t count_lo = std::min<int64_t>(count, fV);
      const int64_t count_hi = std::max<int64_t>(count - fV, 0);
      auto [y0, y1] = round_to<scalar_t>(a0 * scale, a1 * scale);
      if (weight != nullptr) {
        std::tie(y0, y1) = round_to<scalar_t>(
            y0 * fVec::loadu(weight + i, count_lo), y1 * fVec::loadu(weight + i + fV, count_hi));
      }
      quantize_store(q + i, y0, qscale, count_lo);
      if (count_hi > 0) quantize_store(q + i + fV, y1, qscale, count_hi);
    });
  }
}

// ---------------------------------------------------------------------------
// Whole-tensor loops, parallel over rows.

template <typename scalar_t>
void rms_norm_rows(
    scalar_t* out, int64_t out_stride, const scalar_t* x, int64_t x_stride,
    const float* weight, int64_t rows, int64_t hidden, float epsilon) {
  const bool parallel = rows > 1 && rows * hidden >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* xr = x + r * x_stride;
    const float inv_rms = inv_rms_of(sum_of_squares(xr, hidden), hidden, epsilon);
    normalize(out + r * out_stride, xr, weight, inv_rms, hidden);
  }
}

template <typename scalar_t>
void fused_add_rms_norm_rows(
    scalar_t* x, int64_t x_stride, scalar_t* residual, int64_t residual_stride,
    const float* weight, int64_t rows, int64_t hidden, float epsilon) {
  const bool parallel = rows > 1 && rows * hidden >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    scalar_t* xr = x + r * x_stride;
    scalar_t* rr = residual + r * residual_stride;
    const float inv_rms = inv_rms_of(add_residual(xr, rr, hidden), hidden, epsilon);
    normalize(xr, rr, weight, inv_rms, hidden);
  }
}

// vLLM's numerics: the fp32 sum is normalized (for fp32, fused_add_rms_norm_rows).
template <typename scalar_t>
void vllm_fused_add_rms_norm_rows(
    scalar_t* x, int64_t x_stride, scalar_t* residual, int64_t residual_stride,
    const float* weight, int64_t rows, int64_t hidden, float epsilon) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    fused_add_rms_norm_rows(x, x_stride, residual, residual_stride, weight, rows, hidden, epsilon);
  } else {
    const bool parallel = rows > 1 && rows * hidden >= kParallelMinElements;
#pragma omp parallel if (parallel)
    {
      std::vector<float> sum(hidden);  // one row's fp32 sums, per thread
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        scalar_t* xr = x + r * x_stride;
        scalar_t* rr = residual + r * residual_stride;
        const float inv_rms =
            inv_rms_of(add_residual_fp32(xr, rr, sum.data(), hidden), hidden, epsilon);
        normalize_fp32_sum(xr, sum.data(), weight, inv_rms, hidden);
      }
    }
  }
}

template <typename scalar_t>
void rms_norm_quant_rows(
    fp8_t* q, const scalar_t* x, int64_t x_stride, const float* weight, int64_t rows,
    int64_t hidden, float epsilon, float qscale) {
  const fVec qs(qscale);
#pragma omp parallel for schedule(static) if (run_parallel(rows, rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    const scalar_t* xr = x + r * x_stride;
    const float inv_rms = inv_rms_of(sum_of_squares(xr, hidden), hidden, epsilon);
    normalize_quant(q + r * hidden, xr, weight, inv_rms, qs, hidden);
  }
}

template <typename scalar_t>
void fused_add_rms_norm_quant_rows(
    fp8_t* q, const scalar_t* x, int64_t x_stride, scalar_t* residual, int64_t residual_stride,
    const float* weight, int64_t rows, int64_t hidden, float epsilon, float qscale) {
  const fVec qs(qscale);
#pragma omp parallel for schedule(static) if (run_parallel(rows, rows * hidden))
  for (int64_t r = 0; r < rows; ++r) {
    scalar_t* rr = residual + r * residual_stride;
    const float inv_rms = inv_rms_of(add_residual(x + r * x_stride, rr, hidden), hidden, epsilon);
    normalize_quant(q + r * hidden, rr, weight, inv_rms, qs, hidden);
  }
}

// ---------------------------------------------------------------------------
// Arguments.

// The weight as a contiguous vector of `hidden` elements (nullptr data if absent).
at::Tensor checked_weight(
    const char* op, const std::optional<at::Tensor>& weight, const at::Tensor& x) {
  if (!weight.has_value() || !weight->defined()) return at::Tensor();
  check_tensor(op, "weight", *weight, x);
  TORCH_CHECK(
      weight->dim() == 1 && weight->size(0) == x.size(-1), "vllm_ir_cpu::", op,
      ": weight must have shape (", x.size(-1), ",), got ", weight->sizes());
  return weight->contiguous();
}

// x's dtype dispatched, with the weight as the fp32 vector the row loops take:
// calls f(tag, weight) (weight nullptr when w is undefined).
template <typename F>
void dispatch_weighted(const char* op, const at::Tensor& x, const at::Tensor& w, F&& f) {
  dispatch_dtype(op, x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    std::vector<float> buffer;
    f(tag, weight_as_float<scalar_t>(w, buffer));
  });
}

// ---------------------------------------------------------------------------
// The ops.

void rms_norm(
    at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    double epsilon) {
  constexpr const char* op = "rms_norm";
  TORCH_CHECK(x.dim() >= 1, "vllm_ir_cpu::rms_norm: x must have at least one dimension");
  check_tensor(op, "x", x, x);
  check_tensor(op, "out", out, x);
  check_same_shape(op, "out", out, x);
  at::assert_no_partial_overlap(out, x);  // out may be x itself
  const at::Tensor w = checked_weight(op, weight, x);
  if (x.numel() == 0) return;

  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  const Rows src = rows_of(x);
  // out's own rows, or a contiguous temporary copied into it afterwards
  const std::optional<int64_t> out_stride = row_stride(out);
  const Rows dst =
      out_stride ? Rows{out, *out_stride} : Rows{at::empty(x.sizes(), x.options()), hidden};
  dispatch_weighted(op, x, w, [&](auto tag, const float* weight_f) {
    using scalar_t = decltype(tag);
    rms_norm_rows<scalar_t>(
        dst.tensor.data_ptr<scalar_t>(), dst.stride, src.tensor.const_data_ptr<scalar_t>(),
        src.stride, weight_f, rows, hidden, static_cast<float>(epsilon));
  });
  if (!dst.tensor.is_same(out)) out.copy_(dst.tensor);
}

// rms_norm into a new contiguous tensor: the functional form the IR impl
// calls, so that a compiled graph stays functional where it is lowered.
at::Tensor rms_norm_functional(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, double epsilon) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  rms_norm(out, x, weight, epsilon);
  return out;
}

template <bool kVllmNumerics>
void fused_add_rms_norm_impl(
    at::Tensor& x, at::Tensor& x_residual, const std::optional<at::Tensor>& weight,
    double epsilon) {
  constexpr const char* op = kVllmNumerics ? "vllm_fused_add_rms_norm" : "fused_add_rms_norm";
  TORCH_CHECK(
      x.dim() >= 1, "vllm_ir_cpu::fused_add_rms_norm: x must have at least one dimension");
  check_tensor(op, "x", x, x);
  check_tensor(op, "x_residual", x_residual, x);
  check_same_shape(op, "x_residual", x_residual, x);
  at::assert_no_overlap(x, x_residual);
  const at::Tensor w = checked_weight(op, weight, x);
  if (x.numel() == 0) return;

  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  // both are written: their own rows, or contiguous copies copied back
  const Rows xs = rows_of(x);
  const Rows rs = rows_of(x_residual);
  dispatch_weighted(op, x, w, [&](auto tag, const float* weight_f) {
    using scalar_t = decltype(tag);
    const auto rows_fn = kVllmNumerics ? vllm_fused_add_rms_norm_rows<scalar_t>
                                       : fused_add_rms_norm_rows<scalar_t>;
    rows_fn(
        xs.tensor.data_ptr<scalar_t>(), xs.stride, rs.tensor.data_ptr<scalar_t>(), rs.stride,
        weight_f, rows, hidden, static_cast<float>(epsilon));
  });
  if (!xs.tensor.is_same(x)) x.copy_(xs.tensor);
  if (!rs.tensor.is_same(x_residual)) x_residual.copy_(rs.tensor);
}

void fused_add_rms_norm(
    at::Tensor& x, at::Tensor& x_residual, const std::optional<at::Tensor>& weight,
    double epsilon) {
  fused_add_rms_norm_impl<false>(x, x_residual, weight, epsilon);
}

void vllm_fused_add_rms_norm(
    at::Tensor& x, at::Tensor& x_residual, const std::optional<at::Tensor>& weight,
    double epsilon) {
  fused_add_rms_norm_impl<true>(x, x_residual, weight, epsilon);
}

// static_scaled_fp8_quant(rms_norm(x, weight, epsilon), scale) into a new
// contiguous float8_e4m3fn tensor.
at::Tensor rms_norm_static_fp8_quant(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, double epsilon,
    const at::Tensor& scale) {
  constexpr const char* op = "rms_norm_static_fp8_quant";
  check_input(op, x);
  const at::Tensor w = checked_weight(op, weight, x);
  const float qscale = scalar_of(op, "scale", scale);
  return fp8_of_rows(op, x, [&](auto tag, fp8_t* q, const auto* data, int64_t stride, int64_t rows, int64_t hidden) {
    using scalar_t = decltype(tag);
    std::vector<float> buffer;
    rms_norm_quant_rows<scalar_t>(
        q, data, stride, weight_as_float<scalar_t>(w, buffer), rows, hidden,
        static_cast<float>(epsilon), qscale);
  });
}

// x_residual <- round(x + x_residual) in place; returns the FP8 quantization
// of rms_norm(x_residual) in a new contiguous tensor. x is only read.
at::Tensor fused_add_rms_norm_static_fp8_quant(
    const at::Tensor& x, at::Tensor& x_residual, const std::optional<at::Tensor>& weight,
    double epsilon, const at::Tensor& scale) {
  constexpr const char* op = "fused_add_rms_norm_static_fp8_quant";
  check_input(op, x);
  check_tensor(op, "x_residual", x_residual, x);
  check_same_shape(op, "x_residual", x_residual, x);
  at::assert_no_overlap(x, x_residual);
  const at::Tensor w = checked_weight(op, weight, x);
  const float qscale = scalar_of(op, "scale", scale);
  at::Tensor written = x_residual;  // the residual rows the kernel writes: x_residual or a copy
  at::Tensor q = fp8_of_rows(op, x, [&](auto tag, fp8_t* out, const auto* data, int64_t stride, int64_t rows, int64_t hidden) {
    using scalar_t = decltype(tag);
    const Rows rs = rows_of(x_residual);
    written = rs.tensor;
    std::vector<float> buffer;
    fused_add_rms_norm_quant_rows<scalar_t>(
        out, data, stride, rs.tensor.data_ptr<scalar_t>(), rs.stride,
        weight_as_float<scalar_t>(w, buffer), rows, hidden, static_cast<float>(epsilon), qscale);
  });
  if (!written.is_same(x_residual)) x_residual.copy_(written);
  return q;
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_ir_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_functional", &rms_norm_functional);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("vllm_fused_add_rms_norm", &vllm_fused_add_rms_norm);
  m.impl("rms_norm_static_fp8_quant", &rms_norm_static_fp8_quant);
  m.impl("fused_add_rms_norm_static_fp8_quant", &fused_add_rms_norm_static_fp8_quant);
}

}  // namespace vllm_ir_cpu
