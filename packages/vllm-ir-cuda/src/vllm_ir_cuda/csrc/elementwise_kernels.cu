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
// per row reduces it, then quantizes the row it kept in registers.
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
constexpr int kMaxReduceThreads = 1024;

dim3 elementwise_grid(int64_t rows, int64_t num_vecs) {
  return row_slices_grid(rows, num_vecs, kElementwiseThreads);
}

__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, 1.0f + expf(-g)); }

template <typename T, int VEC>
__global__ void __launch_bounds__(kElementwiseThreads)
    silu_and_mul_kernel(T* __restrict__ out, int64_t out_stride, const T* __restrict__ x,
                        int64_t x_stride, int d) {
  gated_and_mul_row<T, VEC>(out, out_stride, x, x_stride, d, [](float g) { return silu(g); });
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

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(fabsf(v)); }

template <typename T, int VEC>
__device__ __forceinline__ uint32_t vec_amax_bits(const Vec<T, VEC>& v, uint32_t amax_bits) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const uint32_t bits = abs_bits(to_float(v.data[j]));
    amax_bits = bits > amax_bits ? bits : amax_bits;
  }
  return amax_bits;
}

template <typename T, int VEC>
__device__ __forceinline__ void quantize_vec(uint8_t* q, const Vec<T, VEC>& v,
                                             const Fp8Scale& scale) {
  Vec<uint8_t, VEC> out;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    out.data[j] = scale.quantize(to_float(v.data[j]));
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
  const Fp8Scale scale(*scale_ptr);
  const int num_vecs = hidden / VEC;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < num_vecs;
       i += gridDim.y * blockDim.x) {
    quantize_vec<T, VEC>(out_row + i * VEC, load_vec<T, VEC>(x_row + i * VEC), scale);
  }
}

// Vectors a thread of the dynamic quantization keeps in registers (at most
// kMaxCachedVecs, as few as keep the block at kTargetReduceThreads), in blocks of
// at most kMaxCachedThreads (which leaves room for the registers); longer rows
// are read twice by 1024 threads. Depends on the row length only.
constexpr int kMaxCachedVecs = 8;
constexpr int kTargetReduceThreads = 256;
constexpr int kMaxCachedThreads = 512;

// One block per row. With CACHE > 0 a thread keeps its CACHE vectors of the
// row in registers between the amax and the quantization; with CACHE == 0
// the row is read twice (the second time mostly from L1/L2).
template <typename T, int VEC, int CACHE>
__global__ void __launch_bounds__(CACHE > 0 ? kMaxCachedThreads : kMaxReduceThreads)
    dynamic_quant_kernel(uint8_t* __restrict__ out, int64_t out_stride,
                         float* __restrict__ scales, const T* __restrict__ x, int64_t x_stride,
                         const float* __restrict__ scale_ub, int hidden) {
  const int64_t row = blockIdx.x;
  const T* x_row = x + row * x_stride;
  uint8_t* out_row = out + row * out_stride;
  const int num_vecs = hidden / VEC;

  uint32_t amax_bits = 0u;
  Vec<T, VEC> cached[CACHE > 0 ? CACHE : 1];
  if constexpr (CACHE > 0) {
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) {
        cached[k] = load_vec<T, VEC>(x_row + i * VEC);
        amax_bits = vec_amax_bits(cached[k], amax_bits);
      }
    }
  } else {
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
      amax_bits = vec_amax_bits(load_vec<T, VEC>(x_row + i * VEC), amax_bits);
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
  const Fp8Scale divisor(scale);
  if constexpr (CACHE > 0) {
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) {
        quantize_vec<T, VEC>(out_row + i * VEC, cached[k], divisor);
      }
    }
  } else {
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
      quantize_vec<T, VEC>(out_row + i * VEC, load_vec<T, VEC>(x_row + i * VEC), divisor);
    }
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
  const int threads = round_up_to_warp(num_vecs);
  return threads < kMaxReduceThreads ? threads : kMaxReduceThreads;
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

template <typename T, int VEC>
void launch_dynamic(uint8_t* out, int64_t out_stride, float* scales, const T* x,
                    int64_t x_stride, const float* scale_ub, int64_t rows, int hidden,
                    cudaStream_t stream) {
  const int64_t num_vecs = hidden / VEC;
  const int max_cache = VEC == 1 ? kMaxCachedVecs / 2 : kMaxCachedVecs;
  int cache = 1;
  while (cache < max_cache && ceil_div(num_vecs, cache) > kTargetReduceThreads) {
    cache *= 2;
  }
  const dim3 grid(static_cast<unsigned>(rows));
  const int64_t threads = ceil_div(num_vecs, cache);
  const int block = reduce_threads(threads);
#define VLLM_IR_DYNAMIC(CACHE)                                              \
  dynamic_quant_kernel<T, VEC, CACHE><<<grid, block, 0, stream>>>(out, out_stride, scales, x, \
                                                                  x_stride, scale_ub, hidden)
  if (threads > kMaxCachedThreads) {
    VLLM_IR_DYNAMIC(0);
  } else if (cache == 1) {
    VLLM_IR_DYNAMIC(1);
  } else if (cache == 2) {
    VLLM_IR_DYNAMIC(2);
  } else if (cache == 4 || VEC == 1) {
    VLLM_IR_DYNAMIC(4);
  } else if constexpr (VEC > 1) {  // 8 scalars would spill on sm_80; they never get here
    VLLM_IR_DYNAMIC(8);
  }
#undef VLLM_IR_DYNAMIC
}

template <typename T>
cudaError_t dynamic_quant_typed(void* out, int64_t out_stride, float* scales, const void* x,
                                int64_t x_stride, const float* scale_ub, int64_t rows,
                                int64_t hidden, cudaStream_t stream) {
  constexpr int kVec = kVecWidth<T>;
  auto* o = static_cast<uint8_t*>(out);
  const auto* in = static_cast<const T*>(x);
  const int h = static_cast<int>(hidden);
  if (vectorizable<T>(hidden, out_stride, out, x_stride, x)) {
    launch_dynamic<T, kVec>(o, out_stride, scales, in, x_stride, scale_ub, rows, h, stream);
  } else {
    launch_dynamic<T, 1>(o, out_stride, scales, in, x_stride, scale_ub, rows, h, stream);
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
