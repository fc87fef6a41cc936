"""Which FX nodes share memory, read from the FakeTensors in their meta.

Views, ``as_strided``, aliasing ``reshape``, getitems of multi-output ops and
in-place ops that return their input all produce tensors whose FakeTensor
shares an untyped storage with the input's. Grouping nodes by storage is
therefore exact for every op that runs on FakeTensors, with no list of view
ops to keep up to date. Groups can be merged after a pass rewrites the graph
so that two storages become one (clone elimination does).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = [
    "AliasGroups",
    "is_write",
    "meta_value",
    "regions_overlap",
    "tensor_values",
    "written_args",
]


def tensor_values(value: object) -> Iterator[torch.Tensor]:
    """The tensors in a node's ``meta['val']`` (a tensor, or nested tuples/lists)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensor_values(v)


def meta_value(node: fx.Node) -> object:
    """A node's value: ``meta['val']`` (AOT graphs), else Dynamo's ``example_value``."""
    return node.meta.get("val", node.meta.get("example_value"))


# Targets known to write nothing although they carry no schema: FX's tuple
# access, and the functional wrappers AOTAutograd puts around mutating ops.
_SCHEMALESS_PURE: frozenset[object] = frozenset(
    {
        operator.getitem,
        torch.ops.higher_order.auto_functionalized,
        torch.ops.higher_order.auto_functionalized_v2,
    }
)


def written_args(node: fx.Node) -> list[fx.Node]:
    """The argument nodes ``node`` may write to.

    For an ``OpOverload`` the schema's alias annotations say. Anything else
    that takes tensors — a higher-order op such as
    ``triton_kernel_wrapper_mutation``, a Python function — has no schema to
    ask, so every tensor it receives counts as written: a pass that cannot
    prove a tensor unwritten must keep the clone that protects it.
    """
    if node.op != "call_function":
        return []
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return _schema_writes(node, target._schema)
    if target in _SCHEMALESS_PURE:
        return []
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), found.append)
    return [n for n in dict.fromkeys(found) if _may_hold_tensor(n)]


def _may_hold_tensor(node: fx.Node) -> bool:
    value = meta_value(node)
    return value is None or any(True for _ in tensor_values(value))


def _schema_writes(node: fx.Node, schema: torch.FunctionSchema) -> list[fx.Node]:
    written: list[fx.Node] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, fx.Node):
                written.append(v)
    return written


def is_write(node: fx.Node) -> bool:
    return bool(written_args(node))


class AliasGroups:
    """Union-find over the storages of a graph's tensor values."""

    def __init__(self, graph: fx.Graph) -> None:
        self._parent: dict[object, object] = {}
        self._storages: dict[fx.Node, list[object]] = {}
        self._members: dict[object, set[fx.Node]] = {}
        for node in graph.nodes:
            keys: list[object] = [
                StorageWeakRef(t.untyped_storage())
                for t in tensor_values(meta_value(node))
                if not _is_sparse(t)
            ]
            self._storages[node] = keys
            for key in keys:
                self._parent.setdefault(key, key)
                self._members.setdefault(key, set()).add(node)

    def _find(self, key: object) -> object:
        while self._parent[key] is not key:
            self._parent[key] = self._parent[self._parent[key]]
            key = self._parent[key]
        return key

    def groups(self, node: fx.Node) -> set[object]:
        """The storage groups ``node``'s value lives in (empty for non-tensors)."""
        return {self._find(k) for k in self._storages.get(node, ())}

    def aliases(self, node: fx.Node) -> set[fx.Node]:
        """The nodes that share memory with ``node``, itself included."""
        found = {node}
        for root in self.groups(node):
            found |= self._members[root]
        return found

    def merge(self, a: fx.Node, b: fx.Node) -> None:
        """Record that ``a`` and ``b`` now share memory."""
        keys = self._storages.get(a, []) + self._storages.get(b, [])
        roots = {self._find(k) for k in keys}
        if roots:
            first = roots.pop()
            for r in roots:
                self._parent[r] = first
                self._members[first] |= self._members.pop(r)


def _is_sparse(t: torch.Tensor) -> bool:
    return t.layout is not torch.strided


_Size = Any
"""A size, stride or offset: an ``int``, or a ``SymInt`` under symbolic shapes."""


def _known(condition: object) -> bool:
    """``condition`` holds for every value its symbols may take (never guards)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(condition))  # type: ignore[arg-type]


def regions_overlap(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether two tensors of one storage share a byte: ``False`` proven disjoint,
    ``True`` proven overlapping, ``None`` when their strides and (symbolic)
    sizes prove neither.

    Storage sharing says only that two views *may* touch; ``q, k, v =
    qkv.split(...)`` are three disjoint column blocks of one buffer. Disjoint
    when their byte spans are apart, or when, for a period ``P`` among their
    strides, every dimension either steps by multiples of ``P`` or stays inside
    one sub-range of ``[0, P)`` (a column block of rows ``P`` bytes wide), and
    the two sub-ranges are apart. Overlapping when one of them fills its span
    densely and the other's first or last element lies in that span. Answered
    with ``statically_known_true``: no guard is added.
    """
    if _is_sparse(a) or _is_sparse(b):
        return None
    if _known(a.numel() == 0) or _known(b.numel() == 0):
        return False
    spans: list[tuple[_Size, _Size]] = [_span(a), _span(b)]
    (start_a, end_a), (start_b, end_b) = spans
    if _known(end_a <= start_b) or _known(end_b <= start_a):
        return False
    periods: list[_Size] = [
        s * t.element_size()
        for t in (a, b)
        for n, s in zip(t.shape, t.stride(), strict=True)
        if not _known(n <= 1)
    ]
    for period in periods:
        if _known(period <= 0):
            continue
        blocks: list[tuple[_Size, _Size] | None] = [
            _block(t, start, period) for t, (start, _) in zip((a, b), spans, strict=True)
        ]
        if None in blocks:
            continue
        (lo_a, hi_a), (lo_b, hi_b) = blocks  # type: ignore[misc]
        if _known(hi_a <= lo_b) or _known(hi_b <= lo_a):
            return False
    Span = tuple[_Size, _Size]
    pairs: list[tuple[torch.Tensor, Span, torch.Tensor, Span]] = [
        (a, spans[0], b, spans[1]),
        (b, spans[1], a, spans[0]),
    ]
    for dense, (start, end), other, (first, last) in pairs:
        last = last - other.element_size()  # the last element's first byte
        if _fills_span(dense) and any(
            _known(start <= x) and _known(x < end) for x in (first, last)
        ):
            return True
    return None


def _span(t: torch.Tensor) -> tuple[_Size, _Size]:
    """Bytes ``[start, end)`` from ``t``'s first element to past its last (strides are >= 0)."""
    size = t.element_size()
    start: _Size = t.storage_offset() * size
    reach: _Size = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + (reach + 1) * size


def _block(t: torch.Tensor, start: _Size, period: _Size) -> tuple[_Size, _Size] | None:
    """The bytes ``[lo, hi)`` within ``[0, period)`` that ``t`` touches in every
    period, if each of its dimensions steps by a multiple of ``period`` or
    stays inside that range; else ``None``."""
    inner: _Size = 0
    for n, s in zip(t.shape, t.stride(), strict=True):
        step: _Size = s * t.element_size()
        if not _known(step % period == 0):
            inner = inner + (n - 1) * step
    # the offset within its period; ``start % period`` stays an opaque Mod for
    # symbolic sizes, so take ``start`` itself when it is inside the first period
    lo: _Size = start if _known(start < period) else start % period
    hi: _Size = lo + inner + t.element_size()
    return (lo, hi) if _known(hi <= period) else None


def _fills_span(t: torch.Tensor) -> bool:
    """Every byte of ``t``'s span belongs to one of its elements (a dense layout)."""
    dims = sorted(
        ((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if not _known(n == 1)),
        key=lambda d: _hint(d[0]),
    )
    expected: _Size = 1
    for stride, n in dims:
        if not _known(stride == expected):
            return False
        expected = stride * n
    return True


def _hint(value: object) -> int:
    """An ordering key for a stride: its value, or a symbolic one's hint (never a guard)."""
    if isinstance(value, int):
        return value
    hint = getattr(getattr(value, "node", None), "hint", None)
    return int(hint) if isinstance(hint, int) else 0
