"""The kernels as torch ops: ``torch.ops.vllm_ir_cuda.<name>`` for each of :data:`SCHEMAS`.

Importing this module defines, with :mod:`torch.library`, the ops' schemas
(arguments they write are ``Tensor(a!)``) and their fake impls: all that
tracing, ``torch.compile`` and FakeTensors need, on any machine. The CUDA
implementations live in the compiled library (``csrc/binding.cpp``, through
``TORCH_LIBRARY_IMPL(vllm_ir_cuda, CUDA, m)``).

The library is built and loaded on the first call with CUDA tensors: until
then, a ``CompositeExplicitAutograd`` kernel serves the call, builds and loads
the library, and calls the op again, which now reaches the CUDA kernel (a
kernel registered for the CUDA key takes precedence over the composite one).
So eager calls, compiled graphs and direct ``torch.ops`` calls all build on
first use, and never earlier. Calls with tensors on another device fail with
a message saying so.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.library import Library

from vllm_ir_cuda import _build
from vllm_ir_cuda._schemas import SCHEMAS

# and one OpOverload per schema, named after it (defined below)
__all__ = ["DTYPES", "NAMESPACE", "SCHEMAS", *SCHEMAS]

NAMESPACE = "vllm_ir_cuda"


DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes the kernels take (every tensor argument of a call shares one)."""

_lib = Library(NAMESPACE, "DEF")
for _schema in SCHEMAS.values():
    _lib.define(_schema)


def _check(op: str, x: Tensor, others: dict[str, Tensor | None], *, first: str = "x") -> None:
    """The binding's dtype and device checks, for FakeTensors at trace time.

    ``first`` names ``x`` in the messages (``query`` for rotary_embedding).
    """
    if x.dtype not in DTYPES:
        raise RuntimeError(
            f"vllm_ir_cuda::{op}: {first} has dtype {x.dtype}; the kernels take "
            f"{', '.join(str(d) for d in DTYPES)}"
        )
    for name, t in others.items():
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise RuntimeError(
                f"vllm_ir_cuda::{op}: {name} has dtype {t.dtype} but {first} has dtype {x.dtype}"
            )
        if t.device != x.device:
            raise RuntimeError(
                f"vllm_ir_cuda::{op}: {name} is on {t.device} but {first} is on {x.device}"
            )


@torch.library.register_fake(f"{NAMESPACE}::rms_norm", lib=_lib)
def _rms_norm_fake(out: Tensor, x: Tensor, weight: Tensor | None, epsilon: float) -> None:
    _check("rms_norm", x, {"out": out, "weight": weight})


@torch.library.register_fake(f"{NAMESPACE}::fused_add_rms_norm", lib=_lib)
def _fused_add_rms_norm_fake(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
) -> None:
    _check("fused_add_rms_norm", x, {"x_residual": x_residual, "weight": weight})


@torch.library.register_fake(f"{NAMESPACE}::vllm_fused_add_rms_norm", lib=_lib)
def _vllm_fused_add_rms_norm_fake(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
) -> None:
    _check("vllm_fused_add_rms_norm", x, {"x_residual": x_residual, "weight": weight})


def _check_fp8(op: str, x: Tensor, out: Tensor, scales: dict[str, Tensor | None]) -> None:
    """The binding's checks of an FP8 output and float32 scales, at trace time."""
    if out.dtype != torch.float8_e4m3fn:
        raise RuntimeError(
            f"vllm_ir_cuda::{op}: out has dtype {out.dtype}; it must be torch.float8_e4m3fn"
        )
    for name, t in {"out": out, **scales}.items():
        if t is not None and t.device != x.device:
            raise RuntimeError(
                f"vllm_ir_cuda::{op}: {name} is on {t.device} but x is on {x.device}"
            )
    for name, t in scales.items():
        if t is not None and t.dtype != torch.float32:
            raise RuntimeError(
                f"vllm_ir_cuda::{op}: {name} has dtype {t.dtype}; it must be float32"
            )


@torch.library.register_fake(f"{NAMESPACE}::silu_and_mul", lib=_lib)
def _silu_and_mul_fake(out: Tensor, x: Tensor) -> None:
    _check("silu_and_mul", x, {"out": out})


@torch.library.register_fake(f"{NAMESPACE}::gelu_and_mul", lib=_lib)
def _gelu_and_mul_fake(out: Tensor, x: Tensor, approximate: str) -> None:
    _check("gelu_and_mul", x, {"out": out})
    _check_approximate(approximate)


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise RuntimeError(
            f'vllm_ir_cuda::gelu_and_mul: approximate must be "none" or "tanh", got "{approximate}"'
        )


@torch.library.register_fake(f"{NAMESPACE}::rotary_embedding", lib=_lib)
def _rotary_embedding_fake(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool
) -> None:
    _check("rotary_embedding", query, {"key": key, "cos": cos, "sin": sin}, first="query")
    op = "vllm_ir_cuda::rotary_embedding"
    if query.dim() < 2 or key.dim() < 2 or query.shape[:-2] != key.shape[:-2]:
        raise RuntimeError(
            f"{op}: query {list(query.shape)} and key {list(key.shape)} must have the same "
            "token dimensions"
        )
    tokens = query.shape[:-2].numel()
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != tokens:
        raise RuntimeError(
            f"{op}: cos and sin must both have shape [{tokens}, rotary_dim] (one row per "
            f"token), got {list(cos.shape)} and {list(sin.shape)}"
        )
    rot = cos.shape[1]
    if rot % 2 or rot > query.shape[-1] or rot > key.shape[-1]:
        raise RuntimeError(
            f"{op}: rotary_dim (cos.size(-1) = {rot}) must be even and at most the head size "
            f"of query ({query.shape[-1]}) and key ({key.shape[-1]})"
        )


@torch.library.register_fake(f"{NAMESPACE}::static_scaled_fp8_quant", lib=_lib)
def _static_fake(out: Tensor, x: Tensor, scale: Tensor) -> None:
    _check("static_scaled_fp8_quant", x, {})
    _check_fp8("static_scaled_fp8_quant", x, out, {"scale": scale})


@torch.library.register_fake(f"{NAMESPACE}::dynamic_per_token_fp8_quant", lib=_lib)
def _dynamic_fake(out: Tensor, scales: Tensor, x: Tensor, scale_ub: Tensor | None) -> None:
    _check("dynamic_per_token_fp8_quant", x, {})
    _check_fp8("dynamic_per_token_fp8_quant", x, out, {"scales": scales, "scale_ub": scale_ub})


@torch.library.register_fake(f"{NAMESPACE}::rms_norm_static_fp8_quant", lib=_lib)
def _rms_quant_fake(
    out: Tensor, x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> None:
    _check("rms_norm_static_fp8_quant", x, {"weight": weight})
    _check_fp8("rms_norm_static_fp8_quant", x, out, {"scale": scale})


@torch.library.register_fake(f"{NAMESPACE}::fused_add_rms_norm_static_fp8_quant", lib=_lib)
def _fused_quant_fake(
    out: Tensor,
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    scale: Tensor,
) -> None:
    op = "fused_add_rms_norm_static_fp8_quant"
    _check(op, x, {"x_residual": x_residual, "weight": weight})
    _check_fp8(op, x, out, {"scale": scale})


def _build_on_first_call(name: str) -> Callable[..., None]:
    qualname = f"{NAMESPACE}::{name}"

    def first_call(*args: object) -> None:
        device = args[0].device  # type: ignore[attr-defined]  # every op's first arg: a tensor
        if device.type != "cuda":
            raise RuntimeError(
                f"torch.ops.{NAMESPACE}.{name} runs on CUDA tensors only, got tensors on "
                f"{device}; on this device use vllm_ir.ops.{name}, which selects another impl"
            )
        library = _build.load()
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA"):
            raise RuntimeError(
                f"{library} was loaded but registered no CUDA kernel for {qualname}; "
                "delete it (or the VLLM_IR_CACHE_DIR entry holding it) to rebuild"
            )
        getattr(torch.ops.vllm_ir_cuda, name).default(*args)

    first_call.__name__ = f"{name}_first_call"
    return first_call


for _name in SCHEMAS:
    _lib.impl(_name, _build_on_first_call(_name), "CompositeExplicitAutograd")

rms_norm: torch._ops.OpOverload = torch.ops.vllm_ir_cuda.rms_norm.default
"""``rms_norm(out, x, weight, epsilon)``: writes ``rms_norm(x)`` into ``out``."""

fused_add_rms_norm: torch._ops.OpOverload = torch.ops.vllm_ir_cuda.fused_add_rms_norm.default
"""``fused_add_rms_norm(x, x_residual, weight, epsilon)``: in place, the sum into
``x_residual``, its normalization into ``x``."""

vllm_fused_add_rms_norm: torch._ops.OpOverload = (
    torch.ops.vllm_ir_cuda.vllm_fused_add_rms_norm.default
)
"""In place, vLLM's numerics: ``x_residual = x + x_residual`` (rounded), ``x`` = the
RMSNorm of the float32 sum."""

silu_and_mul: torch._ops.OpOverload = torch.ops.vllm_ir_cuda.silu_and_mul.default
"""``silu_and_mul(out, x)``: writes ``silu(x[..., :d]) * x[..., d:]`` into ``out``."""

gelu_and_mul: torch._ops.OpOverload = torch.ops.vllm_ir_cuda.gelu_and_mul.default
"""``gelu_and_mul(out, x, approximate)``: writes ``gelu(x[..., :d], approximate) * x[..., d:]``
into ``out``."""

rotary_embedding: torch._ops.OpOverload = torch.ops.vllm_ir_cuda.rotary_embedding.default
"""``rotary_embedding(query, key, cos, sin, is_neox)``: RoPE in place of ``query`` and ``key``
(``(*tokens, heads, head_size)``, the same token dims) with ``cos``/``sin`` rows
``[tokens, rotary_dim]``."""

static_scaled_fp8_quant: torch._ops.OpOverload = (
    torch.ops.vllm_ir_cuda.static_scaled_fp8_quant.default
)
"""``static_scaled_fp8_quant(out, x, scale)``: FP8 ``x / scale`` into ``out``."""

dynamic_per_token_fp8_quant: torch._ops.OpOverload = (
    torch.ops.vllm_ir_cuda.dynamic_per_token_fp8_quant.default
)
"""``dynamic_per_token_fp8_quant(out, scales, x, scale_ub)``: per-row scales and FP8 values."""

rms_norm_static_fp8_quant: torch._ops.OpOverload = (
    torch.ops.vllm_ir_cuda.rms_norm_static_fp8_quant.default
)
"""``rms_norm_static_fp8_quant(out, x, weight, epsilon, scale)``: FP8 of the norm into ``out``."""

fused_add_rms_norm_static_fp8_quant: torch._ops.OpOverload = (
    torch.ops.vllm_ir_cuda.fused_add_rms_norm_static_fp8_quant.default
)
"""``fused_add_rms_norm_static_fp8_quant(out, x, x_residual, weight, epsilon, scale)``: the sum
into ``x_residual`` (in place), FP8 of its norm into ``out``; ``x`` is only read."""
