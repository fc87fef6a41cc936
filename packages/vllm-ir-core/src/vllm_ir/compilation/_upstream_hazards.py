"""Programs that torch itself compiles wrongly, found before they are compiled.

AOTAutograd (torch 2.13) miscompiles a program that, with dynamic shapes,
takes an ``as_strided`` view of a graph input and mutates that input in place:
functionalization replays the view on the updated value, a new buffer that
starts at the input's first element, with the absolute offset meant for the
input's storage, so the view reads rows further on. Plain ``torch.compile``
does the same::

    def f(x):  # x = base[1:5], dynamic=True
        v = x.as_strided((2, x.shape[1]), x.stride(), x.storage_offset() + x.stride(0))
        x.add_(1)
        return v * 2  # compiled: rows 2..3 of x; eager: rows 1..2

The wrong offset is in the graph AOTAutograd hands Inductor, so no post-grad
pass can tell it from an intended one. ``VllmIRBackend`` checks the Dynamo
graph instead and runs a graph with this shape eagerly (a warning says so):
slower, never wrong.

    >>> import torch
    >>> from torch import fx
    >>> g = fx.Graph()
    >>> x = g.placeholder("x")
    >>> view = g.call_method("as_strided", (x, (2, 8), (8, 1), 8))
    >>> _ = g.call_method("add_", (x, 1))
    >>> _ = g.output(view)
    >>> print(as_strided_input_mutation(g, dynamic=True))
    as_strided view of graph input x, which the program also writes in place (add_)
    >>> print(as_strided_input_mutation(g, dynamic=False))
    None
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

from vllm_ir.compilation._aliasing import meta_value, tensor_values

__all__ = ["as_strided_input_mutation", "has_dynamic_inputs"]

_VIEW_METHODS = frozenset(
    {
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "as_strided",
        "t",
        "transpose",
        "permute",
        "expand",
        "expand_as",
        "narrow",
        "select",
        "unsqueeze",
        "squeeze",
        "flatten",
        "unflatten",
        "diagonal",
        "unfold",
        "movedim",
        "detach",
        "split",
        "chunk",
        "unbind",
        "__getitem__",
    }
)
_AS_STRIDED = (
    torch.as_strided,
    torch.Tensor.as_strided,
    torch.ops.aten.as_strided.default,
    torch.as_strided_,
    torch.Tensor.as_strided_,
    torch.ops.aten.as_strided_.default,
)
_INPLACE_OPERATORS = frozenset(
    {
        operator.setitem,
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.iand,
        operator.ior,
        operator.ixor,
    }
)


def has_dynamic_inputs(example_inputs: Sequence[Any]) -> bool:
    """Whether any example input is symbolic (a SymInt, or a tensor with symbolic geometry)."""
    for value in example_inputs:
        if isinstance(value, torch.SymInt):
            return True
        if isinstance(value, torch.Tensor):
            geometry = (*value.shape, *value.stride(), value.storage_offset())
            if any(isinstance(s, torch.SymInt) for s in geometry):
                return True
    return False


def as_strided_input_mutation(graph: fx.Graph, *, dynamic: bool) -> str | None:
    """Why ``graph`` (a Dynamo graph) hits the AOTAutograd bug above, or None."""
    if not dynamic:
        return None
    for placeholder in graph.find_nodes(op="placeholder"):
        aliases = _aliases(placeholder)
        strided = any(_is_as_strided(n) for n in aliases)
        if not strided:
            continue
        for node in graph.nodes:
            if _writes(node, aliases):
                name = node.target if isinstance(node.target, str) else node.name
                return (
                    f"as_strided view of graph input {placeholder.name}, which the program "
                    f"also writes in place ({name})"
                )
    return None


def _aliases(placeholder: fx.Node) -> set[fx.Node]:
    """The placeholder and the views taken of it (transitively).

    A node is a view when its example value (Dynamo's FakeTensor) shares the
    placeholder's storage, however the view was spelled (``x.T``, ``x.real``,
    ``x.data``, ``aten.alias``, ...); nodes without an example value are
    followed by name, as before.
    """
    storage = _storage(placeholder)
    found = {placeholder}
    stack = [placeholder]
    while stack:
        for user in stack.pop().users:
            if user in found:
                continue
            theirs = _storage(user) if storage is not None else None
            same = theirs is not None and theirs == storage
            if same or _is_view_of(user, found):
                found.add(user)
                stack.append(user)
    return found


def _storage(node: fx.Node) -> Any:
    # split / chunk / unbind: the storage of their pieces
    value = next(tensor_values(meta_value(node)), None)
    if value is None:
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (RuntimeError, NotImplementedError):  # tensors without storage
        return None


def _is_view_of(node: fx.Node, nodes: set[fx.Node]) -> bool:
    if not node.args or node.args[0] not in nodes:
        return False
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.op == "call_function":
        target = node.target
        if target is operator.getitem or target in _AS_STRIDED:
            return True
        name = getattr(target, "__name__", "")
        return name in _VIEW_METHODS and getattr(target, "__module__", "") in ("torch", None)
    return False


def _is_as_strided(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in ("as_strided", "as_strided_")
    return node.op == "call_function" and node.target in _AS_STRIDED


def _writes(node: fx.Node, aliases: set[fx.Node]) -> bool:
    """Whether ``node`` may write one of ``aliases`` (over-approximated)."""
    args = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
    if not any(a in aliases for a in args):
        return False
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.startswith("__") and node.args[0] in aliases
    if node.op != "call_function":
        return False
    if node.target in _INPLACE_OPERATORS:
        return node.args[0] in aliases
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(getattr(target, o)._schema.is_mutable for o in target.overloads())
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable or target._overloadname == "maybe_inplace"
    if "out" in node.kwargs:
        return True
    name = getattr(target, "__name__", "")
    return name.endswith("_") and not name.startswith("__")
