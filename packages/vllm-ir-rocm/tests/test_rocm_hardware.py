"""On the vendor's GPU with its library: the real kernels against the native semantics
(:class:`vllm_ir.testing.vendor.HardwareChecks`); skipped elsewhere, with the reason
the availability probe gives."""

from __future__ import annotations

from rocm_stand_ins import VENDOR
from vllm_ir.testing.vendor import HardwareChecks


class TestHardware(HardwareChecks):
    vendor = VENDOR
