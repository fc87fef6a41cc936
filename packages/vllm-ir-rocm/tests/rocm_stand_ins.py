"""A CPU stand-in for AMD's ``aiter`` module (not a test module of its own).

It has the two entry points vllm-ir-rocm calls, with AITER's signatures,
argument checks and in-place behaviour (``ROCm/aiter``, ``aiter/ops/rmsnorm.py``),
computing on CPU tensors, and it records every call
(:class:`vllm_ir.testing.vendor.StandInKernels`) so tests can check which
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

import types
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor
from vllm_ir.testing.vendor import (
    StandInKernels,
    VendorUnderTest,
    check_rows,
    reference_rms,
    stand_in_defaults,
    stand_in_module,
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _normalize(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    return reference_rms(x, weight, epsilon, weight_in_fp32=True)


def _check(name: str, input: Tensor, weight: Tensor) -> None:
    check_rows(name, "vllm-ir-rocm", input, weight, _DTYPES)


@dataclass
class StandInAiter(StandInKernels):
    """The recorder behind the stand-in module; ``modules["aiter"]`` goes into ``sys.modules``."""

    def __post_init__(self) -> None:
        module = stand_in_module(
            "aiter", "CPU stand-in for AMD's AITER (vllm-ir-rocm tests)", __file__
        )
        module.__version__ = "0.0.0+cpu-stand-in"  # type: ignore[attr-defined]
        module.rmsnorm2d_fwd = self.rmsnorm2d_fwd  # type: ignore[attr-defined]
        module.rms_norm = self.rmsnorm2d_fwd  # type: ignore[attr-defined]
        module.fused_add_rms_norm_cu = self.fused_add_rms_norm_cu  # type: ignore[attr-defined]
        self.modules = {"aiter": module}

    @property
    def module(self) -> types.ModuleType:
        return self.modules["aiter"]

    def rmsnorm2d_fwd(
        self, input: Tensor, weight: Tensor, epsilon: float, use_model_sensitive_rmsnorm: int = 0
    ) -> Tensor:
        self.record(
            "rmsnorm2d_fwd",
            input=input,
            weight=weight,
            epsilon=epsilon,
            use_model_sensitive_rmsnorm=use_model_sensitive_rmsnorm,
        )
        _check("rmsnorm2d_fwd", input, weight)
        return _normalize(input, weight, epsilon).contiguous()

    def fused_add_rms_norm_cu(
        self, input: Tensor, residual_in: Tensor, weight: Tensor, epsilon: float
    ) -> None:
        self.record(
            "fused_add_rms_norm_cu",
            input=input,
            residual_in=residual_in,
            weight=weight,
            epsilon=epsilon,
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


def _pretend_rocm_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


TRITON_STAND_IN = stand_in_defaults(
    ("cuda", "rocm", "xpu"), ["triton", "triton_batch_invariant"], rank=-10
)
"""vllm-ir-triton's defaults where it is not installed (its platforms and rank)."""

VENDOR = VendorUnderTest(
    package="vllm_ir_rocm",
    distribution="vllm-ir-rocm",
    platform="rocm",
    device_type="cuda",
    eager_default=("aiter", "vllm_c"),
    rms_call="rmsnorm2d_fwd",
    fused_call="fused_add_rms_norm_cu",
    residual_arg="residual_in",
    declined_dtype=torch.float32,
    stand_in=StandInAiter,
    on_vendor_build=lambda: bool(torch.version.hip),
    not_here="not a ROCm build",
    gpu="a ROCm GPU with AITER",
    pretend_gpu=_pretend_rocm_gpu,
    not_installed="AITER is not installed",
    import_failure=(
        "aiter",
        RuntimeError("hipErrorNoBinaryForGpu: no kernel image for this GPU"),
        "importing 'aiter' failed: RuntimeError: hipErrorNoBinaryForGpu",
    ),
    neighbours={"vllm_ir_triton": TRITON_STAND_IN},
    with_neighbours=("triton", "triton_batch_invariant", "native"),
)
"""vllm-ir-rocm for the shared checks of :mod:`vllm_ir.testing.vendor`."""
