"""Runtime branches over size buckets in a compiled graph.

With a dynamic token count whose known range spans several buckets of an
op's priority table, no one impl serves every size the graph runs at. The
lowering then emits ``torch.cond`` on ``tokens <= bound``, nested one level
per bucket, each branch the traced impl of its bucket: one graph serves
every size without recompiling or adding a guard. Buckets outside the
symbol's value range (its ShapeEnv's) are pruned; neighbouring buckets
selecting the same impl are merged; one impl left means no branch.

A node whose sizes a branch cannot carry (:class:`BranchUnsupported`: an
unbacked size, outputs whose sizes differ between buckets, a size symbol no
input of the graph gives, a copy whose strides this torch's Inductor cannot
order) is not branched: the lowering leaves the IR op in
the graph, and it selects its impl at run time, as in eager mode.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from vllm_ir._op.op import IrOp
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir._selection.buckets import SizePlan, symbolic_range

__all__ = [
    "Branch",
    "BranchUnsupported",
    "branch_outputs_hazard",
    "branch_buckets",
    "bucket_branches",
    "describe_branches",
    "emit_cond",
    "emit_product",
    "emit_size",
    "plain_strides",
    "require_orderable_strides",
    "ranges_text",
    "size_symbol_operands",
]

Branch = tuple[int | None, IrOpImpl]
"""``(max_tokens, impl)``: the impl of calls up to ``max_tokens`` tokens (None: the rest)."""


class BranchUnsupported(RuntimeError):
    """A node's sizes cannot go through ``torch.cond`` branches as Inductor
    compiles them; the lowering selects that node's impl at run time instead."""


@functools.cache
def _orders_strides_without_shape_env() -> bool:
    """Whether this torch's Inductor lowers ``force_stride_order`` by sorting the
    strides as bare sympy expressions (torch 2.11), which raises where sympy cannot
    decide an order; later versions sort them with the shape environment's help."""
    from torch._inductor import lowering

    fn = getattr(lowering.inductor_force_stride_order, "__wrapped__", None)
    return fn is None or "shape_env" not in fn.__code__.co_names


def require_orderable_strides(val: torch.Tensor) -> None:
    """Raise :class:`BranchUnsupported` where Inductor could not lower forcing
    ``val``'s strides: on torch 2.11 a stride such as ``hidden // heads``, which may
    be 0 for all sympy knows, cannot be compared with 1."""
    if not _orders_strides_without_shape_env():
        return
    from torch._inductor.ir import get_stride_order

    strides = [s.node.expr if isinstance(s, torch.SymInt) else s for s in val.stride()]
    try:
        get_stride_order(strides)
    except TypeError as e:
        raise BranchUnsupported(
            f"this torch's Inductor cannot order the strides {tuple(strides)} of a "
            f"contiguous copy ({e})"
        ) from None


def bucket_branches(
    plan: SizePlan, tokens: Any, choose: Callable[[int, int, int], IrOpImpl]
) -> list[Branch]:
    """The impl of every bucket of ``plan`` a symbolic token count can fall into,
    neighbouring buckets with one impl merged into one branch.

    ``choose(i, low, high)`` picks bucket ``i``'s impl, given the symbol's
    value range ``[low, high]`` (the lowering selects at the bucket's smallest
    reachable count; the autotuner measures at its largest).
    """
    low, high = symbolic_range(tokens)
    reached = plan.indices(low, high)
    branches: list[Branch] = []
    for i in reached:
        impl = choose(i, low, high)
        bound = plan.upper(i) if i < reached[-1] else None
        if branches and branches[-1][1] is impl:
            branches[-1] = (bound, impl)  # same impl as the bucket below: one branch
        else:
            branches.append((bound, impl))
    return branches


def describe_branches(branches: Sequence[Branch]) -> str:
    """``<=64:cpu_c;native``: what a branched node runs, in the CLI spelling."""
    return ranges_text([(bound, impl.provider) for bound, impl in branches])


def ranges_text(ranges: Sequence[tuple[int | None, str]]) -> str:
    """``<=64:cpu_c;native`` for ``(max_tokens, provider)`` per size range (None:
    the rest), neighbours running the same provider merged: a branched node, or a
    node of a graph compiled per size range."""
    merged: list[tuple[int | None, str]] = []
    for bound, provider in ranges:
        if merged and merged[-1][1] == provider:
            merged[-1] = (bound, provider)
        else:
            merged.append((bound, provider))
    return ";".join(("" if bound is None else f"<={bound}:") + p for bound, p in merged)


def branch_buckets(
    op: IrOp, args: Sequence[Any], branches: Sequence[Branch]
) -> list[tuple[str, int, IrOpImpl]]:
    """Per branch of a node: its bucket label (``<=16``; ``>256`` for the last),
    the smallest token count it runs at (its representative), and its impl.

    One branch (every bucket the count can reach selects alike) is labelled
    with its bucket of the op's table, or ``all sizes`` if it spans several.
    """
    low, high = symbolic_range(op.tokens(*args))
    cuts = SizePlan(tuple(bound for bound, _ in branches if bound is not None))
    return [
        (
            cuts.label(i) if cuts else op.size_plan().label_of_range(low, high),
            cuts.lowest(i, low),
            impl,
        )
        for i, (_, impl) in enumerate(branches)
    ]


def _free_symbols(values: Sequence[Any]) -> set[Any]:
    """The size symbols of ``values`` (tensors: sizes, strides, offsets; SymInts)."""
    found: set[Any] = set()
    for v in values:
        sizes = (*v.shape, *v.stride(), v.storage_offset()) if isinstance(v, torch.Tensor) else (v,)
        for size in sizes:
            if isinstance(size, torch.SymInt):
                found |= size.node.expr.free_symbols
    return found


def branch_outputs_hazard(
    operand_vals: Sequence[torch.Tensor],
    expected: Sequence[Any],
    modules: Sequence[fx.GraphModule],
) -> str | None:
    """Why ``torch.cond`` over ``modules`` cannot stand for a node with outputs
    ``expected`` and tensor operands ``operand_vals``, or None.

    ``torch.cond`` gives an output a fresh unbacked size wherever a size holds an
    unbacked symbol or the branches' sizes differ, and the lowering does not
    bind such a symbol to the node's own; an unbacked size in an operand has no
    graph input to pass it to a branch by.
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    def unbacked(values: Sequence[Any]) -> bool:
        return any(free_unbacked_symbols(s) for s in _free_symbols(values))

    if unbacked(operand_vals) or unbacked(expected):
        return "an unbacked (data-dependent) size"
    for gm in modules:
        outs = gm.graph.output_node().args[0]
        assert isinstance(outs, (tuple, list))  # a traced branch returns a tuple
        vals = [o.meta.get("val") if isinstance(o, fx.Node) else o for o in outs]
        if len(vals) != len(expected):
            return "a branch returns another number of outputs"
        for got, want in zip(vals, expected, strict=True):
            if not isinstance(want, torch.Tensor):
                continue
            if not isinstance(got, torch.Tensor) or got.dim() != want.dim():
                return "a branch's output differs from the op's"
            if not all(_same_expr(a, b) for a, b in zip(got.shape, want.shape, strict=True)):
                return (
                    f"a branch's output sizes {tuple(got.shape)} are not the op's "
                    f"{tuple(want.shape)} as expressions"
                )
    return None


def size_symbol_operands(graph: fx.Graph, vals: Sequence[torch.Tensor]) -> list[fx.Node]:
    """Nodes of ``graph`` (inserted at its insertion point where needed) giving
    each size symbol the tensors ``vals`` use, in their sizes, strides and offsets;
    :class:`BranchUnsupported` (nothing inserted) if no input gives one.

    A ``torch.cond`` branch is a graph of its own, and Inductor binds a symbol in
    it only from an input that is that symbol: a branch reading ``x[1:]`` (size
    ``s0 - 1``) needs ``s0`` passed in, as Dynamo passes a user ``cond`` the free
    symbols of its operands. Taken from a symbol input of the graph, else from a
    size or stride of a tensor input.
    """
    wanted = _free_symbols(vals)
    found: dict[Any, fx.Node | tuple[Any, fx.Node, int, torch.SymInt]] = {}
    placeholders = list(graph.find_nodes(op="placeholder"))
    for ph in placeholders:
        val = ph.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr in wanted:
            found.setdefault(val.node.expr, ph)
    for ph in placeholders:
        val = ph.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for getter, sizes in ((torch.ops.aten.sym_size.int, val.shape),
                              (torch.ops.aten.sym_stride.int, val.stride())):  # fmt: skip
            for dim, size in enumerate(sizes):
                if isinstance(size, torch.SymInt) and size.node.expr in wanted - found.keys():
                    found[size.node.expr] = (getter, ph, dim, size)
    missing = wanted - found.keys()
    if missing:
        # an unbacked size, or one only a product of inputs' sizes gives
        raise BranchUnsupported(
            f"a bucket branch needs the size symbols {sorted(map(str, missing))}, which no "
            "input of the graph gives"
        )
    nodes = []
    for sym in sorted(found, key=str):
        where = found[sym]
        if isinstance(where, tuple):  # inserted only now: nothing is left behind on a refusal
            getter, ph, dim, sym_size = where
            node = graph.call_function(getter, (ph, dim))
            node.meta["val"] = sym_size
            where = node
        nodes.append(where)
    return nodes


def plain_strides(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy whose strides are the plain products of its
    sizes: what ``torch.cond`` merges branch outputs by (it refuses a stride it
    cannot rebuild from the sizes, such as ``Max(1, s1)``, or a non-dense one)."""
    strides: list[Any] = []
    expected: Any = 1
    for size in reversed(t.shape):
        strides.append(expected)
        expected = expected * size
    strides.reverse()
    if all(_same_expr(a, b) for a, b in zip(t.stride(), strides, strict=True)):
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _same_expr(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    expr = lambda v: v.node.expr if isinstance(v, torch.SymInt) else v  # noqa: E731
    return bool(expr(a) == expr(b))


def _token_count(graph: fx.Graph, act: fx.Node, val: torch.Tensor, feature_dims: int) -> Any:
    """Nodes computing the token count of activation ``act`` (or an int if static):
    the product of its dims but the last ``feature_dims`` (``IrOp.tokens``)."""
    total: Any = 1
    for dim in range(val.dim() - feature_dims):
        factor = emit_size(graph, act, dim, val.shape[dim])
        total = factor if total == 1 else emit_product(graph, total, factor)
    return total


def emit_size(graph: fx.Graph, tensor: fx.Node, dim: int, size: Any) -> Any:
    """``size``, the ``shape[dim]`` of ``tensor``'s value: an int as it is, a
    symbolic size as a ``sym_size`` node of ``graph``."""
    if type(size) is int:
        return size
    node = graph.call_function(torch.ops.aten.sym_size.int, (tensor, dim))
    node.meta["val"] = size
    return node


def emit_product(graph: fx.Graph, a: Any, b: Any) -> Any:
    """``a * b`` for ints or size nodes: an int when both are, else a node of ``graph``."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    node = graph.call_function(operator.mul, (a, b))
    node.meta["val"] = _val(a) * _val(b)
    return node


def _val(x: Any) -> Any:
    return x.meta["val"] if isinstance(x, fx.Node) else x


def emit_cond(
    graph: fx.Graph,
    owner: torch.nn.Module,
    operands: Sequence[fx.Node],
    act_index: int,
    bound: int,
    then_gm: fx.GraphModule,
    else_gm: fx.GraphModule,
    fake_mode: Any,
    feature_dims: int = 1,
) -> list[fx.Node]:
    """Insert ``cond(tokens <= bound, then_gm, else_gm, operands)`` into ``graph``
    (at its insertion point); returns one node per output. Both branches take
    ``operands`` and return a tuple."""
    vals = [o.meta["val"] for o in operands]
    tokens = _token_count(graph, operands[act_index], vals[act_index], feature_dims)
    pred = graph.call_function(operator.le, (tokens, bound))
    pred.meta["val"] = _val(tokens) <= bound
    names = []
    for gm in (then_gm, else_gm):
        i = 0
        while hasattr(owner, f"_vllm_ir_bucket{i}"):
            i += 1
        owner.register_module(f"_vllm_ir_bucket{i}", gm)
        attr = graph.get_attr(f"_vllm_ir_bucket{i}")
        attr.meta["val"] = gm
        names.append(attr)
    cond = graph.call_function(
        torch.ops.higher_order.cond, (pred, names[0], names[1], tuple(operands))
    )
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        out = torch.ops.higher_order.cond(pred.meta["val"], then_gm, else_gm, tuple(vals))
    cond.meta["val"] = out
    items = []
    for k, v in enumerate(out):
        item = graph.call_function(operator.getitem, (cond, k))
        item.meta["val"] = v
        items.append(item)
    return items


def nested_cond_module(
    operand_vals: Sequence[torch.Tensor],
    act_index: int,
    bounds: Sequence[int],
    modules: Sequence[fx.GraphModule],
    fake_mode: Any,
    feature_dims: int = 1,
) -> fx.GraphModule:
    """A module of ``operands`` running ``modules[i]`` for calls of at most
    ``bounds[i]`` tokens and ``modules[-1]`` for the rest (one fewer bound)."""
    if not bounds:
        return modules[0]
    rest = nested_cond_module(
        operand_vals, act_index, bounds[1:], modules[1:], fake_mode, feature_dims
    )
    root = torch.nn.Module()
    graph = fx.Graph(owning_module=None)
    phs = []
    for k, v in enumerate(operand_vals):
        ph = graph.placeholder(f"arg{k}")
        ph.meta["val"] = v
        phs.append(ph)
    outs = emit_cond(
        graph, root, phs, act_index, bounds[0], modules[0], rest, fake_mode, feature_dims
    )
    graph.output(tuple(outs))
    return fx.GraphModule(root, graph)
