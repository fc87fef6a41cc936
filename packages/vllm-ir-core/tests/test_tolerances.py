"""The promises of ``vllm_ir._schema.tolerances``, checked against their reasoning.

A faithful norm kernel differs from native only in its summation order, i.e.
in ``inv_rms`` by a few float32 ulps. These tests perturb native's ``inv_rms``
by that much, on millions of elements, and check the doubly rounded results
stay within the stated tolerances (and that one FP8 step covers the quantized
ones), so a tolerance too tight for real kernels fails here, not on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from vllm_ir._schema.tolerances import EXACT, FP8_ONE_STEP, NORM_TOLERANCES, fp8_steps_apart
from vllm_ir.ops.quant import FP8


def _norm_with_inv_rms_scaled(
    x: torch.Tensor, weight: torch.Tensor, epsilon: float, factor: float
) -> torch.Tensor:
    """native rms_norm with inv_rms multiplied by ``factor`` (a reordered sum's effect)."""
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon) * factor
    return (xf * inv).to(x.dtype) * weight


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_norm_tolerance_covers_a_reordered_sum(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    rows, hidden = 1024, 4096  # 4M elements: tails of |x / rms| beyond 4 occur
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    want = ir.ops.rms_norm.native(x, w, 1e-6)
    tol = ir.ops.rms_norm.tolerance(dtype)
    assert tol == NORM_TOLERANCES[dtype]
    assert ir.ops.fused_add_rms_norm.tolerance(dtype) == tol
    changed = 0
    for ulps in (-4, -1, 1, 4):
        got = _norm_with_inv_rms_scaled(x, w, 1e-6, 1 + ulps * 2.0**-23)
        changed += int((got != want).sum())
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)
    if dtype != torch.float32:
        assert changed > 0  # the perturbation is large enough to flip roundings


def test_norm_plus_quant_is_within_one_fp8_step() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 4096, generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, generator=gen)).to(torch.bfloat16)
    scale = torch.tensor([0.02])
    want = ir.ops.rms_norm_static_fp8_quant.native(x, w, 1e-6, scale)
    tol = ir.ops.rms_norm_static_fp8_quant.tolerance(torch.bfloat16)
    assert tol == FP8_ONE_STEP
    for ulps in (-4, 4):
        normed = _norm_with_inv_rms_scaled(x, w, 1e-6, 1 + ulps * 2.0**-23)
        got = ir.ops.static_scaled_fp8_quant.native(normed, scale)
        assert int(fp8_steps_apart(got, want).max()) <= 1
        torch.testing.assert_close(got.float(), want.float(), atol=tol.atol, rtol=tol.rtol)


def test_fp8_steps_apart() -> None:
    codes = torch.tensor([0x00, 0x80, 0x01, 0x81, 0x7E, 0x7F, 0x38], dtype=torch.uint8)
    values = codes.view(FP8)
    others = torch.tensor([0x80, 0x00, 0x02, 0x01, 0x7D, 0x7F, 0x38], dtype=torch.uint8)
    apart = fp8_steps_apart(values, others.view(FP8)).tolist()
    assert apart == [0, 0, 1, 2, 1, 0, 0]  # +-0 equal; -min to +min is 2; NaN pairs 0
    assert EXACT.atol == EXACT.rtol == 0.0


def test_tolerances_register_through_handles_that_undo_only_their_own() -> None:
    op = ir.ops.silu_and_mul
    default = op.tolerance(torch.float64) if torch.float64 in op.tolerances else None
    loose, tight = ir.Tolerance(atol=1.0, rtol=1.0), ir.Tolerance(atol=1e-9, rtol=1e-9)
    first = op.register_tolerances({torch.float64: loose})
    second = op.register_tolerances({torch.float64: tight})
    assert op.tolerance(torch.float64) == tight
    first.remove()  # an older registration's removal keeps the newer one
    assert op.tolerance(torch.float64) == tight
    second.remove()
    assert (torch.float64 in op.tolerances) is (default is not None)
    with pytest.raises(TypeError, match=r"torch\.dtype to a vllm_ir\.Tolerance"):
        op.register_tolerances({"float64": tight})  # type: ignore[dict-item]
    assert not hasattr(op.tolerances, "pop")  # read-only but for registrations
