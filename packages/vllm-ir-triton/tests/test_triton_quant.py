"""``silu_and_mul`` and the FP8 ops of ``triton``: bit-exact quantization, layouts,
fallbacks, and the in-place contract of ``fused_add_rms_norm_static_fp8_quant``.

FP8 outputs are compared as bit patterns (``uint8`` views): the quantization
is fully determined (IEEE division, clamp, round to nearest even), so the
kernels must give torch's bits on every backend. The fused norm + quant
kernels must give exactly the bits of the plain norm kernel's output
quantized (their reduction order is the norm kernel's, not torch's).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import vllm_ir as ir
from triton_helpers import DEVICE, DTYPES, run_size_mismatch
from vllm_ir.kits.quant import fp8_steps_apart
from vllm_ir_triton import PROVIDER, launch

FP8 = torch.float8_e4m3fn
SILU = ir.ops.silu_and_mul
STATIC = ir.ops.static_scaled_fp8_quant
DYNAMIC = ir.ops.dynamic_per_token_fp8_quant
RMS_QUANT = ir.ops.rms_norm_static_fp8_quant
FUSED_QUANT = ir.ops.fused_add_rms_norm_static_fp8_quant
NEW_OPS = [SILU, STATIC, DYNAMIC, RMS_QUANT, FUSED_QUANT]
EPS = 1e-6


def _bits(t: torch.Tensor) -> torch.Tensor:
    assert t.dtype == FP8, t.dtype
    return t.view(torch.uint8)


def _assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    differ = _bits(got) != _bits(want)
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {differ.numel()} FP8 values differ, e.g. "
        f"{_bits(got)[differ][:5].tolist()} instead of {_bits(want)[differ][:5].tolist()}"
    )


def _scale(value: float = 0.02) -> torch.Tensor:
    return torch.tensor([value], device=DEVICE)


def _rounding_cases() -> torch.Tensor:
    """Every finite FP8 value, every midpoint (ties) and their float32 neighbours,
    the saturation boundary, subnormals, infinities, NaN, signed zeros."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    values = values[values.isfinite()].unique()
    mids = (values[1:] + values[:-1]) / 2
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    special = [448.0, 449.0, 463.9, 464.0, 479.9, 480.0, 1e4, 3e38, float("inf"), float("nan")]
    special += [2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-11, 1e-30, 1e-40, 0.0]
    special_t = torch.tensor(special)
    g = torch.Generator().manual_seed(11)
    return torch.cat(
        [
            values,
            mids,
            mids.nextafter(up),
            mids.nextafter(down),
            values.nextafter(up),
            values.nextafter(down),
            special_t,
            -special_t,
            torch.randn(2000, generator=g) * 100,
        ]
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_fp8_rounding_is_torchs_bit_for_bit() -> None:
    """Ties to even, carries into the exponent, saturation to +-448, subnormals,
    NaN and infinities, as ``tensor.to(float8_e4m3fn)`` after native's clamp.
    (Triton's own float32 -> fp8e4nv cast in the interpreter gets most of these wrong.)"""
    cases = _rounding_cases().to(DEVICE)
    x = cases[: cases.numel() // 4 * 4].view(4, -1)  # only random values at the end are cut
    for scale in (1.0, 0.02, 3.0):
        got = launch.static_scaled_fp8_quant(x, _scale(scale))
        _assert_bits_equal(got, STATIC.native(x, _scale(scale)), f"scale {scale}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quant_ops_are_bit_exact_on_their_samples(dtype: torch.dtype) -> None:
    with STATIC.set_priority([PROVIDER]), DYNAMIC.set_priority([PROVIDER]):
        for sample in STATIC.sample_inputs(dtype, DEVICE):
            assert STATIC.selected_impl(*sample.args).provider == PROVIDER
            _assert_bits_equal(STATIC(*sample.args), STATIC.native(*sample.args), sample.name)
        for sample in DYNAMIC.sample_inputs(dtype, DEVICE):
            assert DYNAMIC.selected_impl(*sample.args).provider == PROVIDER
            q, scales = DYNAMIC(*sample.args)
            want_q, want_scales = DYNAMIC.native(*sample.args)
            _assert_bits_equal(q, want_q, sample.name)
            assert torch.equal(scales, want_scales), sample.name


def test_dynamic_scale_is_natives_on_each_device() -> None:
    """Native's ``amax / 448`` is IEEE division on CPU and ``amax * float32(1/448)`` on
    CUDA (ATen multiplies by a scalar divisor's reciprocal): half the scales differ by
    an ulp. The kernel follows the device; both variants run here, checked bit for bit."""
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(64, 40, generator=g) * 10).to(DEVICE)
    amax = x.abs().amax(dim=-1, keepdim=True)
    divided = amax / torch.tensor(448.0, device=DEVICE)  # a tensor divisor: IEEE everywhere
    multiplied = amax * torch.tensor(launch.INV_FP8_MAX, device=DEVICE)
    assert not torch.equal(divided, multiplied)  # the cases tell the two apart
    for reciprocal, want in ((False, divided), (True, multiplied)):
        q, scales = launch.dynamic_per_token_fp8_quant(x, None, reciprocal_scale=reciprocal)
        assert torch.equal(scales, want), reciprocal
        _assert_bits_equal(q, STATIC.native(x, want), f"reciprocal {reciprocal}")
    _, scales = launch.dynamic_per_token_fp8_quant(x, None)
    assert torch.equal(scales, DYNAMIC.native(x)[1])


def _short_rows(samples: Iterator[ir.SampleInput]) -> Iterator[ir.SampleInput]:
    return (s for s in samples if s.args[0].shape[-1] <= 128)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_quant_is_the_norm_kernel_quantized(dtype: torch.dtype) -> None:
    """Bit for bit: the norm kernel's output, quantized; the residual exactly native's.
    Also through the loop over blocks (a small block forced). The samples' short
    rows only: the interpreter pays per element (the conformance kit has the rest)."""
    for sample in _short_rows(RMS_QUANT.sample_inputs(dtype, DEVICE)):
        x, w, eps, scale = sample.args
        for max_block in (None, 32):
            got = launch.rms_norm(x, w, eps, scale=scale, max_block=max_block)
            normed = launch.rms_norm(x, w, eps, max_block=max_block)
            _assert_bits_equal(got, STATIC.native(normed, scale), f"{sample.name} {max_block}")
    for sample in _short_rows(FUSED_QUANT.sample_inputs(dtype, DEVICE)):
        x, r, w, eps, scale = sample.args
        for max_block in (None, 32):
            r1, x2, r2 = r.clone(), x.clone(), r.clone()
            got = launch.fused_add_rms_norm_static_fp8_quant_(
                x, r1, w, eps, scale, max_block=max_block
            )
            launch.fused_add_rms_norm_(x2, r2, w, eps, max_block=max_block)
            what = f"{sample.name} {max_block}"
            _assert_bits_equal(got, STATIC.native(x2, scale), what)
            assert torch.equal(r1, r2), what
            assert torch.equal(r1, x + r), what


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_dynamic_quant_special_rows() -> None:
    """A zero row (the minimum scale), a huge one, infinities and NaN (torch's amax
    propagates NaN, GPU max reductions drop it), with and without ``scale_ub``
    (a NaN bound too); the single block and the loop over blocks."""
    x = torch.randn(6, 80, generator=torch.Generator().manual_seed(2))
    x[0] = 0.0
    x[1] *= 1e30
    x[2, 5] = float("inf")
    x[3, 70] = float("nan")
    x[4, 3], x[4, 60] = float("-inf"), float("nan")
    x = x.to(DEVICE)
    for ub in (None, 0.5, float("nan")):
        scale_ub = None if ub is None else _scale(ub)
        want_q, want_scales = DYNAMIC.native(x, scale_ub)
        for max_block in (None, 32):
            q, scales = launch.dynamic_per_token_fp8_quant(x, scale_ub, max_block=max_block)
            torch.testing.assert_close(scales, want_scales, rtol=0, atol=0, equal_nan=True)
            torch.testing.assert_close(q.float(), want_q.float(), rtol=0, atol=0, equal_nan=True)
            finite = want_scales.isfinite().squeeze(-1)  # NaN rows: NaN's sign may differ
            _assert_bits_equal(q[finite], want_q[finite], f"ub {ub}, block {max_block}")


def _layouts(dtype: torch.dtype, hidden: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=DEVICE)

    return [
        ("1-row", randn(1, hidden)),
        ("3d", randn(2, 3, hidden)),
        ("1d", randn(hidden)),
        ("strided", randn(5, hidden + 40)[1:4, 8 : 8 + hidden]),
        ("transposed", randn(hidden, 3).t()),
        ("permuted", randn(2, hidden, 3).transpose(1, 2)),  # rows do not collapse: copied
        ("no-rows", randn(0, hidden)),
    ]


def _close(got: Any, want: Any, op: ir.IrOp, dtype: torch.dtype, name: str) -> None:
    tol = op.tolerance(dtype)
    torch.testing.assert_close(
        got, want, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{op.name} {name}: {m}"
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_layout(dtype: torch.dtype) -> None:
    """Beyond the ops' samples: each row layout, for each op; FP8 bit for bit."""
    scale = _scale()
    w = (1 + 0.1 * torch.randn(48)).to(dtype=dtype, device=DEVICE)
    with ir.IrOpPriorityConfig(**{op.name: [PROVIDER] for op in NEW_OPS}).scope():
        for name, x in _layouts(dtype, 96):
            assert SILU.selected_impl(x).provider == PROVIDER
            _close(SILU(x), SILU.native(x), SILU, dtype, name)
        for name, x in _layouts(dtype, 48):
            _assert_bits_equal(STATIC(x, scale), STATIC.native(x, scale), name)
            got_q, got_s = DYNAMIC(x)
            want_q, want_s = DYNAMIC.native(x)
            _assert_bits_equal(got_q, want_q, name)
            assert torch.equal(got_s, want_s), name
            got, want = RMS_QUANT(x, w, EPS, scale), RMS_QUANT.native(x, w, EPS, scale)
            _close(got.float(), want.float(), RMS_QUANT, dtype, name)
            assert not (fp8_steps_apart(got, want) > 1).any(), name
            r = torch.randn(x.shape).to(dtype=dtype, device=DEVICE)
            q, res = FUSED_QUANT(x, r, w, EPS, scale)
            want_q, want_res = FUSED_QUANT.native(x, r, w, EPS, scale)
            assert torch.equal(res, want_res), name
            _close(q.float(), want_q.float(), RMS_QUANT, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_loop_over_blocks(dtype: torch.dtype) -> None:
    x = torch.randn(3, 300, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    _close(launch.silu_and_mul(x, max_block=64), SILU.native(x), SILU, dtype, "loop")


def test_fused_quant_maybe_inplace_writes_only_the_residual() -> None:
    """The contract: the new residual into the donated ``x_residual`` (returned as the
    second output), the FP8 result in a new tensor, ``x`` read only."""
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(4, 64, generator=g).to(DEVICE), torch.randn(4, 64, generator=g).to(DEVICE)
    w, scale = (1 + 0.1 * torch.randn(64, generator=g)).to(DEVICE), _scale()
    want_q, want_r = FUSED_QUANT.native(x, r, w, EPS, scale)
    impl = FUSED_QUANT.impls[PROVIDER]
    assert impl.inplace
    xs, rs = x.clone(), r.clone()
    with FUSED_QUANT.set_priority([PROVIDER]):
        assert FUSED_QUANT.selected_impl(xs, rs, w, EPS, scale).provider == PROVIDER
        q, res = FUSED_QUANT.maybe_inplace(xs, rs, w, EPS, scale)
    assert res.data_ptr() == rs.data_ptr()
    assert torch.equal(rs, want_r)
    assert torch.equal(xs, x)  # x is only read
    assert q.dtype == FP8
    assert q.shape == x.shape
    assert q.untyped_storage().data_ptr() not in {xs.data_ptr(), rs.data_ptr()}
    _close(q.float(), want_q.float(), RMS_QUANT, torch.float32, "maybe_inplace")


def test_fused_quant_default_overload_leaves_inputs_untouched() -> None:
    x, r = torch.randn(4, 64, device=DEVICE), torch.randn(4, 64, device=DEVICE)
    x0, r0, scale = x.clone(), r.clone(), _scale()
    with FUSED_QUANT.set_priority([PROVIDER]):
        q, res = FUSED_QUANT(x, r, None, EPS, scale)
        q2, res2 = FUSED_QUANT.torch_op(x, r, None, EPS, scale)  # through the dispatcher
    assert torch.equal(x, x0)
    assert torch.equal(r, r0)
    assert res.data_ptr() != r.data_ptr()
    assert torch.equal(res, x0 + r0)
    _assert_bits_equal(q, q2, "dispatcher")
    assert torch.equal(res2, res)


@pytest.mark.parametrize("layout", ["strided-rows", "permuted"])
def test_fused_quant_maybe_inplace_into_views(layout: str) -> None:
    if layout == "strided-rows":
        base_x, base_r = torch.randn(4, 96, device=DEVICE), torch.randn(4, 96, device=DEVICE)
        x, r = base_x[:, 16:80], base_r[:, 16:80]
    else:  # no row view: computed on copies, the residual written back
        base_x, base_r = torch.randn(2, 64, 3, device=DEVICE), torch.randn(2, 64, 3, device=DEVICE)
        x, r = base_x.transpose(1, 2), base_r.transpose(1, 2)
    before_x, before_r = base_x.clone(), base_r.clone()
    want_q, want_r = FUSED_QUANT.native(x.clone(), r.clone(), None, EPS, _scale())
    with FUSED_QUANT.set_priority([PROVIDER]):
        q, res = FUSED_QUANT.maybe_inplace(x, r, None, EPS, _scale())
    assert res.data_ptr() == r.data_ptr()
    assert torch.equal(res, want_r)
    assert torch.equal(base_x, before_x)
    _close(q.float(), want_q.float(), RMS_QUANT, torch.float32, layout)
    if layout == "strided-rows":  # nothing outside the view
        assert torch.equal(base_r[:, :16], before_r[:, :16])
        assert torch.equal(base_r[:, 80:], before_r[:, 80:])


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


S = torch.tensor([0.02])


@pytest.mark.parametrize(
    ("op", "args", "why"),
    [
        (SILU, (_t(4, 8).double(),), "float64"),
        (STATIC, (_t(4, 8), S.half()), "float16 scale"),
        (STATIC, (_t(4, 8), S.view(1, 1)), "2-D scale"),
        (DYNAMIC, (_t(4, 8), S.half()), "float16 scale_ub"),
        (RMS_QUANT, (_t(4, 8), _t(8).half(), EPS, S), "weight dtype differs"),
        (RMS_QUANT, (_t(4, 8), None, EPS, S.double()), "float64 scale"),
        (FUSED_QUANT, (_t(4, 8), _t(4, 8).half(), None, EPS, S), "residual dtype"),
        (FUSED_QUANT, (_t(4, 8), _t(8), None, EPS, S), "residual rank"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_declined_arguments_fall_back_to_native(
    op: ir.IrOp, args: tuple[Any, ...], why: str
) -> None:
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    # native named next: installed providers' platform defaults come after it
    with op.set_priority([PROVIDER, "native"]):
        selection = op.select(*args)
    assert selection.impl.provider == "native", why
    assert "supports_args returned False" in selection.decisions[0].reason


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (STATIC, (_t(4, 8), _t(8).abs())),  # a per-column scale
        (RMS_QUANT, (_t(4, 8), _t(8), EPS, _t(8).abs())),
        (FUSED_QUANT, (_t(4, 8), _t(1, 8), None, EPS, S)),  # broadcast residual
    ],
    ids=["static-per-column", "rms-quant-per-column", "fused-broadcast"],
)
def test_size_mismatches_are_computed_by_native(op: ir.IrOp, args: tuple[Any, ...]) -> None:
    """What supports_args cannot see (sizes), the impl hands to native: no launch."""
    got, want = run_size_mismatch(op, PROVIDER, args)
    for g, w in zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]:
        torch.testing.assert_close(g.float(), w.float(), rtol=0, atol=0)


@pytest.mark.parametrize("width", [1, 3, 7])
@pytest.mark.parametrize("name", ["silu_and_mul", "gelu_and_mul"])
def test_an_odd_width_is_the_ops_error(name: str, width: int) -> None:
    """Native, the selected ``triton`` impl and a direct launch all raise the op's one
    ValueError (native used to broadcast widths 1 and 3)."""
    from vllm_ir_triton import impls

    op = ir.get_op(name)
    x = _t(4, width).to(DEVICE)
    message = "^" + re.escape(f"{name}: x's last dimension ({width}) must be even: it holds")
    calls = [
        lambda: op.native(x),
        lambda: getattr(impls, name)(x),
        lambda: getattr(launch, name)(x, *(("none",) if name == "gelu_and_mul" else ())),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()
    with op.set_priority([PROVIDER]):
        assert op.selected_impl(x).provider == PROVIDER  # sizes are not in supports_args
        with pytest.raises(ValueError, match=message):
            op(x)


def test_dynamic_quant_of_empty_rows_raises_natives_error() -> None:
    x = torch.empty(2, 0, device=DEVICE)
    with pytest.raises(IndexError, match="non-zero size"):
        DYNAMIC.native(x)
    with DYNAMIC.set_priority([PROVIDER]), pytest.raises(IndexError, match="non-zero size"):
        DYNAMIC(x)


def test_torch_ops_are_opaque_under_tracing() -> None:
    """Traced (as the lowering does), each impl is one kernel-op node, no launch."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from vllm_ir_triton import impls

    x, r, w, s = _t(4, 64), _t(4, 64), _t(64), S
    x, r, w, s = (t.to(DEVICE) for t in (x, r, w, s))
    lib = torch.ops.vllm_ir_triton
    traced = {
        lib.silu_and_mul.default: (lambda x: impls.silu_and_mul(x), (x,)),
        lib.static_scaled_fp8_quant.default: (impls.static_scaled_fp8_quant, (x, s)),
        lib.dynamic_per_token_fp8_quant.default: (impls.dynamic_per_token_fp8_quant, (x, s)),
        lib.rms_norm_static_fp8_quant.default: (
            lambda x, w, s: impls.rms_norm_static_fp8_quant(x, w, EPS, s),
            (x, w, s),
        ),
        lib.fused_add_rms_norm_static_fp8_quant_.default: (
            lambda x, r, w, s: impls.fused_add_rms_norm_static_fp8_quant(x, r, w, EPS, s),
            (x, r, w, s),
        ),
    }
    for target, (fn, args) in traced.items():
        gm = make_fx(fn, tracing_mode="fake")(*args)
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert target in targets, (target, targets)
