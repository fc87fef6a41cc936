"""An op's signature: what its parameters are, and the checks on declaring one.

IR ops take plain positional-or-keyword parameters with annotations, since the
annotations define the torch schema; activations (the tensors ``maybe_inplace``
callers donate) are Tensor parameters; the generated fast path is built from
the parameters' kinds (:func:`tensor_kind`).
"""

from __future__ import annotations

import inspect
import keyword
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "GENERATED_PREFIX",
    "RESERVED_PARAMETERS",
    "SEQUENCE_ORIGINS",
    "TensorKind",
    "check_native_signature",
    "check_op_name",
    "count_tensor_outputs",
    "is_scalar_annotation",
    "params_source",
    "resolve_activations",
    "tensor_kind",
]

TensorKind = typing.Literal["tensor", "optional", "list", "other"]

_SCALARS = (int, float, bool, str, type(None))

SEQUENCE_ORIGINS = (list, tuple, Sequence)
"""What ``typing.get_origin`` gives for the sequence annotations an op may take
(``list[T]``, ``tuple[T, ...]``, ``typing.Sequence[T]``: its origin is
``collections.abc.Sequence``); torch's schema makes each a list."""

GENERATED_PREFIX = "_vllm_ir_"
"""Every name generated code defines or reads (globals, locals, its ``self``)
starts with this; op parameters may not, so they can never shadow one."""

RESERVED_PARAMETERS = frozenset({"self"})
"""Parameter names torch's op bindings and methods take for themselves."""


def tensor_kind(annotation: object) -> TensorKind:
    """Classify a parameter annotation: Tensor, Tensor | None, list of Tensor, other."""
    if annotation is torch.Tensor:
        return "tensor"
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and torch.Tensor in args:
        return "optional"
    if origin in SEQUENCE_ORIGINS and args and args[0] is torch.Tensor:
        return "list"
    return "other"


def is_scalar_annotation(annotation: object) -> bool:
    """int, float, bool, str, or an Optional of one: hashable as it is."""
    if annotation in _SCALARS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(a in _SCALARS for a in typing.get_args(annotation))
    return False


def params_source(sig: inspect.Signature, namespace: dict[str, Any]) -> str:
    """The parameter list of generated code, defaults bound through ``namespace``."""
    parts = []
    for p in sig.parameters.values():
        if p.default is inspect.Parameter.empty:
            parts.append(p.name)
        else:
            namespace[f"{GENERATED_PREFIX}default_{p.name}"] = p.default
            parts.append(f"{p.name}={GENERATED_PREFIX}default_{p.name}")
    return ", ".join(parts)


def check_op_name(name: object, taken: Mapping[str, str], shadowed: Collection[str]) -> None:
    """An op name is an identifier, public, and not yet used (``taken``: registered
    op -> module that registered it; ``shadowed``: other names in ``vllm_ir.ops``)."""
    if (
        not isinstance(name, str)
        or not name.isidentifier()
        or not name.isascii()
        or keyword.iskeyword(name)
    ):
        raise ValueError(
            f"IR op name must be an ASCII Python identifier such as 'my_op' (torch op "
            f"names are ASCII), got {name!r}"
        )
    if name.startswith("_"):
        raise ValueError(f"IR op name {name!r} must not start with an underscore")
    if name in taken:
        raise ValueError(
            f"IR op {name!r} is already registered (by {taken[name]}); choose another name"
        )
    from vllm_ir._base.namespace import NAMESPACE

    namespace = getattr(torch.ops, NAMESPACE)
    own = vars(namespace).get(name)
    if hasattr(type(namespace), name) or (
        own is not None and not isinstance(own, torch._ops.OpOverloadPacket)
    ):
        # an attribute of the torch.ops namespace object itself (e.g. 'name'):
        # torch.ops.<namespace>.<name> would never reach the op
        raise ValueError(
            f"IR op name {name!r} is an attribute of torch.ops.{NAMESPACE} itself, so "
            f"torch.ops.{NAMESPACE}.{name} could not reach the op; choose another name"
        )
    if name in shadowed:
        raise ValueError(
            f"IR op name {name!r} would shadow vllm_ir.ops.{name}; choose another name"
        )


def check_native_signature(name: str, sig: inspect.Signature) -> None:
    """Parameters are plain, annotated, and named apart from generated code's names."""
    for p in sig.parameters.values():
        if p.name in RESERVED_PARAMETERS or p.name.startswith(GENERATED_PREFIX):
            raise ValueError(
                f"IR op {name!r}: parameter name {p.name!r} is reserved (names starting "
                f"with {GENERATED_PREFIX!r} and {', '.join(sorted(RESERVED_PARAMETERS))!s} "
                "belong to the generated call); rename the parameter"
            )
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            raise TypeError(
                f"IR op {name!r}: parameter {p.name!r} is {p.kind.description}; IR ops "
                "take plain positional-or-keyword parameters only"
            )
        if p.annotation is inspect.Parameter.empty:
            raise TypeError(
                f"IR op {name!r}: parameter {p.name!r} has no type annotation; "
                "annotations define the op's torch schema"
            )
        if isinstance(p.default, str) and not _schema_safe(p.default):
            # torch renders str defaults between double quotes, unescaped: '"'
            # breaks its parser, a backslash silently changes the default
            raise ValueError(
                f"IR op {name!r}: parameter {p.name!r} has the default {p.default!r}, "
                "which a torch schema cannot hold (a double quote, backslash or control "
                "character); choose a default without them"
            )


def _schema_safe(text: str) -> bool:
    return not any(c in '"\\' or not c.isprintable() for c in text)


def resolve_activations(
    name: str, sig: inspect.Signature, activations: Sequence[str] | None, allow_inplace: bool
) -> tuple[str, ...]:
    """The activation parameter names: given, or those starting with ``x``; checked."""
    params = sig.parameters
    if activations is None:
        chosen = tuple(p for p in params if p.startswith("x"))
    elif isinstance(activations, str):
        raise TypeError(f"IR op {name!r}: activations must be a list of names, got a string")
    elif not isinstance(activations, (list, tuple)) or not all(
        isinstance(a, str) for a in activations
    ):
        raise TypeError(
            f"IR op {name!r}: activations must be a list of parameter names such as "
            f"['x'], got {type(activations).__name__} {activations!r:.60}"
        )
    else:
        chosen = tuple(activations)
    for a in chosen:
        if a not in params:
            raise ValueError(
                f"IR op {name!r}: activation {a!r} is not a parameter; parameters: "
                f"{', '.join(params)}"
            )
        if tensor_kind(params[a].annotation) != "tensor":
            raise TypeError(
                f"IR op {name!r}: activation {a!r} is annotated {params[a].annotation}, "
                "but activations must be Tensors"
            )
    if allow_inplace:
        if not chosen:
            raise ValueError(
                f"IR op {name!r} has allow_inplace=True but no activations; name them "
                "with activations=[...] or start their parameter names with 'x'"
            )
        n_out = count_tensor_outputs(sig.return_annotation)
        if n_out != len(chosen):
            raise ValueError(
                f"IR op {name!r} has allow_inplace=True, so each output must be able to "
                f"reuse one activation, but it returns {n_out} tensor(s) for "
                f"{len(chosen)} activation(s) {list(chosen)}"
            )
    return chosen


def count_tensor_outputs(annotation: object) -> int:
    if annotation is torch.Tensor:
        return 1
    if typing.get_origin(annotation) is tuple:
        return sum(1 for a in typing.get_args(annotation) if a is torch.Tensor)
    return 0
