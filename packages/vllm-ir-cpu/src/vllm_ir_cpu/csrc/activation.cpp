// silu_and_mul for CPU tensors: the "cpu_c" kernel.
//
// Semantics are exactly those of the native function in vllm_ir/ops/activation.py,
// `F.silu(x[..., :d]) * x[..., d:]`, as ATen computes it:
//   * silu(g) = g / (1 + exp(-g)) in fp32, rounded to the input dtype;
//   * times the up half in fp32, rounded to the input dtype.
// ATen's silu evaluates exp with at::vec's vectorized exp on whole chunks of
// 2 * Vectorized<scalar_t>::size() elements of a row and with std::exp on the
// rest; this kernel does the same, so results match it bit for bit (on one
// thread: ATen's parallel split of a large tensor can move the boundary).
//
// The last dimension must be even. Rows may be strided as long as the last
// dimension is contiguous; other layouts go through a contiguous copy. The
// output is a new contiguous tensor.

#include "common.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace vllm_ir_cpu {
namespace {

inline fVec silu(const fVec& g) {
  return g / (fVec(1.0f) + g.neg().exp());
}

inline float silu(float g) {
  return g / (1.0f + std::exp(-g));
}

// out[0:d] <- round(round(silu(x[0:d])) * x[d:2d]).
template <typename scalar_t>
inline void silu_and_mul_row(scalar_t* out, const scalar_t* x, int64_t d) {
  const scalar_t* gate = x;
  const scalar_t* up = x + d;
  using bVec = Vectorized<scalar_t>;
  constexpr int64_t V = bVec::size();
  // ATen's cpu_kernel_vec vectorizes whole chunks of 2 * V elements only
  const int64_t vectorized = d - d % (2 * V);
  int64_t i = 0;
  if constexpr (std::is_same_v<scalar_t, float>) {
    for (; i < vectorized; i += V) {
      (silu(fVec::loadu(gate + i)) * fVec::loadu(up + i)).store(out + i);
    }
    for (; i < d; ++i) out[i] = silu(gate[i]) * up[i];
  } else {
    for (; i < vectorized; i += V) {
      auto [g0, g1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(gate + i));
      auto [u0, u1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(up + i));
      auto [s0, s1] = round_to<scalar_t>(silu(g0), silu(g1));
      at::vec::convert_from_float<scalar_t>(s0 * u0, s1 * u1).store(out + i);
    }
    for (; i < d; ++i) {
      const float s = static_cast<float>(static_cast<scalar_t>(silu(static_cast<float>(gate[i]))));
      out[i] = static_cast<scalar_t>(s * static_cast<float>(up[i]));
    }
  }
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  constexpr const char* op = "silu_and_mul";
  check_input(op, x);
  const int64_t width = x.size(-1);
  TORCH_CHECK(
      width % 2 == 0, "vllm_ir_cpu::", op, ": x's last dimension must be even, got ", width);
  const int64_t d = width / 2;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = d;
  at::Tensor out = at::empty(sizes, x.options());
  if (out.numel() == 0) return out;

  const int64_t rows = x.numel() / width;
  const Rows src = rows_of(x);
  dispatch_dtype(op, x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* data = src.tensor.const_data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
#pragma omp parallel for schedule(static) if (run_parallel(rows, rows * width))
    for (int64_t r = 0; r < rows; ++r) {
      silu_and_mul_row(dst + r * d, data + r * src.stride, d);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_ir_cpu, CPU, m) {
  m.impl("silu_and_mul", &silu_and_mul);
}

}  // namespace vllm_ir_cpu
