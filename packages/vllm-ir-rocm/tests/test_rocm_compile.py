"""The impls through ``torch.compile``: lowered as opaque ops, in place without clones
(:class:`vllm_ir.testing.vendor.CompileChecks`)."""

from __future__ import annotations

from rocm_stand_ins import VENDOR
from vllm_ir.testing.vendor import CompileChecks


class TestCompile(CompileChecks):
    vendor = VENDOR
