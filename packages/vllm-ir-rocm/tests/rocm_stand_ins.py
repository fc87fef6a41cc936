"""A CPU stand-in for AMD's ``aiter`` module (not a test module of its own).

It has the two entry points vllm-ir-rocm calls, with AITER's signatures,
argument checks and in-place behaviour (``ROCm/aiter``, ``aiter/ops/rmsnorm.py``),
computing on CPU tensors, and it records every call so tests can check which
tensors reached which function:

* ``rmsnorm2d_fwd(input, weight, epsilon, use_model_sensitive_rmsnorm=0)``
  returns a new tensor; ``input`` may have a row stride larger than its rows
  (AITER reads such 2-D views without a copy); fp32 accumulation, the weight
  applied in fp32, one rounding to the dtype;
* ``fused_add_rms_norm_cu(input, residual_in, weight, epsilon)`` writes
  ``residual_in += input`` (rounded to the dtype) and then
  ``input = rmsnorm(residual_in) * weight``; both must be contiguous.

Stricter than AITER in one way: it insists on 2-D rows, which is what
vllm-ir-rocm promises to pass.
"""

from __future__ import annotations

import importlib.machinery
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class Call:
    """One call of a stand-in entry point: its name and its arguments by AITER's names."""

    name: str
    args: dict[str, Any]


def _normalize(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    x32 = x.float()
    inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    return (x32 * inv_rms * weight.float()).to(x.dtype)


def _check(name: str, input: Tensor, weight: Tensor) -> None:
    assert input.dim() == 2, f"stand-in {name}: vllm-ir-rocm passes 2-D rows, got {input.dim()}-D"
    assert input.dtype in _DTYPES, f"stand-in {name}: fp16/bf16/fp32 only, got {input.dtype}"
    assert weight.dtype == input.dtype, f"stand-in {name}: weight dtype must match input"
    assert weight.is_contiguous(), f"stand-in {name}: weight must be contiguous"
    assert weight.shape == (input.shape[-1],), f"stand-in {name}: weight length != hidden"
    assert input.stride(-1) == 1, f"stand-in {name}: last dim must be contiguous"


@dataclass
class StandInAiter:
    """The recorder behind the stand-in module; ``module`` goes into ``sys.modules``."""

    calls: list[Call] = field(default_factory=list)
    module: types.ModuleType = field(init=False)

    def __post_init__(self) -> None:
        module = types.ModuleType("aiter", "CPU stand-in for AMD's AITER (vllm-ir-rocm tests)")
        module.__file__ = __file__
        module.__spec__ = importlib.machinery.ModuleSpec("aiter", None, origin=__file__)
        module.__version__ = "0.0.0+cpu-stand-in"  # type: ignore[attr-defined]
        module.rmsnorm2d_fwd = self.rmsnorm2d_fwd  # type: ignore[attr-defined]
        module.rms_norm = self.rmsnorm2d_fwd  # type: ignore[attr-defined]
        module.fused_add_rms_norm_cu = self.fused_add_rms_norm_cu  # type: ignore[attr-defined]
        self.module = module

    def named(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def rmsnorm2d_fwd(
        self, input: Tensor, weight: Tensor, epsilon: float, use_model_sensitive_rmsnorm: int = 0
    ) -> Tensor:
        self.calls.append(
            Call(
                "rmsnorm2d_fwd",
                {
                    "input": input,
                    "weight": weight,
                    "epsilon": epsilon,
                    "use_model_sensitive_rmsnorm": use_model_sensitive_rmsnorm,
                },
            )
        )
        _check("rmsnorm2d_fwd", input, weight)
        return _normalize(input, weight, epsilon).contiguous()

    def fused_add_rms_norm_cu(
        self, input: Tensor, residual_in: Tensor, weight: Tensor, epsilon: float
    ) -> None:
        self.calls.append(
            Call(
                "fused_add_rms_norm_cu",
                {"input": input, "residual_in": residual_in, "weight": weight, "epsilon": epsilon},
            )
        )
        _check("fused_add_rms_norm_cu", input, weight)
        assert input.is_contiguous(), "stand-in fused_add_rms_norm_cu: input must be contiguous"
        assert residual_in.is_contiguous(), "stand-in fused_add_rms_norm_cu: bad residual"
        assert residual_in.dtype == input.dtype, "stand-in fused_add_rms_norm_cu: bad residual"
        assert residual_in.numel() == input.numel(), "residual shape != input"
        residual_in.add_(input)
        input.copy_(_normalize(residual_in, weight, epsilon))


def unrelated_aiter() -> types.ModuleType:
    """What ``import aiter`` gives with PyPI's unrelated ``aiter`` (async iterators) installed."""
    module = types.ModuleType("aiter", "Useful patterns building upon asynchronous iterators.")
    module.__file__ = "/site-packages/aiter/__init__.py"
    module.anext = lambda *a: None  # type: ignore[attr-defined]
    return module
