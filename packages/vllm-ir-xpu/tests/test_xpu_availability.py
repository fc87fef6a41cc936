"""When the ``xpu_kernels`` impls count as supported, and the reasons given when not."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.library import Library
from vllm_ir.testing.vendor import AvailabilityChecks
from vllm_ir_xpu import availability
from xpu_stand_ins import VENDOR, StandInXpuKernels

HAS_XPU = hasattr(torch, "xpu") and torch.xpu.is_available()


@pytest.fixture
def xpu_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend torch sees an Intel GPU."""
    VENDOR.pretend_gpu(monkeypatch)


@pytest.fixture
def stand_in_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInXpuKernels]:
    with StandInXpuKernels() as stand_in:
        for name, module in stand_in.modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        yield stand_in


@pytest.mark.skipif(HAS_XPU, reason="checks the answer on a machine without an XPU")
def test_no_xpu() -> None:
    found = availability.probe()
    assert not found.supported
    assert not found.hardware
    assert "torch.xpu.is_available() is False" in (found.reason or "")


@pytest.mark.usefixtures("xpu_gpu", "stand_in_modules")
def test_an_op_with_another_schema_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = Library("vllm_ir_xpu_test_drift", "DEF")
    try:
        lib.define("rms_norm(Tensor input, Tensor weight, float epsilon) -> Tensor")
        drifted, real = torch.ops.vllm_ir_xpu_test_drift, torch.ops._C

        class Namespace:
            def __getattr__(self, name: str) -> Any:
                return getattr(drifted if name == "rms_norm" else real, name)

        monkeypatch.setattr(torch.ops, "_C", Namespace())
        found = availability.probe()
    finally:
        lib._destroy()
    assert not found.supported
    reason = found.reason or ""
    assert "is not the API this package targets" in reason
    assert "not the one this package was written for (result, input, weight, epsilon" in reason


class TestAvailability(AvailabilityChecks):
    vendor = VENDOR
