// gelu_and_mul and rotary_embedding: torch-free CUDA kernels, called from torch
// by binding.cpp (torch.ops.vllm_ir_cuda.gelu_and_mul / rotary_embedding).
//
// Semantics are those of vllm_ir.ops.activation.gelu_and_mul and
// vllm_ir.ops.rotary.rotary_embedding (the native functions):
//   * gelu_and_mul: ATen's float32 formulas, g * 0.5 * (1 + erf(g * M_SQRT1_2)) or
//     0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3))), rounded to the dtype,
//     times `up`, rounded again (erff/tanhf may differ from ATen's CUDA kernel by
//     an fp32 ulp: within the op's tolerance);
//   * rotary_embedding, in place, a block per token, a thread per group of pairs
//     (128-bit accesses where aligned): a' = round(round(a * cos_a) - round(b * sin_a)), b' = round(round(b *
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

__device__ __forceinline__ float gelu_erf(float g) {
  return __fmul_rn(__fmul_rn(g, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(g, 0.70710678118654752f))));
}

__device__ __forceinline__ float gelu_tanh(float g) {
  const float cube = __fmul_rn(__fmul_rn(g, g), g);
  const float inner =
      __fmul_rn(0.79788456080286536f, __fadd_rn(g, __fmul_rn(0.044715f, cube)));
  return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
}

template <bool TANH>
__device__ __forceinline__ float gelu(float g) {
  return TANH ? gelu_tanh(g) : gelu_erf(g);
}

// VEC elements of the gate, of up and of out per access (128-bit when VEC > 1).
template <typename T, int VEC, bool TANH>
__global__ void __launch_bounds__(kThreads)
    gelu_and_mul_kernel(T* __restrict__ out, int64_t out_stride, const T* __restrict__ x,
                        int64_t x_stride, int d) {
  gated_and_mul_row<T, VEC>(out, out_stride, x, x_stride, d,
                            [](float g) { return gelu<TANH>(g); });
}

// round(v) to T, back in fp32: what a separate ATen multiply or add stores.
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  return to_float(from_float<T>(v));
}

// One rotated pair: a' = round(round(a * cos_a) - round(b * sin_a)),
// b' = round(round(b * cos_b) + round(a * sin_b)).
template <typename T>
__device__ __forceinline__ void rotate_pair(T& a, T& b, T cos_a, T sin_a, T cos_b, T sin_b) {
  const float fa = to_float(a);
  const float fb = to_float(b);
  const float a_cos = rounded<T>(__fmul_rn(fa, to_float(cos_a)));
  const float b_sin = rounded<T>(__fmul_rn(fb, to_float(sin_a)));
  const float b_cos = rounded<T>(__fmul_rn(fb, to_float(cos_b)));
  const float a_sin = rounded<T>(__fmul_rn(fa, to_float(sin_b)));
  a = from_float<T>(__fsub_rn(a_cos, b_sin));
  b = from_float<T>(__fadd_rn(b_cos, a_sin));
}

// A block per token (grid.x; grid.y splits a token with many heads): its threads
// stride over (head, group) items, a group being VEC consecutive channels.
// neox: group g holds channels [g*VEC, g*VEC + VEC), paired with the group
// rot/2 channels later (groups = half / VEC); gptj: VEC/2 adjacent pairs
// (groups = rot / VEC). With VEC == 1 every item is one pair, read element by
// element (any alignment). cos/sin rows are read once per head, from L1/L2
// after the first. Every element gets the same arithmetic on either path.
template <typename T, int VEC, bool NEOX>
__global__ void __launch_bounds__(kThreads)
    rotary_kernel(T* __restrict__ x, int64_t token_stride, int64_t head_stride, int heads,
                  const T* __restrict__ cos, const T* __restrict__ sin, int64_t cs_stride,
                  int half) {
  const int64_t token = blockIdx.x;
  T* xt = x + token * token_stride;
  const T* c = cos + token * cs_stride;
  const T* s = sin + token * cs_stride;
  const int groups = VEC == 1 ? half : (NEOX ? half / VEC : 2 * half / VEC);
  const int items = heads * groups;
  for (int w = blockIdx.y * blockDim.x + threadIdx.x; w < items; w += gridDim.y * blockDim.x) {
    const int head = w / groups;
    const int g = w - head * groups;
    T* xr = xt + head * head_stride;
    if constexpr (VEC == 1) {
      const int ia = NEOX ? g : 2 * g;
      const int ib = NEOX ? g + half : 2 * g + 1;
      T a = xr[ia];
      T b = xr[ib];
      rotate_pair(a, b, c[ia], s[ia], c[ib], s[ib]);
      xr[ia] = a;
      xr[ib] = b;
    } else if constexpr (NEOX) {
      const int ia = g * VEC;
      const int ib = ia + half;
      Vec<T, VEC> a = load_vec<T, VEC>(xr + ia);
      Vec<T, VEC> b = load_vec<T, VEC>(xr + ib);
      const Vec<T, VEC> ca = load_vec<T, VEC>(c + ia);
      const Vec<T, VEC> sa = load_vec<T, VEC>(s + ia);
      const Vec<T, VEC> cb = load_vec<T, VEC>(c + ib);
      const Vec<T, VEC> sb = load_vec<T, VEC>(s + ib);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        rotate_pair(a.data[j], b.data[j], ca.data[j], sa.data[j], cb.data[j], sb.data[j]);
      }
      store_vec(xr + ia, a);
      store_vec(xr + ib, b);
    } else {
      const int i0 = g * VEC;
      Vec<T, VEC> v = load_vec<T, VEC>(xr + i0);
      const Vec<T, VEC> cv = load_vec<T, VEC>(c + i0);
      const Vec<T, VEC> sv = load_vec<T, VEC>(s + i0);
#pragma unroll
      for (int j = 0; j < VEC; j += 2) {
        rotate_pair(v.data[j], v.data[j + 1], cv.data[j], sv.data[j], cv.data[j + 1],
                    sv.data[j + 1]);
      }
      store_vec(xr + i0, v);
    }
  }
}

dim3 grid_of(int64_t rows, int64_t n) { return row_slices_grid(rows, n, kThreads); }

template <typename T, int VEC>
void launch_gelu(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t rows, int d,
                 bool tanh_approx, cudaStream_t stream) {
  const dim3 grid = grid_of(rows, d / VEC);
  if (tanh_approx) {
    gelu_and_mul_kernel<T, VEC, true><<<grid, kThreads, 0, stream>>>(out, out_stride, x,
                                                                      x_stride, d);
  } else {
    gelu_and_mul_kernel<T, VEC, false><<<grid, kThreads, 0, stream>>>(out, out_stride, x,
                                                                       x_stride, d);
  }
}

template <typename T>
cudaError_t gelu_typed(void* out, int64_t out_stride, const void* x, int64_t x_stride,
                       int64_t rows, int64_t d, bool tanh_approx, cudaStream_t stream) {
  constexpr int kVec = kVecWidth<T>;
  auto* o = static_cast<T*>(out);
  const auto* in = static_cast<const T*>(x);
  const int dd = static_cast<int>(d);
  // the up half starts d elements after the gate: aligned when d is a multiple of kVec
  if (d % kVec == 0 && out_stride % kVec == 0 && x_stride % kVec == 0 && aligned16(out) &&
      aligned16(x)) {
    launch_gelu<T, kVec>(o, out_stride, in, x_stride, rows, dd, tanh_approx, stream);
  } else {
    launch_gelu<T, 1>(o, out_stride, in, x_stride, rows, dd, tanh_approx, stream);
  }
  return cudaGetLastError();
}

template <typename T, int VEC>
void launch_rotary(T* x, int64_t token_stride, int64_t head_stride, int64_t tokens, int heads,
                   const T* cos, const T* sin, int64_t cs_stride, int half, bool is_neox,
                   cudaStream_t stream) {
  const int64_t groups = VEC == 1 ? half : (is_neox ? half / VEC : 2 * half / VEC);
  const int64_t items = heads * groups;
  const dim3 grid = grid_of(tokens, items);
  const int threads = items < kThreads ? round_up_to_warp(items) : kThreads;
  if (is_neox) {
    rotary_kernel<T, VEC, true><<<grid, threads, 0, stream>>>(x, token_stride, head_stride,
                                                              heads, cos, sin, cs_stride, half);
  } else {
    rotary_kernel<T, VEC, false><<<grid, threads, 0, stream>>>(x, token_stride, head_stride,
                                                               heads, cos, sin, cs_stride, half);
  }
}

template <typename T>
cudaError_t rotary_typed(void* x, int64_t token_stride, int64_t head_stride, int64_t tokens,
                         int64_t heads, const void* cos, const void* sin, int64_t cs_stride,
                         int64_t rot, bool is_neox, cudaStream_t stream) {
  constexpr int kVec = kVecWidth<T>;
  auto* xp = static_cast<T*>(x);
  const auto* c = static_cast<const T*>(cos);
  const auto* s = static_cast<const T*>(sin);
  const int half = static_cast<int>(rot / 2);
  const int h = static_cast<int>(heads);
  // 128-bit groups need every group start on a 16-byte boundary: the bases,
  // the strides, and (neox) the offset of the second half
  const bool vectorized = (is_neox ? half % kVec == 0 : rot % kVec == 0) &&
                          token_stride % kVec == 0 && head_stride % kVec == 0 &&
                          cs_stride % kVec == 0 && aligned16(x) && aligned16(cos) &&
                          aligned16(sin);
  if (vectorized) {
    launch_rotary<T, kVec>(xp, token_stride, head_stride, tokens, h, c, s, cs_stride, half,
                           is_neox, stream);
  } else {
    launch_rotary<T, 1>(xp, token_stride, head_stride, tokens, h, c, s, cs_stride, half,
                        is_neox, stream);
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
  // a token's (head, pair) items are indexed with 32-bit integers
  if (tokens < 0 || heads < 0 || tokens * heads > kMaxRows || rotary_dim < 0 ||
      rotary_dim % 2 != 0 || rotary_dim > kMaxHidden || heads * (rotary_dim / 2) > kMaxRows) {
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
