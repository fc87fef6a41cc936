"""The ``cpu_c`` impls through the IR ops: semantics, selection, the in-place contract."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_ir as ir
from cpu_c_testing import DTYPES, on_cpu_platform
from vllm_ir.testing.declines import NORM_DECLINES, assert_declined
from vllm_ir_cpu import PROVIDER, build, impls

pytestmark = on_cpu_platform

RMS = ir.ops.rms_norm
FUSED = ir.ops.fused_add_rms_norm
EPS = 1e-6


def _close(got: Any, want: Any, op: ir.IrOp, dtype: torch.dtype, name: str) -> None:
    tol = op.tolerance(dtype)
    torch.testing.assert_close(
        got, want, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{op.name} {name}: {m}"
    )


def _extra_rms(dtype: torch.dtype) -> Iterator[ir.SampleInput]:
    g = torch.Generator().manual_seed(7)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    yield ir.SampleInput((randn(1, 4096), randn(4096), 1e-6), "1-row-4096")
    yield ir.SampleInput((randn(5, 1023), randn(1023), 1e-5), "odd-hidden-1023")
    yield ir.SampleInput((randn(2, 5, 257), randn(257), 1e-6), "3d-odd")
    yield ir.SampleInput((randn(8, 640)[:, 64:576], randn(512), 1e-6), "strided-rows-512")
    yield ir.SampleInput((randn(3, 200), None, 1e-6), "no-weight-200")


def _extra_fused(dtype: torch.dtype) -> Iterator[ir.SampleInput]:
    for s in _extra_rms(dtype):
        x, w, eps = s.args
        yield ir.SampleInput((x, torch.randn(x.shape).to(dtype), w, eps), s.name)


def _samples(op: ir.IrOp, dtype: torch.dtype) -> list[ir.SampleInput]:
    extra = _extra_rms(dtype) if op is RMS else _extra_fused(dtype)
    return [*op.sample_inputs(dtype), *extra]


def _expected_provider(sample: ir.SampleInput) -> str:
    return "native" if "variance" in sample.name else PROVIDER


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", [RMS, FUSED], ids=lambda op: op.name)
def test_matches_native_on_every_sample(kernels: Path, op: ir.IrOp, dtype: torch.dtype) -> None:
    with op.set_priority([PROVIDER]):
        for sample in _samples(op, dtype):
            args = sample.clone().args
            assert op.selected_impl(*args).provider == _expected_provider(sample), sample.name
            want = op.native(*sample.clone().args)
            _close(op(*args), want, op, dtype, sample.name)
            if op.allow_inplace:
                _close(op.maybe_inplace(*sample.clone().args), want, op, dtype, sample.name)


@pytest.mark.parametrize(("op", "why", "args"), NORM_DECLINES)
def test_declined_arguments_fall_back_to_native(op: str, why: str, args: Any) -> None:
    assert_declined(ir.get_op(op), PROVIDER, args(), why)


def test_maybe_inplace_writes_into_the_donated_tensors(kernels: Path) -> None:
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.rand(64)
    want = FUSED.native(x, r, w, EPS)
    with FUSED.set_priority([PROVIDER]):
        h, res = FUSED.maybe_inplace(x, r, w, EPS)
    assert h.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert res.untyped_storage().data_ptr() == r.untyped_storage().data_ptr()
    torch.testing.assert_close((h, res), want)


def test_maybe_inplace_into_strided_rows(kernels: Path) -> None:
    base_x, base_r = torch.randn(4, 96), torch.randn(4, 96)
    x, r = base_x[:, 16:80], base_r[:, 16:80]
    want = FUSED.native(x.clone(), r.clone(), None, EPS)
    untouched = base_x[:, :16].clone()
    with FUSED.set_priority([PROVIDER]):
        h, res = FUSED.maybe_inplace(x, r, None, EPS)
    assert h.data_ptr() == x.data_ptr()
    assert res.data_ptr() == r.data_ptr()
    torch.testing.assert_close((h, res), want)
    assert torch.equal(base_x[:, :16], untouched)  # nothing outside the view


def test_default_overload_leaves_inputs_untouched(kernels: Path) -> None:
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.rand(64)
    x0, r0 = x.clone(), r.clone()
    with FUSED.set_priority([PROVIDER]):
        assert FUSED.selected_impl(x, r, w, EPS).provider == PROVIDER
        h, res = FUSED(x, r, w, EPS)
        # through torch.ops too (the path tracers and autograd take)
        h2, res2 = FUSED.torch_op(x, r, w, EPS)
    assert torch.equal(x, x0)
    assert torch.equal(r, r0)
    assert h.data_ptr() != x.data_ptr()
    assert res.data_ptr() != r.data_ptr()
    torch.testing.assert_close((h, res), FUSED.native(x0, r0, w, EPS))
    torch.testing.assert_close((h2, res2), (h, res))


def test_rms_norm_never_writes_its_input(kernels: Path) -> None:
    x = torch.randn(4, 64)
    x0 = x.clone()
    with RMS.set_priority([PROVIDER]):
        RMS(x, None, EPS)
    assert torch.equal(x, x0)


def test_gradients_are_native_ones(kernels: Path) -> None:
    x = torch.randn(3, 32, requires_grad=True)
    w = torch.rand(32, requires_grad=True)
    with RMS.set_priority([PROVIDER]):
        RMS(x, w, EPS).sum().backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    RMS.native(x2, w2, EPS).sum().backward()
    torch.testing.assert_close((x.grad, w.grad), (x2.grad, w2.grad))


def test_missing_toolchain_declines_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(build, "is_loaded", lambda: False)
    monkeypatch.setattr(build, "toolchain_problem", lambda: "no C++ compiler ('c++' not found)")
    monkeypatch.setattr(impls, "_warned_toolchain", False)
    x = torch.randn(2, 8)
    with caplog.at_level(logging.WARNING, logger="vllm_ir"), RMS.set_priority([PROVIDER]):
        assert RMS.selected_impl(x, None, EPS).provider == "native"
        assert FUSED.selected_impl(x, x.clone(), None, EPS).provider == "native"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "cpu_c kernels cannot be built, so they are skipped: no C++ compiler ('c++' not found)"
    ]
