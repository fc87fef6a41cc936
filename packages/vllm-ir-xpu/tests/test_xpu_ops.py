"""The wrapper ops on any machine: schemas, fake impls, opcheck, and one node per impl call
(:class:`vllm_ir.testing.vendor.OpsChecks`)."""

from __future__ import annotations

from vllm_ir.testing.vendor import OpsChecks
from xpu_stand_ins import VENDOR


class TestOps(OpsChecks):
    vendor = VENDOR
