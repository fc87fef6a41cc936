"""When the ``aiter`` impls count as supported, and the reasons given when not."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

import pytest
import torch
from rocm_stand_ins import VENDOR, StandInAiter, unrelated_aiter
from vllm_ir.testing.vendor import AvailabilityChecks
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


class TestAvailability(AvailabilityChecks):
    vendor = VENDOR
