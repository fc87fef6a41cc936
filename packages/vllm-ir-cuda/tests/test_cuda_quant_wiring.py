"""The impls of silu_and_mul and the FP8 ops over CPU stand-ins of their kernels:
argument mapping, layouts, the native fallbacks for sizes the kernels do not
take, and the in-place contract of fused_add_rms_norm_static_fp8_quant."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import vllm_ir as ir
from cuda_stand_ins import STANDIN, StandInKernels
from vllm_ir_cuda import quant

FP8 = torch.float8_e4m3fn
EPS = 1e-6


@pytest.fixture
def quant_standin(cpu_kernels: StandInKernels) -> Iterator[StandInKernels]:
    supports = quant.supports_args_for("cpu")
    for name, impl in quant.IMPLS.items():
        ir.get_op(name).register_impl(
            STANDIN, supports_args=supports[name], inplace=name in quant.INPLACE
        )(impl)
    yield cpu_kernels
    for name in quant.IMPLS:
        if STANDIN in ir.get_op(name).registered_impls:
            ir.get_op(name).unregister_impl(STANDIN)


def _equal(got: object, want: object) -> None:
    if isinstance(got, tuple):
        assert isinstance(want, tuple)
        for g, w in zip(got, want, strict=True):
            _equal(g, w)
        return
    assert isinstance(got, torch.Tensor)
    assert isinstance(want, torch.Tensor)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    if got.dtype == FP8:
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    else:  # CPU torch's vectorized and scalar silu may differ in the last bit
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(quant.IMPLS))
def test_samples_reach_the_kernel_and_equal_native(
    quant_standin: StandInKernels, name: str, dtype: torch.dtype
) -> None:
    op = ir.get_op(name)
    with op.set_priority([STANDIN, "native"]):
        for sample in op.sample_inputs(dtype, "cpu"):
            assert op.selected_impl(*sample.args).provider == STANDIN, sample.name
            before = quant_standin.calls[name]
            _equal(op(*sample.args), op.native(*sample.args))
            assert quant_standin.calls[name] == before + 1, sample.name


def test_last_dim_strided_inputs_are_copied(quant_standin: StandInKernels) -> None:
    x = torch.randn(96, 6).t()  # (6, 96), stride (1, 6)
    scale = torch.tensor([0.02])
    _equal(quant.silu_and_mul(x), ir.ops.silu_and_mul.native(x))
    _equal(quant.static_scaled_fp8_quant(x, scale), ir.ops.static_scaled_fp8_quant.native(x, scale))
    _equal(quant.dynamic_per_token_fp8_quant(x), ir.ops.dynamic_per_token_fp8_quant.native(x))
    w = torch.rand(96) + 0.5
    want = ir.ops.rms_norm_static_fp8_quant.native(x, w, EPS, scale)
    _equal(quant.rms_norm_static_fp8_quant(x, w, EPS, scale), want)
    r = torch.randn(96, 6).t()
    r0 = r.clone()
    want2 = ir.ops.fused_add_rms_norm_static_fp8_quant.native(x, r0, w, EPS, scale)
    q, res = quant.fused_add_rms_norm_static_fp8_quant(x, r, w, EPS, scale)
    assert res is r
    assert r.stride() == (1, 6)
    _equal((q, res), want2)


def test_sizes_the_kernels_do_not_take_are_computed_by_native(
    quant_standin: StandInKernels,
) -> None:
    x = torch.randn(4, 8)
    per_channel = torch.rand(8) + 0.01
    _equal(
        quant.static_scaled_fp8_quant(x, per_channel),
        ir.ops.static_scaled_fp8_quant.native(x, per_channel),
    )
    _equal(
        quant.rms_norm_static_fp8_quant(x, torch.ones(1), EPS, torch.tensor([0.1])),
        ir.ops.rms_norm_static_fp8_quant.native(x, torch.ones(1), EPS, torch.tensor([0.1])),
    )
    odd = r"silu_and_mul: x's last dimension \(7\) must be even"  # the op's error, no launch
    with pytest.raises(ValueError, match=odd):
        quant.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match=odd):
        ir.ops.silu_and_mul.native(torch.randn(2, 7))
    assert sum(quant_standin.calls.values()) == 0


def test_fused_quant_writes_the_residual_in_place(quant_standin: StandInKernels) -> None:
    op = ir.ops.fused_add_rms_norm_static_fp8_quant
    x, r, w, s = torch.randn(5, 64), torch.randn(5, 64), torch.rand(64) + 0.5, torch.tensor([0.05])
    x0, r0 = x.clone(), r.clone()
    want = op.native(x0, r0, w, EPS, s)
    with op.set_priority([STANDIN]):
        got = op(x, r, w, EPS, s)  # default overload: inputs untouched
        assert torch.equal(x, x0)
        assert torch.equal(r, r0)
        _equal(got, want)
        got = op.maybe_inplace(x, r, w, EPS, s)
    assert got[1].data_ptr() == r.data_ptr()
    assert torch.equal(x, x0)  # x is only read
    _equal(got, want)


@pytest.mark.parametrize("name", list(quant.IMPLS))
def test_supports_args_declines_what_the_binding_rejects(name: str) -> None:
    supports = quant.supports_args_for("cpu")[name]
    op = ir.get_op(name)
    (sample, *_) = op.sample_inputs(torch.float16, "cpu")
    args = list(sample.args)
    assert supports(*args)
    assert not supports(
        *[a.double() if isinstance(a, torch.Tensor) and a is args[0] else a for a in args]
    )
    assert not quant.supports_args_for("cuda")[name](*args)  # CPU tensors: not the kernels'
    if name in ("static_scaled_fp8_quant", "rms_norm_static_fp8_quant"):
        args[-1] = args[-1].double()  # a float64 scale
        assert not supports(*args)
