"""How the ROCm defaults compose with the other providers' contributions: the shared
checks (:class:`vllm_ir.testing.vendor.DefaultsChecks`), then what is ROCm's own."""

from __future__ import annotations

import vllm_ir as ir
from rocm_stand_ins import VENDOR
from vllm_ir.testing import add_platform_defaults
from vllm_ir.testing.vendor import OPS, OTHER_SOURCE, DefaultsChecks


class TestDefaults(DefaultsChecks):
    vendor = VENDOR

    def test_if_vllm_c_also_contributes_rocm_defaults_the_order_holds(self) -> None:
        # should vllm-ir-cuda build its kernels for ROCm and list vllm_c there (rank 100)
        add_platform_defaults(
            OTHER_SOURCE,
            [ir.provider.PlatformDefaults("rocm", eager={op: ["vllm_c"] for op in OPS}, rank=100)],
        )
        for op in OPS:
            assert self.eager(op)[:2] == ["aiter", "vllm_c"]
            sources = [e.source for e in ir.get_op(op).get_priority_entries("eager")]
            assert sources[:2] == ["rocm eager default of vllm-ir-rocm"] * 2
