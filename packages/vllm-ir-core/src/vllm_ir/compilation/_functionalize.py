"""Pre-grad: ``maybe_inplace`` -> ``default``, after checking the donation is honoured.

A donated activation may be overwritten by the op, so nothing may read it —
or any view or alias of it that shares an element with it, taken before or
after the call — once the op has run. Such a program raises ``ValueError``
naming the op, the activation and the reader. A tensor of the same storage
whose elements are provably apart (``v`` of ``q, k, v = qkv.split(...)``) is
no reader; one whose overlap sizes and strides leave open (symbolic sizes,
unusual strides) makes the call donate nothing for that activation, like the
default overload, rather than fail: a correct program compiles either way.
Each rewritten node remembers which of its arguments were donated, and which
graph inputs each donated value may share elements with
(``meta["custom"]``), which the lowering and clone elimination read after
AOTAutograd.

Like the eager overload, a call whose arguments autograd needs donates
nothing: its output requires grad (grad mode on and an input requiring grad).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

from vllm_ir.compilation._aliasing import (
    AliasGroups,
    meta_value,
    regions_overlap,
    tensor_values,
    written_args,
)
from vllm_ir.compilation._context import (
    DONATED_INPUTS_META,
    DONATED_META,
    Donation,
    InputSignature,
    get_pass_context,
)
from vllm_ir.compilation._pass_base import VllmIRPass
from vllm_ir.compilation.ir_nodes import call_args, ir_op_of, is_ir_node

__all__ = ["InplaceFunctionalizationPass", "input_signature"]


class InplaceFunctionalizationPass(VllmIRPass):
    name = "inplace_functionalization"

    def run(self, graph: fx.Graph) -> None:
        nodes = [n for n in graph.nodes if is_ir_node(n, "maybe_inplace")]
        if not nodes:
            return
        ctx = get_pass_context()
        ctx.graph_inputs = input_signature(graph)
        inputs = {n: i for i, n in enumerate(graph.find_nodes(op="placeholder"))}
        aliases = AliasGroups(graph)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for node in nodes:
            op = ir_op_of(node)
            args = call_args(node, op)
            autograd = _autograd_needs(node)
            donated: list[int] = []
            donated_inputs: list[tuple[int, tuple[int, ...]]] = []
            seen: dict[fx.Node, str] = {}
            for name in op.activations:
                index = list(op.signature.parameters).index(name)
                value = args[index]
                if not isinstance(value, fx.Node):
                    continue
                if value in seen:
                    raise ValueError(
                        f"{op.name}.maybe_inplace: {value.name} is passed as both "
                        f"{seen[value]!r} and {name!r}; a tensor can be donated once per call"
                    )
                seen[value] = name
                group = aliases.aliases(value)
                apart = _check_not_read_after(op.name, name, value, node, group, order)
                if autograd:
                    continue
                if not apart:
                    ctx.declined_activations.append((node.name, name))
                    continue
                donated.append(index)
                # the graph inputs that may share an element with it (not a sibling slice)
                positions = tuple(
                    sorted(inputs[m] for m in group if m in inputs and _may_share(value, m))
                )
                donated_inputs.append((index, positions))
                donation = Donation(op.name, node.name, name, value.name, bool(positions))
                ctx.donations.append(donation)
            if autograd:
                ctx.declined.append(node.name)
            node.target = op.torch_op
            custom = node.meta.setdefault("custom", {})
            custom[DONATED_META] = tuple(donated)
            custom[DONATED_INPUTS_META] = tuple(donated_inputs)
            ctx.functionalized += 1


def input_signature(graph: fx.Graph) -> InputSignature:
    """(kind, dtype, rank) of each graph input, in order."""
    signature: list[tuple[str, object, int]] = []
    for node in graph.find_nodes(op="placeholder"):
        value = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(value, torch.Tensor):
            signature.append(("tensor", value.dtype, value.dim()))
        else:
            signature.append((type(value).__name__, None, 0))
    return tuple(signature)


def _autograd_needs(node: fx.Node) -> bool:
    """Whether autograd records this call (so eager would donate nothing).

    The output requires grad exactly when grad mode was on and an input
    required grad. Without metadata, assume it does: donating is the risk.
    """
    value: Any = node.meta.get("example_value", node.meta.get("val"))
    outputs = list(tensor_values(value))
    if not outputs:
        return True
    return any(t.requires_grad for t in outputs)


def _check_not_read_after(
    op_name: str,
    arg_name: str,
    value: fx.Node,
    call: fx.Node,
    group: set[fx.Node],
    order: dict[fx.Node, int],
) -> bool:
    """Raise if a tensor sharing elements with ``value`` is read after ``call``.

    Returns False when a later reader of ``value``'s storage may or may not
    touch its elements (the donation must then be declined), True when every
    later reader is provably apart from them.
    """
    donated = meta_value(value)
    apart = True
    for member in group:
        tensors = list(tensor_values(meta_value(member)))
        readers = [
            user
            for user in member.users
            if user is not call
            and order[user] > order[call]
            and not _takes_a_view(user, member, tensors)
        ]
        if not readers:
            continue
        if member is not value and isinstance(donated, torch.Tensor):
            relations = {regions_overlap(donated, t) for t in tensors}
            if relations == {False}:
                continue  # same storage, other elements (a sibling slice)
            if True not in relations:
                apart = False  # may touch them: undecided, so the donation is declined
                continue
        user = readers[0]
        via = "" if member is value else f" through its alias {member.name}"
        reader = "the graph output" if user.op == "output" else f"{user.name} ({user.target})"
        raise ValueError(
            f"{op_name}.maybe_inplace donates activation {arg_name!r} ({value.name}), "
            f"but {reader} reads it{via} after the call. A donated tensor may hold "
            "garbage afterwards: clone it before the call, or call the default "
            f"overload ir.ops.{op_name}(...) which leaves its inputs intact."
        )
    return apart


def _may_share(value: fx.Node, other: fx.Node) -> bool:
    a, b = meta_value(value), meta_value(other)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return True
    return other is value or regions_overlap(a, b) is not False


def _takes_a_view(user: fx.Node, member: fx.Node, tensors: list[torch.Tensor]) -> bool:
    """``user`` only takes views of ``member``: it reads no element itself.

    A tuple's ``getitem``, or a node whose only tensor argument is ``member``,
    that writes nothing its schema declares, and whose values are new tensors
    (an in-place op returns its argument itself) of ``member``'s storage:
    ``qkv[:, 24:]`` or ``qkv.split(...)`` taken after the call. Its values
    are members of the alias group, whose readers are checked in turn.
    """
    if user.target is operator.getitem and len(tensors) != 1:
        return True
    values = list(tensor_values(meta_value(user)))
    storages = {StorageWeakRef(t.untyped_storage()) for t in tensors if t.layout is torch.strided}
    if not values or any(
        v.layout is not torch.strided
        or StorageWeakRef(v.untyped_storage()) not in storages
        or any(v is t for t in tensors)
        for v in values
    ):
        return False
    arguments: list[fx.Node] = []
    fx.node.map_arg((user.args, user.kwargs), arguments.append)
    others = [a for a in arguments if a is not member and any(tensor_values(meta_value(a)))]
    return not others and not written_args(user)
