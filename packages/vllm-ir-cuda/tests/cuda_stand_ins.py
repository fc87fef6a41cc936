"""CPU stand-ins for the CUDA kernels (not a test module; named to be unique
when several packages' tests run in one pytest session).

Python kernels for ``torch.ops.vllm_ir_cuda.*`` registered for the CPU
dispatch key compute the native semantics, so the impls' wiring (argument
mapping, the in-place contract, tracing and compiling) runs without a GPU.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from torch.library import Library
from vllm_ir_cuda import ops

STANDIN = "vllm_c_cpu_standin"
"""The impls of :mod:`vllm_ir_cuda.layernorm`, registered to run on the CPU stand-ins."""

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.version.cuda is None,
    reason="needs an NVIDIA GPU and a CUDA build of torch (torch.cuda.is_available() is False)",
)


def conformance_params(names: Sequence[str]) -> list[Any]:
    """The conformance kit's cases for the ops ``names`` over the stand-ins, as pytest
    params ``(op_name, check, dtype)``: every check in every dtype the kernels take,
    ``compiled`` in float32 only (a compile per case)."""
    cases = [
        (op, check, dtype)
        for op in names
        for check in ("correctness", "supports_args", "mutation", "opcheck")
        for dtype in ops.DTYPES
    ] + [(op, "compiled", torch.float32) for op in names]
    return [
        pytest.param(o, c, d, id=f"{o}-{c}-{str(d).removeprefix('torch.')}") for o, c, d in cases
    ]


def accepted_samples(
    op: ir.IrOp, dtype: torch.dtype, declined: Callable[[Any], None] = lambda sample: None
) -> Iterator[Any]:
    """``op``'s sample inputs in ``dtype`` that the :data:`STANDIN` impl's ``supports_args``
    accepts; each one it declines goes to ``declined`` (which may assert why)."""
    supports = op.impls[STANDIN].supports_args
    for sample in op.sample_inputs(dtype):
        if supports(*sample.args):
            yield sample
        else:
            declined(sample)


def _check_rows(op: str, *tensors: Tensor) -> None:
    # the binding's contract: rows contiguous in the last dimension
    for t in tensors:
        if t.size(-1) > 1 and t.stride(-1) != 1:
            raise RuntimeError(f"stand-in {op}: last dimension not contiguous: {t.stride()}")


def _check_scale(op: str, scale: Tensor) -> None:
    # the binding's contract: one float32 element
    if scale.dtype != torch.float32 or scale.numel() != 1:
        raise RuntimeError(f"stand-in {op}: scale {scale.dtype} {tuple(scale.shape)}")


class StandInKernels:
    """CPU kernels for ``torch.ops.vllm_ir_cuda.*`` with the native semantics.

    ``calls`` counts the calls per op, to prove a path reached the kernel op.
    """

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.lib = Library(ops.NAMESPACE, "IMPL")
        self.lib.impl("rms_norm", self._rms_norm, "CPU")
        self.lib.impl("fused_add_rms_norm", self._fused_add_rms_norm, "CPU")
        self.lib.impl("vllm_fused_add_rms_norm", self._vllm_fused_add_rms_norm, "CPU")
        self.lib.impl("silu_and_mul", self._silu_and_mul, "CPU")
        self.lib.impl("gelu_and_mul", self._gelu_and_mul, "CPU")
        self.lib.impl("rotary_embedding", self._rotary_embedding, "CPU")
        self.lib.impl("static_scaled_fp8_quant", self._static_quant, "CPU")
        self.lib.impl("dynamic_per_token_fp8_quant", self._dynamic_quant, "CPU")
        self.lib.impl("rms_norm_static_fp8_quant", self._rms_quant, "CPU")
        self.lib.impl("fused_add_rms_norm_static_fp8_quant", self._fused_quant, "CPU")

    def _rms_norm(self, out: Tensor, x: Tensor, weight: Tensor | None, epsilon: float) -> None:
        self.calls["rms_norm"] += 1
        _check_rows("rms_norm", out, x)
        out.copy_(ir.ops.rms_norm.native(x, weight, epsilon))

    def _fused_add_rms_norm(
        self, x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
    ) -> None:
        self.calls["fused_add_rms_norm"] += 1
        _check_rows("fused_add_rms_norm", x, x_residual)
        x_residual.add_(x)  # rounded to the dtype, like the native x + x_residual
        x.copy_(ir.ops.rms_norm.native(x_residual, weight, epsilon))

    def _vllm_fused_add_rms_norm(
        self, x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
    ) -> None:
        self.calls["vllm_fused_add_rms_norm"] += 1
        _check_rows("vllm_fused_add_rms_norm", x, x_residual)
        out, total = ir.ops.vllm_fused_add_rms_norm.native(x, x_residual, weight, epsilon)
        x.copy_(out)
        x_residual.copy_(total)

    def _silu_and_mul(self, out: Tensor, x: Tensor) -> None:
        self.calls["silu_and_mul"] += 1
        _check_rows("silu_and_mul", out, x)
        out.copy_(ir.ops.silu_and_mul.native(x))

    def _gelu_and_mul(self, out: Tensor, x: Tensor, approximate: str) -> None:
        self.calls["gelu_and_mul"] += 1
        _check_rows("gelu_and_mul", out, x)
        out.copy_(ir.ops.gelu_and_mul.native(x, approximate))

    def _rotary_embedding(
        self, query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool
    ) -> None:
        # the binding's contract: one token shape, cos/sin [tokens, rotary_dim] rows
        self.calls["rotary_embedding"] += 1
        _check_rows("rotary_embedding", query, key, cos, sin)
        tokens = query.shape[:-2]
        if (
            key.shape[:-2] != tokens
            or cos.dim() != 2
            or cos.shape != sin.shape
            or cos.shape[0] != tokens.numel()
            or (cos.shape[0] > 1 and cos.stride(0) != sin.stride(0))
        ):
            raise RuntimeError(
                f"stand-in rotary_embedding: {tuple(query.shape)} {tuple(key.shape)} "
                f"{tuple(cos.shape)} {tuple(sin.shape)}"
            )
        shape = (*tokens, cos.shape[-1])
        q, k = ir.ops.rotary_embedding.native(query, key, cos.view(shape), sin.view(shape), is_neox)
        query.copy_(q)
        key.copy_(k)

    def _static_quant(self, out: Tensor, x: Tensor, scale: Tensor) -> None:
        self.calls["static_scaled_fp8_quant"] += 1
        _check_rows("static_scaled_fp8_quant", out, x)
        _check_scale("static_scaled_fp8_quant", scale)
        out.copy_(ir.ops.static_scaled_fp8_quant.native(x, scale))

    def _dynamic_quant(
        self, out: Tensor, scales: Tensor, x: Tensor, scale_ub: Tensor | None
    ) -> None:
        self.calls["dynamic_per_token_fp8_quant"] += 1
        _check_rows("dynamic_per_token_fp8_quant", out, x)
        if scale_ub is not None:
            _check_scale("dynamic_per_token_fp8_quant", scale_ub)
        q, s = ir.ops.dynamic_per_token_fp8_quant.native(x, scale_ub)
        out.copy_(q)
        scales.copy_(s)

    def _rms_quant(
        self, out: Tensor, x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
    ) -> None:
        self.calls["rms_norm_static_fp8_quant"] += 1
        _check_rows("rms_norm_static_fp8_quant", out, x)
        _check_scale("rms_norm_static_fp8_quant", scale)
        out.copy_(ir.ops.rms_norm_static_fp8_quant.native(x, weight, epsilon, scale))

    def _fused_quant(
        self,
        out: Tensor,
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        scale: Tensor,
    ) -> None:
        self.calls["fused_add_rms_norm_static_fp8_quant"] += 1
        _check_rows("fused_add_rms_norm_static_fp8_quant", out, x, x_residual)
        _check_scale("fused_add_rms_norm_static_fp8_quant", scale)
        x_residual.add_(x)
        out.copy_(
            ir.ops.static_scaled_fp8_quant.native(
                ir.ops.rms_norm.native(x_residual, weight, epsilon), scale
            )
        )

    def close(self) -> None:
        self.lib._destroy()
