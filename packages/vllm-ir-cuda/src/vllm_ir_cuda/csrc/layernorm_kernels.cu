// RMSNorm and fused residual-add + RMSNorm: one thread block per row.
//
// Semantics are those of vllm_ir.ops.layernorm (the native functions):
// squares are summed in fp32, the normalized value is rounded to the input
// dtype *before* it is multiplied by the weight, and the fused kernel rounds
// the residual sum to the dtype, stores it, and normalizes that rounded sum.
//
// Each thread handles the elements (or 128-bit vectors of them) i, i + B,
// i + 2B, ... of its row, B = blockDim.x. When a row fits in at most
// kMaxCachedVecs vectors per thread they stay in registers between the sum
// and the scaling pass; longer rows are read a second time (from L1/L2).
// The block size depends only on the row length and the dtype, never on the
// number of rows, so a row's result does not depend on the batch it is in.
//
// vllm_fused_add_rms_norm_kernel is vLLM's numerics: it stores the same rounded
// sum but normalizes the fp32 sum, kept in registers (cached rows) or recomputed
// from x and the old residual in the second pass (long rows: the first pass then
// stores nothing, so both inputs are still there to read).
//
// With QUANT, the normalized row (the value the plain kernel would store) is
// quantized to FP8 with a static scale (fp8.cuh) into a separate uint8 output
// instead: rms_norm_static_fp8_quant and fused_add_rms_norm_static_fp8_quant.

#include <cstdint>

#include "dtype.cuh"
#include "fp8.cuh"
#include "launch.cuh"
#include "layernorm.h"
#include "reduce.cuh"

namespace vllm_ir_cuda {
namespace {

constexpr int kMaxThreads = 1024;
// Vectors a thread keeps in registers between the two passes (4 x 16 bytes).
constexpr int kMaxCachedVecs = 4;
// Block size the planner aims for before caching more vectors per thread.
constexpr int kTargetThreads = 512;
// Rows of at least this many vectors get two or more per thread: on the H200
// (bf16, 16384 rows) rms_norm at hidden 4096 went from 0.79 of a copy's
// bandwidth (512 threads x 1 vector) to 0.93 (256 x 2); at 8192, 512 x 2 gave
// 0.89 and 256 x 4 0.77.
constexpr int64_t kTwoVecsFrom = 256;

template <typename T, int N>
__device__ __forceinline__ float sum_of_squares(const Vec<T, N>& v) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float f = to_float(v.data[j]);
    s += f * f;
  }
  return s;
}

// x * inv_rms rounded to T, then times the weight (rounded again), like
// `(x.float() * rsqrt(var + eps)).to(T) * weight`.
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> normalize(const Vec<T, N>& v, float inv_rms,
                                               const T* __restrict__ weight, int offset) {
  Vec<T, N> out;
  if (weight != nullptr) {
    const Vec<T, N> w = load_vec<T, N>(weight + offset);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const T y = from_float<T>(to_float(v.data[j]) * inv_rms);
      out.data[j] = from_float<T>(to_float(y) * to_float(w.data[j]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      out.data[j] = from_float<T>(to_float(v.data[j]) * inv_rms);
    }
  }
  return out;
}

// Stores a normalized vector: as T, or (QUANT) as FP8 bits of it divided by `scale`.
template <bool QUANT, typename T, int N>
__device__ __forceinline__ void store_out(void* out_row, int offset, const Vec<T, N>& v,
                                          const Fp8Scale& scale) {
  if constexpr (QUANT) {
    Vec<uint8_t, N> q;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      q.data[j] = scale.quantize(to_float(v.data[j]));
    }
    store_vec(static_cast<uint8_t*>(out_row) + offset, q);
  } else {
    store_vec(static_cast<T*>(out_row) + offset, v);
  }
}

template <bool QUANT, typename T>
constexpr int64_t out_size() {
  return QUANT ? 1 : static_cast<int64_t>(sizeof(T));
}

__device__ __forceinline__ float load_scale(const float* scale) {
  return scale != nullptr ? *scale : 1.0f;
}

__device__ __forceinline__ float inverse_rms(float sum_sq, int hidden, float epsilon) {
  const float variance = block_sum(sum_sq) / static_cast<float>(hidden);
  return rsqrtf(variance + epsilon);
}

// residual[i] = round(x[i] + residual[i]); returns the stored sum.
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> add_residual(const T* x, T* residual) {
  const Vec<T, VEC> a = load_vec<T, VEC>(x);
  const Vec<T, VEC> r = load_vec<T, VEC>(residual);
  Vec<T, VEC> s;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    s.data[j] = from_float<T>(to_float(a.data[j]) + to_float(r.data[j]));
  }
  store_vec(residual, s);
  return s;
}

// One row, pass one: x's vector i, or (ADD) the rounded sum x + residual,
// stored into residual first.
template <typename T, int VEC, bool ADD>
__device__ __forceinline__ Vec<T, VEC> row_vec(const T* x_row, T* residual_row, int i) {
  if constexpr (ADD) {
    return add_residual<T, VEC>(x_row + i * VEC, residual_row + i * VEC);
  } else {
    return load_vec<T, VEC>(x_row + i * VEC);
  }
}

// rms_norm of each row of x into out (`out` may alias `x` exactly: every
// element is read and then written by the same thread, so neither pointer is
// __restrict__). With ADD, in place: the sum x + residual goes to `residual`
// and its normalization to `out` (`x` itself unless QUANT; each element of x
// is read before the same thread writes it); the second pass re-reads the
// stored (rounded) sum, written by the same thread. Without ADD, `residual`
// is unused.
template <typename T, int VEC, int CACHE, bool QUANT, bool ADD>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_kernel(void* out, int64_t out_stride, const T* x, int64_t x_stride, T* residual,
                    int64_t residual_stride, const T* __restrict__ weight,
                    const float* __restrict__ scale_ptr, int hidden, float epsilon) {
  const int64_t row = blockIdx.x;
  const T* x_row = x + row * x_stride;
  T* residual_row = ADD ? residual + row * residual_stride : nullptr;
  // what the scaling pass reads when the row is not cached: x, or the stored sum
  const T* normed_row = ADD ? residual_row : x_row;
  void* out_row = static_cast<char*>(out) + row * out_stride * out_size<QUANT, T>();
  const int num_vecs = hidden / VEC;
  const Fp8Scale scale(load_scale(scale_ptr));

  float sum_sq = 0.0f;
  if constexpr (CACHE > 0) {
    Vec<T, VEC> cached[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) {
        cached[k] = row_vec<T, VEC, ADD>(x_row, residual_row, i);
        sum_sq += sum_of_squares(cached[k]);
      }
    }
    const float inv_rms = inverse_rms(sum_sq, hidden, epsilon);
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) {
        store_out<QUANT>(out_row, i * VEC, normalize(cached[k], inv_rms, weight, i * VEC),
                         scale);
      }
    }
  } else {
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
      sum_sq += sum_of_squares(row_vec<T, VEC, ADD>(x_row, residual_row, i));
    }
    const float inv_rms = inverse_rms(sum_sq, hidden, epsilon);
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
      const Vec<T, VEC> v = load_vec<T, VEC>(normed_row + i * VEC);
      store_out<QUANT>(out_row, i * VEC, normalize(v, inv_rms, weight, i * VEC), scale);
    }
  }
}

// The fp32 sums of x and residual's vector i (rounded into residual when STORE).
template <typename T, int VEC, bool STORE>
__device__ __forceinline__ void fp32_sums(const T* x_row, T* residual_row, int i,
                                          float (&s)[VEC]) {
  const Vec<T, VEC> a = load_vec<T, VEC>(x_row + i * VEC);
  const Vec<T, VEC> r = load_vec<T, VEC>(residual_row + i * VEC);
  Vec<T, VEC> rounded;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    s[j] = to_float(a.data[j]) + to_float(r.data[j]);
    rounded.data[j] = from_float<T>(s[j]);
  }
  if constexpr (STORE) {
    store_vec(residual_row + i * VEC, rounded);
  }
}

// normalize() of fp32 values: round(round(s * inv_rms) * weight).
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> normalize_fp32(const float (&s)[VEC], float inv_rms,
                                                      const T* __restrict__ weight, int offset) {
  Vec<T, VEC> out;
  if (weight != nullptr) {
    const Vec<T, VEC> w = load_vec<T, VEC>(weight + offset);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const T y = from_float<T>(s[j] * inv_rms);
      out.data[j] = from_float<T>(to_float(y) * to_float(w.data[j]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      out.data[j] = from_float<T>(s[j] * inv_rms);
    }
  }
  return out;
}

// In place, vLLM's numerics: residual = round(x + residual), x = rms_norm of the fp32 sum.
template <typename T, int VEC, int CACHE>
__global__ void __launch_bounds__(kMaxThreads)
    vllm_fused_add_rms_norm_kernel(T* x, int64_t x_stride, T* residual, int64_t residual_stride,
                                   const T* __restrict__ weight, int hidden, float epsilon) {
  const int64_t row = blockIdx.x;
  T* x_row = x + row * x_stride;
  T* residual_row = residual + row * residual_stride;
  const int num_vecs = hidden / VEC;
  float sum_sq = 0.0f;
  if constexpr (CACHE > 0) {
    float cached[CACHE][VEC];
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) {
        fp32_sums<T, VEC, true>(x_row, residual_row, i, cached[k]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum_sq += cached[k][j] * cached[k][j];
      }
    }
    const float inv_rms = inverse_rms(sum_sq, hidden, epsilon);
#pragma unroll
    for (int k = 0; k < CACHE; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < num_vecs) {
        store_vec(x_row + i * VEC, normalize_fp32<T, VEC>(cached[k], inv_rms, weight, i * VEC));
      }
    }
  } else {
    float s[VEC];
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
      fp32_sums<T, VEC, false>(x_row, residual_row, i, s);
#pragma unroll
      for (int j = 0; j < VEC; ++j) sum_sq += s[j] * s[j];
    }
    const float inv_rms = inverse_rms(sum_sq, hidden, epsilon);
    for (int i = threadIdx.x; i < num_vecs; i += blockDim.x) {
      fp32_sums<T, VEC, true>(x_row, residual_row, i, s);  // this thread's own elements
      store_vec(x_row + i * VEC, normalize_fp32<T, VEC>(s, inv_rms, weight, i * VEC));
    }
  }
}

// -- launch planning (host) ----------------------------------------------

struct LaunchPlan {
  int cache;    // vectors per thread kept in registers; 0: read the row twice
  int threads;  // a multiple of 32, at most kMaxThreads
};

// Depends on the row length only (never on the row count): batch invariance.
LaunchPlan plan(int64_t num_vecs, bool vectorized) {
  if (vectorized) {
    int cache = num_vecs >= kTwoVecsFrom ? 2 : 1;
    while (cache < kMaxCachedVecs && ceil_div(num_vecs, cache) > kTargetThreads) {
      cache *= 2;
    }
    const int64_t threads = ceil_div(num_vecs, cache);
    if (threads <= kMaxThreads) {
      return {cache, round_up_to_warp(threads)};
    }
    return {0, kMaxThreads};
  }
  return {0, num_vecs >= kMaxThreads ? kMaxThreads : round_up_to_warp(num_vecs)};
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// 128-bit accesses need every row of every tensor on a 16-byte boundary.
// Strides are checked even for a single row, so that whether a row takes the
// vector path does not depend on how many rows are launched with it.
template <typename T>
bool can_vectorize(int64_t hidden, const void* a, int64_t a_stride, const void* b,
                   int64_t b_stride, const void* weight) {
  constexpr int kVec = kVecWidth<T>;
  return hidden % kVec == 0 && a_stride % kVec == 0 && b_stride % kVec == 0 && aligned16(a) &&
         aligned16(b) && (weight == nullptr || aligned16(weight));
}

// One kernel template per (vector width, cache depth): the plan picks it.
template <typename T, int VEC, bool QUANT, bool ADD>
void launch_rms_norm(const LaunchPlan& p, void* out, int64_t out_stride, const T* x,
                     int64_t x_stride, T* residual, int64_t residual_stride, const T* weight,
                     const float* scale, int64_t rows, int hidden, float epsilon,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows));
  const dim3 block(p.threads);
#define VLLM_IR_RMS_NORM(CACHE)                                                      \
  rms_norm_kernel<T, VEC, CACHE, QUANT, ADD><<<grid, block, 0, stream>>>(           \
      out, out_stride, x, x_stride, residual, residual_stride, weight, scale, hidden, \
      epsilon)
  if constexpr (VEC > 1) {
    switch (p.cache) {
      case 1:
        VLLM_IR_RMS_NORM(1);
        return;
      case 2:
        VLLM_IR_RMS_NORM(2);
        return;
      case 4:
        VLLM_IR_RMS_NORM(4);
        return;
      default:
        break;
    }
  }
  VLLM_IR_RMS_NORM(0);
#undef VLLM_IR_RMS_NORM
}

// `out` holds T (or, QUANT, FP8 bytes): its alignment needs are those of
// VEC of its elements; requiring 16 bytes for every pointer keeps one rule.
template <typename T, bool QUANT, bool ADD>
cudaError_t rms_norm_typed(void* out, int64_t out_stride, const void* x, int64_t x_stride,
                           void* residual, int64_t residual_stride, const void* weight,
                           const float* scale, int64_t rows, int64_t hidden, float epsilon,
                           cudaStream_t stream) {
  constexpr int kVec = kVecWidth<T>;
  const bool vectorized =
      can_vectorize<T>(hidden, out, out_stride, x, x_stride, weight) &&
      (!ADD || can_vectorize<T>(hidden, x, x_stride, residual, residual_stride, weight));
  const LaunchPlan p = plan(vectorized ? hidden / kVec : hidden, vectorized);
  const auto* xs = static_cast<const T*>(x);
  auto* rs = static_cast<T*>(residual);
  const auto* w = static_cast<const T*>(weight);
  const int h = static_cast<int>(hidden);
  if (vectorized) {
    launch_rms_norm<T, kVec, QUANT, ADD>(p, out, out_stride, xs, x_stride, rs, residual_stride,
                                         w, scale, rows, h, epsilon, stream);
  } else {
    launch_rms_norm<T, 1, QUANT, ADD>(p, out, out_stride, xs, x_stride, rs, residual_stride, w,
                                      scale, rows, h, epsilon, stream);
  }
  return cudaGetLastError();
}

// The four entry points: rms_norm (ADD: with the residual add first), the
// result as T or (QUANT) FP8.
template <bool QUANT, bool ADD>
cudaError_t rms_norm_dispatch(void* out, int64_t out_row_stride, const void* x,
                              int64_t x_row_stride, void* residual, int64_t residual_row_stride,
                              const void* weight, const float* scale, int64_t rows,
                              int64_t hidden, float epsilon, DType dtype, cudaStream_t stream) {
  return dispatch_rows(rows, hidden, dtype, [&](auto tag) {
    return rms_norm_typed<decltype(tag), QUANT, ADD>(out, out_row_stride, x, x_row_stride,
                                                     residual, residual_row_stride, weight,
                                                     scale, rows, hidden, epsilon, stream);
  });
}

template <typename T, int VEC>
void launch_vllm_fused(const LaunchPlan& p, T* x, int64_t x_stride, T* residual,
                       int64_t residual_stride, const T* weight, int64_t rows, int hidden,
                       float epsilon, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows));
  const dim3 block(p.threads);
#define VLLM_IR_VLLM_FUSED(CACHE)                                                          \
  vllm_fused_add_rms_norm_kernel<T, VEC, CACHE><<<grid, block, 0, stream>>>(              \
      x, x_stride, residual, residual_stride, weight, hidden, epsilon)
  if constexpr (VEC > 1) {
    switch (p.cache) {
      case 1:
        VLLM_IR_VLLM_FUSED(1);
        return;
      case 2:
        VLLM_IR_VLLM_FUSED(2);
        return;
      case 4:
        VLLM_IR_VLLM_FUSED(4);
        return;
      default:
        break;
    }
  }
  VLLM_IR_VLLM_FUSED(0);
#undef VLLM_IR_VLLM_FUSED
}

}  // namespace

cudaError_t vllm_fused_add_rms_norm(void* x, int64_t x_row_stride, void* residual,
                                    int64_t residual_row_stride, const void* weight,
                                    int64_t rows, int64_t hidden, float epsilon, DType dtype,
                                    cudaStream_t stream) {
  return dispatch_rows(rows, hidden, dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = kVecWidth<T>;
    const bool vectorized =
        can_vectorize<T>(hidden, x, x_row_stride, residual, residual_row_stride, weight);
    const LaunchPlan p = plan(vectorized ? hidden / kVec : hidden, vectorized);
    auto* xs = static_cast<T*>(x);
    auto* rs = static_cast<T*>(residual);
    const auto* w = static_cast<const T*>(weight);
    const int h = static_cast<int>(hidden);
    if (vectorized) {
      launch_vllm_fused<T, kVec>(p, xs, x_row_stride, rs, residual_row_stride, w, rows, h,
                                 epsilon, stream);
    } else {
      launch_vllm_fused<T, 1>(p, xs, x_row_stride, rs, residual_row_stride, w, rows, h, epsilon,
                              stream);
    }
    return cudaGetLastError();
  });
}

cudaError_t rms_norm(void* out, int64_t out_row_stride, const void* x, int64_t x_row_stride,
                     const void* weight, int64_t rows, int64_t hidden, float epsilon,
                     DType dtype, cudaStream_t stream) {
  return rms_norm_dispatch<false, false>(out, out_row_stride, x, x_row_stride, nullptr, 0, weight,
                                         nullptr, rows, hidden, epsilon, dtype, stream);
}

cudaError_t fused_add_rms_norm(void* x, int64_t x_row_stride, void* residual,
                               int64_t residual_row_stride, const void* weight, int64_t rows,
                               int64_t hidden, float epsilon, DType dtype, cudaStream_t stream) {
  return rms_norm_dispatch<false, true>(x, x_row_stride, x, x_row_stride, residual,
                                        residual_row_stride, weight, nullptr, rows, hidden,
                                        epsilon, dtype, stream);
}

cudaError_t rms_norm_static_fp8_quant(void* out, int64_t out_row_stride, const void* x,
                                      int64_t x_row_stride, const void* weight,
                                      const float* scale, int64_t rows, int64_t hidden,
                                      float epsilon, DType dtype, cudaStream_t stream) {
  if (scale == nullptr) {
    return cudaErrorInvalidValue;
  }
  return rms_norm_dispatch<true, false>(out, out_row_stride, x, x_row_stride, nullptr, 0, weight,
                                        scale, rows, hidden, epsilon, dtype, stream);
}

cudaError_t fused_add_rms_norm_static_fp8_quant(void* out, int64_t out_row_stride,
                                                const void* x, int64_t x_row_stride,
                                                void* residual, int64_t residual_row_stride,
                                                const void* weight, const float* scale,
                                                int64_t rows, int64_t hidden, float epsilon,
                                                DType dtype, cudaStream_t stream) {
  if (scale == nullptr) {
    return cudaErrorInvalidValue;
  }
  return rms_norm_dispatch<true, true>(out, out_row_stride, x, x_row_stride, residual,
                                       residual_row_stride, weight, scale, rows, hidden, epsilon,
                                       dtype, stream);
}

}  // namespace vllm_ir_cuda
