"""Trace-through mode (``ir.enable_torch_wrap(False)``): no torch.ops wrapper off the fast path."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir._base import torch_wrap


def _ir_nodes(gm: torch.fx.GraphModule) -> list[str]:
    return [
        str(n.target)
        for n in gm.graph.nodes
        if n.op == "call_function" and str(n.target).startswith(f"{ir.NAMESPACE}.")
    ]


def _targets(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def _negating_impl(x: Tensor, factor: float) -> Tensor:
    # two negations: its own mark in a traced graph, the native result
    return torch.neg(torch.neg(x * factor))


@pytest.fixture
def marked_op(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    def scale(x: Tensor, factor: float) -> Tensor:
        return x * factor

    op = make_op(scale)
    op.register_impl("negating")(_negating_impl)
    return op


@pytest.fixture(autouse=True)
def _wrap_restored() -> object:
    yield
    torch_wrap._set(True)
    torch._dynamo.reset()


def test_enable_torch_wrap_is_a_call_and_a_context_manager() -> None:
    assert ir.torch_wrap_enabled()

    def fails_inside() -> None:
        with ir.enable_torch_wrap(False):
            assert not ir.torch_wrap_enabled()
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fails_inside()
    assert ir.torch_wrap_enabled()  # restored on the exception
    ir.enable_torch_wrap(False)  # a plain call: process-wide, kept
    assert not ir.torch_wrap_enabled()
    ir.enable_torch_wrap(True)
    assert ir.torch_wrap_enabled()
    with pytest.raises(TypeError, match="enable_torch_wrap takes True"):
        ir.enable_torch_wrap(0)  # type: ignore[arg-type]


def test_aot_eager_traces_the_selected_impl_and_guards_on_the_mode(marked_op: ir.IrOp) -> None:
    def f(x: Tensor) -> Tensor:
        return marked_op(x, 3.0) + 1

    x = torch.randn(8, 16)
    with marked_op.set_priority(["negating"]):
        expected = f(x)
        backend = AotEagerAndRecordGraphs()
        counter = CompileCounterWithBackend(backend)
        compiled = torch.compile(f, backend=counter, dynamic=True, fullgraph=True)
        torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
        assert _ir_nodes(backend.fw_graphs[-1]), "the wrapped mode records the IR node"
        with ir.enable_torch_wrap(False):
            torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
            other = torch.randn(5, 16)  # dynamic: no retrace for a new size
            torch.testing.assert_close(compiled(other), f(other), rtol=0, atol=0)
    assert counter.frame_count == 2, "Dynamo guards on the setting: one trace per mode"
    traced = backend.fw_graphs[-1]
    assert _ir_nodes(traced) == []
    assert "aten.neg.default" in _targets(traced), "the selected impl is what was traced"


def test_make_fx_records_the_selected_impl(marked_op: ir.IrOp) -> None:
    x = torch.randn(4, 8)
    with marked_op.set_priority(["negating"]), ir.enable_torch_wrap(False):
        gm = make_fx(lambda t: marked_op(t, 2.0))(x)
        torch.testing.assert_close(gm(x), x * 2.0)
    assert _ir_nodes(gm) == []
    assert "aten.neg.default" in _targets(gm)


def test_inplace_impl_runs_on_copies_when_traced(inplace_op: ir.IrOp) -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    expected = inplace_op.native(x, y)
    with inplace_op.set_priority(["writes_inputs"]), ir.enable_torch_wrap(False):
        x0, y0 = x.clone(), y.clone()
        gm = make_fx(lambda a, b: inplace_op(a, b))(x, y)
        out = gm(x, y)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close((x, y), (x0, y0))  # the default overload wrote nothing


def test_calls_needing_gradients_keep_the_autograd_wrapper(marked_op: ir.IrOp) -> None:
    x = torch.randn(4, 8, requires_grad=True)
    with marked_op.set_priority(["negating"]), ir.enable_torch_wrap(False):
        y = marked_op(x, 3.0)
    assert y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_fast_path_is_unchanged(marked_op: ir.IrOp) -> None:
    x = torch.randn(4, 8)
    with marked_op.set_priority(["negating"]), ir.enable_torch_wrap(False):
        # the dispatch check (conftest) re-validates every cached call against select()
        assert marked_op.selected_impl(x, 2.0).provider == "negating"
        torch.testing.assert_close(marked_op(x, 2.0), x * 2.0)


def test_inductor_compiles_without_vllm_ir_passes() -> None:
    """One Inductor compile: rms_norm traced through, equal to eager."""
    x, w = torch.randn(6, 32), torch.randn(32)
    r = torch.randn(6, 32)

    def f(x: Tensor, r: Tensor) -> Tensor:
        y = ir.ops.rms_norm(x, w, 1e-6)
        a, b = ir.ops.fused_add_rms_norm(y, r, w, 1e-6)
        return a + b

    expected = f(x, r)
    with ir.enable_torch_wrap(False):
        compiled = torch.compile(f, backend="inductor", fullgraph=True)
        torch.testing.assert_close(compiled(x, r), expected)


def test_env_var_turns_it_off_at_import() -> None:
    code = "import vllm_ir as ir; print(ir.torch_wrap_enabled())"
    env = {**os.environ, "VLLM_IR_TORCH_WRAP": "off"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
