// Element types, their fp32 conversions and 128-bit vectors of them.
//
// Conversions are explicit intrinsics: torch builds CUDA sources with
// __CUDA_NO_HALF_CONVERSIONS__ and friends, which remove the implicit ones.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace vllm_ir_cuda {

template <typename T>
struct Convert;

template <>
struct Convert<float> {
  static __device__ __forceinline__ float to_float(float v) { return v; }
  static __device__ __forceinline__ float from_float(float v) { return v; }
};

template <>
struct Convert<__half> {
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

template <>
struct Convert<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) {
    return __bfloat162float(v);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) {
    return __float2bfloat16_rn(v);
  }
};

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return Convert<T>::to_float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return Convert<T>::from_float(v);
}

// N elements loaded or stored with one instruction: 16 bytes (ld.global.v4)
// when N * sizeof(T) == 16, one element when N == 1.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T data[N];
};

// Elements per 128-bit access.
template <typename T>
constexpr int kVecWidth = 16 / static_cast<int>(sizeof(T));

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// The rows a gated activation (silu_and_mul, gelu_and_mul) of this thread
// block works on: x's row holds the gate, then `d` elements later the up
// projection; out's row receives act(gate) * up.
template <typename T>
struct GatedRow {
  const T* gate;
  const T* up;
  T* out;
};

template <typename T>
__device__ __forceinline__ GatedRow<T> gated_row(T* out, int64_t out_stride, const T* x,
                                                 int64_t x_stride, int d) {
  const int64_t row = blockIdx.x;
  const T* gate = x + row * x_stride;
  return {gate, gate + d, out + row * out_stride};
}

// The loop of a gated activation over this block's row, VEC elements per access:
// out = round(round(act(gate)) * up), act in fp32, every rounding where ATen's
// separate kernels store. The block strides over the row in grid.y slices.
template <typename T, int VEC, typename Act>
__device__ __forceinline__ void gated_and_mul_row(T* out, int64_t out_stride, const T* x,
                                                  int64_t x_stride, int d, Act act) {
  const GatedRow<T> r = gated_row(out, out_stride, x, x_stride, d);
  const int num_vecs = d / VEC;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < num_vecs;
       i += gridDim.y * blockDim.x) {
    const Vec<T, VEC> g = load_vec<T, VEC>(r.gate + i * VEC);
    const Vec<T, VEC> u = load_vec<T, VEC>(r.up + i * VEC);
    Vec<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const T a = from_float<T>(act(to_float(g.data[j])));
      o.data[j] = from_float<T>(__fmul_rn(to_float(a), to_float(u.data[j])));
    }
    store_vec(r.out + i * VEC, o);
  }
}

}  // namespace vllm_ir_cuda
