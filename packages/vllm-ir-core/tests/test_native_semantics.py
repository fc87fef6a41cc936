"""The native functions are the semantics: check them against first principles."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, vs: int | None):
    x32 = x.double()
    var_src = x32 if vs is None else x32[..., :vs]
    rms = torch.sqrt(var_src.pow(2).mean(-1, keepdim=True) + eps)
    out = (x32 / rms).to(x.dtype)
    return out if weight is None else out * weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_matches_reference(dtype: torch.dtype) -> None:
    op = ir.ops.rms_norm
    for sample in op.sample_inputs(dtype):
        tol = op.tolerance(dtype)
        got = op(*sample.args)
        want = reference_rms_norm(*sample.args, *(() if len(sample.args) == 4 else (None,)))
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, msg=sample.name)


def test_rms_norm_computes_in_fp32() -> None:
    # values whose squares overflow fp16 still normalize correctly
    x = torch.full((2, 8), 300.0, dtype=torch.float16)
    out = ir.ops.rms_norm(x, None, 1e-6)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.ones_like(out))


def test_rms_norm_variance_size_uses_leading_channels() -> None:
    x = torch.tensor([[1.0, 1.0, 100.0, 100.0]])
    out = ir.ops.rms_norm(x, None, 0.0, 2)
    torch.testing.assert_close(out, x)  # rms of the first two channels is 1


def test_weight_promotes_dtype() -> None:
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    w = torch.ones(16, dtype=torch.float32)
    assert ir.ops.rms_norm(x, w, 1e-6).dtype == torch.float32
    assert ir.ops.rms_norm(x, None, 1e-6).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rms_norm_is_add_then_norm(dtype: torch.dtype) -> None:
    op = ir.ops.fused_add_rms_norm
    for sample in op.sample_inputs(dtype):
        x, residual, weight, eps, *rest = sample.args
        out, new_residual = op(*sample.args)
        summed = x + residual
        torch.testing.assert_close(new_residual, summed, atol=0, rtol=0)
        want = ir.ops.rms_norm(summed, weight, eps, *rest)
        torch.testing.assert_close(out, want, atol=0, rtol=0, msg=sample.name)


def test_sample_inputs_cover_the_documented_cases() -> None:
    names = [s.name for s in ir.ops.rms_norm.sample_inputs()]
    assert {"1x64", "2x3x128", "4x64-no-weight", "4x96-variance64", "4x128-strided-rows"} <= set(
        names
    )
    strided = next(s for s in ir.ops.rms_norm.sample_inputs() if "strided" in s.name)
    assert not strided.args[0].is_contiguous()


def test_tolerances_defined_per_dtype() -> None:
    assert (
        ir.ops.rms_norm.tolerance(torch.float32).atol
        < ir.ops.rms_norm.tolerance(torch.bfloat16).atol
    )
    with pytest.raises(KeyError, match=r"no tolerance defined for torch\.int8"):
        ir.ops.rms_norm.tolerance(torch.int8)
