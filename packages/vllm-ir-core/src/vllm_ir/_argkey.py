"""Per-op generated helpers for the eager hot path.

From an op's signature we generate, once, straight-line functions that build
the selection-cache key and test whether any tensor argument needs grad. A
generic loop over ``args`` costs several hundred nanoseconds more per call.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TensorKind", "make_key_fn", "make_needs_grad_fn", "tensor_kind"]

TensorKind = typing.Literal["tensor", "optional", "list", "other"]


def tensor_kind(annotation: object) -> TensorKind:
    """Classify a parameter annotation: Tensor, Tensor | None, list of Tensor, other."""
    if annotation is torch.Tensor:
        return "tensor"
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and torch.Tensor in args:
        return "optional"
    if origin in (list, tuple, typing.Sequence) and args and args[0] is torch.Tensor:
        return "list"
    return "other"


_SCALARS = (int, float, bool, str, type(None))


def _is_scalar(annotation: object) -> bool:
    """int, float, bool, str, or an Optional of one: hashable as it is."""
    if annotation in _SCALARS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(a in _SCALARS for a in typing.get_args(annotation))
    return False


def _meta(name: str, first: bool) -> str:
    # An op's tensors share one device and layout (its native function fails
    # otherwise), so only the first tensor pays for them: each read is ~50 ns.
    if first:
        return f"{name}.dtype, {name}.ndim, {name}.get_device(), {name}.layout"
    return f"{name}.dtype, {name}.ndim"


def _generic_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.device, value.ndim, value.layout)
    if isinstance(value, (list, tuple)):
        return tuple(_generic_meta(v) for v in value)
    return value


def _compile(source: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    exec(compile(source, f"<vllm_ir {name}>", "exec"), namespace)
    return namespace[name]


def _params_source(sig: inspect.Signature, namespace: dict[str, Any]) -> str:
    parts = []
    for p in sig.parameters.values():
        if p.default is inspect.Parameter.empty:
            parts.append(p.name)
        else:
            namespace[f"_default_{p.name}"] = p.default
            parts.append(f"{p.name}=_default_{p.name}")
    return ", ".join(parts)


def make_key_fn(sig: inspect.Signature) -> Callable[..., tuple[Any, ...]]:
    """``key(state, *args)`` -> hashable tuple of the metadata selection may read.

    Per tensor: dtype and ndim; device and layout of the first tensor
    parameter; non-tensor arguments by value.
    """
    namespace: dict[str, Any] = {"_generic_meta": _generic_meta}
    items = ["state"]
    first = True
    for p in sig.parameters.values():
        kind = tensor_kind(p.annotation)
        if kind == "tensor":
            items.append(_meta(p.name, first))
            first = False
        elif kind == "optional":
            items.append(f"None if {p.name} is None else ({_meta(p.name, first)})")
        elif _is_scalar(p.annotation):
            items.append(p.name)
        else:
            items.append(f"_generic_meta({p.name})")
    source = (
        f"def key(state, {_params_source(sig, namespace)}):\n    return ({', '.join(items)},)\n"
    )
    return _compile(source, "key", namespace)


def make_needs_grad_fn(sig: inspect.Signature) -> Callable[..., bool]:
    """``needs_grad(*args)`` -> whether any tensor argument requires grad."""
    namespace: dict[str, Any] = {}
    terms = []
    for p in sig.parameters.values():
        kind = tensor_kind(p.annotation)
        if kind == "tensor":
            terms.append(f"{p.name}.requires_grad")
        elif kind == "optional":
            terms.append(f"({p.name} is not None and {p.name}.requires_grad)")
        elif kind == "list":
            terms.append(f"any(t.requires_grad for t in {p.name})")
    body = " or ".join(terms) or "False"
    source = f"def needs_grad({_params_source(sig, namespace)}):\n    return {body}\n"
    return _compile(source, "needs_grad", namespace)
