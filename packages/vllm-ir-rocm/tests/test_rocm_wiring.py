"""The impls' wiring on CPU, over the stand-in ``aiter``: the shared checks
(:class:`vllm_ir.testing.vendor.WiringChecks`), then what is AITER's own."""

from __future__ import annotations

import torch
import vllm_ir as ir
from rocm_stand_ins import VENDOR, StandInAiter
from vllm_ir.testing.vendor import WiringChecks
from vllm_ir_rocm import PROVIDER


class TestWiring(WiringChecks):
    vendor = VENDOR


def test_rms_norm_asks_for_aiters_default_variant(kernels: StandInAiter) -> None:
    x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        ir.ops.rms_norm(x, w, 1e-6)
    assert kernels.calls[0].args["use_model_sensitive_rmsnorm"] == 0


def test_fused_add_declines_a_row_strided_x(kernels: StandInAiter) -> None:
    # AITER's in-place kernel takes no strides: x must be contiguous too
    x, r = torch.randn(4, 128, dtype=torch.bfloat16)[:, :64], torch.randn(4, 64).bfloat16()
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        assert ir.ops.fused_add_rms_norm.select(x, r, None, 1e-6).impl.provider != PROVIDER
    assert kernels.calls == []
