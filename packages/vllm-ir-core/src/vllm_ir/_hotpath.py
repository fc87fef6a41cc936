"""The eager hot path, generated per op from its signature.

From an op's signature we generate, once, straight-line Python: the
selection-cache key, the "does any tensor need grad" test, and the whole
eager ``__call__`` with the op's own parameters. Each saved attribute read,
``*args`` pack or extra call is 30-100 ns; generic code over ``args`` cost
about twice the generated code's overhead on the hot path.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TensorKind", "make_eager_call", "make_key_fn", "make_needs_grad_fn", "tensor_kind"]

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


def _meta(name: str, first: bool, required: bool) -> str:
    # An op's tensors share one device and layout (its native function fails
    # otherwise), so only the first tensor pays for them: each read is ~50 ns.
    # Required tensors (the activations, typically) add whether they are
    # contiguous: kernels that need dense rows decline the others.
    items = [f"{name}.dtype", f"{name}.ndim"]
    if first:
        items += [f"{name}.device", f"{name}.layout"]
    if required:
        items.append(f"{name}.is_contiguous()")
    return ", ".join(items)


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


def _key_expr(sig: inspect.Signature) -> str:
    items = ["_scoped_get()"]
    first = True
    for p in sig.parameters.values():
        kind = tensor_kind(p.annotation)
        if kind == "tensor":
            items.append(_meta(p.name, first, required=True))
            first = False
        elif kind == "optional":
            items.append(f"None if {p.name} is None else ({_meta(p.name, first, required=False)})")
        elif _is_scalar(p.annotation):
            items.append(p.name)
        else:
            items.append(f"_generic_meta({p.name})")
    return f"({', '.join(items)},)"


def _needs_grad_expr(sig: inspect.Signature) -> str:
    terms = []
    for p in sig.parameters.values():
        kind = tensor_kind(p.annotation)
        if kind == "tensor":
            terms.append(f"{p.name}.requires_grad")
        elif kind == "optional":
            terms.append(f"({p.name} is not None and {p.name}.requires_grad)")
        elif kind == "list":
            terms.append(f"any(t.requires_grad for t in {p.name})")
    return " or ".join(terms) or "False"


def _base_namespace(scoped_get: Callable[[], Any]) -> dict[str, Any]:
    return {"_generic_meta": _generic_meta, "_scoped_get": scoped_get}


def make_key_fn(sig: inspect.Signature, scoped_get: Callable[[], Any]) -> Callable[..., Any]:
    """``key(*args)`` -> hashable tuple of the metadata selection may read.

    The scoped priority state; per tensor, dtype and ndim; device and layout
    of the first tensor parameter; whether each required (non-optional)
    tensor is contiguous; non-tensor arguments by value.
    """
    namespace = _base_namespace(scoped_get)
    source = f"def key({_params_source(sig, namespace)}):\n    return {_key_expr(sig)}\n"
    return _compile(source, "key", namespace)


def make_needs_grad_fn(sig: inspect.Signature) -> Callable[..., bool]:
    """``needs_grad(*args)`` -> whether any tensor argument requires grad."""
    namespace: dict[str, Any] = {}
    source = (
        f"def needs_grad({_params_source(sig, namespace)}):\n    return {_needs_grad_expr(sig)}\n"
    )
    return _compile(source, "needs_grad", namespace)


def make_eager_call(
    sig: inspect.Signature,
    op_name: str,
    *,
    torch_op: Callable[..., Any],
    calls: dict[Any, Callable[..., Any]],
    resolve: Callable[[Any, tuple[Any, ...]], Callable[..., Any]],
    scoped_get: Callable[[], Any],
) -> Callable[..., Any]:
    """The eager ``__call__(self, <op params>)`` of one overload of one op.

    Plain eager calls look up, in ``calls``, the function to run for the
    arguments' metadata (the selected impl, or for the default overload and
    an inplace impl, one that clones the activations first); ``resolve(key,
    args)`` fills it on a miss. Calls under Dynamo, a dispatch mode
    (``make_fx``, FakeTensorMode), ``__torch_function__`` arguments, or with
    tensors that need grad go through ``torch_op`` so a tracer records one
    node and autograd sees the op.
    """
    namespace = _base_namespace(scoped_get)
    namespace.update(
        _is_compiling=torch.compiler.is_compiling,
        _dispatch_stack_len=torch._C._len_torch_dispatch_stack,
        _has_torch_function=torch.overrides.has_torch_function,
        _grad_enabled=torch.is_grad_enabled,
        _torch_op=torch_op,
        _calls=calls,
        _resolve=resolve,
    )
    names = list(sig.parameters)
    args = ", ".join(names)
    # tensors inside list arguments may carry __torch_function__ too
    checked = ", ".join(
        f"*{p.name}" if tensor_kind(p.annotation) == "list" else p.name
        for p in sig.parameters.values()
    )
    lines = [
        f"def {op_name}(self, {_params_source(sig, namespace)}):",
        "    if (_is_compiling() or _dispatch_stack_len()",
        f"            or _has_torch_function(({checked},))",
        f"            or (_grad_enabled() and ({_needs_grad_expr(sig)}))):",
        f"        return _torch_op({args})",
        f"    key = {_key_expr(sig)}",
        "    try:",
        f"        return _calls[key]({args})",
        "    except KeyError:",
        f"        return _resolve(key, ({args},))({args})",
        "    except TypeError:  # an unhashable argument: no caching",
        f"        return _resolve(None, ({args},))({args})",
    ]
    # named after the op, so a wrong call says "rms_norm() missing 1 required ..."
    return _compile("\n".join(lines) + "\n", op_name, namespace)
