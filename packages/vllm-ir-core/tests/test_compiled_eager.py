"""Compiled impls in eager mode: ``op.set_priority([...], compile=True)``."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from torch._dynamo.testing import AotEagerAndRecordGraphs
from vllm_ir._selection import compiled_eager
from vllm_ir._selection.compiled_eager import CompiledCall
from vllm_ir.priority import compiled_selection


def scale_rows(x: Tensor, weight: Tensor, factor: float) -> Tensor:
    return (x * weight).mul(factor).add(1.0)


@pytest.fixture
def row_op(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    op = make_op(scale_rows)

    @op.register_impl("kernel")  # not compiled=True: never compiled
    def _kernel(x: Tensor, weight: Tensor, factor: float) -> Tensor:
        return (x * weight).mul(factor).add(1.0)

    return op


def _cached_fn(op: ir.IrOp, *args: Any) -> Any:
    return op._eager.calls[op.selector.fast_key(*args)]


def _refuse(*args: Any) -> Any:
    raise AssertionError("the compiled callable ran")


def test_native_runs_compiled_for_every_token_count_without_recompiling(row_op: ir.IrOp) -> None:
    w = torch.randn(32)
    with row_op.set_priority(["native"], compile=True):
        x = torch.randn(8, 32)
        torch.testing.assert_close(row_op(x, w, 0.5), row_op.native(x, w, 0.5))
        assert isinstance(_cached_fn(row_op, x, w, 0.5), CompiledCall)
        with torch.compiler.set_stance("fail_on_recompile"):
            for n in (1, 0, 3, 257):
                xx = torch.randn(n, 32)
                torch.testing.assert_close(row_op(xx, w, 0.5), row_op.native(xx, w, 0.5))
            xs = torch.randn(2, 5, 32)  # 3-D: another argument class, its own compile
        torch.testing.assert_close(row_op(xs, w, 0.5), row_op.native(xs, w, 0.5))
    # outside the scope: the plain function again, from a fresh cache
    with row_op.set_priority(["native"]):
        assert _cached_fn_after_call(row_op, x, w, 0.5) is row_op.native


def _cached_fn_after_call(op: ir.IrOp, *args: Any) -> Any:
    op(*args)
    return _cached_fn(op, *args)


def test_impls_not_marked_compiled_and_odd_layouts_run_plain(row_op: ir.IrOp) -> None:
    w = torch.randn(16)
    x = torch.randn(4, 16)
    with row_op.set_priority(["kernel"], compile=True):
        assert _cached_fn_after_call(row_op, x, w, 2.0) is row_op.impls["kernel"].impl_fn
    with row_op.set_priority(["native"], compile=True):
        t = torch.randn(16, 4).t()  # not contiguous: no compile for it
        torch.testing.assert_close(row_op(t, w, 2.0), row_op.native(t, w, 2.0))
        assert _cached_fn(row_op, t, w, 2.0) is row_op.native


def test_compiled_call_runs_plain_where_compile_is_not_in_force(row_op: ir.IrOp) -> None:
    impl = row_op.impls["native"]
    call = CompiledCall(row_op.name, impl)
    call.compiled = _refuse  # what must not run
    call.warmed = True
    x, w = torch.randn(3, 8), torch.randn(8)
    expected = row_op.native(x, w, 3.0)
    # another context with the same cache entry, but no request
    torch.testing.assert_close(call(x, w, 3.0), expected)
    with row_op.set_priority(["native"], compile=True):
        with compiled_selection():  # the lowering pass's selection: never compiled
            torch.testing.assert_close(call(x, w, 3.0), expected)
        ran: list[tuple[Any, ...]] = []
        call.compiled = lambda *a: ran.append(a) or expected  # in force: compiled
        call(x, w, 3.0)
        assert len(ran) == 1


def test_an_outer_compile_records_the_op_not_the_compiled_callable(row_op: ir.IrOp) -> None:
    def f(x: Tensor, w: Tensor) -> Tensor:
        return row_op(x, w, 2.0) - 1

    backend = AotEagerAndRecordGraphs()
    x, w = torch.randn(4, 8), torch.randn(8)
    with row_op.set_priority(["native"], compile=True):
        out = torch.compile(f, backend=backend, fullgraph=True)(x, w)
    torch.testing.assert_close(out, f(x, w))
    targets = {str(n.target) for n in backend.fw_graphs[0].graph.nodes}
    assert f"{ir.NAMESPACE}.{row_op.name}.default" in targets
    torch._dynamo.reset()


def test_flags_are_checked(row_op: ir.IrOp, inplace_op: ir.IrOp) -> None:
    with (
        pytest.raises(TypeError, match="compile must be a bool"),
        row_op.set_priority(["native"], compile="yes"),  # type: ignore[arg-type]
    ):
        pass
    with pytest.raises(ValueError, match="compiled=True needs a functional impl"):
        inplace_op.register_impl("x_compiled", inplace=True, compiled=True)
    with pytest.raises(TypeError, match="compiled must be a bool"):
        row_op.register_impl("y_compiled", compiled=1)  # type: ignore[arg-type]
    assert row_op.impls["native"].compiled
    assert not row_op.impls["kernel"].compiled


def test_the_request_is_scoped_and_restored(row_op: ir.IrOp) -> None:
    assert not compiled_eager.compile_requested(row_op.name)

    def fails_inside() -> None:
        with row_op.set_priority(["native"], compile=True):
            assert compiled_eager.compile_requested(row_op.name)
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fails_inside()
    assert not compiled_eager.compile_requested(row_op.name)


def test_a_generator_scope_closed_elsewhere_ends_the_request(row_op: ir.IrOp) -> None:
    """A compile scope held across a generator's yield, finalized by another thread
    or closed out of order, ends its request in the caller's context too."""

    def stream() -> Iterator[None]:
        with row_op.set_priority(["native"], compile=True):
            yield

    def closed_by_a_thread() -> bool:
        g = stream()
        next(g)
        thread = threading.Thread(target=g.close)
        thread.start()
        thread.join()
        return compiled_eager.compile_requested(row_op.name)

    def closed_out_of_order() -> bool:
        a, b = stream(), stream()
        next(a)
        next(b)
        a.close()
        b.close()
        return compiled_eager.compile_requested(row_op.name)

    for case in (closed_by_a_thread, closed_out_of_order):
        # a context of its own: a leaked request must not reach the other tests
        assert not contextvars.Context().run(case), case.__name__
    assert not compiled_eager.compile_requested(row_op.name)


def test_make_fx_in_a_compile_scope_traces_the_plain_impl(row_op: ir.IrOp) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    impl = row_op.impls["native"]
    call = CompiledCall(row_op.name, impl)
    call.compiled = _refuse
    call.warmed = True
    x, w = torch.randn(3, 8), torch.randn(8)
    with row_op.set_priority(["native"], compile=True):
        gm = make_fx(lambda a, b: call(a, b, 2.0))(x, w)  # under a dispatch mode: plain
    torch.testing.assert_close(gm(x, w), row_op.native(x, w, 2.0))


def add_rows(x: Tensor, y: Tensor) -> Tensor:
    return x + y * 2


def test_an_invalid_call_gets_the_plain_impls_own_error(make_op: Callable[..., ir.IrOp]) -> None:
    op = make_op(add_rows)
    x5, y5, x7 = torch.randn(5, 8), torch.randn(5, 8), torch.randn(7, 8)
    native_error = r"^The size of tensor a \(7\) must match the size of tensor b \(5\)"
    with op.set_priority(["native"], compile=True):
        for _ in range(2):  # on the first call (not compiled yet), then on a warmed one
            with pytest.raises(RuntimeError, match=native_error) as info:
                op(x7, y5)  # not Dynamo's fake-tensor error, nor one chained to it
            assert info.value.__context__ is None
            torch.testing.assert_close(op(x5, y5), add_rows(x5, y5))
        call = _cached_fn(op, x5, y5)
        assert isinstance(call, CompiledCall)
        assert call.warmed
        assert not call.failed  # the caller's error: still compiled
    torch._dynamo.reset()


def test_a_warmed_call_whose_recompile_fails_runs_plain(
    make_op: Callable[..., ir.IrOp], caplog: pytest.LogCaptureFixture
) -> None:
    op = make_op(add_rows)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with op.set_priority(["native"], compile=True), torch._dynamo.config.patch(recompile_limit=1):
        op(x, y)
        call = _cached_fn(op, x, y)
        assert call.warmed
        # Dynamo guards on grad mode: a recompile, over the limit (FailOnRecompileLimitHit)
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                torch.testing.assert_close(op(x, y), add_rows(x, y))
        assert call.failed  # the compile's fault: the class runs plain from now on
        torch.testing.assert_close(op(x, y), add_rows(x, y))
    assert sum("could not be compiled" in r.getMessage() for r in caplog.records) == 1
    torch._dynamo.reset()
