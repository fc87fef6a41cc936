"""When the ``xpu_kernels`` impls count as supported, and the reasons given when not."""

from __future__ import annotations

import importlib.abc
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import vllm_ir as ir
import vllm_ir_xpu
from torch.library import Library
from vllm_ir_xpu import availability
from xpu_stand_ins import StandInXpuKernels

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


def test_unsupported_reason_is_exposed() -> None:
    assert availability.current().reason == vllm_ir_xpu.UNSUPPORTED_REASON
    with availability.forced(availability.Availability(False, "because a test says so")):
        assert vllm_ir_xpu.UNSUPPORTED_REASON == "because a test says so"
    with availability.forced(availability.Availability(True, device_type="cpu")):
        assert vllm_ir_xpu.UNSUPPORTED_REASON is None


@pytest.mark.skipif(HAS_XPU, reason="checks the registration on a machine without an XPU")
def test_registered_unsupported_here_with_the_reason_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm_ir_xpu import layernorm

    for op in (ir.ops.rms_norm, ir.ops.fused_add_rms_norm):
        op.unregister_impl("xpu_kernels")
    with caplog.at_level("INFO", logger="vllm_ir.providers.xpu_kernels"):
        found = layernorm.register_kernels()
    assert not found.supported
    assert not ir.ops.rms_norm.impls["xpu_kernels"].supported
    assert not ir.ops.fused_add_rms_norm.impls["xpu_kernels"].supported
    assert ir.ops.fused_add_rms_norm.impls["xpu_kernels"].inplace
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "registered as unsupported" in m and "torch.xpu.is_available()" in m for m in messages
    )
    assert all(r.levelname == "INFO" for r in caplog.records)


def test_importing_the_package_imports_no_vendor_code() -> None:
    code = (
        "import sys, vllm_ir_xpu\n"
        "assert 'vllm_xpu_kernels' not in sys.modules\n"
        "assert 'vllm_ir_xpu.layernorm' not in sys.modules\n"
        "print(vllm_ir_xpu.provider.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "xpu_kernels"


@pytest.mark.skipif(HAS_XPU, reason="checks the report on a machine without an XPU")
def test_module_command_reports_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vllm_ir_xpu"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "provider 'xpu_kernels'" in done.stdout
    assert "supported: no: torch" in done.stdout
    assert "torch.xpu.is_available() is False" in done.stdout


def test_package_docstring_example() -> None:
    import doctest

    results = doctest.testmod(vllm_ir_xpu, raise_on_error=True)
    assert results.attempted == 2  # the import and the example
