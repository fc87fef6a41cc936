// The torch side of the kernels: argument checks, the current device and
// stream, and the CUDA implementations of the ops whose schemas
// vllm_ir_cuda/ops.py defines with torch.library:
//
//   vllm_ir_cuda::rms_norm(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()
//   vllm_ir_cuda::fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight,
//                                    float epsilon) -> ()
//   and silu_and_mul, gelu_and_mul, rotary_embedding (in place into query and key),
//   static_scaled_fp8_quant, dynamic_per_token_fp8_quant,
//   rms_norm_static_fp8_quant, fused_add_rms_norm_static_fp8_quant (ops.SCHEMAS).
//
// Every argument is checked (device, dtype, shape, the layout the kernels
// address, overlap, sizes the kernels index) before any work: bad input
// raises a one-line RuntimeError naming the argument, never reaches a kernel.
// The messages are built as one std::string (VLLM_IR_CHECK) and never through
// std::ostream: on the H200 machine, formatting an integer through c10::str's
// ostringstream inside this library crashed the process (SIGSEGV) instead of
// raising.
//
// This is the only source that includes torch headers; the kernels
// (layernorm_kernels.cu) see raw pointers and strides only.

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/accumulate.h>
#include <c10/util/string_view.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "layernorm.h"

namespace {

using vllm_ir_cuda::DType;

// The pieces of an error message, appended as text (no std::ostream).
void append(std::string& s, const char* piece) { s += piece; }
void append(std::string& s, const std::string& piece) { s += piece; }
void append(std::string& s, c10::string_view piece) { s.append(piece.data(), piece.size()); }
void append(std::string& s, at::ScalarType t) { s += c10::toString(t); }
void append(std::string& s, const c10::Device& d) { s += d.str(); }
template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
void append(std::string& s, I v) {
  s += std::to_string(v);
}

// Raises "vllm_ir_cuda::<op><parts>" (parts start with ": ") as a c10::Error (a RuntimeError in Python).
template <typename... Parts>
[[noreturn]] C10_NOINLINE void fail(const char* op, const Parts&... parts) {
  std::string msg = "vllm_ir_cuda::";
  msg += op;
  (append(msg, parts), ...);
  TORCH_CHECK(false, msg);
}

// TORCH_CHECK with a message of text pieces, built only on failure.
#define VLLM_IR_CHECK(cond, op, ...) \
  do {                               \
    if (C10_UNLIKELY(!(cond))) {     \
      fail(op, __VA_ARGS__);         \
    }                                \
  } while (false)

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

// "[a, b, c]", built by hand: error messages never depend on stream operators
// of torch's array types.
std::string dims(c10::IntArrayRef d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    s += (i == 0 ? "" : ", ") + std::to_string(d[i]);
  }
  return s + "]";
}

// x is the tensor every other argument is checked against.
void check_x(const char* op, const at::Tensor& x) {
  VLLM_IR_CHECK(x.is_cuda(), op, ": x must be a CUDA tensor, got one on ",
              x.device());
  VLLM_IR_CHECK(supported_dtype(x.scalar_type()), op, ": x has dtype ", x.scalar_type(),
              "; the kernels take float32, float16 and bfloat16");
  VLLM_IR_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
}

void check_like_x(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  VLLM_IR_CHECK(t.device() == x.device(), op, ": ", name, " is on ", t.device(),
              " but x is on ", x.device());
  VLLM_IR_CHECK(t.scalar_type() == x.scalar_type(), op, ": ", name,
              " has dtype ", t.scalar_type(), " but x has dtype ", x.scalar_type());
  VLLM_IR_CHECK(t.sizes() == x.sizes(), op, ": ", name, " has shape ",
              dims(t.sizes()), " but x has shape ", dims(x.sizes()));
}

// A float32 tensor of one element on x's device (a static scale or scale_ub).
void check_scale(const char* op, const char* name, const at::Tensor& s, const at::Tensor& x) {
  VLLM_IR_CHECK(s.device() == x.device(), op, ": ", name, " is on ", s.device(),
              " but x is on ", x.device());
  VLLM_IR_CHECK(s.scalar_type() == at::kFloat && s.numel() == 1, op, ": ", name,
              " must be one float32 element, got ", s.scalar_type(), " of shape ",
              dims(s.sizes()));
}

// The kernels read rows of contiguous elements.
void check_last_dim(const char* op, const char* name, const at::Tensor& t) {
  VLLM_IR_CHECK(t.dim() >= 1, op, ": ", name,
              " must have at least one dimension");
  VLLM_IR_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", name,
              " must be contiguous in its last dimension, but its strides are ",
              dims(t.strides()), "; pass ", name, ".contiguous()");
}

// An output the kernels write, on x's device with the given shape: of x's
// dtype, or of `dtype` when given (FP8 results, float32 scales).
void check_out(const char* op, const char* name, const at::Tensor& t, const at::Tensor& x,
               c10::IntArrayRef shape, std::optional<at::ScalarType> dtype = std::nullopt) {
  VLLM_IR_CHECK(t.device() == x.device(), op, ": ", name, " is on ", t.device(),
              " but x is on ", x.device());
  if (dtype.has_value()) {
    VLLM_IR_CHECK(t.scalar_type() == *dtype, op, ": ", name, " has dtype ",
                t.scalar_type(), "; it must be ", *dtype);
  } else {
    VLLM_IR_CHECK(t.scalar_type() == x.scalar_type(), op, ": ", name,
                " has dtype ", t.scalar_type(), " but x has dtype ", x.scalar_type());
  }
  VLLM_IR_CHECK(t.sizes() == shape, op, ": ", name, " has shape ",
              dims(t.sizes()), " but must have shape ", dims(shape));
}

// An FP8 (float8_e4m3fn) output of x's shape on x's device, whose rows the kernels address.
// It shares no memory with x.
void check_fp8_out(const char* op, const at::Tensor& out, const at::Tensor& x) {
  check_out(op, "out", out, x, x.sizes(), at::kFloat8_e4m3fn);
  check_last_dim(op, "out", out);
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, x);
}

void check_weight(const char* op, const std::optional<at::Tensor>& weight, const at::Tensor& x) {
  if (!weight.has_value()) {
    return;
  }
  const at::Tensor& w = *weight;
  VLLM_IR_CHECK(w.device() == x.device(), op, ": weight is on ", w.device(),
              " but x is on ", x.device());
  VLLM_IR_CHECK(w.scalar_type() == x.scalar_type(), op, ": weight has dtype ",
              w.scalar_type(), " but x has dtype ", x.scalar_type());
  VLLM_IR_CHECK(w.dim() == 1 && w.size(0) == x.size(-1), op, ": weight must have shape [", x.size(-1), "] (x's last dimension), got ",
              dims(w.sizes()));
  VLLM_IR_CHECK(w.is_contiguous(), op, ": weight must be contiguous, but its stride is ", dims(w.strides()),
              "; pass weight.contiguous()");
}

// What every norm op checks first: x, a tensor of its shape and dtype that
// the kernel addresses as rows too (out, or x_residual), and the weight.
void check_norm_args(const char* op, const at::Tensor& x, const char* name, const at::Tensor& t,
                     const std::optional<at::Tensor>& weight) {
  check_x(op, x);
  check_like_x(op, name, t, x);
  check_last_dim(op, "x", x);
  check_last_dim(op, name, t);
  check_weight(op, weight, x);
  at::assert_no_internal_overlap(t);
}

// The stride, in elements, of t's dimensions [0, end) collapsed into one
// (size-1 dimensions skipped); `none` when every one of them has size 1 (or
// there are none); nullopt when they do not collapse into one stride.
std::optional<int64_t> collapsed_stride(const at::Tensor& t, int64_t end, int64_t none) {
  std::optional<int64_t> stride;
  int64_t expected = 0;
  for (int64_t d = end - 1; d >= 0; --d) {
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
  return stride.has_value() ? *stride : none;
}

// The distance, in elements, between consecutive rows when t's leading
// dimensions collapse into one (as `t.view(-1, t.size(-1))` would allow);
// nullopt when they do not.
std::optional<int64_t> row_stride(const at::Tensor& t) {
  const int64_t nd = t.dim();
  if (nd == 1) {
    return t.size(0);
  }
  return collapsed_stride(t, nd - 1, t.stride(nd - 2));
}

struct Extent {
  int64_t rows;
  int64_t hidden;
};

Extent extent(const char* op, const at::Tensor& x) {
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  VLLM_IR_CHECK(rows <= vllm_ir_cuda::kMaxRows && hidden <= vllm_ir_cuda::kMaxHidden, op, ": x has ", rows, " rows of ", hidden,
              " elements; the kernels take at most ", vllm_ir_cuda::kMaxRows, " rows of at most ",
              vllm_ir_cuda::kMaxHidden, " elements");
  return {rows, hidden};
}

const void* weight_ptr(const std::optional<at::Tensor>& weight) {
  return weight.has_value() ? weight->const_data_ptr() : nullptr;
}

void check_launch(const char* op, cudaError_t err) {
  VLLM_IR_CHECK(err == cudaSuccess, op, ": kernel launch failed: ",
              cudaGetErrorString(err));
}

// Leading dimensions that do not collapse into rows of one stride (rare:
// e.g. a permuted 3-D view) go through a contiguous copy, written back.
at::Tensor as_rows(const at::Tensor& t) {
  return row_stride(t).has_value() ? t : t.contiguous();
}

// An output the kernels can write directly (its rows collapse into one
// stride), else a contiguous temporary that `finish_out` copies back.
at::Tensor out_rows_of(const at::Tensor& out) {
  return row_stride(out).has_value() ? out : at::empty(out.sizes(), out.options());
}

void finish_out(at::Tensor& out, const at::Tensor& rows) {
  if (!rows.is_same(out)) {
    out.copy_(rows);
  }
}

cudaStream_t stream_of(const at::Tensor& x) {
  return c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
}

// What a row kernel is launched with: x's rows (read), out's rows (written),
// each with its row stride, their extent and the stream.
struct RowLaunch {
  const void* x;
  int64_t x_stride;
  void* out;
  int64_t out_stride;
  Extent e;
  cudaStream_t stream;
};

// The frame of every op that reads x's rows into an output of rows: nothing
// for an empty x; else on x's device `launch(RowLaunch)` (returning the
// launch's cudaError_t) over x's rows (a copy when they do not collapse) and
// out's (a temporary, copied back after a successful launch, when they do not).
template <typename Launch>
void launch_rows(const char* op, at::Tensor& out, const at::Tensor& x, Launch&& launch) {
  if (x.numel() == 0) {
    return;
  }
  const Extent e = extent(op, x);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const at::Tensor x_rows = as_rows(x);
  at::Tensor out_rows = out_rows_of(out);
  check_launch(op, launch(RowLaunch{x_rows.const_data_ptr(), *row_stride(x_rows),
                                    out_rows.mutable_data_ptr(), *row_stride(out_rows), e,
                                    stream_of(x)}));
  finish_out(out, out_rows);
}

// silu_and_mul and gelu_and_mul: x holds the gate and the up projection
// (*, 2 * d); out is (*, d) of x's dtype.
void check_gated(const char* op, const at::Tensor& out, const at::Tensor& x) {
  check_x(op, x);
  check_last_dim(op, "x", x);
  VLLM_IR_CHECK(x.size(-1) % 2 == 0, op, ": x's last dimension (", x.size(-1),
              ") must be even: it holds the gate and the up projection");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() /= 2;
  check_out(op, "out", out, x, shape);
  check_last_dim(op, "out", out);
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, x);
}

void rms_norm_cuda(at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                   double epsilon) {
  constexpr const char* op = "rms_norm";
  check_norm_args(op, x, "out", out, weight);
  at::assert_no_partial_overlap(out, x);
  launch_rows(op, out, x, [&](const RowLaunch& r) {
    return vllm_ir_cuda::rms_norm(r.out, r.out_stride, r.x, r.x_stride, weight_ptr(weight),
                                  r.e.rows, r.e.hidden, static_cast<float>(epsilon),
                                  kernel_dtype(x.scalar_type()), r.stream);
  });
}

template <bool kVllmNumerics>
void fused_add_rms_norm_rows(at::Tensor& x, at::Tensor& x_residual,
                             const std::optional<at::Tensor>& weight, double epsilon) {
  constexpr const char* op = kVllmNumerics ? "vllm_fused_add_rms_norm" : "fused_add_rms_norm";
  check_norm_args(op, x, "x_residual", x_residual, weight);
  at::assert_no_internal_overlap(x);
  at::assert_no_overlap(x, x_residual);
  if (x.numel() == 0) {
    return;
  }
  const Extent e = extent(op, x);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();

  at::Tensor x_rows = as_rows(x);
  at::Tensor residual_rows = as_rows(x_residual);
  constexpr auto kernel =
      kVllmNumerics ? vllm_ir_cuda::vllm_fused_add_rms_norm : vllm_ir_cuda::fused_add_rms_norm;
  check_launch(op, kernel(x_rows.mutable_data_ptr(), *row_stride(x_rows),
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

void silu_and_mul_cuda(at::Tensor& out, const at::Tensor& x) {
  constexpr const char* op = "silu_and_mul";
  check_gated(op, out, x);
  launch_rows(op, out, x, [&](const RowLaunch& r) {
    return vllm_ir_cuda::silu_and_mul(r.out, r.out_stride, r.x, r.x_stride, r.e.rows,
                                      r.e.hidden / 2, kernel_dtype(x.scalar_type()), r.stream);
  });
}

void gelu_and_mul_cuda(at::Tensor& out, const at::Tensor& x, c10::string_view approximate) {
  constexpr const char* op = "gelu_and_mul";
  VLLM_IR_CHECK(approximate == "none" || approximate == "tanh", op, ": approximate must be \"none\" or \"tanh\", got \"", std::string(approximate),
              "\"");
  check_gated(op, out, x);
  const bool tanh = approximate == "tanh";
  launch_rows(op, out, x, [&](const RowLaunch& r) {
    return vllm_ir_cuda::gelu_and_mul(r.out, r.out_stride, r.x, r.x_stride, r.e.rows,
                                      r.e.hidden / 2, tanh, kernel_dtype(x.scalar_type()),
                                      r.stream);
  });
}

// The stride, in elements, between consecutive tokens of a (*tokens, heads,
// head_size) tensor when its token dimensions collapse into one (0 when there
// are none or all have size 1); nullopt when they do not.
std::optional<int64_t> token_stride(const at::Tensor& t) {
  return collapsed_stride(t, t.dim() - 2, 0);
}

// RoPE of one (*tokens, heads, head_size) tensor in place; cos/sin are checked
// [tokens, rotary_dim] rows sharing a stride.
void rotate_in_place(const char* op, const char* name, at::Tensor& t, const at::Tensor& cos,
                     const at::Tensor& sin, bool is_neox) {
  // token dims that do not collapse into one stride (e.g. Hugging Face's
  // [batch, heads, seq, head] seen as its transpose(1, 2) with batch > 1) go
  // through a contiguous copy, written back
  at::Tensor rows = token_stride(t).has_value() ? t : t.contiguous();
  const int64_t heads = t.size(-2);
  const int64_t tokens = heads == 0 ? 0 : t.numel() / (heads * t.size(-1));
  VLLM_IR_CHECK(tokens * heads <= vllm_ir_cuda::kMaxRows, op, ": ", name,
              " has ", tokens * heads, " (token, head) rows; the kernel takes at most ",
              vllm_ir_cuda::kMaxRows);
  VLLM_IR_CHECK(heads * (cos.size(1) / 2) <= vllm_ir_cuda::kMaxRows, op, ": ", name, " has ",
                heads, " heads of ", cos.size(1) / 2,
                " rotated pairs; the kernel takes at most ", vllm_ir_cuda::kMaxRows,
                " pairs per token");
  check_launch(op, vllm_ir_cuda::rotary_embedding(
                       rows.mutable_data_ptr(), *token_stride(rows), rows.stride(-2), tokens,
                       heads, cos.const_data_ptr(), sin.const_data_ptr(), cos.stride(0),
                       cos.size(1), is_neox, kernel_dtype(t.scalar_type()), stream_of(t)));
  if (!rows.is_same(t)) {
    t.copy_(rows);
  }
}

void rotary_embedding_cuda(at::Tensor& query, at::Tensor& key, const at::Tensor& cos,
                           const at::Tensor& sin, bool is_neox) {
  constexpr const char* op = "rotary_embedding";
  VLLM_IR_CHECK(query.is_cuda(), op, ": query must be a CUDA tensor, got one on ",
              query.device());
  VLLM_IR_CHECK(supported_dtype(query.scalar_type()), op, ": query has dtype ",
              query.scalar_type(), "; the kernel takes float32, float16 and bfloat16");
  VLLM_IR_CHECK(query.dim() >= 2 && key.dim() >= 2, op, ": query and key must be (*tokens, heads, head_size), got shapes ",
              dims(query.sizes()), " and ", dims(key.sizes()));
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"key", key},
                                {"cos", cos},
                                {"sin", sin}}) {
    VLLM_IR_CHECK(t.device() == query.device(), op, ": ", name, " is on ",
                t.device(), " but query is on ", query.device());
    VLLM_IR_CHECK(t.scalar_type() == query.scalar_type(), op, ": ", name,
                " has dtype ", t.scalar_type(), " but query has dtype ", query.scalar_type());
  }
  VLLM_IR_CHECK(query.sizes().slice(0, query.dim() - 2) == key.sizes().slice(0, key.dim() - 2), op, ": query ", dims(query.sizes()), " and key ",
              dims(key.sizes()), " must have the same token dimensions");
  const int64_t tokens = c10::multiply_integers(query.sizes().slice(0, query.dim() - 2));
  VLLM_IR_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == tokens, op, ": cos and sin must both have shape [", tokens,
              ", rotary_dim] (one row per token), got ", dims(cos.sizes()), " and ",
              dims(sin.sizes()));
  const int64_t rot = cos.size(1);
  VLLM_IR_CHECK(rot % 2 == 0 && rot <= query.size(-1) && rot <= key.size(-1), op, ": rotary_dim (cos.size(-1) = ", rot,
              ") must be even and at most the head size of query (", query.size(-1),
              ") and key (", key.size(-1), ")");
  VLLM_IR_CHECK((rot <= 1 || (cos.stride(1) == 1 && sin.stride(1) == 1)) &&
                  (tokens <= 1 || cos.stride(0) == sin.stride(0)), op, ": cos and sin must have contiguous rows and one row stride, got strides ",
              dims(cos.strides()), " and ", dims(sin.strides()), "; pass them .contiguous()");
  check_last_dim(op, "query", query);
  check_last_dim(op, "key", key);
  at::assert_no_internal_overlap(query);
  at::assert_no_internal_overlap(key);
  at::assert_no_overlap(query, key);
  for (const at::Tensor* t : {&query, &key}) {
    at::assert_no_overlap(*t, cos);
    at::assert_no_overlap(*t, sin);
  }
  if (tokens == 0 || rot == 0) {
    return;
  }
  const c10::cuda::CUDAGuard device_guard(query.device());
  if (query.numel() > 0) {
    rotate_in_place(op, "query", query, cos, sin, is_neox);
  }
  if (key.numel() > 0) {
    rotate_in_place(op, "key", key, cos, sin, is_neox);
  }
}

void static_scaled_fp8_quant_cuda(at::Tensor& out, const at::Tensor& x, const at::Tensor& scale) {
  constexpr const char* op = "static_scaled_fp8_quant";
  check_x(op, x);
  check_last_dim(op, "x", x);
  check_fp8_out(op, out, x);
  check_scale(op, "scale", scale, x);
  launch_rows(op, out, x, [&](const RowLaunch& r) {
    return vllm_ir_cuda::static_scaled_fp8_quant(r.out, r.out_stride, r.x, r.x_stride,
                                                 scale.const_data_ptr<float>(), r.e.rows,
                                                 r.e.hidden, kernel_dtype(x.scalar_type()),
                                                 r.stream);
  });
}

void dynamic_per_token_fp8_quant_cuda(at::Tensor& out, at::Tensor& scales, const at::Tensor& x,
                                      const std::optional<at::Tensor>& scale_ub) {
  constexpr const char* op = "dynamic_per_token_fp8_quant";
  check_x(op, x);
  check_last_dim(op, "x", x);
  VLLM_IR_CHECK(x.size(-1) > 0, op, ": x's rows have no elements, so no amax");
  check_fp8_out(op, out, x);
  std::vector<int64_t> scales_shape(x.sizes().begin(), x.sizes().end());
  scales_shape.back() = 1;
  check_out(op, "scales", scales, x, scales_shape, at::kFloat);
  VLLM_IR_CHECK(scales.is_contiguous(), op, ": scales must be contiguous, but its strides are ", dims(scales.strides()));
  if (scale_ub.has_value()) {
    check_scale(op, "scale_ub", *scale_ub, x);
  }
  at::assert_no_overlap(out, scales);
  at::assert_no_overlap(scales, x);
  launch_rows(op, out, x, [&](const RowLaunch& r) {
    return vllm_ir_cuda::dynamic_per_token_fp8_quant(
        r.out, r.out_stride, scales.mutable_data_ptr<float>(), r.x, r.x_stride,
        scale_ub.has_value() ? scale_ub->const_data_ptr<float>() : nullptr, r.e.rows,
        r.e.hidden, kernel_dtype(x.scalar_type()), r.stream);
  });
}

void rms_norm_static_fp8_quant_cuda(at::Tensor& out, const at::Tensor& x,
                                    const std::optional<at::Tensor>& weight, double epsilon,
                                    const at::Tensor& scale) {
  constexpr const char* op = "rms_norm_static_fp8_quant";
  check_x(op, x);
  check_last_dim(op, "x", x);
  check_fp8_out(op, out, x);
  check_weight(op, weight, x);
  check_scale(op, "scale", scale, x);
  launch_rows(op, out, x, [&](const RowLaunch& r) {
    return vllm_ir_cuda::rms_norm_static_fp8_quant(
        r.out, r.out_stride, r.x, r.x_stride, weight_ptr(weight), scale.const_data_ptr<float>(),
        r.e.rows, r.e.hidden, static_cast<float>(epsilon), kernel_dtype(x.scalar_type()),
        r.stream);
  });
}

void fused_add_rms_norm_static_fp8_quant_cuda(at::Tensor& out, const at::Tensor& x,
                                              at::Tensor& x_residual,
                                              const std::optional<at::Tensor>& weight,
                                              double epsilon, const at::Tensor& scale) {
  constexpr const char* op = "fused_add_rms_norm_static_fp8_quant";
  check_norm_args(op, x, "x_residual", x_residual, weight);
  check_fp8_out(op, out, x);
  check_scale(op, "scale", scale, x);
  at::assert_no_overlap(x, x_residual);
  at::assert_no_overlap(out, x_residual);
  at::Tensor residual_rows;  // the residual's rows the kernel writes: x_residual or a copy
  launch_rows(op, out, x, [&](const RowLaunch& r) {
    residual_rows = as_rows(x_residual);
    return vllm_ir_cuda::fused_add_rms_norm_static_fp8_quant(
        r.out, r.out_stride, r.x, r.x_stride, residual_rows.mutable_data_ptr(),
        *row_stride(residual_rows), weight_ptr(weight), scale.const_data_ptr<float>(), r.e.rows,
        r.e.hidden, static_cast<float>(epsilon), kernel_dtype(x.scalar_type()), r.stream);
  });
  if (residual_rows.defined() && !residual_rows.is_same(x_residual)) {
    x_residual.copy_(residual_rows);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_ir_cuda, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm_rows<false>);
  m.impl("vllm_fused_add_rms_norm", &fused_add_rms_norm_rows<true>);
  m.impl("silu_and_mul", &silu_and_mul_cuda);
  m.impl("gelu_and_mul", &gelu_and_mul_cuda);
  m.impl("rotary_embedding", &rotary_embedding_cuda);
  m.impl("static_scaled_fp8_quant", &static_scaled_fp8_quant_cuda);
  m.impl("dynamic_per_token_fp8_quant", &dynamic_per_token_fp8_quant_cuda);
  m.impl("rms_norm_static_fp8_quant", &rms_norm_static_fp8_quant_cuda);
  m.impl("fused_add_rms_norm_static_fp8_quant", &fused_add_rms_norm_static_fp8_quant_cuda);
}
