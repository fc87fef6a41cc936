"""The kernel ops ``torch.ops.vllm_ir_cpu.*``: schemas and fake impls, defined in Python.

Defining the schemas here rather than in C++ lets Dynamo, ``make_fx`` and the
vllm-ir lowering trace calls to the kernels before the library is built (a
FakeTensor call never needs it). The C++ library registers only the CPU
kernels (``TORCH_LIBRARY_IMPL``).

Until the library is loaded, a real call reaches a ``CompositeExplicitAutograd``
kernel that builds and loads it, then calls the op again, which now
dispatches to the C++ kernel (a backend kernel takes precedence over a
composite one). This matters for a compiled graph served from Inductor's
cache in a fresh process: it calls the kernel ops without tracing the impls
that would otherwise have triggered the build.

Ops (``Tensor(a!)``: written in place):

* ``rms_norm(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()``
* ``rms_norm_functional(Tensor x, Tensor? weight, float epsilon) -> Tensor``:
  the same into a new contiguous tensor; what the IR impl calls, so graphs
  lowered before Inductor's own passes stay functional.
* ``fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight,
  float epsilon) -> ()``: ``x_residual += x`` (rounded to the dtype), then
  ``x = rms_norm(x_residual)``.
* ``vllm_fused_add_rms_norm(...)``: the same arguments; vLLM's numerics (the
  fp32 sum is normalized, only ``x_residual`` is rounded).
* ``silu_and_mul(Tensor x) -> Tensor``: ``silu(x[..., :d]) * x[..., d:]``.
* ``gelu_and_mul(Tensor x, str approximate) -> Tensor``: ``gelu(x[..., :d],
  approximate) * x[..., d:]``.
* ``rotary_embedding(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin,
  bool is_neox) -> ()``: RoPE of ``query`` and ``key`` in place;
  ``rotary_embedding_functional(...) -> (Tensor, Tensor)``: the same into new
  contiguous tensors.
* ``rotary_embedding_fp32(...)``: ``rotary_embedding``'s arguments, in place;
  each output computed in fp32 and rounded to the dtype once.
* ``static_scaled_fp8_quant(Tensor x, Tensor scale) -> Tensor``: FP8
  (``float8_e4m3fn``) of ``x / scale``.
* ``dynamic_per_token_fp8_quant(Tensor x, Tensor? scale_ub) -> (Tensor, Tensor)``:
  FP8 with a scale per row, and the scales (``(..., 1)``, fp32).
* ``rms_norm_static_fp8_quant(Tensor x, Tensor? weight, float epsilon,
  Tensor scale) -> Tensor``: FP8 of ``rms_norm(x)``.
* ``fused_add_rms_norm_static_fp8_quant(Tensor x, Tensor(a!) x_residual,
  Tensor? weight, float epsilon, Tensor scale) -> Tensor``: ``x_residual += x``
  (rounded), then FP8 of ``rms_norm(x_residual)``; ``x`` is only read.

Every output is a new contiguous tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["NAMESPACE", "SCHEMAS", "kernel_ops"]

NAMESPACE = "vllm_ir_cpu"

SCHEMAS: dict[str, str] = {
    "rms_norm": "(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()",
    "rms_norm_functional": "(Tensor x, Tensor? weight, float epsilon) -> Tensor",
    "fused_add_rms_norm": (
        "(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight, float epsilon) -> ()"
    ),
    "vllm_fused_add_rms_norm": (
        "(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight, float epsilon) -> ()"
    ),
    "silu_and_mul": "(Tensor x) -> Tensor",
    "gelu_and_mul": "(Tensor x, str approximate) -> Tensor",
    "rotary_embedding": (
        "(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, bool is_neox) -> ()"
    ),
    "rotary_embedding_functional": (
        "(Tensor query, Tensor key, Tensor cos, Tensor sin, bool is_neox) -> (Tensor, Tensor)"
    ),
    "rotary_embedding_fp32": (
        "(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, bool is_neox) -> ()"
    ),
    "static_scaled_fp8_quant": "(Tensor x, Tensor scale) -> Tensor",
    "dynamic_per_token_fp8_quant": "(Tensor x, Tensor? scale_ub) -> (Tensor, Tensor)",
    "rms_norm_static_fp8_quant": (
        "(Tensor x, Tensor? weight, float epsilon, Tensor scale) -> Tensor"
    ),
    "fused_add_rms_norm_static_fp8_quant": (
        "(Tensor x, Tensor(a!) x_residual, Tensor? weight, float epsilon, Tensor scale) -> Tensor"
    ),
}

FP8 = torch.float8_e4m3fn
"""The dtype of the quantized outputs."""

_lib = torch.library.Library(NAMESPACE, "DEF")
for _name, _schema in SCHEMAS.items():
    _lib.define(f"{_name}{_schema}")


def _fake_rms_norm(out: Tensor, x: Tensor, weight: Tensor | None, epsilon: float) -> None:
    return None


def _fake_rms_norm_functional(x: Tensor, weight: Tensor | None, epsilon: float) -> Tensor:
    # the kernel allocates its output contiguous, whatever the input's layout
    return x.new_empty(x.shape)


def _fake_fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
) -> None:
    return None


def _fake_silu_and_mul(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _fake_gelu_and_mul(x: Tensor, approximate: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _fake_rotary_embedding(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool
) -> None:
    return None


def _fake_rotary_embedding_functional(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool
) -> tuple[Tensor, Tensor]:
    return query.new_empty(query.shape), key.new_empty(key.shape)


def _fake_static_scaled_fp8_quant(x: Tensor, scale: Tensor) -> Tensor:
    return x.new_empty(x.shape, dtype=FP8)


def _fake_dynamic_per_token_fp8_quant(x: Tensor, scale_ub: Tensor | None) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape, dtype=FP8), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


def _fake_rms_norm_static_fp8_quant(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    return x.new_empty(x.shape, dtype=FP8)


def _fake_fused_add_rms_norm_static_fp8_quant(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    return x.new_empty(x.shape, dtype=FP8)


_FAKES: dict[str, Callable[..., Any]] = {
    "rms_norm": _fake_rms_norm,
    "rms_norm_functional": _fake_rms_norm_functional,
    "fused_add_rms_norm": _fake_fused_add_rms_norm,
    "vllm_fused_add_rms_norm": _fake_fused_add_rms_norm,
    "silu_and_mul": _fake_silu_and_mul,
    "gelu_and_mul": _fake_gelu_and_mul,
    "rotary_embedding": _fake_rotary_embedding,
    "rotary_embedding_functional": _fake_rotary_embedding_functional,
    "rotary_embedding_fp32": _fake_rotary_embedding,
    "static_scaled_fp8_quant": _fake_static_scaled_fp8_quant,
    "dynamic_per_token_fp8_quant": _fake_dynamic_per_token_fp8_quant,
    "rms_norm_static_fp8_quant": _fake_rms_norm_static_fp8_quant,
    "fused_add_rms_norm_static_fp8_quant": _fake_fused_add_rms_norm_static_fp8_quant,
}
assert set(_FAKES) == set(SCHEMAS)
for _name, _fake in _FAKES.items():
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _fake, lib=_lib)


def _build_then_call(name: str) -> Any:
    def kernel(*args: Any) -> Any:
        devices = {a.device.type for a in args if isinstance(a, Tensor)}
        if devices != {"cpu"}:
            raise NotImplementedError(
                f"{NAMESPACE}::{name} runs on CPU tensors only, got tensors on "
                f"{', '.join(sorted(devices))}"
            )
        from vllm_ir_cpu import build

        if build.is_loaded():  # loaded, yet the CPU kernel did not take over
            raise RuntimeError(
                f"{NAMESPACE}::{name}: the library {build.build()} is loaded but registers "
                "no CPU kernel for this op; rebuild it with `python -m vllm_ir_cpu build`"
            )
        build.build()
        return getattr(getattr(torch.ops, NAMESPACE), name).default(*args)

    kernel.__name__ = f"{name}_build_then_call"
    return kernel


for _name in SCHEMAS:
    _lib.impl(_name, _build_then_call(_name), "CompositeExplicitAutograd")


def kernel_ops() -> dict[str, torch._ops.OpOverload]:
    """Name -> ``torch.ops.vllm_ir_cpu.<name>.default`` for every kernel op."""
    packet = getattr(torch.ops, NAMESPACE)
    return {name: getattr(packet, name).default for name in SCHEMAS}
