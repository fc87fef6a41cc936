"""The installed package as a user meets it: discovered, and explained by ``vllm-ir``
(:class:`vllm_ir.testing.vendor.DiscoveryChecks`; skipped where it is not installed)."""

from __future__ import annotations

from rocm_stand_ins import VENDOR
from vllm_ir.testing.vendor import DiscoveryChecks


class TestDiscovery(DiscoveryChecks):
    vendor = VENDOR
