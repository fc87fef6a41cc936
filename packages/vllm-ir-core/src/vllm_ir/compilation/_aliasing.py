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

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["AliasGroups", "is_write", "meta_value", "tensor_values", "written_args"]


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
