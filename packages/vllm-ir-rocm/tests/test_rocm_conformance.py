"""The conformance kit over the impls, with the stand-in kernels on CPU
(:class:`vllm_ir.testing.vendor.ConformanceChecks`): the wiring keeps the ops'
contracts. The vendor's numerics are checked only by ``test_rocm_hardware.py``."""

from __future__ import annotations

from rocm_stand_ins import VENDOR
from vllm_ir.testing.vendor import ConformanceChecks


class TestConformance(ConformanceChecks):
    vendor = VENDOR
