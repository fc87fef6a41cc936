"""The impls' wiring on CPU, over the stand-in ``aiter``: argument mapping, declines,
and the in-place contract of ``fused_add_rms_norm``."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from rocm_stand_ins import StandInAiter
from vllm_ir_rocm import PROVIDER, layernorm

BF16, FP16 = torch.bfloat16, torch.float16


def _rows(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = ir.ops.rms_norm.tolerance(got.dtype)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


# -- selection on the ROCm platform -------------------------------------------


def test_rocm_platform_defaults_select_aiter(
    aiter: StandInAiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "rocm")
    ir.invalidate_caches()
    x, w = _rows(4, 64), _rows(64)
    assert ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider == PROVIDER
    out = ir.ops.rms_norm(x, w, 1e-6)
    assert len(aiter.named("rmsnorm2d_fwd")) == 1
    _assert_close(out, ir.ops.rms_norm.native(x, w, 1e-6))


def test_other_platforms_do_not_default_to_aiter(aiter: StandInAiter) -> None:
    x, w = _rows(4, 64), _rows(64)
    assert ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider == "native"
    ir.ops.rms_norm(x, w, 1e-6)
    assert aiter.calls == []


# -- argument mapping ---------------------------------------------------------


def test_rms_norm_hands_x_rows_weight_and_epsilon_to_rmsnorm2d_fwd(aiter: StandInAiter) -> None:
    x, w = _rows(2, 3, 128), _rows(128)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        out = ir.ops.rms_norm(x, w, 1e-5)
    (call,) = aiter.calls
    assert call.name == "rmsnorm2d_fwd"
    got = call.args["input"]
    assert got.shape == (6, 128)
    assert got.data_ptr() == x.data_ptr(), "x's rows, not a copy"
    assert call.args["weight"] is w
    assert call.args["epsilon"] == 1e-5
    assert call.args["use_model_sensitive_rmsnorm"] == 0, "AITER's default variant"
    assert out.shape == x.shape
    assert out.is_contiguous()
    _assert_close(out, ir.ops.rms_norm.native(x, w, 1e-5))


def test_rms_norm_reads_row_strided_slices_in_place(aiter: StandInAiter) -> None:
    wide = _rows(4, 256)
    x, w = wide[:, :128], _rows(128)
    assert layernorm.rows_flatten_free(x)
    assert not x.is_contiguous()
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        assert ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider == PROVIDER
        out = ir.ops.rms_norm(x, w, 1e-6)
    got = aiter.calls[0].args["input"]
    assert got.data_ptr() == x.data_ptr()
    assert got.stride() == (256, 1)
    _assert_close(out, ir.ops.rms_norm.native(x, w, 1e-6))


def test_missing_weight_becomes_ones(aiter: StandInAiter) -> None:
    x = _rows(3, 64, dtype=FP16)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        out = ir.ops.rms_norm(x, None, 1e-6)
    weight = aiter.calls[0].args["weight"]
    assert weight.dtype == FP16
    assert weight.shape == (64,)
    assert bool((weight == 1).all())
    _assert_close(out, ir.ops.rms_norm.native(x, None, 1e-6))


def test_fused_add_hands_both_activations_to_the_in_place_kernel(aiter: StandInAiter) -> None:
    x, r, w = _rows(2, 5, 96), _rows(2, 5, 96), _rows(96)
    want = ir.ops.fused_add_rms_norm.native(x, r, w, 1e-6)
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        out, residual = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    (call,) = aiter.calls
    assert call.name == "fused_add_rms_norm_cu"
    assert call.args["input"].data_ptr() == x_ptr
    assert call.args["input"].shape == (10, 96)
    assert call.args["residual_in"].data_ptr() == r_ptr
    assert call.args["weight"] is w
    assert call.args["epsilon"] == 1e-6
    _assert_close(out, want[0])
    _assert_close(residual, want[1])


# -- the in-place contract ----------------------------------------------------


def test_maybe_inplace_outputs_alias_the_donated_activations(aiter: StandInAiter) -> None:
    x, r, w = _rows(8, 64), _rows(8, 64), _rows(64)
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        out, residual = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    assert out.data_ptr() == x.data_ptr()
    assert residual.data_ptr() == r.data_ptr()


def test_default_overload_leaves_inputs_untouched(aiter: StandInAiter) -> None:
    x, r, w = _rows(8, 64), _rows(8, 64), _rows(64)
    x0, r0 = x.clone(), r.clone()
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        out, residual = ir.ops.fused_add_rms_norm(x, r, w, 1e-6)
    assert len(aiter.calls) == 1, "the kernel ran, on clones"
    assert torch.equal(x, x0)
    assert torch.equal(r, r0)
    assert out.data_ptr() not in (x.data_ptr(), r.data_ptr())
    assert residual.data_ptr() not in (x.data_ptr(), r.data_ptr())
    want = ir.ops.fused_add_rms_norm.native(x0, r0, w, 1e-6)
    _assert_close(out, want[0])
    _assert_close(residual, want[1])


# -- declines -----------------------------------------------------------------


def _selected(op: ir.IrOp, *args: object) -> str:
    with op.set_priority([PROVIDER]):
        return op.select(*args).impl.provider


@pytest.mark.parametrize(
    ("case", "args"),
    [
        ("fp32", lambda: (_rows(4, 64, dtype=torch.float32), _rows(64, dtype=torch.float32), 1e-6)),
        ("variance_size", lambda: (_rows(4, 96), _rows(96), 1e-6, 64)),
        ("weight dtype differs", lambda: (_rows(4, 64), _rows(64, dtype=torch.float32), 1e-6)),
        ("weight 2-D", lambda: (_rows(4, 64), _rows(1, 64), 1e-6)),
        ("last dim strided", lambda: (_rows(64, 4).t(), _rows(64), 1e-6)),
        ("flatten would copy", lambda: (_rows(3, 4, 64).transpose(0, 1), _rows(64), 1e-6)),
        (
            "split heads view",
            lambda: (_rows(5, 3 * 128)[:, :256].view(5, 2, 128), _rows(128), 1e-6),
        ),
        ("0-d", lambda: (torch.tensor(1.0, dtype=BF16), None, 1e-6)),
    ],
)
def test_rms_norm_declines(aiter: StandInAiter, case: str, args: object) -> None:
    call = args()  # type: ignore[operator]
    assert _selected(ir.ops.rms_norm, *call) == "native", case
    assert aiter.calls == []


@pytest.mark.parametrize(
    ("case", "args"),
    [
        ("fp32", lambda: (*_pair(torch.float32), _rows(64, dtype=torch.float32), 1e-6)),
        ("variance_size", lambda: (*_pair(BF16), _rows(64), 1e-6, 32)),
        ("residual dtype differs", lambda: (_rows(4, 64), _rows(4, 64, dtype=FP16), None, 1e-6)),
        ("residual rank differs", lambda: (_rows(4, 64), _rows(64), None, 1e-6)),
        ("x row-strided", lambda: (_rows(4, 128)[:, :64], _rows(4, 64), None, 1e-6)),
        ("residual transposed", lambda: (_rows(4, 64), _rows(64, 4).t(), None, 1e-6)),
    ],
)
def test_fused_add_rms_norm_declines(aiter: StandInAiter, case: str, args: object) -> None:
    call = args()  # type: ignore[operator]
    assert _selected(ir.ops.fused_add_rms_norm, *call) == "native", case
    assert aiter.calls == []


def _pair(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return _rows(4, 64, dtype=dtype), _rows(4, 64, dtype=dtype)


def test_declines_are_explained(aiter: StandInAiter) -> None:
    x = _rows(4, 64, dtype=torch.float32)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        selection = ir.ops.rms_norm.select(x, None, 1e-6)
    first = selection.decisions[0]
    assert first.entry.provider == PROVIDER
    assert not first.accepted
    assert "supports_args returned False" in first.reason


# -- layouts the predicates decline, called directly ---------------------------
# Dispatch never sends a declined layout here (strides are in the dispatch
# key), but the impls are public functions: called directly, they must still
# compute the op exactly.


def test_rms_norm_on_a_declined_layout_is_still_right(aiter: StandInAiter) -> None:
    x, w = _rows(3, 4, 64).transpose(0, 1), _rows(64)
    out = layernorm.rms_norm(x, w, 1e-6)
    want = ir.ops.rms_norm.native(x, w, 1e-6)
    assert aiter.calls[0].args["input"].is_contiguous(), "copied to contiguous rows"
    _assert_close(out, want)
    assert out.stride() == want.stride(), "laid out like the native result"


def test_fused_add_on_declined_layouts_still_writes_its_activations(aiter: StandInAiter) -> None:
    x, r, w = _rows(4, 128)[:, :64], _rows(64, 4).t(), _rows(64)
    want = ir.ops.fused_add_rms_norm.native(x.clone(), r.clone(), w, 1e-6)
    out, residual = layernorm.fused_add_rms_norm(x, r, w, 1e-6)
    assert out is x
    assert residual is r
    _assert_close(x, want[0])
    _assert_close(r, want[1])


def test_a_declined_layout_after_a_cached_selection_runs_native(aiter: StandInAiter) -> None:
    w = _rows(64)
    dense, transposed = _rows(4, 3, 64), _rows(3, 4, 64).transpose(0, 1)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        assert ir.ops.rms_norm.select(transposed, w, 1e-6).impl.provider == "native"
        ir.ops.rms_norm(dense, w, 1e-6)  # caches the selection for dense bf16 rows
        aiter.calls.clear()
        out = ir.ops.rms_norm(transposed, w, 1e-6)  # another key: selected afresh
    assert aiter.calls == []
    want = ir.ops.rms_norm.native(transposed, w, 1e-6)
    _assert_close(out, want)
    assert out.stride() == want.stride()


def test_sequence_first_batch_1_rows_are_accepted(aiter: StandInAiter) -> None:
    # (S, 1, H) from transpose(0, 1) of (1, S, H): contiguous, the size-1
    # dimension's stride is S * H, and .view(-1, H) works
    x = _rows(1, 16, 64).transpose(0, 1)
    r = _rows(1, 16, 64).transpose(0, 1)
    assert x.shape == (16, 1, 64)
    assert x.stride() == (64, 1024, 1)
    assert x.is_contiguous()
    w = _rows(64)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        assert ir.ops.rms_norm.select(x, w, 1e-6).impl.provider == PROVIDER
        _assert_close(ir.ops.rms_norm(x, w, 1e-6), ir.ops.rms_norm.native(x, w, 1e-6))
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        assert ir.ops.fused_add_rms_norm.select(x, r, w, 1e-6).impl.provider == PROVIDER


def test_empty_inputs_never_reach_aiter(aiter: StandInAiter) -> None:
    x, r, w = _rows(0, 64), _rows(0, 64), _rows(64)
    assert layernorm.rms_norm(x, w, 1e-6).shape == (0, 64)
    layernorm.fused_add_rms_norm(x, r, w, 1e-6)
    assert aiter.calls == []
