// The torch side of the kernels: argument checks, the current device and
// stream, and the CUDA implementations of the ops whose schemas
// vllm_ir_cuda/ops.py defines with torch.library:
//
//   vllm_ir_cuda::rms_norm(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()
//   vllm_ir_cuda::fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight,
//                                    float epsilon) -> ()
//
// This is the only source that includes torch headers; the kernels
// (layernorm_kernels.cu) see raw pointers and strides only.

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "layernorm.h"

namespace {

using vllm_ir_cuda::DType;

bool supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

DType kernel_dtype(at::ScalarType t) {
  if (t == at::kHalf) {
    return DType::kFloat16;
  }
  if (t == at::kBFloat16) {
    return DType::kBFloat16;
  }
  return DType::kFloat32;
}

// x is the tensor every other argument is checked against.
void check_x(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "vllm_ir_cuda::", op, ": x must be a CUDA tensor, got one on ",
              x.device());
  TORCH_CHECK(supported_dtype(x.scalar_type()), "vllm_ir_cuda::", op,
              ": x has dtype ", x.scalar_type(),
              "; the kernels take float32, float16 and bfloat16");
  TORCH_CHECK(x.dim() >= 1, "vllm_ir_cuda::", op, ": x must have at least one dimension");
}

void check_like_x(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  TORCH_CHECK(t.device() == x.device(), "vllm_ir_cuda::", op, ": ", name, " is on ", t.device(),
              " but x is on ", x.device());
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "vllm_ir_cuda::", op, ": ", name,
              " has dtype ", t.scalar_type(), " but x has dtype ", x.scalar_type());
  TORCH_CHECK(t.sizes() == x.sizes(), "vllm_ir_cuda::", op, ": ", name, " has shape ",
              t.sizes(), " but x has shape ", x.sizes());
}

// The kernels read rows of contiguous elements.
void check_last_dim(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, "vllm_ir_cuda::", op, ": ", name,
              " must be contiguous in its last dimension, but its strides are ", t.strides(),
              "; pass ", name, ".contiguous()");
}

void check_weight(const char* op, const std::optional<at::Tensor>& weight, const at::Tensor& x) {
  if (!weight.has_value()) {
    return;
  }
  const at::Tensor& w = *weight;
  TORCH_CHECK(w.device() == x.device(), "vllm_ir_cuda::", op, ": weight is on ", w.device(),
              " but x is on ", x.device());
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), "vllm_ir_cuda::", op, ": weight has dtype ",
              w.scalar_type(), " but x has dtype ", x.scalar_type());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1), "vllm_ir_cuda::", op,
              ": weight must have shape [", x.size(-1), "] (x's last dimension), got ",
              w.sizes());
  TORCH_CHECK(w.is_contiguous(), "vllm_ir_cuda::", op,
              ": weight must be contiguous, but its stride is ", w.strides(),
              "; pass weight.contiguous()");
}

// The distance, in elements, between consecutive rows when t's leading
// dimensions collapse into one (as `t.view(-1, t.size(-1))` would allow);
// nullopt when they do not.
std::optional<int64_t> row_stride(const at::Tensor& t) {
  const int64_t nd = t.dim();
  if (nd == 1) {
    return t.size(0);
  }
  std::optional<int64_t> stride;
  int64_t expected = 0;
  for (int64_t d = nd - 2; d >= 0; --d) {
    if (t.size(d) == 1) {
      continue;
    }
    if (!stride.has_value()) {
      stride = t.stride(d);
      expected = t.stride(d) * t.size(d);
    } else if (t.stride(d) != expected) {
      return std::nullopt;
    } else {
      expected *= t.size(d);
    }
  }
  return stride.has_value() ? *stride : t.stride(nd - 2);
}

struct Extent {
  int64_t rows;
  int64_t hidden;
};

Extent extent(const char* op, const at::Tensor& x) {
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  TORCH_CHECK(rows <= vllm_ir_cuda::kMaxRows && hidden <= vllm_ir_cuda::kMaxHidden,
              "vllm_ir_cuda::", op, ": x has ", rows, " rows of ", hidden,
              " elements; the kernels take at most ", vllm_ir_cuda::kMaxRows, " rows of at most ",
              vllm_ir_cuda::kMaxHidden, " elements");
  return {rows, hidden};
}

const void* weight_ptr(const std::optional<at::Tensor>& weight) {
  return weight.has_value() ? weight->const_data_ptr() : nullptr;
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "vllm_ir_cuda::", op, ": kernel launch failed: ",
              cudaGetErrorString(err));
}

// Leading dimensions that do not collapse into rows of one stride (rare:
// e.g. a permuted 3-D view) go through a contiguous copy, written back.
at::Tensor as_rows(const at::Tensor& t) {
  return row_stride(t).has_value() ? t : t.contiguous();
}

void rms_norm_cuda(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                   double epsilon) {
  constexpr const char* op = "rms_norm";
  check_x(op, x);
  check_like_x(op, "out", out, x);
  check_last_dim(op, "x", x);
  check_last_dim(op, "out", out);
  check_weight(op, weight, x);
  at::assert_no_internal_overlap(out);
  at::assert_no_partial_overlap(out, x);
  if (x.numel() == 0) {
    return;
  }
  const Extent e = extent(op, x);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();

  const at::Tensor x_rows = as_rows(x);
  at::Tensor out_rows = row_stride(out).has_value() ? out : at::empty(out.sizes(), out.options());
  check_launch(op, vllm_ir_cuda::rms_norm(out_rows.mutable_data_ptr(), *row_stride(out_rows),
                                          x_rows.const_data_ptr(), *row_stride(x_rows),
                                          weight_ptr(weight), e.rows, e.hidden,
                                          static_cast<float>(epsilon),
                                          kernel_dtype(x.scalar_type()), stream));
  if (!out_rows.is_same(out)) {
    out.copy_(out_rows);
  }
}

void fused_add_rms_norm_cuda(at::Tensor& x, at::Tensor& x_residual,
                             const std::optional<at::Tensor>& weight, double epsilon) {
  constexpr const char* op = "fused_add_rms_norm";
  check_x(op, x);
  check_like_x(op, "x_residual", x_residual, x);
  check_last_dim(op, "x", x);
  check_last_dim(op, "x_residual", x_residual);
  check_weight(op, weight, x);
  at::assert_no_internal_overlap(x);
  at::assert_no_internal_overlap(x_residual);
  at::assert_no_overlap(x, x_residual);
  if (x.numel() == 0) {
    return;
  }
  const Extent e = extent(op, x);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();

  at::Tensor x_rows = as_rows(x);
  at::Tensor residual_rows = as_rows(x_residual);
  check_launch(op, vllm_ir_cuda::fused_add_rms_norm(
                       x_rows.mutable_data_ptr(), *row_stride(x_rows),
                       residual_rows.mutable_data_ptr(), *row_stride(residual_rows),
                       weight_ptr(weight), e.rows, e.hidden, static_cast<float>(epsilon),
                       kernel_dtype(x.scalar_type()), stream));
  if (!x_rows.is_same(x)) {
    x.copy_(x_rows);
  }
  if (!residual_rows.is_same(x_residual)) {
    x_residual.copy_(residual_rows);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_ir_cuda, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm_cuda);
}
