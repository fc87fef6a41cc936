// FP8 (float8_e4m3fn) quantization for CPU tensors: the "cpu_c" kernels.
//
// Semantics are exactly those of the native functions in vllm_ir/ops/quant.py:
//   * static_scaled_fp8_quant: x in fp32, divided by the one fp32 scale,
//     clamped to +-448, rounded to nearest even (common.h: quantize_store);
//   * dynamic_per_token_fp8_quant: per row, amax = max |x| (a NaN propagates),
//     bounded by scale_ub if given, scale = max(amax / 448, 1 / (448 * 512))
//     in fp32 (true divisions, as ATen's), then the row quantized with it.
//
// Outputs are new contiguous tensors; x may have any layout (rows of one
// stride are read in place, other layouts through a contiguous copy).

#include "common.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace vllm_ir_cpu {
namespace {

// 1 / (448 * 512), rounded to fp32 as ATen's clamp(min=...) rounds its scalar.
const float kMinScale = static_cast<float>(1.0 / (448.0 * 512.0));

// q[0:n] <- fp8(clamp(x[0:n] / scale)).
template <typename scalar_t>
inline void quantize_row(fp8_t* q, const scalar_t* x, const fVec& scale, int64_t n) {
  constexpr int64_t fV = fVec::size();
  if constexpr (std::is_same_v<scalar_t, float>) {
    for (int64_t i = 0; i < n; i += fV) {
      const int64_t count = std::min<int64_t>(fV, n - i);
      quantize_store(q + i, fVec::loadu(x + i, count), scale, count);
    }
  } else {
    for_each_vec(x, n, [&](int64_t i, int64_t count, const fVec& a0, const fVec& a1) {
      quantize_store(q + i, a0, scale, std::min<int64_t>(count, fV));
      if (count > fV) quantize_store(q + i + fV, a1, scale, count - fV);
    });
  }
}

// max |x[0:n]| as fp32 (exact: no rounding in an absolute value or a maximum);
// NaN if any element is NaN, as ATen's amax.
template <typename scalar_t>
inline float abs_max(const scalar_t* x, int64_t n) {
  constexpr int64_t fV = fVec::size();
  fVec m0(0.0f), m1(0.0f);  // lanes past the end load as zeros: no effect
  if constexpr (std::is_same_v<scalar_t, float>) {
    for (int64_t i = 0; i < n; i += fV) {
      m0 = at::vec::maximum(m0, fVec::loadu(x + i, std::min<int64_t>(fV, n - i)).abs());
    }
  } else {
    for_each_vec(x, n, [&](int64_t, int64_t, const fVec& a0, const fVec& a1) {
      m0 = at::vec::maximum(m0, a0.abs());
      m1 = at::vec::maximum(m1, a1.abs());
    });
  }
  alignas(64) float lanes[fV];
  at::vec::maximum(m0, m1).store(lanes);  // at::vec::maximum propagates NaN
  float m = 0.0f;
  for (int64_t j = 0; j < fV; ++j) {
    if (std::isnan(lanes[j])) return std::numeric_limits<float>::quiet_NaN();
    m = std::max(m, lanes[j]);
  }
  return m;
}

// The scale of one row, as the native function computes it in fp32.
inline float row_scale(float amax, const std::optional<float>& scale_ub) {
  if (scale_ub) {  // amax.clamp(max=scale_ub): a NaN on either side gives NaN
    const float ub = *scale_ub;
    if (std::isnan(ub) || amax > ub) amax = ub;
  }
  const float scale = amax / kFp8Max;
  return std::isnan(scale) ? scale : std::max(scale, kMinScale);
}

// ---------------------------------------------------------------------------
// The ops.

at::Tensor static_scaled_fp8_quant(const at::Tensor& x, const at::Tensor& scale) {
  constexpr const char* op = "static_scaled_fp8_quant";
  check_input(op, x);
  const fVec qs(scalar_of(op, "scale", scale));
  return fp8_of_rows(op, x, [&](auto, fp8_t* out, const auto* data, int64_t stride, int64_t rows, int64_t hidden) {
#pragma omp parallel for schedule(static) if (run_parallel(rows, rows * hidden))
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(out + r * hidden, data + r * stride, qs, hidden);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> dynamic_per_token_fp8_quant(
    const at::Tensor& x, const std::optional<at::Tensor>& scale_ub) {
  constexpr const char* op = "dynamic_per_token_fp8_quant";
  check_input(op, x);
  TORCH_CHECK(
      x.size(-1) > 0, "vllm_ir_cpu::", op,
      ": x's last dimension must not be empty (each row needs an amax)");
  std::optional<float> ub;
  if (scale_ub.has_value() && scale_ub->defined()) ub = scalar_of(op, "scale_ub", *scale_ub);
  std::vector<int64_t> scale_sizes(x.sizes().begin(), x.sizes().end());
  scale_sizes.back() = 1;
  at::Tensor scales = at::empty(scale_sizes, x.options().dtype(at::kFloat));
  at::Tensor q = fp8_of_rows(op, x, [&](auto, fp8_t* out, const auto* data, int64_t stride, int64_t rows, int64_t hidden) {
    float* row_scales = scales.data_ptr<float>();
#pragma omp parallel for schedule(static) if (run_parallel(rows, rows * hidden))
    for (int64_t r = 0; r < rows; ++r) {
      const auto* xr = data + r * stride;
      const float scale = row_scale(abs_max(xr, hidden), ub);
      row_scales[r] = scale;
      quantize_row(out + r * hidden, xr, fVec(scale), hidden);
    }
  });
  return {q, scales};
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_ir_cpu, CPU, m) {
  m.impl("static_scaled_fp8_quant", &static_scaled_fp8_quant);
  m.impl("dynamic_per_token_fp8_quant", &dynamic_per_token_fp8_quant);
}

}  // namespace vllm_ir_cpu
