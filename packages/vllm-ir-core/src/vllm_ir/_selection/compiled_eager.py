"""Compiled impls in eager mode: ``op.set_priority([...], compile=True)``.

Within such a scope, a plain eager call of the op runs the selected impl
through ``torch.compile`` (Inductor) when the impl may be compiled: ``native``
always, a provider's impl when registered with ``compiled=True``. Eager
native is a chain of unfused kernels; compiled, it is one or two.

* One compile per impl and argument class: per tensor dtype, device, rank,
  last dimension and contiguity, and every non-tensor argument by value
  (Dynamo specializes on them). Every dimension but the last of a tensor of
  rank 2 or more is a token dimension, compiled *unbacked*
  (``mark_unbacked``): no recompile for any token count, 0 and 1 included.
  The marks go on aliases of the first call's tensors, never on the caller's.
* Calls a compile cannot serve run the plain impl: a non-contiguous tensor,
  an impl not marked compilable, more than :data:`MAX_VARIANTS` argument
  classes for one op, or a compile that failed (logged once).
* A compiled call that raises (a first compile, or a recompile of a warmed
  class: Dynamo guards on grad mode, and its recompile limit may be hit) runs
  the plain impl: if that raises too, the call was invalid and the caller gets
  the impl's own error, not Dynamo's; if not, the argument class runs plain
  from then on (logged once).
* Never traced into an outer compile: under Dynamo, ``make_fx`` or a
  dispatch mode the eager fast path is not taken (calls go through the torch
  op or trace-through), and the compiled callable itself runs the plain impl
  when it finds itself compiling or in compiled selection.

The request is scoped like priorities (per thread / task), also when its
scope is a generator's, closed out of order or from another context (a
generator finalized by another thread): the request is then marked ended, so
no context that still holds it, the opener's included, keeps compiling.
Entering and leaving a compile scope invalidates the eager caches, so a call
never keeps the other setting's cached choice in the same context. Two
contexts whose scoped priorities are identical share cache entries: a
compiled callable checks the request at each call and runs the plain impl
where it is not in force (the same impl, so the same result); the other way
round, a context asking for compile may run the plain impl cached by another
one.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch

from vllm_ir._base.cache import invalidate_caches
from vllm_ir._base.logger import get_logger
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir.priority import selection_mode

__all__ = ["MAX_VARIANTS", "CompiledCall", "compiled_fn_for", "compile_requested", "requested"]

logger = get_logger(__name__)

MAX_VARIANTS = 16
"""Most argument classes compiled per op and impl; beyond, calls run the plain impl."""


class _Request:
    """One open ``compile=True`` scope of one op.

    Contexts hold requests, not names: ``ContextVar.reset`` cannot restore a
    context other than the one closing the scope, so a scope closed out of
    order or from another context ends its request by marking it ``closed``,
    which every context still holding it sees.
    """

    __slots__ = ("closed", "op_name")

    def __init__(self, op_name: str) -> None:
        self.op_name = op_name
        self.closed = False


_requested: contextvars.ContextVar[tuple[_Request, ...]] = contextvars.ContextVar(
    "vllm_ir_compiled_eager", default=()
)
_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
# the data lives on the runtime (vllm_ir._base.runtime): (op name, impl) ->
# argument class -> its compiled call (None: runs plain)
_compiled = RUNTIME.compiled_eager


def compile_requested(op_name: str) -> bool:
    """Whether a ``set_priority(..., compile=True)`` scope for ``op_name`` is open here."""
    return any(r.op_name == op_name and not r.closed for r in _requested.get())


@contextlib.contextmanager
def requested(op_name: str) -> Iterator[None]:
    """Within the block, eager calls of ``op_name`` run their selected impl compiled."""
    request = _Request(op_name)
    # closed requests (of scopes ended elsewhere) are dropped as new ones open
    mine = (*(r for r in _requested.get() if not r.closed), request)
    token = _requested.set(mine)
    invalidate_caches()  # cached calls chose without the request
    try:
        yield
    finally:
        _end(request, mine, token)
        invalidate_caches()


def _end(request: _Request, mine: tuple[_Request, ...], token: contextvars.Token[Any]) -> None:
    """End ``request``: in order in its opener's context, ``reset`` (contexts that
    copied it keep it, as context variables do); out of order (a later scope is
    still open here) or from another context (``reset`` refuses the token), mark
    it closed, for every context that holds it."""
    if _requested.get() is mine:
        try:
            _requested.reset(token)
            return
        except ValueError:  # the token belongs to another context (a copy of it)
            pass
    request.closed = True


def _argument_class(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """What a compile is specialized on; ``None``: not compiled (a non-contiguous tensor)."""
    facts: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.layout != torch.strided or not a.is_contiguous():
                return None
            last = a.shape[-1] if a.dim() else None
            facts.append((a.dtype, a.device, a.dim(), last))
        elif isinstance(a, (list, tuple)):
            return None  # tensor lists: not compiled
        else:
            facts.append((type(a), a))
    return tuple(facts)


def _token_dims(t: torch.Tensor) -> list[int]:
    return list(range(t.dim() - 1)) if t.dim() >= 2 else []


class CompiledCall:
    """The eager call of one impl for one argument class, through ``torch.compile``."""

    __slots__ = ("compiled", "failed", "impl", "op_name", "warmed")

    def __init__(self, op_name: str, impl: IrOpImpl) -> None:
        self.op_name = op_name
        self.impl = impl
        self.compiled: Callable[..., Any] = torch.compile(impl.impl_fn, fullgraph=True)
        self.warmed = False
        self.failed = False

    def __call__(self, *args: Any) -> Any:
        if (
            self.failed
            or _is_compiling()
            or _dispatch_stack_len()  # make_fx, FakeTensorMode: traced, never compiled
            or not compile_requested(self.op_name)
            or selection_mode() == "compiled"
        ):
            return self.impl.impl_fn(*args)
        try:
            return self.compiled(*args) if self.warmed else self._first_call(args)
        except Exception as e:  # judged by the plain impl, below
            failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        # Outside the except block, so the plain impl's own error (if any) is
        # raised without Dynamo's one chained to it.
        return self._run_plain_after(failure, args)

    def _run_plain_after(self, failure: str, args: tuple[Any, ...]) -> Any:
        """The plain impl, after the compiled call raised ``failure``.

        A warmed call may recompile (a guard on grad mode, a shape the compile
        did not cover) and a recompile can fail (Dynamo's recompile limit) or
        wrap the caller's error in pages of fake-tensor internals. The plain
        impl decides which it was: if it raises too, the call was invalid and
        the caller gets the impl's own error; if not, the compile was at fault,
        and this argument class runs plain from now on (logged once).
        """
        out = self.impl.impl_fn(*args)
        self.failed = True
        logger.warning(
            "compiled eager: %s of op %r could not be compiled, running it plain: %s",
            self.impl.provider,
            self.op_name,
            failure,
        )
        return out

    def _first_call(self, args: tuple[Any, ...]) -> Any:
        import torch._dynamo

        aliases = []
        for a in args:
            if isinstance(a, torch.Tensor) and _token_dims(a):
                alias = a.detach()  # the marks stay off the caller's tensor
                torch._dynamo.decorators.mark_unbacked(alias, _token_dims(a))
                aliases.append(alias)
            else:
                aliases.append(a)
        out = self.compiled(*aliases)
        self.warmed = True
        return out

    def __repr__(self) -> str:
        return f"CompiledCall({self.op_name}:{self.impl.provider})"


def compiled_fn_for(op_name: str, impl: IrOpImpl, args: tuple[Any, ...]) -> CompiledCall | None:
    """The compiled call of ``impl`` for ``args``, or ``None`` where it runs plain."""
    if not impl.compiled or impl.inplace or not compile_requested(op_name):
        return None
    cls = _argument_class(args)
    if cls is None:
        return None
    with _compiled.lock:
        variants = _compiled.variants.setdefault((op_name, impl), {})
        if cls in variants:
            return variants[cls]
        if len(variants) >= MAX_VARIANTS:
            if None not in variants.values():
                logger.warning(
                    "compiled eager: op %r (%s) has %d compiled argument classes; "
                    "calls of others run the plain impl",
                    op_name,
                    impl.provider,
                    MAX_VARIANTS,
                )
            variants[cls] = None
            return None
        call = variants[cls] = CompiledCall(op_name, impl)
        return call


def forget(op_name: str, impl: IrOpImpl) -> None:
    """Drop the compiled calls of an unregistered impl."""
    with _compiled.lock:
        _compiled.variants.pop((op_name, impl), None)
