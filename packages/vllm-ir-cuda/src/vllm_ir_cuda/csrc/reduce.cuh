// Warp and block sums of fp32 values.

#pragma once

#include <cuda_runtime.h>

namespace vllm_ir_cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

// `v` reduced over the block, returned to every thread: `warp_reduce(v)`
// combines the values of a warp (returned to every lane), then the first warp
// combines the warps' results (`identity` in the lanes past the last warp).
// blockDim.x must be a multiple of 32 (and at most 1024). The order of the
// combinations depends only on blockDim.x, so a row's result does not depend
// on the other rows launched. Callable once per kernel and type of `v`: the
// scratch space is not reset for a second use.
template <typename V, typename WarpReduce>
__device__ __forceinline__ V block_reduce(V v, V identity, WarpReduce warp_reduce) {
  __shared__ V partial[kWarpSize];
  __shared__ V total;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;

  v = warp_reduce(v);
  if (lane == 0) {
    partial[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    V r = lane < num_warps ? partial[lane] : identity;
    r = warp_reduce(r);
    if (lane == 0) {
      total = r;
    }
  }
  __syncthreads();
  return total;
}

struct WarpSum {
  __device__ __forceinline__ float operator()(float v) const { return warp_sum(v); }
};

// The sum of `v` over the block (block_reduce).
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, 0.0f, WarpSum{}); }

}  // namespace vllm_ir_cuda
