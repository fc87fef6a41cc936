"""Argument types checked against an op's schema, on the eager miss path.

The torch op checks every argument against its schema; the eager fast path
skips that (a hit costs one dict lookup), so a call that misses the cache is
checked here instead. Three outcomes per call:

* every argument has the exact Python type its annotation names: the call
  may be cached;
* an argument is a value torch converts (a 0-d tensor or a numpy scalar for
  a ``float``, a ``bool`` for an ``int`` ...): the call goes through the torch
  op, uncached, so it behaves exactly as ``torch.ops.<NAMESPACE>.<op>`` does and
  no key keeps such a value (or a tensor) alive;
* anything else raises ``TypeError`` naming the argument, what the schema
  expects and what was passed.
"""

from __future__ import annotations

import inspect
import numbers
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import torch

from vllm_ir._base.text import short_repr
from vllm_ir._schema.signature import SEQUENCE_ORIGINS

__all__ = ["ArgumentCheck", "make_argument_check"]

ArgumentCheck = Literal["plain", "convert"]

_PLAIN: dict[object, tuple[type, ...]] = {
    float: (float, int),
    int: (int,),
    bool: (bool,),
    str: (str,),
}


def _describe(annotation: object) -> str:
    if annotation is torch.Tensor:
        return "Tensor"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("torch.", "")


def _classify(annotation: object, value: Any) -> ArgumentCheck | None:
    """``plain``, ``convert`` or None (not allowed) for one argument."""
    if annotation is torch.Tensor:
        return "plain" if isinstance(value, torch.Tensor) else None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return "plain" if type(None) in args else None
        results = [_classify(a, value) for a in args if a is not type(None)]
        if "plain" in results:
            return "plain"
        return "convert" if "convert" in results else None
    if origin in SEQUENCE_ORIGINS:
        if not isinstance(value, (list, tuple)):
            return None
        inner = args[0] if args else Any
        results = [_classify(inner, v) for v in value]
        if None in results:
            return None
        return "convert" if "convert" in results else "plain"
    plain = _PLAIN.get(annotation)
    if plain is None:
        return "plain"  # an annotation we do not model: the torch op is the judge
    if type(value) in plain:
        return "plain"
    if annotation is not str and (
        isinstance(value, (numbers.Number, torch.SymInt, torch.SymFloat, torch.SymBool))
        or (isinstance(value, torch.Tensor) and value.dim() == 0)
    ):
        return "convert"
    return None


def make_argument_check(
    op_name: str, sig: inspect.Signature
) -> Callable[[tuple[Any, ...]], ArgumentCheck]:
    """``check(args)`` for bound positional ``args`` of the op (see the module doc)."""
    params = list(sig.parameters.values())

    def check(args: tuple[Any, ...]) -> ArgumentCheck:
        outcome: ArgumentCheck = "plain"
        for p, value in zip(params, args, strict=False):
            got = _classify(p.annotation, value)
            if got is None:
                raise TypeError(
                    f"{op_name}() expected a value of type '{_describe(p.annotation)}' for "
                    f"argument '{p.name}' but instead found type '{type(value).__name__}' "
                    f"({short_repr(value, 60)}); pass a {_describe(p.annotation)}, as the op's "
                    f"signature {op_name}{sig} says"
                )
            if got == "convert":
                outcome = "convert"
        return outcome

    return check
