// rotary_embedding for CPU tensors: the "cpu_c" kernel.
//
// Semantics are exactly those of the native function in vllm_ir/ops/rotary.py
// (Hugging Face's apply_rotary_pos_emb on token-major tensors): on each head's
// first rotary_dim = cos.size(-1) channels,
//   neox:  out[i]     = round(round(x[i] * c[i])         - round(x[i + h] * s[i]))
//          out[i + h] = round(round(x[i + h] * c[i + h]) + round(x[i] * s[i + h]))
//   gptj:  out[2i]    = round(round(x[2i] * c[2i])         - round(x[2i + 1] * s[2i]))
//          out[2i+1]  = round(round(x[2i + 1] * c[2i + 1]) + round(x[2i] * s[2i + 1]))
// with h = rotary_dim / 2, each product and sum in fp32 and rounded to the
// dtype as ATen's separate mul and add kernels do (a + (-b) is a - b exactly);
// the other channels are copied. So the result is bit for bit native's: each
// fp32 product goes through opaque(), so the compiler cannot fuse it into the
// add as an FMA, which rounds once where native rounds twice (GCC contracts
// across statements at -O3, and its optimize pragma does not stop that in
// vectorized loops).
//
// Layouts: query (..., heads, head_size) and key (..., kv_heads, head_size) of
// any strides with a contiguous last dimension (Hugging Face's transposed
// [batch, seq, heads, head] views included: rows are addressed through the
// strides, never copied); cos and sin (..., rotary_dim) broadcast over the
// heads and size-1 token dims. Other layouts go through contiguous copies.
//
// rotary_embedding writes query and key in place; rotary_embedding_functional
// writes new contiguous tensors (the same row code, reading one, writing the other).
//
// rotary_embedding_fp32 (in place) is the op of that name in rotary.py: the
// same rotation with each fp32 product and the fp32 sum kept, rounded to the
// dtype once (kOnce below); for fp32 tensors it is rotary_embedding.

#include "common.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace vllm_ir_cpu {
namespace {

// The op a kernel's errors name: kOnce (rounded once) is rotary_embedding_fp32's.
template <bool kOnce>
constexpr const char* kOp = kOnce ? "rotary_embedding_fp32" : "rotary_embedding";

// Offsets of every token (all dims but the last two: heads, head_size) of a
// tensor, through its strides. Computed once per token, not per (token, head)
// row: the divisions cost more than the rotation at decode sizes.
class TokenOffsets {
 public:
  TokenOffsets(at::IntArrayRef sizes, at::IntArrayRef strides)
      : sizes_(sizes.begin(), sizes.end() - 2), strides_(strides.begin(), strides.end() - 2) {}

  int64_t operator()(int64_t token) const {
    int64_t offset = 0;
    for (int64_t d = static_cast<int64_t>(sizes_.size()) - 1; d >= 0; --d) {
      offset += (token % sizes_[d]) * strides_[d];
      token /= sizes_[d];
    }
    return offset;
  }

 private:
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
};

// v as computed, hidden from the optimizer so no FMA absorbs the product.
inline float opaque(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+v"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(v));
#endif
  return v;
}

inline fVec opaque(const fVec& v) {
#if defined(__GNUC__) && defined(CPU_CAPABILITY_AVX512)
  __m512 raw = v;
  asm("" : "+v"(raw));
  return fVec(raw);
#elif defined(__GNUC__) && defined(CPU_CAPABILITY_AVX2)
  __m256 raw = v;
  asm("" : "+v"(raw));
  return fVec(raw);
#else
  return v;  // at::vec's portable fallback: plain arrays, no asm-able register
#endif
}

// kOnce: the fp32 value kept (rounded to the dtype once, on the store).
template <typename scalar_t, bool kOnce = false>
inline float rounded(float v) {
  if constexpr (kOnce || std::is_same_v<scalar_t, float>) {
    return opaque(v);
  } else {
    return static_cast<float>(static_cast<scalar_t>(v));
  }
}

// Two fp32 halves (lo, hi) of a vector of scalar_t: round(round(a * c) -+ round(b * s)),
// or with kOnce the fp32 a * c -+ b * s (the store rounds it once).
template <typename scalar_t, bool kOnce>
inline std::tuple<fVec, fVec> rotate_lanes(
    const std::tuple<fVec, fVec>& a, const std::tuple<fVec, fVec>& c,
    const std::tuple<fVec, fVec>& b, const std::tuple<fVec, fVec>& s, bool minus) {
  fVec ac0 = opaque(std::get<0>(a) * std::get<0>(c)), ac1 = opaque(std::get<1>(a) * std::get<1>(c));
  fVec bs0 = opaque(std::get<0>(b) * std::get<0>(s)), bs1 = opaque(std::get<1>(b) * std::get<1>(s));
  if constexpr (!kOnce) {
    std::tie(ac0, ac1) = round_to<scalar_t>(ac0, ac1);
    std::tie(bs0, bs1) = round_to<scalar_t>(bs0, bs1);
  }
  if (minus) return {ac0 - bs0, ac1 - bs1};
  return {ac0 + bs0, ac1 + bs1};
}

// out[0:rot] <- neox rotation of x[0:rot]; x and out may be the same row.
template <typename scalar_t, bool kOnce>
inline void neox_row(
    scalar_t* out, const scalar_t* x, const scalar_t* cos, const scalar_t* sin, int64_t half) {
  int64_t i = 0;
  if constexpr (std::is_same_v<scalar_t, float>) {
    constexpr int64_t V = fVec::size();
    for (; i + V <= half; i += V) {
      const fVec x1 = fVec::loadu(x + i), x2 = fVec::loadu(x + half + i);
      const fVec o1 = opaque(x1 * fVec::loadu(cos + i)) - opaque(x2 * fVec::loadu(sin + i));
      const fVec o2 =
          opaque(x2 * fVec::loadu(cos + half + i)) + opaque(x1 * fVec::loadu(sin + half + i));
      o1.store(out + i);
      o2.store(out + half + i);
    }
  } else {
    using bVec = Vectorized<scalar_t>;
    constexpr int64_t V = bVec::size();  // 2 * fVec::size() lanes of scalar_t
    for (; i + V <= half; i += V) {
      const auto x1 = at::vec::convert_to_float<scalar_t>(bVec::loadu(x + i));
      const auto x2 = at::vec::convert_to_float<scalar_t>(bVec::loadu(x + half + i));
      const auto c1 = at::vec::convert_to_float<scalar_t>(bVec::loadu(cos + i));
      const auto s1 = at::vec::convert_to_float<scalar_t>(bVec::loadu(sin + i));
      const auto c2 = at::vec::convert_to_float<scalar_t>(bVec::loadu(cos + half + i));
      const auto s2 = at::vec::convert_to_float<scalar_t>(bVec::loadu(sin + half + i));
      auto [o1a, o1b] = rotate_lanes<scalar_t, kOnce>(x1, c1, x2, s1, true);
      auto [o2a, o2b] = rotate_lanes<scalar_t, kOnce>(x2, c2, x1, s2, false);
      at::vec::convert_from_float<scalar_t>(o1a, o1b).store(out + i);
      at::vec::convert_from_float<scalar_t>(o2a, o2b).store(out + half + i);
    }
  }
  for (; i < half; ++i) {
    const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[half + i]);
    const float o1 = rounded<scalar_t, kOnce>(x1 * static_cast<float>(cos[i])) -
        rounded<scalar_t, kOnce>(x2 * static_cast<float>(sin[i]));
    const float o2 = rounded<scalar_t, kOnce>(x2 * static_cast<float>(cos[half + i])) +
        rounded<scalar_t, kOnce>(x1 * static_cast<float>(sin[half + i]));
    out[i] = static_cast<scalar_t>(o1);
    out[half + i] = static_cast<scalar_t>(o2);
  }
}

// out[0:rot] <- gptj (interleaved pairs) rotation of x[0:rot]; a scalar loop
// the compiler vectorizes as it can (pairs need lane shuffles at::vec lacks).
template <typename scalar_t, bool kOnce>
inline void gptj_row(
    scalar_t* out, const scalar_t* x, const scalar_t* cos, const scalar_t* sin, int64_t rot) {
  for (int64_t i = 0; i < rot; i += 2) {
    const float x0 = static_cast<float>(x[i]), x1 = static_cast<float>(x[i + 1]);
    const float o0 = rounded<scalar_t, kOnce>(x0 * static_cast<float>(cos[i])) -
        rounded<scalar_t, kOnce>(x1 * static_cast<float>(sin[i]));
    const float o1 = rounded<scalar_t, kOnce>(x1 * static_cast<float>(cos[i + 1])) +
        rounded<scalar_t, kOnce>(x0 * static_cast<float>(sin[i + 1]));
    out[i] = static_cast<scalar_t>(o0);
    out[i + 1] = static_cast<scalar_t>(o1);
  }
}

// A tensor whose last dimension is contiguous: itself, or a contiguous copy.
at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

void check_operand(
    const char* op, const char* name, const at::Tensor& t, const at::Tensor& query) {
  check_tensor(op, name, t, query, "query");
  TORCH_CHECK(t.dim() >= 1, "vllm_ir_cpu::", op, ": ", name, " must have at least one dimension");
}

// Rotate every row of `src` into `dst` (same shape; may be the same tensor).
template <bool kOnce>
void rotate(
    const at::Tensor& dst, const at::Tensor& src_in, const at::Tensor& cos_in,
    const at::Tensor& sin_in, bool is_neox, const char* name) {
  TORCH_CHECK(
      src_in.dim() >= 2, "vllm_ir_cpu::", kOp<kOnce>, ": ", name,
      " must be (..., heads, head_size), got shape ", src_in.sizes());
  const int64_t head_size = src_in.size(-1);
  const int64_t rot = cos_in.size(-1);
  TORCH_CHECK(
      sin_in.sizes() == cos_in.sizes(), "vllm_ir_cpu::", kOp<kOnce>, ": sin has shape ",
      sin_in.sizes(), " but cos has ", cos_in.sizes());
  TORCH_CHECK(
      rot % 2 == 0 && rot <= head_size, "vllm_ir_cpu::", kOp<kOnce>,
      ": rotary_dim (cos.size(-1)) must be even and at most head_size ", head_size, ", got ", rot);
  std::vector<int64_t> rows_shape(src_in.sizes().begin(), src_in.sizes().end());
  rows_shape.back() = rot;
  // broadcast cos/sin over the heads (and size-1 token dims), as native does
  const at::Tensor cos = last_dim_contiguous(cos_in).unsqueeze(-2).expand(rows_shape);
  const at::Tensor sin = last_dim_contiguous(sin_in).unsqueeze(-2).expand(rows_shape);
  const at::Tensor src = last_dim_contiguous(src_in);
  // head_size 0 (and so rot 0): nothing to rotate, and no rows to count by dividing
  if (head_size == 0 || src.numel() == 0) return;
  const int64_t heads = src.size(-2);
  const int64_t rows = src.numel() / head_size;
  const int64_t tokens = rows / heads;  // rows > 0: heads > 0
  const TokenOffsets src_at(src.sizes(), src.strides()), dst_at(dst.sizes(), dst.strides());
  const TokenOffsets cos_at(cos.sizes(), cos.strides()), sin_at(sin.sizes(), sin.strides());
  const int64_t src_h = src.stride(-2), dst_h = dst.stride(-2);
  const int64_t cos_h = cos.stride(-2), sin_h = sin.stride(-2);  // 0 unless cos has heads
  const bool same = dst.data_ptr() == src.data_ptr() && dst.strides() == src.strides();
  dispatch_dtype(kOp<kOnce>, src.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* x = src.const_data_ptr<scalar_t>();
    scalar_t* out = dst.data_ptr<scalar_t>();
    const scalar_t* c = cos.const_data_ptr<scalar_t>();
    const scalar_t* s = sin.const_data_ptr<scalar_t>();
#pragma omp parallel for schedule(static) if (run_parallel(tokens, rows * head_size))
    for (int64_t t = 0; t < tokens; ++t) {
      const scalar_t* xt = x + src_at(t);
      scalar_t* ot = out + dst_at(t);
      const scalar_t* ct = c + cos_at(t);
      const scalar_t* st = s + sin_at(t);
      for (int64_t h = 0; h < heads; ++h) {
        const scalar_t* xr = xt + h * src_h;
        scalar_t* orow = ot + h * dst_h;
        if (is_neox) {
          neox_row<scalar_t, kOnce>(orow, xr, ct + h * cos_h, st + h * sin_h, rot / 2);
        } else {
          gptj_row<scalar_t, kOnce>(orow, xr, ct + h * cos_h, st + h * sin_h, rot);
        }
        if (!same) {
          for (int64_t i = rot; i < head_size; ++i) orow[i] = xr[i];
        }
      }
    }
  });
}

void check_all(
    const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos,
    const at::Tensor& sin) {
  check_cpu_strided(op, "query", query);
  check_operand(op, "key", key, query);
  check_operand(op, "cos", cos, query);
  check_operand(op, "sin", sin, query);
}

template <bool kOnce>
void rotate_in_place(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
    bool is_neox) {
  check_all(kOp<kOnce>, query, key, cos, sin);
  for (const auto& [t, name] : {std::pair{&query, "query"}, std::pair{&key, "key"}}) {
    if (t->size(-1) <= 1 || t->stride(-1) == 1) {
      rotate<kOnce>(*t, *t, cos, sin, is_neox, name);
    } else {  // a strided last dim: rotate a contiguous copy, then write it back
      at::Tensor copy = t->contiguous();
      rotate<kOnce>(copy, copy, cos, sin, is_neox, name);
      t->copy_(copy);
    }
  }
}

void rotary_embedding(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
    bool is_neox) {
  rotate_in_place<false>(query, key, cos, sin, is_neox);
}

void rotary_embedding_fp32(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
    bool is_neox) {
  rotate_in_place<true>(query, key, cos, sin, is_neox);
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_functional(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin,
    bool is_neox) {
  check_all(kOp<false>, query, key, cos, sin);
  at::Tensor q_out = at::empty(query.sizes(), query.options());
  at::Tensor k_out = at::empty(key.sizes(), key.options());
  rotate<false>(q_out, query, cos, sin, is_neox, "query");
  rotate<false>(k_out, key, cos, sin, is_neox, "key");
  return {q_out, k_out};
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_ir_cpu, CPU, m) {
  m.impl("rotary_embedding", &rotary_embedding);
  m.impl("rotary_embedding_functional", &rotary_embedding_functional);
  m.impl("rotary_embedding_fp32", &rotary_embedding_fp32);
}

}  // namespace vllm_ir_cpu
