"""The impls' wiring on CPU, over stand-in kernels: argument mapping, declines,
and the in-place contract of ``fused_add_rms_norm``."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from vllm_ir_xpu import PROVIDER, layernorm
from xpu_stand_ins import StandInXpuKernels

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _rows(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = ir.ops.rms_norm.tolerance(got.dtype)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


# -- selection on the XPU platform --------------------------------------------


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16], ids=str)
def test_xpu_platform_defaults_select_xpu_kernels(
    kernels: StandInXpuKernels, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "xpu")
    ir.invalidate_caches()
    x, w = _rows(4, 64, dtype=dtype), _rows(64, dtype=dtype)
    assert ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider == PROVIDER
    out = ir.ops.rms_norm(x, w, 1e-6)
    assert len(kernels.named("rms_norm")) == 1
    _assert_close(out, ir.ops.rms_norm.native(x, w, 1e-6))


def test_other_platforms_do_not_default_to_xpu_kernels(kernels: StandInXpuKernels) -> None:
    x, w = _rows(4, 64), _rows(64)
    assert ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider == "native"
    ir.ops.rms_norm(x, w, 1e-6)
    assert kernels.calls == []


# -- argument mapping ---------------------------------------------------------


def test_rms_norm_hands_a_fresh_result_and_x_rows_to_the_kernel(kernels: StandInXpuKernels) -> None:
    x, w = _rows(2, 3, 128), _rows(128)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        out = ir.ops.rms_norm(x, w, 1e-5)
    (call,) = kernels.calls
    assert call.name == "rms_norm"
    result, given = call.args["result"], call.args["input"]
    assert given.shape == (6, 128)
    assert given.data_ptr() == x.data_ptr(), "x's rows, not a copy"
    assert result.shape == (6, 128)
    assert result.data_ptr() == out.data_ptr(), "written in place"
    assert result.data_ptr() != x.data_ptr()
    assert call.args["weight"] is w
    assert call.args["epsilon"] == 1e-5
    assert out.shape == x.shape
    assert out.is_contiguous()
    _assert_close(out, ir.ops.rms_norm.native(x, w, 1e-5))


def test_rms_norm_reads_row_strided_slices_in_place(kernels: StandInXpuKernels) -> None:
    wide = _rows(4, 256)
    x, w = wide[:, :128], _rows(128)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        assert ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider == PROVIDER
        out = ir.ops.rms_norm(x, w, 1e-6)
    given = kernels.calls[0].args["input"]
    assert given.data_ptr() == x.data_ptr()
    assert given.stride() == (256, 1)
    _assert_close(out, ir.ops.rms_norm.native(x, w, 1e-6))


def test_missing_weight_becomes_ones(kernels: StandInXpuKernels) -> None:
    x = _rows(3, 64, dtype=FP16)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        out = ir.ops.rms_norm(x, None, 1e-6)
    weight = kernels.calls[0].args["weight"]
    assert weight.dtype == FP16
    assert weight.shape == (64,)
    assert bool((weight == 1).all())
    _assert_close(out, ir.ops.rms_norm.native(x, None, 1e-6))


def test_fused_add_hands_both_activations_to_the_in_place_kernel(
    kernels: StandInXpuKernels,
) -> None:
    x, r, w = _rows(2, 5, 96), _rows(2, 5, 96), _rows(96)
    want = ir.ops.fused_add_rms_norm.native(x, r, w, 1e-6)
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        out, residual = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    (call,) = kernels.calls
    assert call.name == "fused_add_rms_norm"
    assert call.args["input"].data_ptr() == x_ptr
    assert call.args["input"].shape == (10, 96)
    assert call.args["residual"].data_ptr() == r_ptr
    assert call.args["weight"] is w
    assert call.args["epsilon"] == 1e-6
    _assert_close(out, want[0])
    _assert_close(residual, want[1])


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


# -- the in-place contract ----------------------------------------------------


def test_maybe_inplace_outputs_alias_the_donated_activations(kernels: StandInXpuKernels) -> None:
    x, r, w = _rows(8, 64), _rows(8, 64), _rows(64)
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        out, residual = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    assert out.data_ptr() == x.data_ptr()
    assert residual.data_ptr() == r.data_ptr()


def test_default_overload_leaves_inputs_untouched(kernels: StandInXpuKernels) -> None:
    x, r, w = _rows(8, 64), _rows(8, 64), _rows(64)
    x0, r0 = x.clone(), r.clone()
    with ir.ops.fused_add_rms_norm.set_priority([PROVIDER]):
        out, residual = ir.ops.fused_add_rms_norm(x, r, w, 1e-6)
    assert len(kernels.calls) == 1, "the kernel ran, on clones"
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
        ("fp64", lambda: (_rows(4, 64, dtype=torch.float64), _rows(64, dtype=torch.float64), 1e-6)),
        ("variance_size", lambda: (_rows(4, 96), _rows(96), 1e-6, 64)),
        ("weight dtype differs", lambda: (_rows(4, 64), _rows(64, dtype=FP32), 1e-6)),
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
def test_rms_norm_declines(kernels: StandInXpuKernels, case: str, args: object) -> None:
    call = args()  # type: ignore[operator]
    assert _selected(ir.ops.rms_norm, *call) == "native", case
    assert kernels.calls == []


@pytest.mark.parametrize(
    ("case", "args"),
    [
        ("fp64", lambda: (*_pair(torch.float64), None, 1e-6)),
        ("variance_size", lambda: (*_pair(BF16), _rows(64), 1e-6, 32)),
        ("residual dtype differs", lambda: (_rows(4, 64), _rows(4, 64, dtype=FP16), None, 1e-6)),
        ("residual rank differs", lambda: (_rows(4, 64), _rows(64), None, 1e-6)),
        ("residual row-strided", lambda: (_rows(4, 64), _rows(4, 128)[:, :64], None, 1e-6)),
        ("x transposed", lambda: (_rows(64, 4).t(), _rows(4, 64), None, 1e-6)),
    ],
)
def test_fused_add_rms_norm_declines(kernels: StandInXpuKernels, case: str, args: object) -> None:
    call = args()  # type: ignore[operator]
    assert _selected(ir.ops.fused_add_rms_norm, *call) == "native", case
    assert kernels.calls == []


def _pair(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return _rows(4, 64, dtype=dtype), _rows(4, 64, dtype=dtype)


def test_declines_are_explained(kernels: StandInXpuKernels) -> None:
    x = _rows(4, 64, dtype=torch.float64)
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


def test_rms_norm_on_a_declined_layout_is_still_right(kernels: StandInXpuKernels) -> None:
    x, w = _rows(3, 4, 64).transpose(0, 1), _rows(64)
    out = layernorm.rms_norm(x, w, 1e-6)
    want = ir.ops.rms_norm.native(x, w, 1e-6)
    assert kernels.calls[0].args["input"].is_contiguous(), "copied to contiguous rows"
    _assert_close(out, want)
    assert out.stride() == want.stride(), "laid out like the native result"


def test_fused_add_on_declined_layouts_still_writes_its_activations(
    kernels: StandInXpuKernels,
) -> None:
    x, r, w = _rows(64, 4).t(), _rows(4, 128)[:, :64], _rows(64)
    want = ir.ops.fused_add_rms_norm.native(x.clone(), r.clone(), w, 1e-6)
    out, residual = layernorm.fused_add_rms_norm(x, r, w, 1e-6)
    assert out is x
    assert residual is r
    _assert_close(x, want[0])
    _assert_close(r, want[1])


def test_a_declined_layout_after_a_cached_selection_runs_native(kernels: StandInXpuKernels) -> None:
    w = _rows(64)
    dense, transposed = _rows(4, 3, 64), _rows(3, 4, 64).transpose(0, 1)
    with ir.ops.rms_norm.set_priority([PROVIDER]):
        assert ir.ops.rms_norm.select(transposed, w, 1e-6).impl.provider == "native"
        ir.ops.rms_norm(dense, w, 1e-6)  # caches the selection for dense bf16 rows
        kernels.calls.clear()
        out = ir.ops.rms_norm(transposed, w, 1e-6)  # another key: selected afresh
    assert kernels.calls == []
    want = ir.ops.rms_norm.native(transposed, w, 1e-6)
    _assert_close(out, want)
    assert out.stride() == want.stride()


def test_sequence_first_batch_1_rows_are_accepted(kernels: StandInXpuKernels) -> None:
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


def test_empty_inputs_never_reach_the_kernels(kernels: StandInXpuKernels) -> None:
    x, r, w = _rows(0, 64), _rows(0, 64), _rows(64)
    assert layernorm.rms_norm(x, w, 1e-6).shape == (0, 64)
    layernorm.fused_add_rms_norm(x, r, w, 1e-6)
    assert kernels.calls == []
