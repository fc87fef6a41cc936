"""When the ``xpu_kernels`` impls count as supported, and the reasons given when not."""

from __future__ import annotations

import importlib.abc
import importlib.util
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
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)


class _KernelsFinder(importlib.abc.MetaPathFinder):
    """Finds ``vllm_xpu_kernels`` first: absent (``broken=False``) or failing to import."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken

    def find_spec(self, name: str, path: object, target: object = None) -> Any:
        if name.split(".")[0] != "vllm_xpu_kernels":
            return None
        if not self.broken:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        spec = importlib.util.spec_from_loader(
            name, _FailingLoader(), is_package=name == "vllm_xpu_kernels"
        )
        return spec


class _FailingLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        if module.__name__.endswith("._C"):
            raise ImportError("libsycl.so.8: cannot open shared object file")


def _kernels_finder(monkeypatch: pytest.MonkeyPatch, *, broken: bool) -> None:
    for name in ("vllm_xpu_kernels", "vllm_xpu_kernels._C"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [_KernelsFinder(broken), *sys.meta_path])


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


@pytest.mark.usefixtures("xpu_gpu")
def test_kernels_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _kernels_finder(monkeypatch, broken=False)
    found = availability.probe()
    assert not found.supported
    assert found.hardware
    assert "vllm-xpu-kernels is not installed" in (found.reason or "")


@pytest.mark.usefixtures("xpu_gpu")
def test_broken_kernels_import_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    _kernels_finder(monkeypatch, broken=True)
    found = availability.probe()
    assert not found.supported
    assert "importing vllm_xpu_kernels._C failed: ImportError: libsycl" in (found.reason or "")


@pytest.mark.usefixtures("xpu_gpu", "stand_in_modules")
def test_kernels_with_the_expected_ops_are_supported() -> None:
    found = availability.probe()
    assert found.supported
    assert found.reason is None
    assert found.device_type == "xpu"
    assert found.vendor_version == "0.0.0+cpu-stand-in"


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
