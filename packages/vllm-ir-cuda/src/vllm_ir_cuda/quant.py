"""The ``vllm_c`` impls of ``silu_and_mul``, ``gelu_and_mul``, ``rotary_embedding`` and the
four FP8 ops.

Each impl has the op's native signature and maps it onto a kernel op of
:mod:`vllm_ir_cuda.ops`. As in :mod:`vllm_ir_cuda.layernorm`, inputs not
contiguous in their last dimension are copied first, and ``supports_args``
looks only at dtype, device, rank and layout (what the dispatch cache keys
on). Sizes are not in that key, so the rare calls whose sizes the kernels do
not take (a scale of more than one element, a weight of another length, rows
of no elements, an odd or too wide ``rotary_dim``, cos/sin that would broadcast
the output beyond ``query``'s shape) are computed by the native function inside
the impl. An odd last dimension of ``silu_and_mul``'s or ``gelu_and_mul``'s ``x``
is an error for every impl: the impl raises the op's ``ValueError``
(:func:`vllm_ir.ops.activation.check_gated_width`) before any launch.

``rotary_embedding`` is in place (the op allows it): the kernel rotates the
first ``rotary_dim`` channels of ``query`` and ``key`` where they lie and the
impl returns the very tensors it wrote.

Numerics (``vllm_ir.provider``): ``rotary_embedding`` gives native's bits (no
FMA contraction); ``gelu_and_mul`` is within the op's tolerance (``erff`` /
``tanhf`` against ATen's); ``silu_and_mul``, ``static_scaled_fp8_quant``
and ``dynamic_per_token_fp8_quant`` give native's CUDA bits; the norm + quant
ops quantize the value :func:`vllm_ir_cuda.layernorm.rms_norm` computes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.ops.activation import check_gated_width

from vllm_ir_cuda import ops

__all__ = [
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
    "gelu_and_mul",
    "register_kernels",
    "rms_norm_static_fp8_quant",
    "rotary_embedding",
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "supports_args_for",
]

FP8 = torch.float8_e4m3fn


def _rows_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _one_element(scale: Tensor | None) -> bool:
    return scale is None or scale.numel() == 1


def _weight_fits(x: Tensor, weight: Tensor | None) -> bool:
    return weight is None or weight.shape == (x.shape[-1],)


def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` into a new contiguous tensor."""
    check_gated_width("silu_and_mul", x)  # an odd width: the op's error, before any launch
    x = _rows_contiguous(x)
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    ops.silu_and_mul(out, x)
    return out


def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]`` into a new contiguous tensor."""
    check_gated_width("gelu_and_mul", x)  # an odd width: the op's error, before any launch
    x = _rows_contiguous(x)
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    ops.gelu_and_mul(out, x, approximate)
    return out


def _rotary_fits(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether the kernel computes native's result in place: an even ``rotary_dim`` within
    both head sizes, one token shape for query and key, and cos/sin that broadcast to it."""
    rot, tokens = cos.shape[-1], query.shape[:-2]
    cs_tokens = cos.shape[:-1]
    return (
        rot % 2 == 0
        and rot <= query.shape[-1]
        and rot <= key.shape[-1]
        and sin.shape == cos.shape
        and key.shape[:-2] == tokens
        and len(cs_tokens) <= len(tokens)
        and all(c in (1, t) for c, t in zip(reversed(cs_tokens), reversed(tokens), strict=False))
    )


def _cos_sin_rows(t: Tensor, tokens: tuple[int, ...]) -> Tensor:
    """``cos``/``sin`` as the kernel reads them: ``[tokens, rotary_dim]``, contiguous.

    A view (no copy) when they already are, as in a decoder's per-step tables."""
    rot = t.shape[-1]
    return t.expand(*tokens, rot).reshape(-1, rot).contiguous()


def rotary_embedding(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    """In place: RoPE of each (token, head) row's first ``cos.shape[-1]`` channels of
    ``query`` and ``key``; returns ``(query, key)``, the tensors written."""
    if not _rotary_fits(query, key, cos, sin):
        return ir.ops.rotary_embedding.native(query, key, cos, sin, is_neox)
    tokens = tuple(query.shape[:-2])
    c, s = _cos_sin_rows(cos, tokens), _cos_sin_rows(sin, tokens)
    # the kernel reads contiguous channels: other layouts go through a copy, written back
    q_rows, k_rows = _rows_contiguous(query), _rows_contiguous(key)
    ops.rotary_embedding(q_rows, k_rows, c, s, is_neox)
    for rows, t in ((q_rows, query), (k_rows, key)):
        if rows is not t:
            t.copy_(rows)
    return query, key


def static_scaled_fp8_quant(x: Tensor, scale: Tensor) -> Tensor:
    """FP8 ``x / scale`` (one float32 scale) into a new contiguous tensor."""
    if not _one_element(scale):
        return ir.ops.static_scaled_fp8_quant.native(x, scale)
    x = _rows_contiguous(x)
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    ops.static_scaled_fp8_quant(out, x, scale)
    return out


def dynamic_per_token_fp8_quant(x: Tensor, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-row scales ``(..., 1)`` and FP8 values, as native computes them on CUDA."""
    if x.shape[-1] == 0 or not _one_element(scale_ub):
        return ir.ops.dynamic_per_token_fp8_quant.native(x, scale_ub)
    x = _rows_contiguous(x)
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    ops.dynamic_per_token_fp8_quant(out, scales, x, scale_ub)
    return out, scales


def rms_norm_static_fp8_quant(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    """FP8 of ``rms_norm(x, weight, epsilon) / scale`` into a new contiguous tensor."""
    if not _one_element(scale) or not _weight_fits(x, weight):
        return ir.ops.rms_norm_static_fp8_quant.native(x, weight, epsilon, scale)
    x = _rows_contiguous(x)
    if weight is not None:
        weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    ops.rms_norm_static_fp8_quant(out, x, weight, epsilon, scale)
    return out


def fused_add_rms_norm_static_fp8_quant(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> tuple[Tensor, Tensor]:
    """In place: ``x_residual += x`` (rounded); returns (FP8 of its norm, ``x_residual``).

    ``x`` is only read; the FP8 output is a new tensor.
    """
    if not _one_element(scale) or not _weight_fits(x, weight) or x_residual.shape != x.shape:
        return ir.ops.fused_add_rms_norm_static_fp8_quant.native(
            x, x_residual, weight, epsilon, scale
        )
    if weight is not None:
        weight = weight.contiguous()
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    x_rows = _rows_contiguous(x)
    if x_residual.stride(-1) == 1:
        ops.fused_add_rms_norm_static_fp8_quant(out, x_rows, x_residual, weight, epsilon, scale)
    else:
        residual_rows = x_residual.contiguous()
        ops.fused_add_rms_norm_static_fp8_quant(out, x_rows, residual_rows, weight, epsilon, scale)
        x_residual.copy_(residual_rows)
    return out, x_residual


def supports_args_for(device_type: str) -> dict[str, Callable[..., bool]]:
    """``supports_args`` of each impl (by op name) for tensors on ``device_type``.

    The impls use ``"cuda"``; tests run their wiring on CPU stand-ins with ``"cpu"``.
    Only dtype, device, rank and layout: never sizes or values.
    """

    def x_ok(x: Tensor) -> bool:
        return (
            x.device.type == device_type
            and x.dtype in ops.DTYPES
            and x.layout == torch.strided
            and x.ndim >= 1
        )

    def scale_ok(x: Tensor, scale: Tensor | None) -> bool:
        return scale is None or (
            scale.dtype == torch.float32
            and scale.device == x.device
            and scale.layout == torch.strided
        )

    def weight_ok(x: Tensor, weight: Tensor | None) -> bool:
        return weight is None or (
            weight.dtype == x.dtype
            and weight.device == x.device
            and weight.ndim == 1
            and weight.layout == torch.strided
        )

    def silu(x: Tensor) -> bool:
        return x_ok(x)

    def gelu(x: Tensor, approximate: str = "none") -> bool:
        return x_ok(x) and approximate in ("none", "tanh")

    def rotary(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True) -> bool:
        # native promotes mixed dtypes and broadcasts cos/sin of more dims than
        # query[..., 0] into a larger output: neither can be written in place
        return (
            x_ok(query)
            and all(
                t.dtype == query.dtype and t.device == query.device and t.layout == torch.strided
                for t in (key, cos, sin)
            )
            and min(query.ndim, key.ndim) >= 2
            and 1 <= cos.ndim == sin.ndim < min(query.ndim, key.ndim)
        )

    def static(x: Tensor, scale: Tensor) -> bool:
        return x_ok(x) and scale_ok(x, scale)

    def dynamic(x: Tensor, scale_ub: Tensor | None = None) -> bool:
        return x_ok(x) and scale_ok(x, scale_ub)

    def rms_quant(x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor) -> bool:
        return x_ok(x) and weight_ok(x, weight) and scale_ok(x, scale)

    def fused_quant(
        x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
    ) -> bool:
        return (
            x_ok(x)
            and x_residual.dtype == x.dtype
            and x_residual.device == x.device
            and x_residual.ndim == x.ndim
            and x_residual.layout == torch.strided
            and weight_ok(x, weight)
            and scale_ok(x, scale)
        )

    return {
        "silu_and_mul": silu,
        "gelu_and_mul": gelu,
        "rotary_embedding": rotary,
        "static_scaled_fp8_quant": static,
        "dynamic_per_token_fp8_quant": dynamic,
        "rms_norm_static_fp8_quant": rms_quant,
        "fused_add_rms_norm_static_fp8_quant": fused_quant,
    }


IMPLS: dict[str, Callable[..., object]] = {
    "silu_and_mul": silu_and_mul,
    "gelu_and_mul": gelu_and_mul,
    "rotary_embedding": rotary_embedding,
    "static_scaled_fp8_quant": static_scaled_fp8_quant,
    "dynamic_per_token_fp8_quant": dynamic_per_token_fp8_quant,
    "rms_norm_static_fp8_quant": rms_norm_static_fp8_quant,
    "fused_add_rms_norm_static_fp8_quant": fused_add_rms_norm_static_fp8_quant,
}
"""Each op's impl, by op name."""

INPLACE = frozenset({"fused_add_rms_norm_static_fp8_quant", "rotary_embedding"})
"""Ops whose impl writes into an activation (the new residual into ``x_residual``; the
rotated ``query`` and ``key``)."""


def register_kernels(
    provider: str = "vllm_c", *, supported: bool, device_type: str = "cuda"
) -> None:
    """Register the seven impls. Every kernel computes a row (or element) alone, with a
    launch configuration fixed by the row length and dtype: all are batch invariant."""
    supports = supports_args_for(device_type)
    for name, impl in IMPLS.items():
        ir.get_op(name).register_impl(
            provider,
            supported=supported,
            supports_args=supports[name],
            inplace=name in INPLACE,
            batch_invariant=True,
        )(impl)
