"""The kernel launches as torch ops: ``torch.ops.vllm_ir_triton.*``.

Defined with :func:`torch.library.custom_op`, so Dynamo, ``make_fx`` and the
vllm-ir lowering see one opaque node per launch, with a fake impl for
FakeTensors (tracing never launches a kernel):

* ``rms_norm(Tensor x, Tensor? weight, float epsilon, bool batch_invariant) -> Tensor``:
  a new contiguous tensor; functional, so the lowering inlines it before
  Inductor's own passes.
* ``fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight,
  float epsilon, bool batch_invariant) -> ()``: in place, the rounded sum into
  ``x_residual``, its normalization into ``x``. The schema says which
  arguments it writes, which is what clone elimination reads.
* ``vllm_fused_add_rms_norm_(...)``: the same arguments, vLLM's numerics (the
  float32 sum normalized).
* ``silu_and_mul(Tensor x) -> Tensor``: a new contiguous tensor of half the
  last dimension.
* ``gelu_and_mul(Tensor x, str approximate) -> Tensor``: likewise, GELU.
* ``rotary_embedding_(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin,
  bool is_neox) -> ()``: RoPE in place.
* ``static_scaled_fp8_quant(Tensor x, Tensor scale) -> Tensor``,
  ``dynamic_per_token_fp8_quant(Tensor x, Tensor? scale_ub) -> (Tensor, Tensor)``
  and ``rms_norm_static_fp8_quant(Tensor x, Tensor? weight, float epsilon,
  Tensor scale) -> Tensor``: functional, new ``float8_e4m3fn`` tensors (and
  float32 scales of shape ``(..., 1)``).
* ``fused_add_rms_norm_static_fp8_quant_(Tensor x, Tensor(a!) x_residual,
  Tensor? weight, float epsilon, Tensor scale) -> Tensor``: the rounded sum
  into ``x_residual`` (in place), its normalization quantized into a new
  ``float8_e4m3fn`` tensor, returned; ``x`` is only read.

Why opaque ops rather than ``torch.library.triton_op`` / ``wrap_triton``: see
the package README ("torch.compile").
"""

from __future__ import annotations

import torch
from torch import Tensor

from vllm_ir_triton import launch

__all__ = [
    "NAMESPACE",
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm_",
    "fused_add_rms_norm_static_fp8_quant_",
    "rms_norm",
    "vllm_fused_add_rms_norm_",
    "rms_norm_static_fp8_quant",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding_",
    "static_scaled_fp8_quant",
]

NAMESPACE = "vllm_ir_triton"


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool) -> Tensor:
    """RMSNorm of ``x`` (any leading shape) into a new contiguous tensor."""
    return launch.rms_norm(x, weight, epsilon, batch_invariant=batch_invariant)


@rms_norm.register_fake
def _rms_norm_fake(
    x: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{NAMESPACE}::fused_add_rms_norm_", mutates_args=("x", "x_residual"))
def fused_add_rms_norm_(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> None:
    """In place: ``x_residual += x`` (rounded), then ``x = rms_norm(x_residual)``."""
    launch.fused_add_rms_norm_(x, x_residual, weight, epsilon, batch_invariant=batch_invariant)


@fused_add_rms_norm_.register_fake
def _fused_add_rms_norm_fake(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::vllm_fused_add_rms_norm_", mutates_args=("x", "x_residual"))
def vllm_fused_add_rms_norm_(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> None:
    """In place: ``x_residual += x`` (rounded), ``x`` = the RMSNorm of the float32 sum."""
    launch.fused_add_rms_norm_(
        x, x_residual, weight, epsilon, batch_invariant=batch_invariant, vllm=True
    )


@vllm_fused_add_rms_norm_.register_fake
def _vllm_fused_add_rms_norm_fake(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::silu_and_mul", mutates_args=())
def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` into a new contiguous tensor."""
    return launch.silu_and_mul(x)


@silu_and_mul.register_fake
def _silu_and_mul_fake(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op(f"{NAMESPACE}::gelu_and_mul", mutates_args=())
def gelu_and_mul(x: Tensor, approximate: str) -> Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` into a new contiguous tensor."""
    return launch.gelu_and_mul(x, approximate)


@gelu_and_mul.register_fake
def _gelu_and_mul_fake(x: Tensor, approximate: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op(f"{NAMESPACE}::rotary_embedding_", mutates_args=("query", "key"))
def rotary_embedding_(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool) -> None:
    """RoPE of ``query`` and ``key`` in place."""
    launch.rotary_embedding_(query, key, cos, sin, is_neox)


@rotary_embedding_.register_fake
def _rotary_embedding_fake(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool
) -> None:
    return None


@torch.library.custom_op(f"{NAMESPACE}::static_scaled_fp8_quant", mutates_args=())
def static_scaled_fp8_quant(x: Tensor, scale: Tensor) -> Tensor:
    """``x / scale`` clamped and rounded into a new ``float8_e4m3fn`` tensor."""
    return launch.static_scaled_fp8_quant(x, scale)


@static_scaled_fp8_quant.register_fake
def _static_scaled_fp8_quant_fake(x: Tensor, scale: Tensor) -> Tensor:
    return x.new_empty(x.shape, dtype=launch.FP8)


@torch.library.custom_op(f"{NAMESPACE}::dynamic_per_token_fp8_quant", mutates_args=())
def dynamic_per_token_fp8_quant(x: Tensor, scale_ub: Tensor | None) -> tuple[Tensor, Tensor]:
    """Per-row scales and the quantized rows: ``(q, scales)``."""
    return launch.dynamic_per_token_fp8_quant(x, scale_ub)


@dynamic_per_token_fp8_quant.register_fake
def _dynamic_per_token_fp8_quant_fake(x: Tensor, scale_ub: Tensor | None) -> tuple[Tensor, Tensor]:
    scales = x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
    return x.new_empty(x.shape, dtype=launch.FP8), scales


@torch.library.custom_op(f"{NAMESPACE}::rms_norm_static_fp8_quant", mutates_args=())
def rms_norm_static_fp8_quant(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    """RMSNorm of ``x`` quantized with ``scale`` into a new ``float8_e4m3fn`` tensor."""
    return launch.rms_norm(x, weight, epsilon, scale=scale)


@rms_norm_static_fp8_quant.register_fake
def _rms_norm_static_fp8_quant_fake(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    return x.new_empty(x.shape, dtype=launch.FP8)


@torch.library.custom_op(
    f"{NAMESPACE}::fused_add_rms_norm_static_fp8_quant_", mutates_args=("x_residual",)
)
def fused_add_rms_norm_static_fp8_quant_(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    """``x_residual += x`` (rounded, in place); returns its RMSNorm quantized with ``scale``."""
    return launch.fused_add_rms_norm_static_fp8_quant_(x, x_residual, weight, epsilon, scale)


@fused_add_rms_norm_static_fp8_quant_.register_fake
def _fused_add_rms_norm_static_fp8_quant_fake(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    return x.new_empty(x.shape, dtype=launch.FP8)
