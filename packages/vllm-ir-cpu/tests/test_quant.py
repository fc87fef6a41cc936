"""silu_and_mul and the FP8 ops: conformance, bit-exactness, the in-place contract.

The quantized outputs are compared bit for bit with the native functions (as
``uint8``): the kernels divide, clamp and round exactly where native does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_ir as ir
from cpu_c_testing import DTYPES, on_cpu_platform
from vllm_ir.testing import ConformanceCase, conformance_cases
from vllm_ir.testing.declines import assert_declined
from vllm_ir_cpu import PROVIDER, impls
from vllm_ir_cpu.library import kernel_ops

pytestmark = on_cpu_platform

FP8 = torch.float8_e4m3fn
EPS = 1e-6
SILU = ir.ops.silu_and_mul
STATIC = ir.ops.static_scaled_fp8_quant
DYNAMIC = ir.ops.dynamic_per_token_fp8_quant
NORM_QUANT = ir.ops.rms_norm_static_fp8_quant
FUSED_QUANT = ir.ops.fused_add_rms_norm_static_fp8_quant
OPS = [SILU, STATIC, DYNAMIC, NORM_QUANT, FUSED_QUANT]


def _bits(value: Any) -> Any:
    """Tensors as their bits: FP8 as uint8, so NaNs and signed zeros compare too."""
    if isinstance(value, tuple):
        return tuple(_bits(v) for v in value)
    if value.dtype == FP8:
        return value.view(torch.uint8)
    return value.view({4: torch.int32, 2: torch.int16}[value.element_size()])


def assert_bitwise(got: Any, want: Any, what: str) -> None:
    for g, w in (
        zip(_bits(got), _bits(want), strict=True)
        if isinstance(got, tuple)
        else [(_bits(got), _bits(want))]
    ):
        assert g.shape == w.shape, what
        differ = (g != w).sum().item()
        assert differ == 0, f"{what}: {differ} of {g.numel()} elements differ"


# -- the conformance kit --------------------------------------------------


@pytest.mark.parametrize("case", conformance_cases(PROVIDER, ops=OPS), ids=str)
def test_conformance(kernels: Path, case: ConformanceCase) -> None:
    case.check()


# -- bit-exact against native -------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_bitwise_native_on_every_sample(kernels: Path, op: ir.IrOp, dtype: torch.dtype) -> None:
    impl = op.impls[PROVIDER]
    with op.set_priority([PROVIDER]):
        for sample in op.sample_inputs(dtype):
            assert op.selected_impl(*sample.args).provider == PROVIDER, sample.name
            want = op.native(*sample.clone().args)
            assert_bitwise(impl.impl_fn(*sample.clone().args), want, f"{sample.name} impl")
            assert_bitwise(op(*sample.clone().args), want, f"{sample.name} op")
            if op.allow_inplace:
                got = op.maybe_inplace(*sample.clone().args)
                assert_bitwise(got, want, f"{sample.name} maybe_inplace")


def _every_bf16_value() -> torch.Tensor:
    """All 65536 bf16 bit patterns: zeros, subnormals, every exponent, inf, NaN."""
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 0.02, 3.7, 1e-30, 0.0])
def test_static_quant_rounds_every_value_as_native(
    kernels: Path, dtype: torch.dtype, scale: float
) -> None:
    """Division, clamp (NaN kept), round-to-nearest-even, over the whole bf16 range."""
    x = _every_bf16_value().to(dtype).reshape(256, 256)
    s = torch.tensor([scale])
    assert_bitwise(impls.static_scaled_fp8_quant(x, s), STATIC.native(x, s), f"scale {scale}")


def test_static_quant_rounds_random_fp32_as_native(kernels: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4097, generator=g) * torch.logspace(-9, 4, 4097)
    s = torch.tensor([1.0])
    assert_bitwise(impls.static_scaled_fp8_quant(x, s), STATIC.native(x, s), "random fp32")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale_ub", [None, 1.0, float("nan")], ids=["no-ub", "ub-1", "ub-nan"])
def test_dynamic_quant_special_rows(
    kernels: Path, dtype: torch.dtype, scale_ub: float | None
) -> None:
    """Rows with NaN, +-inf, all zeros (the minimum scale): FP8 bit for bit, scales equal."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 300, generator=g)
    x[1, 7] = float("nan")
    x[2] = 0.0
    x[3, 5] = float("inf")
    x[4, 0] = -float("inf")
    x = x.to(dtype)
    args: tuple[Any, ...] = (x,) if scale_ub is None else (x, torch.tensor([scale_ub]))
    q, scales = impls.dynamic_per_token_fp8_quant(*args)
    want_q, want_scales = DYNAMIC.native(*args)
    assert_bitwise(q, want_q, "FP8")
    # equal values, NaN where native has NaN (whose payload ATen's fp16 amax varies)
    torch.testing.assert_close(scales, want_scales, rtol=0, atol=0, equal_nan=True)


def _layouts(dtype: torch.dtype, width: int = 256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)

    def randn(*shape: int) -> torch.Tensor:
        return (3 * torch.randn(*shape, generator=g)).to(dtype)

    return {
        "strided-rows": randn(6, width + 32)[:, 16 : 16 + width],
        "3d-strided-rows": randn(2, 3, width + 72)[..., :width],
        "3d-transposed-leading": randn(3, 2, width).transpose(0, 1),
        "transposed": randn(width, 5).t(),
        "1d": randn(width),
        "below-vector-width": randn(5, 6),
        "odd-width": randn(9, 1002),
        "many-rows-parallel": randn(300, 512),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_any_layout(kernels: Path, dtype: torch.dtype) -> None:
    s = torch.tensor([0.05])
    for name, x in _layouts(dtype).items():
        h = x.shape[-1]
        w = torch.linspace(0.5, 1.5, h).to(dtype)
        assert_bitwise(impls.silu_and_mul(x), SILU.native(x), f"silu {name}")
        assert_bitwise(impls.static_scaled_fp8_quant(x, s), STATIC.native(x, s), f"static {name}")
        assert_bitwise(impls.dynamic_per_token_fp8_quant(x), DYNAMIC.native(x), f"dyn {name}")
        # the norms sum squares in another order than ATen: within the tolerance
        tol = NORM_QUANT.tolerance(dtype)
        got = impls.rms_norm_static_fp8_quant(x, w, EPS, s)
        want = NORM_QUANT.native(x, w, EPS, s)
        assert got.is_contiguous(), name
        torch.testing.assert_close(
            got.float(), want.float(), atol=tol.atol, rtol=tol.rtol, msg=f"norm quant {name}"
        )
        r = torch.rand_like(x)
        want_q, want_r = FUSED_QUANT.native(x, r, w, EPS, s)
        x0, r_ptr = x.clone(), r.data_ptr()
        q, res = impls.fused_add_rms_norm_static_fp8_quant(x, r, w, EPS, s)
        assert res is r, name
        assert r.data_ptr() == r_ptr, name
        assert torch.equal(r, want_r), name  # the rounded sum, exactly
        assert torch.equal(x, x0), name  # x is only read
        torch.testing.assert_close(
            q.float(), want_q.float(), atol=tol.atol, rtol=tol.rtol, msg=f"fused quant {name}"
        )


# -- the in-place contract of fused_add_rms_norm_static_fp8_quant -------------


def _fused_args() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x, r = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    return x, r, 1 + 0.1 * torch.randn(64, generator=g), EPS, torch.tensor([0.02])


def test_fused_quant_in_place_contract(kernels: Path) -> None:
    """maybe_inplace: the new residual in the donated x_residual, q a new FP8 tensor."""
    x, r, w, eps, s = _fused_args()
    want = FUSED_QUANT.native(x.clone(), r.clone(), w, eps, s)
    x0 = x.clone()
    assert FUSED_QUANT.impls[PROVIDER].inplace
    with FUSED_QUANT.set_priority([PROVIDER]):
        q, residual = FUSED_QUANT.maybe_inplace(x, r, w, eps, s)
    assert residual.untyped_storage().data_ptr() == r.untyped_storage().data_ptr()
    assert q.dtype == FP8
    assert q.untyped_storage().data_ptr() not in {
        x.untyped_storage().data_ptr(),
        r.untyped_storage().data_ptr(),
    }
    assert torch.equal(x, x0)  # donated, but not written
    assert_bitwise((q, residual), want, "maybe_inplace")


def test_fused_quant_in_place_into_strided_rows(kernels: Path) -> None:
    base_x, base_r = torch.randn(4, 96), torch.randn(4, 96)
    x, r = base_x[:, 16:80], base_r[:, 16:80]
    s = torch.tensor([0.02])
    want = FUSED_QUANT.native(x.clone(), r.clone(), None, EPS, s)
    untouched = base_r[:, :16].clone()
    with FUSED_QUANT.set_priority([PROVIDER]):
        q, residual = FUSED_QUANT.maybe_inplace(x, r, None, EPS, s)
    assert residual.data_ptr() == r.data_ptr()
    assert_bitwise((q, residual), want, "strided rows")
    assert torch.equal(base_r[:, :16], untouched)  # nothing outside the view


def test_fused_quant_default_overload_leaves_inputs_untouched(kernels: Path) -> None:
    x, r, w, eps, s = _fused_args()
    x0, r0 = x.clone(), r.clone()
    with FUSED_QUANT.set_priority([PROVIDER]):
        assert FUSED_QUANT.selected_impl(x, r, w, eps, s).provider == PROVIDER
        q, residual = FUSED_QUANT(x, r, w, eps, s)
        q2, residual2 = FUSED_QUANT.torch_op(x, r, w, eps, s)  # through the dispatcher
    assert torch.equal(x, x0)
    assert torch.equal(r, r0)
    assert residual.data_ptr() != r.data_ptr()
    want = FUSED_QUANT.native(x0, r0, w, eps, s)
    assert_bitwise((q, residual), want, "default overload")
    assert_bitwise((q2, residual2), want, "torch_op")


@pytest.mark.parametrize("op", [SILU, STATIC, DYNAMIC, NORM_QUANT], ids=lambda op: op.name)
def test_out_of_place_ops_never_write_their_inputs(kernels: Path, op: ir.IrOp) -> None:
    assert not op.impls[PROVIDER].inplace
    for sample in op.sample_inputs(torch.bfloat16):
        before = sample.clone().args
        op.impls[PROVIDER].impl_fn(*sample.args)
        for a, b in zip(sample.args, before, strict=True):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b), sample.name


# -- what is declined ---------------------------------------------------------

_X = torch.randn(4, 8)
_S = torch.tensor([0.02])


@pytest.mark.parametrize(
    ("op", "args", "why"),
    [
        (SILU, (_X.double(),), "float64"),
        (SILU, (torch.tensor(1.0),), "0-d"),
        (STATIC, (_X.double(), _S), "float64"),
        (STATIC, (_X, _S.double()), "float64 scale"),
        (STATIC, (_X, _S.bfloat16()), "bf16 scale"),
        (STATIC, (_X, _S.reshape(1, 1)), "2-D scale"),
        (DYNAMIC, (_X.double(),), "float64"),
        (DYNAMIC, (_X, _S.half()), "fp16 scale_ub"),
        (NORM_QUANT, (_X.bfloat16(), torch.ones(8), EPS, _S), "weight dtype differs"),
        (NORM_QUANT, (_X, torch.ones(1, 8), EPS, _S), "2-D weight"),
        (NORM_QUANT, (_X, None, EPS, _S.double()), "float64 scale"),
        (FUSED_QUANT, (_X, _X.half(), None, EPS, _S), "residual dtype"),
        (FUSED_QUANT, (_X, torch.randn(8), None, EPS, _S), "broadcast residual"),
        (FUSED_QUANT, (_X, _X.clone(), torch.ones(8).half(), EPS, _S), "weight dtype differs"),
        (FUSED_QUANT, (_X, _X.clone(), None, EPS, _S.reshape(1, 1)), "2-D scale"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_declined_arguments_fall_back_to_native(
    op: ir.IrOp, args: tuple[Any, ...], why: str
) -> None:
    assert_declined(op, PROVIDER, args, why, run=False)  # native rejects some of them


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (  # the kernel's own check, behind the impl's (test_an_odd_width_is_the_ops_error)
            lambda: kernel_ops()["silu_and_mul"](torch.randn(2, 7)),
            "last dimension must be even, got 7",
        ),
        (
            lambda: impls.static_scaled_fp8_quant(_X, torch.tensor([0.1, 0.2])),
            r"scale must have one element, got shape \[2\]",
        ),
        (
            lambda: impls.dynamic_per_token_fp8_quant(torch.randn(3, 0)),
            "last dimension must not be empty",
        ),
        (
            lambda: impls.rms_norm_static_fp8_quant(_X, torch.ones(7), EPS, _S),
            r"weight must have shape \(8,\), got \[7\]",
        ),
        (
            lambda: impls.fused_add_rms_norm_static_fp8_quant(_X, torch.randn(1, 8), None, EPS, _S),
            r"x_residual has shape \[1, 8\] but x has \[4, 8\]",
        ),
    ],
    ids=["silu-odd", "scale-numel", "dynamic-empty-rows", "weight-shape", "residual-shape"],
)
def test_errors_say_what_is_wrong(kernels: Path, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul"])
def test_an_odd_width_is_the_ops_error(name: str) -> None:
    """The impl raises the op's ValueError, as native does, before building or running
    a kernel."""
    odd = f"^{name}: x's last dimension \\(7\\) must be even: it holds the gate"
    with pytest.raises(ValueError, match=odd):
        getattr(impls, name)(torch.randn(2, 7))
    with pytest.raises(ValueError, match=odd):
        ir.get_op(name).native(torch.randn(2, 7))


def test_empty_inputs(kernels: Path) -> None:
    x = torch.empty(0, 64)
    assert impls.silu_and_mul(x).shape == (0, 32)
    assert impls.static_scaled_fp8_quant(x, _S).shape == (0, 64)
    q, scales = impls.dynamic_per_token_fp8_quant(x)
    assert (q.shape, scales.shape) == ((0, 64), (0, 1))
    assert impls.rms_norm_static_fp8_quant(x, None, EPS, _S).dtype == FP8
    q, r = impls.fused_add_rms_norm_static_fp8_quant(x, torch.empty(0, 64), None, EPS, _S)
    assert (q.shape, q.dtype, r.shape) == ((0, 64), FP8, (0, 64))
