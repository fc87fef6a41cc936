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
x.storage_offset())`` to address a tensor's memory directly). A view that
reinterprets the dtype of a graph input that does not start its storage (a row
slice) is left to Inductor, whose own dtype view may not start where the slice
does.

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

**Offsets on graph inputs (torch 2.11).** Inductor in torch 2.11 counts an
explicit ``as_strided`` offset on a graph input from the input's first element,
not from the start of its storage (:mod:`._inductor_compat`), so on a row-slice
input it reads rows further on. An inlined impl reading ``x.storage_offset()``
meets this on such an input, and on a copy of one once the copy is gone (fuzz
seed 1085, which plain ``torch.compile`` compiles right). On such a torch the
pass, last, subtracts the input's storage offset from each such offset, so the
graph means what that Inductor reads; an offset before the input's first
element, or one it cannot express, is an error.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._sympy import functions as _sympy_functions

from vllm_ir.compilation._context import get_pass_context
from vllm_ir.compilation._inductor_compat import as_strided_input_offsets_count_from_the_input
from vllm_ir.compilation._pass_base import VllmIRPass

__all__ = [
    "AS_STRIDED_INPUT_OFFSET_META",
    "AbsoluteViewPass",
    "AbsoluteViewRecordPass",
    "count_input_offsets_from_the_input",
    "rebase_absolute_views",
    "record_as_strided_offsets",
    "resolve_storage_offsets",
]

_AS_STRIDED = torch.ops.aten.as_strided.default
_STORAGE_OFFSET = torch.ops.aten.sym_storage_offset.default

AS_STRIDED_INPUT_OFFSET_META = "vllm_ir_as_strided_input_offset"
"""``meta`` key on an ``as_strided`` node: the storage offset of its input when the
graph still meant what eager means (before Inductor's no-op removal), a sympy
expression. See :func:`record_as_strided_offsets`."""


class AbsoluteViewRecordPass(VllmIRPass):
    """Joint-graph pre pass: records each ``as_strided``'s input offset (see module doc)."""

    name = "absolute_views_record"

    def run(self, graph: fx.Graph) -> None:
        record_as_strided_offsets(graph)


class AbsoluteViewPass(VllmIRPass):
    name = "absolute_views"

    def run(self, graph: fx.Graph) -> None:
        get_pass_context().views_rebased += rebase_absolute_views(graph)
        resolve_storage_offsets(graph)
        if as_strided_input_offsets_count_from_the_input():
            count_input_offsets_from_the_input(graph)  # last: eager reads it differently

    def cache_state(self) -> Any:
        return as_strided_input_offsets_count_from_the_input()


def record_as_strided_offsets(graph: fx.Graph) -> int:
    """Record, on each ``as_strided`` node, its input's storage offset now; the count.

    Run before Inductor's no-op removal, which may replace the input (a copy:
    ``x[1:3].clone()``, ``cat([x])``, ``x ** 1``) by what it copies, a tensor
    of the same sizes and strides at another storage offset. The recorded
    offset tells :func:`rebase_absolute_views` which memory the program meant.
    """
    recorded = 0
    for node in graph.find_nodes(op="call_function", target=_AS_STRIDED):
        val = _val(node.args[0])
        if val is not None and AS_STRIDED_INPUT_OFFSET_META not in node.meta:
            node.meta[AS_STRIDED_INPUT_OFFSET_META] = _expr(val.storage_offset())
            recorded += 1
    return recorded


def rebase_absolute_views(graph: fx.Graph) -> int:
    """Rewire each ``aten.as_strided`` to the storage root of its input; the count.

    The new offset is where the program's offset lands in the root's storage:
    ``offset - recorded + position``, with ``recorded`` the input's offset the
    program saw (:func:`record_as_strided_offsets`, else the input's own) and
    ``position`` where the input's data starts in the root's storage now,
    composed from each view's displacement relative to its input. A view's
    displacement depends only on its input's sizes and strides, which no-op
    removal keeps, so positions stay exact after it replaces a copy.

    An ``as_strided`` whose input cannot be placed (a view that reinterprets
    the dtype, a view kind without alias annotations, an offset that cannot be
    expressed) is left as it is: Inductor's own addressing, as in plain
    ``torch.compile``.
    """
    places: dict[fx.Node, tuple[fx.Node, Any] | None] = {}
    symbols = _Symbols(graph)
    rebased = 0
    for node in list(graph.find_nodes(op="call_function", target=_AS_STRIDED)):
        source = node.args[0]
        placed = _place(source, places) if isinstance(source, fx.Node) else None
        places[node] = None
        if placed is None or len(node.args) < 3:
            continue
        root, position = placed
        val = _val(source)
        assert val is not None
        seen = node.meta.get(AS_STRIDED_INPUT_OFFSET_META, _expr(val.storage_offset()))
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        if offset is None:  # the input's own offset, as the program saw it
            offset, delta = 0, position
        else:
            delta = sympy.expand(position - seen)
        base = _expr(_meta(offset))
        new = sympy.expand(base + delta) if base is not None else None
        if root is source and delta == 0:
            places[node] = (root, new) if new is not None else None
            continue
        with graph.inserting_before(node):
            shift = _build(graph, delta, symbols)
            if shift is None:
                continue
            value = _add(graph, offset, shift)
        node.args, node.kwargs = (root, node.args[1], node.args[2], value), {}
        places[node] = (root, new) if new is not None else None
        rebased += 1
    return rebased


def _place(node: fx.Node, places: dict[fx.Node, tuple[fx.Node, Any] | None]) -> Any:
    """``(root, position)``: the node's storage root and where its data starts in
    the root's storage (a sympy expression, in elements), or None if unknown."""
    if node in places:
        return places[node]
    val = _val(node)
    placed = None
    if val is None:
        pass
    elif node.op == "call_function" and node.target is _AS_STRIDED:
        return None  # placed when visited (rebase_absolute_views goes in graph order)
    elif (parent := _view_parent(node)) is not None:
        parent_val = _val(parent)
        up = _place(parent, places) if parent_val is not None else None
        if parent_val is not None and parent_val.dtype != val.dtype:
            # offsets count elements of the view's dtype: a reinterpreting view
            # is a root where it starts its storage, else its root is
            # reinterpreted too and the position converted to the view's unit
            if _expr(val.storage_offset()) == 0:
                placed = (node, sympy.Integer(0))
            elif up is not None:
                placed = _reinterpreted(node.graph, up, parent_val, val, places)
        elif up is not None and parent_val is not None:
            shift = _expr(val.storage_offset()) - _expr(parent_val.storage_offset())
            placed = (up[0], sympy.expand(up[1] + shift))
    elif not _is_view(node) and (node.op == "placeholder" or _expr(val.storage_offset()) == 0):
        # a graph input (Inductor takes its explicit offsets storage-relative),
        # or a buffer the graph computes, which starts its storage
        placed = (node, _expr(val.storage_offset()))
    places[node] = placed
    return placed


def _reinterpreted(
    graph: fx.Graph,
    up: tuple[fx.Node, Any],
    parent_val: torch.Tensor,
    val: torch.Tensor,
    places: dict[fx.Node, tuple[fx.Node, Any] | None],
) -> tuple[fx.Node, Any] | None:
    """``(root.view(val.dtype), position in val's elements)`` for a dtype view,
    or None when the root cannot be reinterpreted or the position is not whole."""
    root, position = up
    root_val = _val(root)
    if root_val is None or root_val.dim() == 0 or root_val.stride(-1) != 1:
        return None
    if _expr(root_val.storage_offset()) != 0:
        # a row slice of a graph input: Inductor may reinterpret it into a buffer of
        # its own, which starts at the slice, where offsets would count from there
        return None
    ratio = sympy.Rational(parent_val.element_size(), val.element_size())
    converted = sympy.expand(position * ratio)
    last = _expr(root_val.shape[-1] * root_val.element_size())
    if not converted.is_integer or last is None or (last % val.element_size()) != 0:
        return None
    key = (root, val.dtype)
    cached = places.get(key)  # type: ignore[call-overload]
    if cached is not None:
        return (cached[0], converted)
    with graph.inserting_after(root):
        new_root = graph.call_function(torch.ops.aten.view.dtype, (root, val.dtype))
    new_root.meta["val"] = root_val.view(val.dtype)
    places[key] = (new_root, sympy.Integer(0))  # type: ignore[index]
    places[new_root] = (new_root, sympy.Integer(0))
    return (new_root, converted)


def _view_parent(node: fx.Node) -> fx.Node | None:
    """The tensor ``node`` is a view of: an aliasing ATen op's input, or the input
    of ``split``/``chunk``/``unbind`` for one of their pieces (``getitem``)."""
    if _is_view(node):
        return node.args[0]  # type: ignore[return-value]
    if node.op == "call_function" and node.target is operator.getitem:
        pieces = node.args[0]
        if isinstance(pieces, fx.Node) and _is_view(pieces, pieces_of=True):
            return pieces.args[0]  # type: ignore[return-value]
    return None


def _is_view(node: object, *, pieces_of: bool = False) -> bool:
    """An ATen op whose output aliases its first argument (its schema says so);
    with ``pieces_of``, one returning a list of such views (``split``)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or not node.args:
        return False
    schema = target._schema
    if not schema.arguments or len(schema.returns) != 1:
        return False
    returns_list = isinstance(schema.returns[0].type, torch.ListType)
    if returns_list != pieces_of or not isinstance(node.args[0], fx.Node):
        return False
    arg, ret = schema.arguments[0].alias_info, schema.returns[0].alias_info
    if arg is None or ret is None or arg.is_write or ret.is_write:
        return False
    if pieces_of:
        # ``Tensor(a -> *) self -> Tensor(a)[]``: the list's elements alias self
        return bool(arg.before_set) and "*" in arg.after_set
    return bool(set(arg.before_set) & set(ret.after_set))


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _expr(value: Any) -> Any:
    """An int or SymInt as a sympy expression (None for anything else)."""
    if isinstance(value, torch.SymInt):
        return value.node.expr
    if isinstance(value, int):
        return sympy.Integer(value)
    return None


def _add(graph: fx.Graph, offset: Any, shift: fx.Node | int) -> Any:
    if isinstance(shift, int) and shift == 0:
        return offset
    if isinstance(offset, int) and offset == 0:
        return shift
    if isinstance(offset, int) and isinstance(shift, int):
        return offset + shift
    node = graph.call_function(operator.add, (offset, shift))
    node.meta["val"] = _meta(offset) + _meta(shift)
    return node


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


def count_input_offsets_from_the_input(graph: fx.Graph) -> int:
    """Make each explicit ``as_strided`` offset on a graph input count from the
    input's first element (what torch 2.11's Inductor reads); the count.

    Eager reads the rewritten graph differently: only for an Inductor that
    :func:`~._inductor_compat.as_strided_input_offsets_count_from_the_input`.
    """
    symbols: _Symbols | None = None
    rewritten = 0
    for node in list(graph.find_nodes(op="call_function", target=_AS_STRIDED)):
        source = node.args[0]
        if not isinstance(source, fx.Node) or source.op != "placeholder":
            continue
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        val = _val(source)
        if offset is None or val is None:
            continue  # no explicit offset: Inductor takes the input's own
        start = _expr(val.storage_offset())
        if start == 0:
            continue
        symbols = symbols or _Symbols(graph)
        with graph.inserting_before(node):
            shift = _build(graph, -start, symbols)
            value = _add(graph, offset, shift) if shift is not None else None
        if value is None or not statically_known_true(_meta(value) >= 0):
            raise RuntimeError(
                f"{node.format_node()}: the offset {offset} on graph input {source.name} "
                f"(storage offset {start}) is before the input's first element, or cannot "
                "be counted from it with the graph's symbols, as this torch's Inductor "
                "reads it (torch 2.11, pytorch/pytorch#175325); use torch 2.13 or later"
            )
        node.args, node.kwargs = (source, node.args[1], node.args[2], value), {}
        rewritten += 1
    return rewritten


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
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return symbols.get(expr)
    combine = _COMBINE.get(type(expr))
    if combine is None:
        return None
    parts = [_build(graph, a, symbols) for a in expr.args]
    if any(p is None for p in parts):
        return None
    if all(isinstance(p, int) for p in parts):
        return int(expr)
    result = parts[0]
    for part in parts[1:]:
        node = graph.call_function(combine, (result, part))
        node.meta["val"] = combine(*(_meta(v) for v in (result, part)))
        result = node
    return result


# The sympy forms shape arithmetic takes (torch.utils._sympy.functions: FloorDiv
# from ``//`` of sizes, e.g. ``chunk`` of a dynamic size; PythonMod / Mod from
# ``%``), and the Python operators that compute them on SymInts.
_COMBINE: dict[type, Any] = {
    sympy.Add: operator.add,
    sympy.Mul: operator.mul,
    _sympy_functions.FloorDiv: operator.floordiv,
    _sympy_functions.CleanDiv: operator.floordiv,
    _sympy_functions.PythonMod: operator.mod,
    _sympy_functions.Mod: operator.mod,
    _sympy_functions.Max: torch.sym_max,
    _sympy_functions.Min: torch.sym_min,
}


def _meta(value: fx.Node | int | None) -> Any:
    return value.meta["val"] if isinstance(value, fx.Node) else value
