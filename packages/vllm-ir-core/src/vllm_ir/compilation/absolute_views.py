"""Post-grad: make Inductor address storage the way eager does.

Two rewrites, both exact, so they run on every graph.

**Absolute views.**
``as_strided(x, size, stride, offset)`` addresses ``x``'s *storage*: the offset
is absolute, and the geometry of ``x`` itself (a slice, a transpose) plays no
part. Inductor (torch 2.13) gets this wrong when ``x`` is a view of a buffer it
computes: ``(a * 2 + 1)[1:3].as_strided((2, 3), (3, 1), 3)`` reads rows 2..3
instead of 1..2 (with static shapes and with dynamic ones), in plain
``torch.compile`` too. Such views come from programs and, more often, from
impls the lowering inlines (``x.as_strided(x.size(), x.stride(),
x.storage_offset())`` to address a tensor's memory directly).

Since the view chain between the root and ``x`` cannot change which storage an
``as_strided`` reads, the pass rewires its input to the root, which Inductor
lowers correctly. An ``as_strided`` without an explicit offset (which takes
``x``'s own) is rebased only when that offset is a known integer, and never
across a view that reinterprets the dtype (``x.view(torch.int32)``), which
changes the unit offsets count in.

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(a):
    ...     return (a + 1)[1:3].as_strided((2, 3), (3, 1), 3)
    >>> gm = make_fx(f)(torch.zeros(4, 3))
    >>> rebase_absolute_views(gm.graph)
    1
    >>> _ = gm.recompile()
    >>> torch.equal(gm(torch.arange(12.0).reshape(4, 3)), f(torch.arange(12.0).reshape(4, 3)))
    True
    >>> [n.args[0].name for n in gm.graph.nodes if n.name == "as_strided"]
    ['add']

**Storage offsets read as values.** An impl traced with dynamic shapes that
reads ``x.storage_offset()`` leaves ``aten.sym_storage_offset(x)`` in the graph
(Dynamo and AOTAutograd never do: they pass the offset's symbol as an input).
Inductor (torch 2.13) has no lowering for it and reads 0, so
``x.as_strided(x.size(), x.stride(), x.storage_offset())`` of a row-slice input
addresses the slice's base. The pass replaces each such node by the offset
itself: an integer, or the graph's symbols (symbol inputs, sizes and strides of
tensor inputs) combined with ``+`` and ``*``.
An offset it cannot express that way is an error, never a silent 0.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
from torch import fx

from vllm_ir.compilation.context import get_pass_context
from vllm_ir.compilation.pass_base import VllmIRPass

__all__ = ["AbsoluteViewPass", "rebase_absolute_views", "resolve_storage_offsets"]

_AS_STRIDED = torch.ops.aten.as_strided.default
_STORAGE_OFFSET = torch.ops.aten.sym_storage_offset.default


class AbsoluteViewPass(VllmIRPass):
    name = "absolute_views"

    def run(self, graph: fx.Graph) -> None:
        get_pass_context().views_rebased += rebase_absolute_views(graph)
        resolve_storage_offsets(graph)


def rebase_absolute_views(graph: fx.Graph) -> int:
    """Rewire each ``aten.as_strided`` of a view to the view chain's root; the count."""
    rebased = 0
    for node in graph.find_nodes(op="call_function", target=_AS_STRIDED):
        source = node.args[0]
        if len(node.args) < 3 or not _is_view(source):
            continue
        root = source
        while _is_view(root) and _same_dtype(root, root.args[0]):
            root = root.args[0]  # type: ignore[assignment]
        if root is source:
            continue
        size, stride = node.args[1], node.args[2]
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        if offset is None:
            offset = _static_offset(source)
            if offset is None:
                continue
        node.args, node.kwargs = (root, size, stride, offset), {}
        rebased += 1
    return rebased


def _is_view(node: object) -> bool:
    """An ATen op whose output aliases its first argument (its schema says so)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or not node.args:
        return False
    schema = target._schema
    if not schema.arguments or len(schema.returns) != 1:
        return False
    arg, ret = schema.arguments[0].alias_info, schema.returns[0].alias_info
    if arg is None or ret is None or arg.is_write or ret.is_write:
        return False
    return bool(set(arg.before_set) & set(ret.after_set)) and isinstance(node.args[0], fx.Node)


def _same_dtype(a: Any, b: Any) -> bool:
    """Offsets count elements: a view that reinterprets the dtype changes their unit."""
    va, vb = a.meta.get("val"), b.meta.get("val")
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.dtype == vb.dtype


def _static_offset(node: fx.Node) -> int | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    offset = val.storage_offset()
    return offset if isinstance(offset, int) else None


def resolve_storage_offsets(graph: fx.Graph) -> int:
    """Replace each ``aten.sym_storage_offset`` node by the offset's value; the count."""
    nodes = list(graph.find_nodes(op="call_function", target=_STORAGE_OFFSET))
    if not nodes:  # the common case: no impl read an offset under dynamic shapes
        return 0
    symbols = _Symbols(graph)
    for node in nodes:
        tensor = node.args[0]
        val = tensor.meta.get("val") if isinstance(tensor, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            raise RuntimeError(f"{node.format_node()}: its tensor has no FakeTensor in meta")
        offset = val.storage_offset()
        with graph.inserting_before(node):
            value = _build(graph, sympy.sympify(offset), symbols)
        if value is None:
            raise RuntimeError(
                f"{node.format_node()}: the storage offset {offset} is not an integer nor "
                "a sum of products of the graph's input sizes and symbols, and Inductor "
                "(torch 2.13) would read 0; compile with static shapes, or do not read "
                "storage_offset() in the impl"
            )
        node.replace_all_uses_with(value)  # type: ignore[arg-type]
        graph.erase_node(node)
    return len(nodes)


class _Symbols:
    """Nodes giving a shape symbol's value: a symbol input, else a size or stride
    of a tensor input (``aten.sym_size`` / ``aten.sym_stride``, which Inductor
    lowers from their FakeTensor values)."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.found: dict[Any, fx.Node] = {}
        self.tensors: list[fx.Node] = []
        for p in graph.find_nodes(op="placeholder"):
            val = p.meta.get("val")
            if isinstance(val, torch.SymInt):
                self.found.setdefault(val.node.expr, p)
            elif isinstance(val, torch.Tensor):
                self.tensors.append(p)

    def get(self, symbol: Any) -> fx.Node | None:
        if symbol in self.found:
            return self.found[symbol]
        for p in self.tensors:
            val = p.meta["val"]
            for target, dims in (
                (torch.ops.aten.sym_size.int, val.shape),
                (torch.ops.aten.sym_stride.int, val.stride()),
            ):
                for d, n in enumerate(dims):
                    if isinstance(n, torch.SymInt) and n.node.expr == symbol:
                        node = self.graph.call_function(target, (p, d))
                        node.meta["val"] = n
                        self.found[symbol] = node
                        return node
        return None


def _build(graph: fx.Graph, expr: Any, symbols: _Symbols) -> fx.Node | int | None:
    """``expr`` as an int or FX nodes over the graph's symbols; None if it cannot."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return symbols.get(expr)
    combine = {sympy.Add: operator.add, sympy.Mul: operator.mul}.get(type(expr))
    if combine is None:
        return None
    parts = [_build(graph, a, symbols) for a in expr.args]
    if any(p is None for p in parts):
        return None
    result = parts[0]
    for part in parts[1:]:
        node = graph.call_function(combine, (result, part))
        node.meta["val"] = combine(*(_meta(v) for v in (result, part)))
        result = node
    return result


def _meta(value: fx.Node | int | None) -> Any:
    return value.meta["val"] if isinstance(value, fx.Node) else value
