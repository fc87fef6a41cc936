"""The two overloads: default never mutates; maybe_inplace may reuse memory."""

from __future__ import annotations

import gc
import random
import typing
import weakref
from collections.abc import Callable

import conftest
import numpy as np
import pytest
import torch
import vllm_ir as ir
from vllm_ir._schema.layout import apart


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(4.0), torch.ones(4)


def test_maybe_inplace_with_inplace_impl_reuses_memory(inplace_op: ir.IrOp) -> None:
    x, y = _inputs()
    with inplace_op.set_priority(["writes_inputs"]):
        out, total = inplace_op.maybe_inplace(x, y)
    assert out.data_ptr() == x.data_ptr()
    assert total.data_ptr() == y.data_ptr()
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0]


def test_default_overload_clones_for_inplace_impl(inplace_op: ir.IrOp) -> None:
    x, y = _inputs()
    with inplace_op.set_priority(["writes_inputs"]):
        out, total = inplace_op(x, y)
    assert (x.tolist(), y.tolist()) == (_inputs()[0].tolist(), _inputs()[1].tolist())
    assert out.data_ptr() != x.data_ptr()
    assert total.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_maybe_inplace_with_functional_impl_leaves_inputs(inplace_op: ir.IrOp) -> None:
    x, y = _inputs()
    out, _ = inplace_op.maybe_inplace(x, y)  # native: functional
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert out.data_ptr() != x.data_ptr()


def test_torch_op_overloads_never_alias_outputs(inplace_op: ir.IrOp) -> None:
    # behind the dispatcher a schema cannot say "may alias": inplace impls run on copies
    packet = getattr(torch.ops.vllm_ir, inplace_op.name)
    with inplace_op.set_priority(["writes_inputs"]):
        for overload in (packet.default, packet.maybe_inplace):
            x, y = _inputs()
            out, total = overload(x, y)
            assert out.data_ptr() != x.data_ptr()
            assert total.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_fused_add_rms_norm_overloads_agree() -> None:
    op = ir.ops.fused_add_rms_norm
    for sample in op.sample_inputs(torch.float32):
        want = op(*sample.clone().args)
        got = op.maybe_inplace(*sample.clone().args)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_maybe_inplace_schema_marks_activations_mutable() -> None:
    schema = torch.ops.vllm_ir.fused_add_rms_norm.maybe_inplace._schema
    mutable = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert mutable == ["x", "x_residual"]
    default = torch.ops.vllm_ir.fused_add_rms_norm.default._schema
    assert not any(a.alias_info for a in default.arguments)


# -- donation only where it cannot change the result ------------------------


def weighted_add(
    x: torch.Tensor, x_other: torch.Tensor, w: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w * (x + x_other), x + x_other): one (optional) non-activation tensor argument."""
    s = x + x_other
    return (s if w is None else s * w), s


@pytest.fixture
def weighted_op(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    op = make_op(weighted_add, allow_inplace=True)

    @op.register_impl("raw_kernel", inplace=True)
    def _kernel(
        x: torch.Tensor, x_other: torch.Tensor, w: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # writes row by row through .data, as a C++ kernel writes through the
        # data pointer: torch neither checks overlap nor bumps versions
        xd, od = x.data, x_other.data
        for i in range(xd.shape[0]):
            od[i] = xd[i] + od[i]
            xd[i] = od[i] if w is None else od[i] * w.data
        return x, x_other

    return op


def _cases() -> list[tuple[str, Callable[[], tuple[torch.Tensor, ...]]]]:
    def expand_other() -> tuple[torch.Tensor, ...]:
        return torch.randn(4, 8), torch.randn(1, 8).expand(4, 8), torch.randn(8)

    def expand_x() -> tuple[torch.Tensor, ...]:
        return torch.randn(1, 8).expand(4, 8), torch.randn(4, 8), torch.randn(8)

    def rows_overlap() -> tuple[torch.Tensor, ...]:
        return torch.randn(4, 8), torch.randn(40).as_strided((4, 8), (4, 1)), torch.randn(8)

    def weight_views_other() -> tuple[torch.Tensor, ...]:
        other = torch.randn(4, 8)
        return torch.randn(4, 8), other, other[0]

    def activations_share_storage() -> tuple[torch.Tensor, ...]:
        buf = torch.randn(5, 8)
        return buf[1:], buf[:4], torch.randn(8)

    def activations_share_memory_through_two_storages() -> tuple[torch.Tensor, ...]:
        # two storage objects over one numpy buffer: one address range (reliability-v4 01)
        array = np.arange(40, dtype=np.float32)
        return torch.from_numpy(array[8:]).view(4, 8), torch.from_numpy(array[:32]).view(4, 8), None

    def weight_shares_memory_through_another_storage() -> tuple[torch.Tensor, ...]:
        raw = bytearray(np.arange(32, dtype=np.float32).tobytes())
        x = torch.frombuffer(raw, dtype=torch.float32).view(4, 8)
        return x, torch.randn(4, 8), torch.frombuffer(raw, dtype=torch.float32)[8:16]

    return [
        (f.__name__, f)
        for f in (
            expand_other,
            expand_x,
            rows_overlap,
            weight_views_other,
            activations_share_storage,
            activations_share_memory_through_two_storages,
            weight_shares_memory_through_another_storage,
        )
    ]


@pytest.mark.parametrize(("name", "make"), _cases())
def test_overlapping_donations_run_on_copies(
    weighted_op: ir.IrOp, name: str, make: Callable[[], tuple[torch.Tensor, ...]]
) -> None:
    args = make()
    want = weighted_op.native(*(None if a is None else a.clone() for a in args))
    with weighted_op.set_priority(["raw_kernel"]):
        got = weighted_op.maybe_inplace(*args)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, msg=name)


@pytest.mark.parametrize("annotation", [list[torch.Tensor], typing.Sequence[torch.Tensor]])
def test_tensors_in_a_sequence_parameter_are_checked_before_donating(
    make_op: Callable[..., ir.IrOp], annotation: object
) -> None:
    """``typing.Sequence[Tensor]`` is a list of tensors as ``list[Tensor]`` is:
    a donated activation that is one of them runs on a copy (reliability-v4 02)."""

    def flip_add(x: torch.Tensor, extra: list[torch.Tensor]) -> torch.Tensor:
        return x + sum(e.flip(0) for e in extra)

    flip_add.__annotations__["extra"] = annotation
    op = make_op(flip_add, allow_inplace=True)

    def _impl(x: torch.Tensor, extra: list[torch.Tensor]) -> torch.Tensor:
        n = x.shape[0]
        for i in range(n):  # row i reads row n-1-i of each extra tensor after earlier writes
            x[i] += sum(e[n - 1 - i] for e in extra)
        return x

    _impl.__annotations__["extra"] = annotation
    op.register_impl("rows_in_place", inplace=True)(_impl)
    rng = random.Random(0)
    with op.set_priority(["rows_in_place"]):
        for _ in range(50):
            buf = torch.randn(6)
            x = buf[rng.randint(0, 2) :][:4]
            extra = [rng.choice((buf[:4], buf[2:], x, torch.randn(4))) for _ in range(2)]
            want = op.native(x.clone(), [e.clone() for e in extra])
            assert torch.equal(op.maybe_inplace(x, extra), want)


def test_separate_donations_still_reuse_memory(weighted_op: ir.IrOp) -> None:
    x, other, w = torch.randn(4, 16)[:, :8], torch.randn(4, 8), torch.randn(8)  # rows of wider rows
    with weighted_op.set_priority(["raw_kernel"]):
        out, total = weighted_op.maybe_inplace(x, other, w)
    assert (out.data_ptr(), total.data_ptr()) == (x.data_ptr(), other.data_ptr())


def test_column_views_of_one_buffer_are_donated_together(weighted_op: ir.IrOp) -> None:
    # vLLM's q and k: columns of one qkv tensor, one storage, no byte in common
    buf = torch.randn(4, 16)
    x, other, w = buf[:, :8], buf[:, 8:], torch.randn(8)
    want = weighted_op.native(x.clone(), other.clone(), w)
    with weighted_op.set_priority(["raw_kernel"]):
        out, total = weighted_op.maybe_inplace(x, other, w)
    assert (out.data_ptr(), total.data_ptr()) == (x.data_ptr(), other.data_ptr())
    for g, e in zip((out, total), want, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("seed", range(3))
def test_random_donations_equal_native_and_leave_the_rest(weighted_op: ir.IrOp, seed: int) -> None:
    """Random views of a few buffers (rows, columns, expands, one another) as the
    activations and the optional weight: ``maybe_inplace`` over a kernel that writes
    through the data pointer returns native's result, and a tensor it was not given
    to write (the weight, and memory no donated view covers) keeps its values."""
    op = weighted_op
    rng = random.Random(seed)
    # the second buffer's memory is a numpy array's: views of it through new
    # storage objects (``torch.from_numpy`` of numpy views) overlap its own
    array = np.random.default_rng(seed).standard_normal((6, 16)).astype(np.float32)
    buffers = [torch.randn(6, 16), torch.from_numpy(array)]

    def view() -> torch.Tensor:
        buf = rng.choice(buffers)
        kind = rng.choice(("fresh", "rows", "cols", "expand", "whole", "numpy"))
        if kind == "fresh":
            return torch.randn(4, 8)
        if kind == "numpy":
            start = rng.randint(0, 2)
            col = rng.choice((0, 4, 8))
            return torch.from_numpy(array[start : start + 4, col : col + 8])
        if kind == "rows":
            start = rng.randint(0, 2)
            return buf[start : start + 4, 8 * rng.randint(0, 1) :][:, :8]
        if kind == "cols":
            start = rng.choice((0, 4, 8))
            return buf[:4, start : start + 8]
        if kind == "expand":
            return buf[rng.randint(0, 5), :8].expand(4, 8)
        return buf[:4, :8]

    donated = 0
    with op.set_priority(["raw_kernel"]):
        for _ in range(300):
            for b in buffers:  # fresh values: donated writes compound otherwise
                b.normal_()
            x, other = view(), view()
            w = rng.choice((None, torch.randn(8), view()[0]))
            before = [b.clone() for b in buffers]
            w_before = None if w is None else w.clone()
            want = op.native(x.clone(), other.clone(), w)
            out, total = op.maybe_inplace(x, other, w)
            torch.testing.assert_close(out, want[0], atol=0, rtol=0)
            torch.testing.assert_close(total, want[1], atol=0, rtol=0)
            if w is not None:
                assert w_before is not None
                assert torch.equal(w, w_before)
            if out.data_ptr() != x.data_ptr():
                # ran on copies: no buffer changed
                assert all(torch.equal(b, c) for b, c in zip(buffers, before, strict=True))
            else:
                donated += 1
    assert donated > 30  # donation happened, not only copies


@pytest.mark.parametrize("seed", range(4))
def test_apart_proves_only_what_holds(seed: int) -> None:
    """Random views (sizes, strides, offsets, dtypes) of one buffer, through one
    storage object or a new one each (``torch.frombuffer``): every pair
    ``apart`` calls apart has no byte in common, counted byte by byte."""
    rng = random.Random(seed)
    raw = bytearray(160)
    shared = torch.frombuffer(raw, dtype=torch.uint8)
    dtypes = (torch.uint8, torch.int16, torch.float32, torch.float64)

    def view() -> tuple[torch.Tensor, set[int]]:
        dtype = rng.choice(dtypes)
        item = torch.empty((), dtype=dtype).element_size()
        elements = len(raw) // item
        while True:
            size = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
            stride = [rng.randint(0, 12) for _ in size]
            offset = rng.randint(0, elements - 1)
            if offset + sum(st * (sz - 1) for st, sz in zip(stride, size, strict=True)) < elements:
                break
        memory = shared if rng.random() < 0.5 else torch.frombuffer(raw, dtype=torch.uint8)
        t = memory.view(dtype).as_strided(size, stride, offset)
        index = torch.arange(elements).as_strided(size, stride, offset)
        return t, {e * item + i for e in index.flatten().tolist() for i in range(item)}

    proven = 0
    for _ in range(3000):
        (a, bytes_a), (b, bytes_b) = view(), view()
        if apart(a, b):
            proven += 1
            assert not bytes_a & bytes_b, (a.shape, a.stride(), a.storage_offset(), b.dtype)
    assert proven > 500  # the check proves a share of them, not none


def test_donating_a_tensor_autograd_saved_fails_its_backward(weighted_op: ir.IrOp) -> None:
    a = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(4, 8)
    loss = (a * b).sum()  # saves b for a's gradient; b itself needs no grad
    with weighted_op.set_priority(["raw_kernel"]):
        weighted_op.maybe_inplace(b, torch.randn(4, 8), torch.ones(8))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _kernel_with_workspace() -> tuple[Callable[..., object], weakref.ref[torch.Tensor]]:
    workspace = torch.empty(1024)  # what a real kernel closes over (GPU memory)

    def impl(x: torch.Tensor, x_other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        workspace.zero_()
        x_other.add_(x)
        torch.mul(x_other, 2, out=x)
        return x, x_other

    return impl, weakref.ref(workspace)


def _register_call_unregister(op: ir.IrOp, overload: str) -> weakref.ref[torch.Tensor]:
    # in a function of its own: registration reads its caller's locals (to
    # resolve string annotations), and that snapshot lives as long as the frame
    impl, ref = _kernel_with_workspace()
    op.register_impl("leaky", inplace=True)(impl)
    call = op if overload == "default" else op.maybe_inplace
    with op.set_priority(["leaky"]):
        call(torch.randn(4), torch.randn(4))
    op.unregister_impl("leaky")
    return ref


@pytest.mark.parametrize("overload", ["default", "maybe_inplace"])
def test_unregistered_inplace_impls_are_freed(
    make_op: Callable[..., ir.IrOp], overload: str
) -> None:
    op = make_op(conftest.add_then_double, allow_inplace=True)
    refs = [_register_call_unregister(op, overload) for _ in range(3)]
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
