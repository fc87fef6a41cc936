"""The installed package as a user meets it: discovered, and explained by ``vllm-ir``
(:class:`vllm_ir.testing.vendor.DiscoveryChecks`; skipped where it is not installed)."""

from __future__ import annotations

from vllm_ir.testing.vendor import DiscoveryChecks
from xpu_stand_ins import VENDOR


class TestDiscovery(DiscoveryChecks):
    vendor = VENDOR
