// gelu_and_mul and rotary_embedding: torch-free CUDA kernels, called from torch
// by binding.cpp (torch.ops.vllm_ir_cuda.gelu_and_mul / rotary_embedding).
//
// Semantics are those of vllm_ir.ops.activation.gelu_and_mul and
// vllm_ir.ops.rotary.rotary_embedding (the native functions):
//   * gelu_and_mul: ATen's float32 formulas, g * 0.5 * (1 + erf(g * M_SQRT1_2)) or
//     0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3))), rounded to the dtype,
//     times `up`, rounded again (erff/tanhf may differ from ATen's CUDA kernel by
//     an fp32 ulp: within the op's tolerance);
//   * rotary_embedding, in place, one thread per rotated pair of a (token, head)
//     row: a' = round(round(a * cos_a) - round(b * sin_a)), b' = round(round(b *
//     cos_b) + round(a * sin_b)), every product and sum rounded with __fmul_rn /
//     __fadd_rn / __fsub_rn (never contracted into an FMA), so the result is
//     native's bit for bit. neox pairs channel i with i + rot/2, gptj 2i with 2i+1;
//     channels past rot are not touched.
// Rows have a contiguous last dimension; query/key rows are addressed as
// (token, head) with a stride each, cos/sin as (token) rows of `rot` elements.

#include <cstdint>

#include "dtype.cuh"
#include "launch.cuh"
#include "layernorm.h"

namespace vllm_ir_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float gelu_erf(float g) {
  return __fmul_rn(__fmul_rn(g, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(g, 0.70710678118654752f))));
}

__device__ __forceinline__ float gelu_tanh(float g) {
  const float cube = __fmul_rn(__fmul_rn(g, g), g);
  const float inner =
      __fmul_rn(0.79788456080286536f, __fadd_rn(g, __fmul_rn(0.044715f, cube)));
  return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
}

template <typename T, bool TANH>
__global__ void __launch_bounds__(kThreads)
    gelu_and_mul_kernel(T* __restrict__ out, int64_t out_stride, const T* __restrict__ x,
                        int64_t x_stride, int d) {
  const GatedRow<T> r = gated_row(out, out_stride, x, x_stride, d);
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < d; i += gridDim.y * blockDim.x) {
    const float g = to_float(r.gate[i]);
    const T act = from_float<T>(TANH ? gelu_tanh(g) : gelu_erf(g));
    r.out[i] = from_float<T>(__fmul_rn(to_float(act), to_float(r.up[i])));
  }
}

// round(v) to T, back in fp32: what a separate ATen multiply or add stores.
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  return to_float(from_float<T>(v));
}

template <typename T, bool NEOX>
__global__ void __launch_bounds__(kThreads)
    rotary_kernel(T* __restrict__ x, int64_t token_stride, int64_t head_stride, int heads,
                  const T* __restrict__ cos, const T* __restrict__ sin, int64_t cs_stride,
                  int half) {
  const int64_t row = blockIdx.x;  // token * heads + head
  const int64_t token = row / heads;
  const int64_t head = row % heads;
  T* xr = x + token * token_stride + head * head_stride;
  const T* c = cos + token * cs_stride;
  const T* s = sin + token * cs_stride;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < half; i += gridDim.y * blockDim.x) {
    const int ia = NEOX ? i : 2 * i;
    const int ib = NEOX ? i + half : 2 * i + 1;
    const float a = to_float(xr[ia]);
    const float b = to_float(xr[ib]);
    const float a_cos = rounded<T>(__fmul_rn(a, to_float(c[ia])));
    const float b_sin = rounded<T>(__fmul_rn(b, to_float(s[ia])));
    const float b_cos = rounded<T>(__fmul_rn(b, to_float(c[ib])));
    const float a_sin = rounded<T>(__fmul_rn(a, to_float(s[ib])));
    xr[ia] = from_float<T>(__fsub_rn(a_cos, b_sin));
    xr[ib] = from_float<T>(__fadd_rn(b_cos, a_sin));
  }
}

dim3 grid_of(int64_t rows, int64_t n) {
  const int64_t slices = ceil_div(n < 1 ? 1 : n, kThreads);
  return dim3(static_cast<unsigned>(rows),
              static_cast<unsigned>(slices < kMaxGridY ? slices : kMaxGridY));
}

template <typename T>
cudaError_t gelu_typed(void* out, int64_t out_stride, const void* x, int64_t x_stride,
                       int64_t rows, int64_t d, bool tanh_approx, cudaStream_t stream) {
  auto* o = static_cast<T*>(out);
  const auto* in = static_cast<const T*>(x);
  const int dd = static_cast<int>(d);
  if (tanh_approx) {
    gelu_and_mul_kernel<T, true>
        <<<grid_of(rows, d), kThreads, 0, stream>>>(o, out_stride, in, x_stride, dd);
  } else {
    gelu_and_mul_kernel<T, false>
        <<<grid_of(rows, d), kThreads, 0, stream>>>(o, out_stride, in, x_stride, dd);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t rotary_typed(void* x, int64_t token_stride, int64_t head_stride, int64_t tokens,
                         int64_t heads, const void* cos, const void* sin, int64_t cs_stride,
                         int64_t rot, bool is_neox, cudaStream_t stream) {
  auto* xp = static_cast<T*>(x);
  const auto* c = static_cast<const T*>(cos);
  const auto* s = static_cast<const T*>(sin);
  const int half = static_cast<int>(rot / 2);
  const dim3 grid = grid_of(tokens * heads, half);
  const int h = static_cast<int>(heads);
  if (is_neox) {
    rotary_kernel<T, true>
        <<<grid, kThreads, 0, stream>>>(xp, token_stride, head_stride, h, c, s, cs_stride, half);
  } else {
    rotary_kernel<T, false>
        <<<grid, kThreads, 0, stream>>>(xp, token_stride, head_stride, h, c, s, cs_stride, half);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t gelu_and_mul(void* out, int64_t out_row_stride, const void* x, int64_t x_row_stride,
                         int64_t rows, int64_t d, bool tanh_approx, DType dtype,
                         cudaStream_t stream) {
  return dispatch_rows(rows, d, dtype, [&](auto tag) {
    return gelu_typed<decltype(tag)>(out, out_row_stride, x, x_row_stride, rows, d, tanh_approx,
                                     stream);
  });
}

cudaError_t rotary_embedding(void* x, int64_t token_stride, int64_t head_stride, int64_t tokens,
                             int64_t heads, const void* cos, const void* sin,
                             int64_t cs_token_stride, int64_t rotary_dim, bool is_neox,
                             DType dtype, cudaStream_t stream) {
  if (tokens < 0 || heads < 0 || tokens * heads > kMaxRows || rotary_dim < 0 ||
      rotary_dim % 2 != 0 || rotary_dim > kMaxHidden) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0 || heads == 0 || rotary_dim == 0) {
    return cudaSuccess;
  }
  return dispatch_dtype(dtype, [&](auto tag) {
    return rotary_typed<decltype(tag)>(x, token_stride, head_stride, tokens, heads, cos, sin,
                                       cs_token_stride, rotary_dim, is_neox, stream);
  });
}

}  // namespace vllm_ir_cuda
