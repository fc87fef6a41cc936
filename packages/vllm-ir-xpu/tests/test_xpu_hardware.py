"""On an Intel GPU with vllm-xpu-kernels: the real kernels against the native semantics.

Skipped elsewhere, with the reason :mod:`vllm_ir_xpu.availability` gives.
These use the registration discovery made (no stand-ins): the conformance
kit on ``xpu`` tensors, the in-place contract, and row-strided inputs.
"""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from vllm_ir.testing import ConformanceCase, conformance_cases
from vllm_ir_xpu import PROVIDER, availability, ops

FOUND = availability.probe()

pytestmark = pytest.mark.skipif(
    not FOUND.supported, reason=f"needs an Intel GPU with vllm-xpu-kernels: {FOUND.reason}"
)

CASES = (
    conformance_cases(
        PROVIDER,
        ops=[ir.ops.rms_norm, ir.ops.fused_add_rms_norm],
        dtypes=ops.DTYPES,
        device="xpu",
    )
    if FOUND.supported
    else []
)


def test_registered_supported() -> None:
    assert ir.ops.rms_norm.impls[PROVIDER].supported
    assert ir.ops.fused_add_rms_norm.impls[PROVIDER].supported


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance_on_xpu(case: ConformanceCase) -> None:
    case.check()


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 4096), (7, 5120), (3, 5, 8192), (513, 7168)])
def test_in_place_contract_on_xpu(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, dtype=dtype, device="xpu")
    r = torch.randn(shape, dtype=dtype, device="xpu")
    w = 1 + 0.1 * torch.randn(shape[-1], dtype=dtype, device="xpu")
    want = ir.ops.fused_add_rms_norm.native(x, r, w, 1e-6)
    x0, r0 = x.clone(), r.clone()
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        out, res = ir.ops.fused_add_rms_norm(x, r, w, 1e-6)
        assert torch.equal(x, x0)
        assert torch.equal(r, r0)
        out2, res2 = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    assert out2.data_ptr() == x.data_ptr()
    assert res2.data_ptr() == r.data_ptr()
    tol = ir.ops.fused_add_rms_norm.tolerance(dtype)
    for got, ref in ((out, want[0]), (res, want[1]), (out2, want[0]), (res2, want[1])):
        torch.testing.assert_close(got, ref, atol=tol.atol, rtol=tol.rtol)


def test_row_strided_rms_norm_on_xpu() -> None:
    wide = torch.randn(64, 2 * 4096, dtype=torch.bfloat16, device="xpu")
    x, w = wide[:, :4096], torch.randn(4096, dtype=torch.bfloat16, device="xpu")
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        assert ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider == PROVIDER
        got = ir.ops.rms_norm(x, w, 1e-6)
    tol = ir.ops.rms_norm.tolerance(torch.bfloat16)
    torch.testing.assert_close(
        got, ir.ops.rms_norm.native(x, w, 1e-6), atol=tol.atol, rtol=tol.rtol
    )
