"""How the XPU defaults compose with the other providers' contributions
(:class:`vllm_ir.testing.vendor.DefaultsChecks`)."""

from __future__ import annotations

from vllm_ir.testing.vendor import DefaultsChecks
from xpu_stand_ins import VENDOR


class TestDefaults(DefaultsChecks):
    vendor = VENDOR
