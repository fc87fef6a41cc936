"""Tracers see one vllm_ir node per call; eager calls never leak into graphs."""

from __future__ import annotations

import torch
import vllm_ir as ir
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir.testing import TinyDecoder


def _ir_targets(graph: torch.fx.Graph) -> list[str]:
    return [
        str(n.target)
        for n in graph.nodes
        if n.op == "call_function" and str(n.target).startswith("vllm_ir.")
    ]


EXPECTED = ["vllm_ir.rms_norm.default"] + ["vllm_ir.fused_add_rms_norm.maybe_inplace"] * 3


def test_make_fx_one_node_per_call() -> None:
    model = TinyDecoder().eval()
    with torch.no_grad():
        gm = make_fx(model)(torch.randn(2, 32))
    assert _ir_targets(gm.graph) == EXPECTED


def test_make_fx_fake_mode_with_grad() -> None:
    def f(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = ir.ops.rms_norm(x, w, 1e-6)
        return ir.ops.fused_add_rms_norm.maybe_inplace(h, r, w, 1e-6)[0]

    x, r = torch.randn(2, 32), torch.randn(2, 32)
    gm = make_fx(f, tracing_mode="fake")(x, r, torch.ones(32))
    assert _ir_targets(gm.graph) == EXPECTED[:2]
    # when autograd needs the donated values, maybe_inplace degrades to default
    gm = make_fx(f, tracing_mode="fake")(x, r, torch.ones(32, requires_grad=True))
    assert _ir_targets(gm.graph) == [
        "vllm_ir.rms_norm.default",
        "vllm_ir.fused_add_rms_norm.default",
    ]


def test_symbolic_trace_one_node_per_call() -> None:
    gm = torch.fx.symbolic_trace(TinyDecoder())
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("vllm_ir.")] == EXPECTED


def test_dynamo_keeps_ir_ops_opaque() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm.forward

    model = TinyDecoder().eval()
    x = torch.randn(2, 32)
    with torch.no_grad():
        eager = model(x.clone())
        compiled = torch.compile(model, backend=backend, fullgraph=True)(x.clone())
    assert len(graphs) == 1
    assert _ir_targets(graphs[0].graph) == EXPECTED
    torch.testing.assert_close(compiled, eager)


def test_eager_matches_traced_graph() -> None:
    model = TinyDecoder().eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        gm = make_fx(model)(x.clone())
        torch.testing.assert_close(gm(x.clone()), model(x.clone()))


def test_dynamo_traces_an_op_never_called_eagerly(make_op) -> None:  # type: ignore[no-untyped-def]
    def fresh(x: torch.Tensor, x_other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + x_other, x_other

    op = make_op(fresh, allow_inplace=True)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm.forward

    fn = torch.compile(
        lambda a, b: op.maybe_inplace(op(a, b)[0], b), backend=backend, fullgraph=True
    )
    fn(torch.ones(2), torch.ones(2))
    assert _ir_targets(graphs[0].graph) == [
        f"vllm_ir.{op.name}.default",
        f"vllm_ir.{op.name}.maybe_inplace",
    ]
