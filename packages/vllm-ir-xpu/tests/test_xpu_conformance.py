"""The conformance kit over the impls, with the stand-in kernels on CPU
(:class:`vllm_ir.testing.vendor.ConformanceChecks`): the wiring keeps the ops'
contracts. The vendor's numerics are checked only by ``test_xpu_hardware.py``."""

from __future__ import annotations

from vllm_ir.testing.vendor import ConformanceChecks
from xpu_stand_ins import VENDOR


class TestConformance(ConformanceChecks):
    vendor = VENDOR
