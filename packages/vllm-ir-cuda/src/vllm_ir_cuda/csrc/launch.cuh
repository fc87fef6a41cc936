// The host side every launcher shares: the extent a launch accepts, and the
// one switch from DType to the element type.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "layernorm.h"

namespace vllm_ir_cuda {

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
