"""Recognizing IR op nodes in FX graphs (for pass authors).

``IrOpInplaceOverload`` is the type of ``op.maybe_inplace``, the overload a
functionalized graph may turn back into an in-place call."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from vllm_ir._op.op import NAMESPACE, IrOp, IrOpInplaceOverload, get_op

__all__ = ["IrOpInplaceOverload", "call_args", "ir_op_of", "is_ir_node"]


def is_ir_node(node: fx.Node, overload: str | None = None) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if target.namespace != NAMESPACE:
        return False
    return overload is None or target._overloadname == overload


def ir_op_of(node: fx.Node) -> IrOp:
    assert isinstance(node.target, torch._ops.OpOverload)
    return get_op(node.target._schema.name.split("::", 1)[1])


def call_args(node: fx.Node, op: IrOp) -> list[Any]:
    """The node's arguments by position, keyword arguments and defaults filled in."""
    bound = op.signature.bind_partial(*node.args, **node.kwargs)
    bound.apply_defaults()
    return list(bound.args)
