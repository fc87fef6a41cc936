"""The impls' wiring on CPU, over stand-in kernels: the shared checks
(:class:`vllm_ir.testing.vendor.WiringChecks`), then what is the XPU kernels' own."""

from __future__ import annotations

import torch
import vllm_ir as ir
from vllm_ir.testing.vendor import WiringChecks
from vllm_ir_xpu import PROVIDER
from xpu_stand_ins import VENDOR, StandInXpuKernels


class TestWiring(WiringChecks):
    vendor = VENDOR


def _rows(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).bfloat16()


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = ir.ops.rms_norm.tolerance(got.dtype)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


def test_rms_norm_hands_a_fresh_result_to_the_kernel(kernels: StandInXpuKernels) -> None:
    x, w = _rows(2, 3, 128), _rows(128)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        out = ir.ops.rms_norm(x, w, 1e-5)
    result = kernels.calls[0].args["result"]
    assert result.shape == (6, 128)
    assert result.data_ptr() == out.data_ptr(), "written in place"
    assert result.data_ptr() != x.data_ptr()


def test_fused_add_reads_a_row_strided_x_in_place(kernels: StandInXpuKernels) -> None:
    x, r, w = _rows(4, 128)[:, :64], _rows(4, 64), _rows(64)
    want = ir.ops.fused_add_rms_norm.native(x.clone(), r.clone(), w, 1e-6)
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        assert ir.ops.fused_add_rms_norm.selected_impl(x, r, w, 1e-6).provider == PROVIDER
        out, residual = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    given = kernels.calls[0].args["input"]
    assert given.data_ptr() == x.data_ptr()
    assert given.stride() == (128, 1)
    assert out.data_ptr() == x.data_ptr()
    _assert_close(out, want[0])
    _assert_close(residual, want[1])
