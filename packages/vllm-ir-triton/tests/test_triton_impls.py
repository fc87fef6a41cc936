"""The impls through the IR ops and the kernels directly: semantics, layouts, fallbacks,
and the in-place contract."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import vllm_ir as ir
from triton_helpers import DEVICE, DTYPES, run_size_mismatch
from vllm_ir.testing.declines import NORM_DECLINES, assert_declined
from vllm_ir_triton import BATCH_INVARIANT_PROVIDER, PROVIDER, launch

RMS = ir.ops.rms_norm
FUSED = ir.ops.fused_add_rms_norm
EPS = 1e-6
PROVIDERS = [PROVIDER, BATCH_INVARIANT_PROVIDER]


def _close(got: Any, want: Any, op: ir.IrOp, dtype: torch.dtype, name: str) -> None:
    tol = op.tolerance(dtype)
    torch.testing.assert_close(
        got, want, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{op.name} {name}: {m}"
    )


def _randn(g: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=DEVICE)


def _weight(hidden: int) -> torch.Tensor:
    return 1 + 0.1 * torch.randn(hidden, device=DEVICE)


def _rms_samples(dtype: torch.dtype) -> Iterator[ir.SampleInput]:
    """Shapes beyond the op's own samples: each row layout the kernels address."""
    g = torch.Generator().manual_seed(7)
    yield ir.SampleInput((_randn(g, dtype, 1, 200), _randn(g, dtype, 200), EPS), "1-row")
    yield ir.SampleInput((_randn(g, dtype, 5, 1023), _randn(g, dtype, 1023), 1e-5), "odd-1023")
    yield ir.SampleInput((_randn(g, dtype, 2, 3, 33), _randn(g, dtype, 33), EPS), "3d-odd")
    yield ir.SampleInput((_randn(g, dtype, 33), _randn(g, dtype, 33), EPS), "1d")
    yield ir.SampleInput((_randn(g, dtype, 6, 160)[1:5, 16:144], None, EPS), "strided-no-weight")
    yield ir.SampleInput((_randn(g, dtype, 48, 4).t(), _randn(g, dtype, 48), EPS), "transposed")
    permuted = _randn(g, dtype, 3, 40, 2).permute(0, 2, 1)  # rows do not collapse: copied
    yield ir.SampleInput((permuted, _randn(g, dtype, 40), EPS), "permuted-3d")
    yield ir.SampleInput((_randn(g, dtype, 0, 64), _randn(g, dtype, 64), EPS), "no-rows")


def _fused_samples(dtype: torch.dtype) -> Iterator[ir.SampleInput]:
    g = torch.Generator().manual_seed(8)
    for s in _rms_samples(dtype):
        x, w, eps = s.args
        residual = _randn(g, dtype, *x.shape)
        if s.name == "strided-no-weight":  # both activations strided, differently
            residual = _randn(g, dtype, 4, 200)[:, 50:178]
        yield ir.SampleInput((x, residual, w, eps), s.name)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", [RMS, FUSED], ids=lambda op: op.name)
def test_matches_native_on_every_layout(op: ir.IrOp, dtype: torch.dtype, provider: str) -> None:
    samples = _rms_samples(dtype) if op is RMS else _fused_samples(dtype)
    with op.set_priority([provider]):
        for sample in samples:
            assert op.selected_impl(*sample.args).provider == provider, sample.name
            want = op.native(*sample.clone().args)
            _close(op(*sample.clone().args), want, op, dtype, sample.name)
            if op.allow_inplace:
                _close(op.maybe_inplace(*sample.clone().args), want, op, dtype, sample.name)


# (rows, hidden): >= 16M elements on a GPU, where two-ulp differences from native's
# summation order do occur (vllm_ir.provider's tolerances); a slice of that under the interpreter
_LARGE = [(4096, 4096), (2048, 8192)] if DEVICE != "cpu" else [(16, 4096)]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("rows", "hidden"), _LARGE, ids=str)
def test_large_norms_are_within_the_stated_ulps(
    rows: int, hidden: int, dtype: torch.dtype, provider: str
) -> None:
    g = torch.Generator().manual_seed(3)
    x, r = _randn(g, dtype, rows, hidden), _randn(g, dtype, rows, hidden)
    w = _weight(hidden).to(dtype)
    with RMS.set_priority([provider]), FUSED.set_priority([provider]):
        assert RMS.selected_impl(x, w, EPS).provider == provider
        _close(RMS(x, w, EPS), RMS.native(x, w, EPS), RMS, dtype, f"{rows}x{hidden}")
        got = FUSED(x, r, w, EPS)
    want = FUSED.native(x, r, w, EPS)
    assert torch.equal(got[1], want[1])  # the rounded sum is exact
    _close(got[0], want[0], FUSED, dtype, f"{rows}x{hidden}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["fast", "batch_invariant"])
def test_loop_over_blocks(dtype: torch.dtype, batch_invariant: bool) -> None:
    """Rows longer than the block: the two-pass loop, with a ragged last block."""
    g = torch.Generator().manual_seed(3)
    x, r, w = _randn(g, dtype, 3, 150), _randn(g, dtype, 3, 150), _randn(g, dtype, 150)
    cfg = launch.launch_config(150, x.element_size(), batch_invariant=batch_invariant, max_block=64)
    assert not cfg.single_pass
    got = launch.rms_norm(x, w, EPS, batch_invariant=batch_invariant, max_block=64)
    _close(got, RMS.native(x, w, EPS), RMS, dtype, "rms_norm loop")
    xs, rs = x.clone(), r.clone()
    launch.fused_add_rms_norm_(xs, rs, w, EPS, batch_invariant=batch_invariant, max_block=64)
    _close((xs, rs), FUSED.native(x, r, w, EPS), FUSED, dtype, "fused loop")


@pytest.mark.parametrize("max_block", [None, 32], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_vllm_fused_add_rms_norm_normalizes_the_fp32_sum(provider: str, max_block: Any) -> None:
    """vLLM's numerics bit for bit, on inputs where the seed op's rounded sum gives other
    outputs: x on a grid of 1/8, residuals of a few 1/1024 (bf16 rounds the sums; their
    squares sum exactly in fp32). Two passes recompute the fp32 sum, never re-read it."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randint(-4, 5, (16, 64), generator=g) / 8).to(torch.bfloat16).to(DEVICE)
    r = (torch.randint(-3, 4, (16, 64), generator=g) / 1024).to(torch.bfloat16).to(DEVICE)
    w = (torch.randint(1, 9, (64,), generator=g) / 4).to(torch.bfloat16).to(DEVICE)
    want = ir.ops.vllm_fused_add_rms_norm.native(x, r, w, EPS)
    assert not torch.equal(want[0], FUSED.native(x, r, w, EPS)[0])  # the test can tell
    xs, rs = x.clone(), r.clone()
    invariant = provider == BATCH_INVARIANT_PROVIDER
    launch.fused_add_rms_norm_(
        xs, rs, w, EPS, batch_invariant=invariant, max_block=max_block, vllm=True
    )
    assert torch.equal(xs, want[0])
    assert torch.equal(rs, want[1])
    with ir.ops.vllm_fused_add_rms_norm.set_priority([provider]):
        got = ir.ops.vllm_fused_add_rms_norm(x, r, w, EPS)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])


def test_launch_configs() -> None:
    fast = launch.launch_config(4096, 2, batch_invariant=False)
    assert fast == launch.LaunchConfig(block=4096, single_pass=True, num_warps=8)
    assert launch.launch_config(1000, 4, batch_invariant=False).block == 1024
    long_row = launch.launch_config(40000, 4, batch_invariant=False)
    assert (long_row.block, long_row.single_pass) == (16384, False)
    for hidden in (64, 1000, 4096, 40000):
        cfg = launch.launch_config(hidden, 2, batch_invariant=True)
        assert (cfg.block, cfg.num_warps) == (1024, 4)
        assert cfg.single_pass is (hidden <= 1024)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_rounding_to_16_bit_is_nearest_even() -> None:
    """Ties, overflow, infinities and NaN round as torch does (Triton's interpreter alone
    would truncate float32 to bfloat16): through the stored residual sum, which is
    ``x + x_residual`` computed in float32 and rounded once, an exact elementwise result."""
    tiny = 2.0**-8  # half a bfloat16 ulp at 1.0: 1 + tiny is a tie
    x = torch.tensor([1.0, 1.0 + 2**-7, -1.0, 3.0e38, -3.0e38, float("inf"), 1.0, 0.0])
    r = torch.tensor([tiny, tiny, -tiny, 3.0e38, -3.0e38, 1.0, float("nan"), -0.0])
    for dtype in (torch.bfloat16, torch.float16):
        xs, rs = x.to(dtype).to(DEVICE), r.to(dtype).to(DEVICE)
        want = xs + rs
        for provider in PROVIDERS:
            with FUSED.set_priority([provider]):
                _, total = FUSED(xs.unsqueeze(0), rs.unsqueeze(0), None, EPS)
            torch.testing.assert_close(total[0], want, atol=0, rtol=0, equal_nan=True)


def test_residual_sum_is_exact_on_every_backend() -> None:
    """The stored sum is elementwise ``x + x_residual`` rounded to the dtype: exact."""
    for dtype in DTYPES:
        g = torch.Generator().manual_seed(5)
        x, r = _randn(g, dtype, 4, 96) * 100, _randn(g, dtype, 4, 96)
        with FUSED.set_priority([PROVIDER]):
            _, total = FUSED(x, r, None, EPS)
        assert torch.equal(total, x + r), dtype


_HALF_WEIGHT = pytest.param(
    "fused_add_rms_norm",
    "fp16 weight of fp16 activations",
    lambda: (torch.randn(4, 8).half(), torch.randn(4, 8).half(), torch.ones(8), EPS),
    id="fused_add_rms_norm-w",
)


@pytest.mark.parametrize(("op", "why", "args"), [*NORM_DECLINES, _HALF_WEIGHT])
def test_declined_arguments_fall_back_to_native(op: str, why: str, args: Any) -> None:
    on_device = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args())
    for provider in PROVIDERS:
        assert_declined(ir.get_op(op), provider, on_device, why)


@pytest.mark.parametrize("x", [torch.empty(4, 8, device="meta"), torch.randn(4, 8).to_sparse()])
def test_other_devices_and_layouts_are_declined(x: torch.Tensor) -> None:
    with RMS.set_priority([PROVIDER, "native"]):
        assert RMS.selected_impl(x, None, EPS).provider == "native"


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (RMS, (torch.randn(4, 1), torch.rand(8), EPS)),  # x broadcasts against the weight
        (RMS, (torch.randn(4, 8), torch.rand(1), EPS)),  # a one-element weight
        (FUSED, (torch.randn(4, 8), torch.randn(1, 8), None, EPS)),  # broadcast residual
        (FUSED, (torch.randn(1, 8), torch.randn(4, 8), torch.rand(8), EPS)),
    ],
    ids=["x-broadcasts", "scalar-weight", "residual-broadcasts", "x-broadcasts-fused"],
)
def test_size_mismatches_are_computed_by_native(op: ir.IrOp, args: tuple[Any, ...]) -> None:
    """What supports_args cannot see (sizes), the impl handles: no launch, native result."""
    got, want = run_size_mismatch(op, PROVIDER, args)
    torch.testing.assert_close(got, want)


def _assert_written_into(
    got: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, r: torch.Tensor, want: Any
) -> None:
    """``maybe_inplace`` returned the donated ``x`` and ``r``, holding ``want``."""
    assert got[0].data_ptr() == x.data_ptr()
    assert got[1].data_ptr() == r.data_ptr()
    torch.testing.assert_close(got, want)


def test_maybe_inplace_writes_into_the_donated_tensors() -> None:
    x, r, w = torch.randn(4, 64, device=DEVICE), torch.randn(4, 64, device=DEVICE), _weight(64)
    want = FUSED.native(x, r, w, EPS)
    for provider in PROVIDERS:
        xs, rs = x.clone(), r.clone()
        with FUSED.set_priority([provider]):
            _assert_written_into(FUSED.maybe_inplace(xs, rs, w, EPS), xs, rs, want)


@pytest.mark.parametrize("layout", ["strided-rows", "permuted"])
def test_maybe_inplace_into_views(layout: str) -> None:
    if layout == "strided-rows":
        base_x, base_r = torch.randn(4, 96, device=DEVICE), torch.randn(4, 96, device=DEVICE)
        x, r = base_x[:, 16:80], base_r[:, 16:80]
    else:  # no row view: computed on copies and written back
        base_x, base_r = torch.randn(2, 64, 3, device=DEVICE), torch.randn(2, 64, 3, device=DEVICE)
        x, r = base_x.transpose(1, 2), base_r.transpose(1, 2)
    want = FUSED.native(x.clone(), r.clone(), None, EPS)
    before_x, before_r = base_x.clone(), base_r.clone()
    with FUSED.set_priority([PROVIDER]):
        _assert_written_into(FUSED.maybe_inplace(x, r, None, EPS), x, r, want)
    if layout == "strided-rows":  # nothing outside the views
        assert torch.equal(base_x[:, :16], before_x[:, :16])
        assert torch.equal(base_r[:, 80:], before_r[:, 80:])


def test_default_overload_leaves_inputs_untouched() -> None:
    x, r, w = torch.randn(4, 64, device=DEVICE), torch.randn(4, 64, device=DEVICE), _weight(64)
    x0, r0 = x.clone(), r.clone()
    with FUSED.set_priority([PROVIDER]):
        assert FUSED.selected_impl(x, r, w, EPS).provider == PROVIDER
        h, res = FUSED(x, r, w, EPS)
        h2, res2 = FUSED.torch_op(x, r, w, EPS)  # through the dispatcher, as tracers call it
    assert torch.equal(x, x0)
    assert torch.equal(r, r0)
    assert h.data_ptr() != x.data_ptr()
    assert res.data_ptr() != r.data_ptr()
    torch.testing.assert_close((h, res), FUSED.native(x0, r0, w, EPS))
    torch.testing.assert_close((h2, res2), (h, res))


def test_rms_norm_never_writes_its_input() -> None:
    x = torch.randn(4, 64, device=DEVICE)
    x0 = x.clone()
    with RMS.set_priority([PROVIDER]):
        RMS(x, None, EPS)
        RMS.torch_op(x, None, EPS)
    assert torch.equal(x, x0)


def test_gradients_are_native_ones() -> None:
    x = torch.randn(3, 32, device=DEVICE, requires_grad=True)
    w = torch.rand(32, device=DEVICE, requires_grad=True)
    with RMS.set_priority([PROVIDER]):
        RMS(x, w, EPS).sum().backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    RMS.native(x2, w2, EPS).sum().backward()
    torch.testing.assert_close((x.grad, w.grad), (x2.grad, w2.grad))


def test_torch_ops_are_opaque_under_tracing() -> None:
    """Traced (as the lowering does), each impl is one kernel-op node, no launch."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from vllm_ir_triton import impls

    x, r, w = torch.randn(4, 64, device=DEVICE), torch.randn(4, 64, device=DEVICE), _weight(64)
    gm = make_fx(lambda x, w: impls.rms_norm(x, w, EPS), tracing_mode="fake")(x, w)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.vllm_ir_triton.rms_norm.default]
    fused = make_fx(lambda x, r, w: impls.fused_add_rms_norm(x, r, w, EPS), tracing_mode="fake")
    gm = fused(x, r, w)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.vllm_ir_triton.fused_add_rms_norm_.default in targets


def test_column_offsets_beyond_32_bits_use_contiguous_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Column offsets are 32-bit in the kernels: rows whose last element lies further
    away (huge transposed tensors) are computed on a contiguous copy, written back."""
    monkeypatch.setattr(launch, "_MAX_COLUMN_OFFSET", 100)
    x = torch.randn(48, 4, device=DEVICE).t()  # column stride 4: 47 * 4 > 100
    r = torch.randn(48, 4, device=DEVICE).t()
    w = _weight(48)
    assert launch._rows(x) is None
    _close(launch.rms_norm(x, w, EPS), RMS.native(x, w, EPS), RMS, torch.float32, "rms")
    want = FUSED.native(x.clone(), r.clone(), w, EPS)
    launch.fused_add_rms_norm_(x, r, w, EPS)
    _close((x, r), want, FUSED, torch.float32, "fused, written back")
