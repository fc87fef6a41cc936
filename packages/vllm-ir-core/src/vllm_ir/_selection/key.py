"""The selection key: the argument facts a cached selection is valid for.

The eager fast path is a cache of :meth:`IrOp.select`: for any arguments it
must run exactly the impl ``select()`` returns. It can only do so if every
``supports_args`` answer is a function of the key. The *selection key*
(:func:`make_key_fn` with ``fast=False``, ``IrOp._key``) holds:

* the scoped priority state and selection mode (one context-variable read;
  process-wide priorities invalidate the caches instead);
* for every tensor argument, required or optional (``None`` is a fact too),
  and every tensor in a list argument:

  - ``dtype`` and ``device`` (type *and* index);
  - ``stride()`` — with it the rank, and every layout fact
    :mod:`vllm_ir._schema.layout` and ``is_contiguous()`` read; a tensor without
    strides (sparse, mkldnn) is never cached;
  - the sizes except the batch size: ``shape[1:]`` for tensors of rank 2 or
    more, the whole shape for rank 0 and 1;
  - the batch size's class: ``0``, ``1`` or "2 or more", the distinction
    Dynamo itself specializes on (an empty or a single row changes which
    strides matter);
  - the data pointer's alignment, ``data_ptr() % 16`` (:data:`ALIGNMENT`);

* every non-tensor argument by value (``==`` and ``hash``).

A predicate may read any of these and nothing else: not the batch size
beyond its class, not the storage offset beyond alignment, never values.
The conformance kit (:mod:`vllm_ir.testing`) re-asks ``supports_args`` with
arguments that share the key and differ elsewhere, and
``VLLM_IR_CHECK_SELECTION=1`` re-validates every cached call against
``select()``.

The eager fast path keys its cache on the *exact* facts instead
(``fast=True``): per tensor ``dtype``, ``device``, the whole ``shape``,
``stride()`` and the alignment — a superset, so every hit is still a
selection-key hit, and each fact is one cheap attribute read (slicing a
``torch.Size`` costs several times more). A batch size it has not seen
misses once and finds the selection through the selection key, without
calling ``supports_args`` again.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from vllm_ir._schema.signature import GENERATED_PREFIX as P
from vllm_ir._schema.signature import is_scalar_annotation, params_source, tensor_kind

__all__ = [
    "ALIGNMENT",
    "BATCH_CLASS",
    "key_expression",
    "key_is_cacheable",
    "make_key_fn",
    "tensor_facts",
]

ALIGNMENT = 16
"""The key holds ``data_ptr() % ALIGNMENT``: predicates may test alignment up to 16 bytes."""

BATCH_CLASS: dict[tuple[int, ...], int] = {(0,): 0, (1,): 1}
"""``shape[:1]`` -> batch class; anything else (rank 0, or a batch of 2 or more) is 2."""


def _exact_facts_source(name: str) -> str:
    """Inline source of one tensor's exact facts, for the eager fast path."""
    return (
        f"{name}.dtype, {name}.device, {name}.shape, {name}.stride(), "
        f"{name}.data_ptr() % {ALIGNMENT}"
    )


def tensor_facts(t: torch.Tensor) -> tuple[Any, ...]:
    """One tensor's key facts, for any tensor, without guards.

    On a FakeTensor the alignment is ``None`` (it has no data), and symbolic
    sizes stay SymInts: such a key is unhashable, so it is never cached, and
    building it adds no guard.
    """
    shape = t.shape
    first = tuple(shape[:1])
    batch: Any = BATCH_CLASS.get(first, 2) if all(type(s) is int for s in first) else first
    align = None if is_fake(t) else t.data_ptr() % ALIGNMENT
    # a bool slices off the batch dim only for rank >= 2
    return (t.dtype, t.device, t.stride(), shape[t.dim() > 1 :], batch, align)


def _generic_facts(value: Any) -> Any:
    """Facts of an argument of another annotation: tensors by facts, lists element-wise."""
    if isinstance(value, torch.Tensor):
        return tensor_facts(value)
    if isinstance(value, (list, tuple)):
        return tuple(_generic_facts(v) for v in value)
    return value


def _generic_exact_facts(value: Any) -> Any:
    """:func:`_generic_facts` with the fast path's exact tensor facts."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.device, value.shape, value.stride(), value.data_ptr() % 16)
    if isinstance(value, (list, tuple)):
        return tuple(_generic_exact_facts(v) for v in value)
    return value


def _param_expression(p: inspect.Parameter, fast: bool) -> str:
    kind = tensor_kind(p.annotation)
    n = p.name
    if kind == "tensor":
        return _exact_facts_source(n) if fast else f"*{P}tensor_facts({n})"
    if kind == "optional":
        facts = f"({_exact_facts_source(n)})" if fast else f"{P}tensor_facts({n})"
        return f"None if {n} is None else {facts}"
    if is_scalar_annotation(p.annotation):
        return n
    return f"{P}generic_exact_facts({n})" if fast else f"{P}generic_facts({n})"


def key_expression(sig: inspect.Signature, *, fast: bool = True) -> str:
    """Source of the key tuple over the signature's parameter names.

    ``fast``: the exact facts, inline, for real tensors on the eager fast
    path; otherwise the selection key, through :func:`tensor_facts`, safe on
    FakeTensors.
    """
    # the scoped priority state: the current scope's (None outside scopes);
    # see vllm_ir.priority for why a scope is read through its .state
    scope = f"(None if ({P}scope := {P}scoped_get()) is None else {P}scope.state)"
    items = [scope] + [_param_expression(p, fast) for p in sig.parameters.values()]
    return f"({', '.join(items)},)"


def key_namespace(scoped_get: Callable[[], Any]) -> dict[str, Any]:
    """The globals :func:`key_expression`'s source refers to."""
    return {
        f"{P}scoped_get": scoped_get,
        f"{P}tensor_facts": tensor_facts,
        f"{P}generic_facts": _generic_facts,
        f"{P}generic_exact_facts": _generic_exact_facts,
    }


def make_key_fn(
    sig: inspect.Signature,
    scoped_get: Callable[[], Any],
    compile_source: Callable[[str, str, dict[str, Any]], Callable[..., Any]],
    *,
    fast: bool,
) -> Callable[..., Any]:
    """``key(*args)`` -> the selection key tuple (see the module docstring)."""
    namespace = key_namespace(scoped_get)
    source = (
        f"def key({params_source(sig, namespace)}):\n    return {key_expression(sig, fast=fast)}\n"
    )
    return compile_source(source, "key", namespace)


def key_is_cacheable(key: Any) -> bool:
    """A key can be stored: hashable, and no NaN (``nan != nan``: it would never hit)."""
    try:
        hash(key)
    except TypeError:
        return False
    return not _has_nan(key)


def _has_nan(value: Any) -> bool:
    if type(value) is float:
        return math.isnan(value)
    if type(value) is tuple:
        return any(_has_nan(v) for v in value)
    return False
