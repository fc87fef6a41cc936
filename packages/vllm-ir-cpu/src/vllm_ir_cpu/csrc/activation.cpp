// silu_and_mul and gelu_and_mul for CPU tensors: the "cpu_c" kernels.
//
// Semantics are exactly those of the native functions in vllm_ir/ops/activation.py,
// `F.silu(x[..., :d]) * x[..., d:]` and `F.gelu(x[..., :d], approximate) * x[..., d:]`,
// as ATen computes them:
//   * act(g) in fp32, rounded to the input dtype, with ATen's formulas:
//     silu(g) = g / (1 + exp(-g)); gelu(g) = g * 0.5 * (1 + erf(g * M_SQRT1_2));
//     gelu_tanh(g) = 0.5 * g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 * g^3)));
//   * times the up half in fp32, rounded to the input dtype.
// ATen evaluates exp/erf/tanh with at::vec's vectorized functions on whole chunks
// of 2 * Vectorized<scalar_t>::size() elements of a row and with std:: functions
// on the rest; these kernels do the same, so results match it bit for bit where
// the compiler makes the same choices (on one thread: ATen's parallel split of a
// large tensor can move the boundary); gelu_and_mul's tolerance allows an ulp of
// erf either way. For a contiguous gate (a single row) ATen's F.gelu runs oneDNN's
// gelu_erf instead where oneDNN takes the dtype (fp32; fp16 on AVX512-FP16 CPUs),
// whose own erf differs by an ulp near -1: within that tolerance, not bit-exact.
// The tanh GELU uses a cheaper tanh (fast_tanh below): within the tolerance, not
// bit-exact.
//
// The last dimension must be even. Rows may be strided as long as the last
// dimension is contiguous; other layouts go through a contiguous copy. The
// output is a new contiguous tensor.

#include "common.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace vllm_ir_cpu {
namespace {

// The activations, in fp32 lanes and scalars, as ATen writes them.
struct Silu {
  static fVec apply(const fVec& g) { return g / (fVec(1.0f) + g.neg().exp()); }
  static float apply(float g) { return g / (1.0f + std::exp(-g)); }
};

struct GeluErf {
  static constexpr float kAlpha = static_cast<float>(M_SQRT1_2);
  static fVec apply(const fVec& g) {
    return g * fVec(0.5f) * (fVec(1.0f) + (g * fVec(kAlpha)).erf());
  }
  static float apply(float g) { return g * 0.5f * (1.0f + std::erf(g * kAlpha)); }
};

// tanh(y) = 1 - 2 / (exp(2y) + 1) with at::vec's exp_u20 (x86): about 3x cheaper
// than Sleef's tanhf_u10, with an absolute error near 1e-6, so the GELU is off by
// at most ~5e-7 * |g| (an fp32 ulp or two; one bf16/fp16 ulp where the value sits
// at a rounding midpoint: within gelu_and_mul's two-ulp tolerance, not bit-exact).
// exp overflows to inf for large y (tanh -> 1) and underflows to 0 (tanh -> -1).
inline fVec fast_tanh(const fVec& y) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return fVec(1.0f) - fVec(2.0f) / ((y + y).exp_u20() + fVec(1.0f));
#else
  return y.tanh();
#endif
}

struct GeluTanh {
  static constexpr float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
  static constexpr float kKappa = 0.044715f;
  static fVec apply(const fVec& g) {
    const fVec cube = g * g * g;
    const fVec inner = fVec(kBeta) * (g + fVec(kKappa) * cube);
    return fVec(0.5f) * g * (fVec(1.0f) + fast_tanh(inner));
  }
  static float apply(float g) {
    const float cube = g * g * g;
    const float inner = kBeta * (g + kKappa * cube);
    return 0.5f * g * (1.0f + std::tanh(inner));
  }
};

// out[0:d] <- round(round(act(x[0:d])) * x[d:2d]).
template <typename Act, typename scalar_t>
inline void act_and_mul_row(scalar_t* out, const scalar_t* x, int64_t d) {
  const scalar_t* gate = x;
  const scalar_t* up = x + d;
  using bVec = Vectorized<scalar_t>;
  constexpr int64_t V = bVec::size();
  // ATen's cpu_kernel_vec vectorizes whole chunks of 2 * V elements only
  const int64_t vectorized = d - d % (2 * V);
  int64_t i = 0;
  if constexpr (std::is_same_v<scalar_t, float>) {
    for (; i < vectorized; i += V) {
      (Act::apply(fVec::loadu(gate + i)) * fVec::loadu(up + i)).store(out + i);
    }
    for (; i < d; ++i) out[i] = Act::apply(gate[i]) * up[i];
  } else {
    for (; i < vectorized; i += V) {
      auto [g0, g1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(gate + i));
      auto [u0, u1] = at::vec::convert_to_float<scalar_t>(bVec::loadu(up + i));
      auto [s0, s1] = round_to<scalar_t>(Act::apply(g0), Act::apply(g1));
      at::vec::convert_from_float<scalar_t>(s0 * u0, s1 * u1).store(out + i);
    }
    for (; i < d; ++i) {
      const float s = static_cast<float>(static_cast<scalar_t>(Act::apply(static_cast<float>(gate[i]))));
      out[i] = static_cast<scalar_t>(s * static_cast<float>(up[i]));
    }
  }
}

template <typename Act>
at::Tensor act_and_mul(const char* op, const at::Tensor& x) {
  check_input(op, x);
  const int64_t width = x.size(-1);
  TORCH_CHECK(
      width % 2 == 0, "vllm_ir_cpu::", op, ": x's last dimension must be even, got ", width);
  const int64_t d = width / 2;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = d;
  at::Tensor out = at::empty(sizes, x.options());
  if (out.numel() == 0) return out;

  dispatch_rows(op, x, [&](auto tag, const auto* data, int64_t stride, int64_t rows, int64_t) {
    using scalar_t = decltype(tag);
    scalar_t* dst = out.data_ptr<scalar_t>();
#pragma omp parallel for schedule(static) if (run_parallel(rows, rows * width))
    for (int64_t r = 0; r < rows; ++r) {
      act_and_mul_row<Act>(dst + r * d, data + r * stride, d);
    }
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  return act_and_mul<Silu>("silu_and_mul", x);
}

at::Tensor gelu_and_mul(const at::Tensor& x, c10::string_view approximate) {
  if (approximate == "none") return act_and_mul<GeluErf>("gelu_and_mul", x);
  if (approximate == "tanh") return act_and_mul<GeluTanh>("gelu_and_mul", x);
  TORCH_CHECK(
      false, "vllm_ir_cpu::gelu_and_mul: approximate must be 'none' or 'tanh', got '",
      std::string(approximate), "'");
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_ir_cpu, CPU, m) {
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("gelu_and_mul", &gelu_and_mul);
}

}  // namespace vllm_ir_cpu
