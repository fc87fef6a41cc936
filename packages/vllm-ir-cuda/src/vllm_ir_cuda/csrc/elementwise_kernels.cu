// silu_and_mul, static FP8 quantization and dynamic per-token FP8 quantization.
//
// Semantics are those of vllm_ir.ops.activation and vllm_ir.ops.quant (the
// native functions) on CUDA, bit for bit: silu in float32 with expf and IEEE
// division, rounded to the dtype, times `up`, rounded again; quantization as
// in fp8.cuh; the dynamic scale as ATen computes `amax / 448` on CUDA.
//
// The elementwise kernels use a 2-D grid: x = the row, y = slices of it that
// the block strides over, so rows of any length and count fill the GPU with
// 128-bit accesses. Dynamic quantization needs the row's amax first: one block
// per row reduces it, then quantizes the row (read again, mostly from L1/L2).
// Nothing depends on the number of rows: every op here is batch invariant (a
// maximum is exact in any order).

#include <cstdint>

#include "dtype.cuh"
#include "fp8.cuh"
#include "launch.cuh"
#include "layernorm.h"
#include "reduce.cuh"

namespace vllm_ir_cuda {
namespace {

constexpr int kElementwiseThreads = 256;
constexpr int kMaxGridY = 65535;
constexpr int kMaxReduceThreads = 1024;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

dim3 elementwise_grid(int64_t rows, int64_t num_vecs) {
  const int64_t slices = ceil_div(num_vecs, kElementwiseThreads);
  return dim3(static_cast<unsigned>(rows),
              static_cast<unsigned>(slices < kMaxGridY ? (slices < 1 ? 1 : slices) : kMaxGridY));
}

__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, 1.0f + expf(-g)); }

template <typename T, int VEC>
__global__ void __launch_bounds__(kElementwiseThreads)
    silu_and_mul_kernel(T* __restrict__ out, int64_t out_stride, const T* __restrict__ x,
                        int64_t x_stride, int d) {
  const GatedRow<T> r = gated_row(out, out_stride, x, x_stride, d);
  const int num_vecs = d / VEC;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < num_vecs;
       i += gridDim.y * blockDim.x) {
    const Vec<T, VEC> g = load_vec<T, VEC>(r.gate + i * VEC);
    const Vec<T, VEC> u = load_vec<T, VEC>(r.up + i * VEC);
    Vec<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const T s = from_float<T>(silu(to_float(g.data[j])));
      o.data[j] = from_float<T>(to_float(s) * to_float(u.data[j]));
    }
    store_vec(r.out + i * VEC, o);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void quantize_vec(uint8_t* q, const T* x, float scale) {
  const Vec<T, VEC> v = load_vec<T, VEC>(x);
  Vec<uint8_t, VEC> out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    out.data[j] = quantize_fp8(to_float(v.data[j]), scale);
  }
  store_vec(q, out);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kElementwiseThreads)
    static_quant_kernel(uint8_t* __restrict__ out, int64_t out_stride, const T* __restrict__ x,
                        int64_t x_stride, const float* __restrict__ scale_ptr, int hidden) {
  const int64_t row = blockIdx.x;
  const T* x_row = x + row * x_stride;
  uint8_t* out_row = out + row * out_stride;
  const float scale = *scale_ptr;
  const int num_vecs = hidden / VEC;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < num_vecs;
       i += gridDim.y * blockDim.x) {
    quantize_vec<T, VEC>(out_row + i * VEC, x_row + i * VEC, scale);
  }
}

struct WarpMaxBits {
  __device__ __forceinline__ uint32_t operator()(uint32_t v) const {
    return __reduce_max_sync(kFullMask, v);
  }
};

// The maximum over the block of non-negative floats given as bit patterns
// (their order as unsigned integers is their order as floats, and a NaN's
// bits exceed infinity's: a NaN anywhere wins, as torch's amax propagates it).
// blockDim.x must be a multiple of 32. Callable once per kernel.
__device__ __forceinline__ uint32_t block_max_bits(uint32_t v) {
  return block_reduce(v, 0u, WarpMaxBits{});
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxReduceThreads)
    dynamic_quant_kernel(uint8_t* __restrict__ out, int64_t out_stride,
                         float* __restrict__ scales, const T* __restrict__ x, int64_t x_stride,
                         const float* __restrict__ scale_ub, int hidden) {
  const int64_t row = blockIdx.x;
  const T* x_row = x + row * x_stride;
  uint8_t* out_row = out + row * out_stride;
  const int num_vecs = hidden / VEC;

  uint32_t amax_bits = 0u;
  for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    const Vec<T, VEC> v = load_vec<T, VEC>(x_row + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const uint32_t bits = __float_as_uint(fabsf(to_float(v.data[j])));
      amax_bits = bits > amax_bits ? bits : amax_bits;
    }
  }
  float amax = __uint_as_float(block_max_bits(amax_bits));
  if (scale_ub != nullptr) {
    const float ub = *scale_ub;
    amax = (amax > ub || ub != ub) ? ub : amax;  // clamp(max=ub); a NaN bound gives NaN
  }
  float scale = amax * kInvFp8Max;  // ATen on CUDA: times the reciprocal of the scalar
  scale = scale < kMinDynamicScale ? kMinDynamicScale : scale;  // NaN stays NaN
  if (threadIdx.x == 0) {
    scales[row] = scale;
  }
  for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
    quantize_vec<T, VEC>(out_row + i * VEC, x_row + i * VEC, scale);
  }
}

// -- launches (host) ----------------------------------------------------------

template <typename T>
bool vectorizable(int64_t n, int64_t a_stride, const void* a, int64_t b_stride, const void* b) {
  constexpr int kVec = kVecWidth<T>;
  return n % kVec == 0 && a_stride % kVec == 0 && b_stride % kVec == 0 && aligned16(a) &&
         aligned16(b);
}

int reduce_threads(int64_t num_vecs) {
  const int64_t warps = ceil_div(num_vecs < 1 ? 1 : num_vecs, kWarpSize);
  const int64_t threads = warps * kWarpSize;
  return static_cast<int>(threads < kMaxReduceThreads ? threads : kMaxReduceThreads);
}

template <typename T>
cudaError_t silu_typed(void* out, int64_t out_stride, const void* x, int64_t x_stride,
                       int64_t rows, int64_t d, cudaStream_t stream) {
  constexpr int kVec = kVecWidth<T>;
  auto* o = static_cast<T*>(out);
  const auto* in = static_cast<const T*>(x);
  const int dd = static_cast<int>(d);
  // the up half starts d elements after the gate: it is aligned when d is a multiple of kVec
  if (vectorizable<T>(d, out_stride, out, x_stride, x)) {
    silu_and_mul_kernel<T, kVec><<<elementwise_grid(rows, d / kVec), kElementwiseThreads, 0,
                                   stream>>>(o, out_stride, in, x_stride, dd);
  } else {
    silu_and_mul_kernel<T, 1>
        <<<elementwise_grid(rows, d), kElementwiseThreads, 0, stream>>>(o, out_stride, in,
                                                                       x_stride, dd);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t static_quant_typed(void* out, int64_t out_stride, const void* x, int64_t x_stride,
                               const float* scale, int64_t rows, int64_t hidden,
                               cudaStream_t stream) {
  constexpr int kVec = kVecWidth<T>;
  auto* o = static_cast<uint8_t*>(out);
  const auto* in = static_cast<const T*>(x);
  const int h = static_cast<int>(hidden);
  if (vectorizable<T>(hidden, out_stride, out, x_stride, x)) {
    static_quant_kernel<T, kVec><<<elementwise_grid(rows, hidden / kVec), kElementwiseThreads,
                                   0, stream>>>(o, out_stride, in, x_stride, scale, h);
  } else {
    static_quant_kernel<T, 1><<<elementwise_grid(rows, hidden), kElementwiseThreads, 0,
                                stream>>>(o, out_stride, in, x_stride, scale, h);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t dynamic_quant_typed(void* out, int64_t out_stride, float* scales, const void* x,
                                int64_t x_stride, const float* scale_ub, int64_t rows,
                                int64_t hidden, cudaStream_t stream) {
  constexpr int kVec = kVecWidth<T>;
  auto* o = static_cast<uint8_t*>(out);
  const auto* in = static_cast<const T*>(x);
  const int h = static_cast<int>(hidden);
  const dim3 grid(static_cast<unsigned>(rows));
  if (vectorizable<T>(hidden, out_stride, out, x_stride, x)) {
    dynamic_quant_kernel<T, kVec><<<grid, reduce_threads(hidden / kVec), 0, stream>>>(
        o, out_stride, scales, in, x_stride, scale_ub, h);
  } else {
    dynamic_quant_kernel<T, 1><<<grid, reduce_threads(hidden), 0, stream>>>(
        o, out_stride, scales, in, x_stride, scale_ub, h);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t silu_and_mul(void* out, int64_t out_row_stride, const void* x, int64_t x_row_stride,
                         int64_t rows, int64_t d, DType dtype, cudaStream_t stream) {
  return dispatch_rows(rows, d, dtype, [&](auto tag) {
    return silu_typed<decltype(tag)>(out, out_row_stride, x, x_row_stride, rows, d, stream);
  });
}

cudaError_t static_scaled_fp8_quant(void* out, int64_t out_row_stride, const void* x,
                                    int64_t x_row_stride, const float* scale, int64_t rows,
                                    int64_t hidden, DType dtype, cudaStream_t stream) {
  if (scale == nullptr) {
    return cudaErrorInvalidValue;
  }
  return dispatch_rows(rows, hidden, dtype, [&](auto tag) {
    return static_quant_typed<decltype(tag)>(out, out_row_stride, x, x_row_stride, scale, rows,
                                             hidden, stream);
  });
}

cudaError_t dynamic_per_token_fp8_quant(void* out, int64_t out_row_stride, float* scales,
                                        const void* x, int64_t x_row_stride,
                                        const float* scale_ub, int64_t rows, int64_t hidden,
                                        DType dtype, cudaStream_t stream) {
  // a row of no elements has no amax (native raises)
  if (hidden == 0 || scales == nullptr) {
    return cudaErrorInvalidValue;
  }
  return dispatch_rows(rows, hidden, dtype, [&](auto tag) {
    return dynamic_quant_typed<decltype(tag)>(out, out_row_stride, scales, x, x_row_stride,
                                              scale_ub, rows, hidden, stream);
  });
}

}  // namespace vllm_ir_cuda
