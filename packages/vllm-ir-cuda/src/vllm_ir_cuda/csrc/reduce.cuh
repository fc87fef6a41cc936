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

// The sum of `v` over the block, returned to every thread. blockDim.x must be
// a multiple of 32 (and at most 1024). The order of additions depends only on
// blockDim.x, so a row's result does not depend on the other rows launched.
// Callable once per kernel: the scratch space is not reset for a second use.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[kWarpSize];
  __shared__ float total;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;

  v = warp_sum(v);
  if (lane == 0) {
    warp_sums[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    float s = lane < num_warps ? warp_sums[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) {
      total = s;
    }
  }
  __syncthreads();
  return total;
}

}  // namespace vllm_ir_cuda
