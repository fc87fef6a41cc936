"""When the ``aiter`` impls count as supported, and the reasons given when not."""

from __future__ import annotations

import sys

import pytest
import torch
from rocm_stand_ins import VENDOR, unrelated_aiter
from vllm_ir.testing.vendor import AvailabilityChecks
from vllm_ir_rocm import availability


@pytest.fixture
def rocm_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend torch is a ROCm build that sees a GPU."""
    VENDOR.pretend_gpu(monkeypatch)


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


@pytest.mark.usefixtures("rocm_gpu")
def test_pypi_aiter_is_not_amd_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiter", unrelated_aiter())
    found = availability.probe()
    assert not found.supported
    reason = found.reason or ""
    assert "rmsnorm2d_fwd" in reason
    assert "fused_add_rms_norm_cu" in reason
    assert "not AMD's AITER" in reason


class TestAvailability(AvailabilityChecks):
    vendor = VENDOR
