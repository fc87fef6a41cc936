// The host side every launcher shares: the extent a launch accepts, grid and
// alignment arithmetic, and the one switch from DType to the element type.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "layernorm.h"

namespace vllm_ir_cuda {

// The largest grid.y a launch may ask for.
constexpr int kMaxGridY = 65535;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether a pointer allows 128-bit (16-byte) vector accesses.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// `n` threads rounded up to whole warps (one warp for n <= 0).
inline int round_up_to_warp(int64_t n) {
  const int64_t warps = ceil_div(n < 1 ? 1 : n, 32);
  return static_cast<int>(warps * 32);
}

// `rows` rows (grid.x) by as many slices of `threads` as `n` needs (grid.y, at
// least 1, at most kMaxGridY: the block strides over the rest).
inline dim3 row_slices_grid(int64_t rows, int64_t n, int threads) {
  const int64_t slices = ceil_div(n < 1 ? 1 : n, threads);
  return dim3(static_cast<unsigned>(rows),
              static_cast<unsigned>(slices < kMaxGridY ? slices : kMaxGridY));
}

// `rows` rows of `n` elements: within what the kernels index (layernorm.h).
inline bool valid_extent(int64_t rows, int64_t n) {
  return rows >= 0 && n >= 0 && rows <= kMaxRows && n <= kMaxHidden;
}

// `launch(T{})` for dtype's element type T (float, __half, __nv_bfloat16):
// its status, or cudaErrorInvalidValue for a dtype outside DType.
template <typename Launch>
cudaError_t dispatch_dtype(DType dtype, Launch&& launch) {
  switch (dtype) {
    case DType::kFloat32:
      return launch(float{});
    case DType::kFloat16:
      return launch(__half{});
    case DType::kBFloat16:
      return launch(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// The frame of a launcher over `rows` rows of `n` elements:
// cudaErrorInvalidValue beyond valid_extent, nothing to do (cudaSuccess) when
// empty, else dispatch_dtype(dtype, launch).
template <typename Launch>
cudaError_t dispatch_rows(int64_t rows, int64_t n, DType dtype, Launch&& launch) {
  if (!valid_extent(rows, n)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || n == 0) {
    return cudaSuccess;
  }
  return dispatch_dtype(dtype, launch);
}

}  // namespace vllm_ir_cuda
