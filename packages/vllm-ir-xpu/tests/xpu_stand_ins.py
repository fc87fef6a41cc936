"""CPU stand-ins for vllm-xpu-kernels (not a test module of its own).

``vllm_xpu_kernels`` and ``vllm_xpu_kernels._C`` modules for ``sys.modules``,
and the two ``torch.ops._C`` ops the provider calls, with vllm-xpu-kernels'
schemas (``csrc/torch_bindings.cpp``), argument checks and in-place
behaviour (``csrc/layernorm.cpp``), registered for the CPU (and, so that
the availability probe finds them, XPU) dispatch keys:

* ``_C::rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon)``:
  ``result`` contiguous, ``input`` rows with unit stride (row stride taken);
  ``result = ((input * rsqrt(mean(input^2) + eps)) rounded to the dtype) * weight``;
* ``_C::fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon)``:
  ``residual = input + residual`` (rounded), ``input = rms_norm(residual) * weight``;
  ``residual`` is indexed densely, ``input`` by its row stride.

Every call is recorded. Stricter than the kernels in one way: they insist on
2-D rows, which is what vllm-ir-xpu promises to pass. The ``_C`` ops are
defined once per process (and kept); :class:`StandInXpuKernels` objects take
turns receiving the calls.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor
from torch.library import Library
from vllm_ir.testing.vendor import (
    StandInKernels,
    VendorUnderTest,
    check_rows,
    reference_rms,
    stand_in_defaults,
    stand_in_module,
)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SCHEMAS = {
    "rms_norm": "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()",
    "fused_add_rms_norm": (
        "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()"
    ),
}


def _normalize(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
    return reference_rms(x, weight, epsilon, weight_in_fp32=False)


def _check(name: str, input: Tensor, weight: Tensor) -> None:
    check_rows(name, "vllm-ir-xpu", input, weight, _DTYPES)


_receiver: StandInXpuKernels | None = None
_library: Library | None = None


def _rms_norm(result: Tensor, input: Tensor, weight: Tensor, epsilon: float) -> None:
    assert _receiver is not None, "stand-in _C::rms_norm called outside a test that installs it"
    _receiver.record("rms_norm", result=result, input=input, weight=weight, epsilon=epsilon)
    _check("rms_norm", input, weight)
    assert result.is_contiguous(), "stand-in rms_norm: result must be contiguous"
    assert result.shape == input.shape, "stand-in rms_norm: result shape != input shape"
    result.copy_(_normalize(input, weight, epsilon))


def _fused_add_rms_norm(input: Tensor, residual: Tensor, weight: Tensor, epsilon: float) -> None:
    assert _receiver is not None, "stand-in _C::fused_add_rms_norm called outside a test"
    _receiver.record(
        "fused_add_rms_norm", input=input, residual=residual, weight=weight, epsilon=epsilon
    )
    _check("fused_add_rms_norm", input, weight)
    assert residual.is_contiguous(), "stand-in fused_add_rms_norm: residual is indexed densely"
    assert residual.shape == input.shape, "stand-in fused_add_rms_norm: residual shape != input"
    residual.add_(input)
    input.copy_(_normalize(residual, weight, epsilon))


def _define_ops() -> None:
    global _library
    if _library is not None:
        return
    lib = Library("_C", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        if not hasattr(torch.ops._C, name):
            lib.define(schema)
    for key in ("CPU", "XPU"):
        lib.impl("rms_norm", _rms_norm, key)
        lib.impl("fused_add_rms_norm", _fused_add_rms_norm, key)
    _library = lib


def _module(name: str) -> types.ModuleType:
    return stand_in_module(name, "CPU stand-in for vllm-xpu-kernels (vllm-ir-xpu tests)", __file__)


@dataclass
class StandInXpuKernels(StandInKernels):
    """The modules to put in ``sys.modules``; entered, it receives the calls of the ``_C`` ops."""

    def __post_init__(self) -> None:
        package = _module("vllm_xpu_kernels")
        package.__path__ = []  # type: ignore[attr-defined]
        package.__version__ = "0.0.0+cpu-stand-in"  # type: ignore[attr-defined]
        extension = _module("vllm_xpu_kernels._C")
        package._C = extension  # type: ignore[attr-defined]
        self.modules = {"vllm_xpu_kernels": package, "vllm_xpu_kernels._C": extension}

    def __enter__(self) -> StandInXpuKernels:
        global _receiver
        _define_ops()
        _receiver = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _receiver
        _receiver = None


def _pretend_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)


TRITON_STAND_IN = stand_in_defaults(
    ("cuda", "rocm", "xpu"), ["triton", "triton_batch_invariant"], rank=-10
)
"""vllm-ir-triton's defaults where it is not installed (its platforms and rank)."""

VENDOR = VendorUnderTest(
    package="vllm_ir_xpu",
    distribution="vllm-ir-xpu",
    platform="xpu",
    device_type="xpu",
    eager_default=("xpu_kernels",),
    rms_call="rms_norm",
    fused_call="fused_add_rms_norm",
    residual_arg="residual",
    declined_dtype=torch.float64,
    stand_in=StandInXpuKernels,
    on_vendor_build=lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
    not_here="torch.xpu.is_available() is False",
    gpu="an Intel GPU with vllm-xpu-kernels",
    pretend_gpu=_pretend_xpu,
    not_installed="vllm-xpu-kernels is not installed",
    import_failure=(
        "vllm_xpu_kernels._C",
        ImportError("libsycl.so.8: cannot open shared object file"),
        "importing vllm_xpu_kernels._C failed: ImportError: libsycl",
    ),
    neighbours={"vllm_ir_triton": TRITON_STAND_IN},
    with_neighbours=("triton", "triton_batch_invariant", "native"),
)
"""vllm-ir-xpu for the shared checks of :mod:`vllm_ir.testing.vendor`."""
