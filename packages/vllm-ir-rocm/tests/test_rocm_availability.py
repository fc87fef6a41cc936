"""When the ``aiter`` impls count as supported, and the reasons given when not."""

from __future__ import annotations

import importlib.abc
import importlib.util
import subprocess
import sys
from typing import Any

import pytest
import torch
import vllm_ir as ir
import vllm_ir_rocm
from rocm_stand_ins import StandInAiter, unrelated_aiter
from vllm_ir_rocm import availability


@pytest.fixture
def rocm_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend torch is a ROCm build that sees a GPU."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_not_a_rocm_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    found = availability.probe()
    assert not found.supported
    assert "not a ROCm build" in (found.reason or "")


def test_rocm_build_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    found = availability.probe()
    assert not found.supported
    assert "sees no GPU" in (found.reason or "")


class _AiterFinder(importlib.abc.MetaPathFinder):
    """Finds ``aiter`` first: absent (``broken=False``) or failing to import."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken

    def find_spec(self, name: str, path: object, target: object = None) -> Any:
        if name != "aiter":
            return None
        if not self.broken:
            raise ModuleNotFoundError("No module named 'aiter'", name="aiter")
        return importlib.util.spec_from_loader(name, _FailingLoader())


class _FailingLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        raise RuntimeError("hipErrorNoBinaryForGpu: no kernel image for this GPU")


def _aiter_finder(monkeypatch: pytest.MonkeyPatch, *, broken: bool) -> None:
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_AiterFinder(broken), *sys.meta_path])


@pytest.mark.usefixtures("rocm_gpu")
def test_aiter_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _aiter_finder(monkeypatch, broken=False)
    found = availability.probe()
    assert not found.supported
    assert "AITER is not installed" in (found.reason or "")


@pytest.mark.usefixtures("rocm_gpu")
def test_pypi_aiter_is_not_amd_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiter", unrelated_aiter())
    found = availability.probe()
    assert not found.supported
    reason = found.reason or ""
    assert "rmsnorm2d_fwd" in reason
    assert "fused_add_rms_norm_cu" in reason
    assert "not AMD's AITER" in reason


@pytest.mark.usefixtures("rocm_gpu")
def test_broken_aiter_import_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    _aiter_finder(monkeypatch, broken=True)
    found = availability.probe()
    assert not found.supported
    assert "importing 'aiter' failed: RuntimeError: hipErrorNoBinaryForGpu" in (found.reason or "")


@pytest.mark.usefixtures("rocm_gpu")
def test_amd_aiter_on_a_rocm_gpu_is_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiter", StandInAiter().module)
    found = availability.probe()
    assert found.supported
    assert found.reason is None
    assert found.device_type == "cuda"
    assert found.vendor_version == "0.0.0+cpu-stand-in"


def test_unsupported_reason_is_exposed() -> None:
    assert availability.current().reason == vllm_ir_rocm.UNSUPPORTED_REASON
    with availability.forced(availability.Availability(False, "because a test says so")):
        assert vllm_ir_rocm.UNSUPPORTED_REASON == "because a test says so"
    with availability.forced(availability.Availability(True, device_type="cpu")):
        assert vllm_ir_rocm.UNSUPPORTED_REASON is None


@pytest.mark.skipif(bool(torch.version.hip), reason="checks the registration on a non-ROCm build")
def test_registered_unsupported_here_with_the_reason_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from vllm_ir_rocm import layernorm

    for op in (ir.ops.rms_norm, ir.ops.fused_add_rms_norm):
        op.unregister_impl("aiter")
    with caplog.at_level("INFO", logger="vllm_ir.providers.aiter"):
        found = layernorm.register_kernels()
    assert not found.supported
    assert not ir.ops.rms_norm.impls["aiter"].supported
    assert not ir.ops.fused_add_rms_norm.impls["aiter"].supported
    assert ir.ops.fused_add_rms_norm.impls["aiter"].inplace
    assert any("registered as unsupported" in r.getMessage() for r in caplog.records)
    assert any("not a ROCm build" in r.getMessage() for r in caplog.records)


def test_importing_the_package_imports_no_vendor_code() -> None:
    code = (
        "import sys, vllm_ir_rocm\n"
        "assert 'aiter' not in sys.modules\n"
        "assert 'vllm_ir_rocm.layernorm' not in sys.modules\n"
        "print(vllm_ir_rocm.provider.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "aiter"


@pytest.mark.skipif(bool(torch.version.hip), reason="checks the report on a non-ROCm build")
def test_module_command_reports_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vllm_ir_rocm"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "provider 'aiter'" in done.stdout
    assert "supported: no: torch" in done.stdout
    assert "not a ROCm build" in done.stdout


def test_package_docstring_example() -> None:
    import doctest

    results = doctest.testmod(vllm_ir_rocm, raise_on_error=True)
    assert results.attempted == 2  # the import and the example
