// Launchers of the kernels (RMSNorm, alone and with FP8 quantization, in
// layernorm_kernels.cu; silu_and_mul and FP8 quantization in
// elementwise_kernels.cu; gelu_and_mul and RoPE in gelu_rotary_kernels.cu): plain C++ over raw pointers, no torch.
//
// Every tensor is seen as `rows` rows of `hidden` contiguous elements; row r
// of a tensor starts `r * row_stride` elements after its base pointer. All
// tensors share one dtype. The launchers pick a vectorized (128-bit) or a
// scalar kernel from the pointers' alignment and the strides, and return the
// launch's status; they never synchronize.
//
// This header is parsed by the host compiler (the torch binding) as well as
// by nvcc, so it holds declarations only.

#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace vllm_ir_cuda {

enum class DType : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
};

// The largest row count one launch accepts (one thread block per row).
constexpr int64_t kMaxRows = 2147483647;
// The longest row: the kernels index a row with 32-bit integers, with room
// for a thread's index plus the block size.
constexpr int64_t kMaxHidden = int64_t{1} << 30;

// out[r, :] = rms_norm(x[r, :]) for r < rows:
//   y = float(x) * rsqrt(mean(float(x)^2) + epsilon), rounded to the dtype,
//   then multiplied by weight (if not null) and rounded again.
// `out` may equal `x` (same rows, same strides); it must not partially overlap.
cudaError_t rms_norm(void* out, int64_t out_row_stride, const void* x, int64_t x_row_stride,
                     const void* weight, int64_t rows, int64_t hidden, float epsilon,
                     DType dtype, cudaStream_t stream);

// In place, for r < rows:
//   residual[r, :] = x[r, :] + residual[r, :]   (rounded to the dtype)
//   x[r, :]        = rms_norm(residual[r, :])   (as above)
cudaError_t fused_add_rms_norm(void* x, int64_t x_row_stride, void* residual,
                               int64_t residual_row_stride, const void* weight, int64_t rows,
                               int64_t hidden, float epsilon, DType dtype, cudaStream_t stream);

// In place, vLLM's numerics, for r < rows:
//   residual[r, :] = x[r, :] + residual[r, :]   (rounded to the dtype)
//   x[r, :]        = rms_norm of the fp32 sum   (the sum before that rounding)
cudaError_t vllm_fused_add_rms_norm(void* x, int64_t x_row_stride, void* residual,
                                    int64_t residual_row_stride, const void* weight,
                                    int64_t rows, int64_t hidden, float epsilon, DType dtype,
                                    cudaStream_t stream);

// out[r, :] = fp8(rms_norm(x[r, :]) / *scale): the value rms_norm stores,
// divided by the float32 scale (a device pointer, one element), clamped to
// +-448 and rounded to float8_e4m3fn bits (uint8 `out`, rows of `hidden` bytes
// `out_row_stride` bytes apart).
cudaError_t rms_norm_static_fp8_quant(void* out, int64_t out_row_stride, const void* x,
                                      int64_t x_row_stride, const void* weight,
                                      const float* scale, int64_t rows, int64_t hidden,
                                      float epsilon, DType dtype, cudaStream_t stream);

// For r < rows: residual[r, :] = x[r, :] + residual[r, :] (rounded, in place),
// out[r, :] = fp8(rms_norm(residual[r, :]) / *scale) as above; x is only read.
cudaError_t fused_add_rms_norm_static_fp8_quant(void* out, int64_t out_row_stride,
                                                const void* x, int64_t x_row_stride,
                                                void* residual, int64_t residual_row_stride,
                                                const void* weight, const float* scale,
                                                int64_t rows, int64_t hidden, float epsilon,
                                                DType dtype, cudaStream_t stream);

// -- elementwise_kernels.cu ---------------------------------------------------

// out[r, :d] = round(round(silu(x[r, :d])) * x[r, d:2d]) with silu(g) = g / (1 + exp(-g))
// in float32, each product rounded to the dtype, as torch computes
// `F.silu(x[..., :d]) * x[..., d:]`.
cudaError_t silu_and_mul(void* out, int64_t out_row_stride, const void* x, int64_t x_row_stride,
                         int64_t rows, int64_t d, DType dtype, cudaStream_t stream);

// out[r, :] = fp8(x[r, :] / *scale) (uint8 `out` as above).
cudaError_t static_scaled_fp8_quant(void* out, int64_t out_row_stride, const void* x,
                                    int64_t x_row_stride, const float* scale, int64_t rows,
                                    int64_t hidden, DType dtype, cudaStream_t stream);

// Per row: amax = max |x[r, :]| (NaN if the row holds one), bounded by *scale_ub
// when not null; scales[r] = max(amax * float32(1/448), float32(1/(448*512))),
// as native computes it on CUDA; out[r, :] = fp8(x[r, :] / scales[r]).
cudaError_t dynamic_per_token_fp8_quant(void* out, int64_t out_row_stride, float* scales,
                                        const void* x, int64_t x_row_stride,
                                        const float* scale_ub, int64_t rows, int64_t hidden,
                                        DType dtype, cudaStream_t stream);

// -- gelu_rotary_kernels.cu ----------------------------------------------------
// (called by binding.cpp's gelu_and_mul and rotary_embedding ops)

// out[r, :d] = round(round(gelu(x[r, :d])) * x[r, d:2d]): erf GELU, or the tanh
// approximation with `tanh_approx`, as torch computes `F.gelu(..., approximate) * up`.
cudaError_t gelu_and_mul(void* out, int64_t out_row_stride, const void* x, int64_t x_row_stride,
                         int64_t rows, int64_t d, bool tanh_approx, DType dtype,
                         cudaStream_t stream);

// RoPE in place of the first `rotary_dim` channels of every (token, head) row of
// `x` (row at x + token * token_stride + head * head_stride, last dim contiguous),
// with cos/sin rows of `rotary_dim` elements cs_token_stride apart per token;
// neox halves or gptj pairs. Bit for bit torch's `x * cos + rotate(x) * sin`.
cudaError_t rotary_embedding(void* x, int64_t token_stride, int64_t head_stride, int64_t tokens,
                             int64_t heads, const void* cos, const void* sin,
                             int64_t cs_token_stride, int64_t rotary_dim, bool is_neox,
                             DType dtype, cudaStream_t stream);

}  // namespace vllm_ir_cuda
