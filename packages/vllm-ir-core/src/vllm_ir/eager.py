"""The eager call path of one op overload: the cache of ``select()``, and its miss path.

``op(...)`` and ``op.maybe_inplace(...)`` run code generated per op
(:mod:`vllm_ir._hotpath`) that looks the arguments' dispatch key up in a
bounded cache (:mod:`vllm_ir.cache`). On a miss, :meth:`EagerCall.miss`
checks the argument types against the schema, selects with
:meth:`IrOp.select`'s rules, and stores the result unless the priorities
changed meanwhile. The rule: **for any arguments, the fast path runs exactly
the impl ``select()`` returns, once.**

``VLLM_IR_CHECK_DISPATCH=1`` (or :func:`set_dispatch_check`) regenerates
every op's call to re-validate each cache hit against an uncached
selection — hits of the exact-facts cache and, on its misses, hits of the
selection-key cache (a new batch size of a known class) — raising
:class:`DispatchMismatch` on a difference: a ``supports_args`` that reads a
fact the key does not hold. It costs a full
selection per call: a debugging and testing aid.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from vllm_ir import envs
from vllm_ir._hotpath import make_eager_call
from vllm_ir.cache import generation, holds, register_cache, store
from vllm_ir.dispatch import describe
from vllm_ir.dispatch_key import key_is_cacheable
from vllm_ir.impl import IrOpImpl

__all__ = ["DispatchMismatch", "EagerCall", "dispatch_check_enabled", "set_dispatch_check"]


class DispatchMismatch(AssertionError):
    """A cached eager selection differs from ``select()`` for the same arguments."""


class SelectingOp(Protocol):
    """What an eager call needs from its op (implemented by :class:`vllm_ir.IrOp`)."""

    name: str
    signature: inspect.Signature

    def _check_args(self, args: tuple[Any, ...]) -> str: ...
    def _route(self, *args: Any) -> bool: ...
    def _fast_key(self, *args: Any) -> Any: ...
    def _select_impl(self, args: tuple[Any, ...]) -> IrOpImpl: ...
    def _cached_select(self, args: tuple[Any, ...]) -> IrOpImpl: ...
    def _clone_activations(self, args: tuple[Any, ...]) -> tuple[Any, ...]: ...

    @property
    def _impls(self) -> dict[str, IrOpImpl]: ...


_check: list[bool | None] = [None]  # None: follow VLLM_IR_CHECK_DISPATCH
_installed: weakref.WeakSet[EagerCall] = weakref.WeakSet()


def dispatch_check_enabled() -> bool:
    """Whether cached eager calls are re-validated against ``select()``."""
    forced = _check[0]
    return envs.check_dispatch() if forced is None else forced


def set_dispatch_check(enabled: bool | None) -> None:
    """Turn re-validation of cached eager calls on or off for every op
    (``None``: follow ``VLLM_IR_CHECK_DISPATCH``)."""
    _check[0] = enabled
    for call in list(_installed):
        call.install()


class EagerCall:
    """One overload's eager ``__call__``: its cache, miss path and check.

    ``copy_activations``: the default overload, which never writes its
    inputs, runs an inplace impl on copies of the activations.
    """

    def __init__(
        self,
        op: SelectingOp,
        owner: type,
        torch_op: Callable[..., Any],
        scoped_get: Callable[[], Any],
        *,
        copy_activations: bool,
    ) -> None:
        self.op = op
        self.owner = owner
        self.torch_op = torch_op
        self.scoped_get = scoped_get
        self.copy_activations = copy_activations
        self.calls: dict[Any, Callable[..., Any]] = register_cache()
        # one wrapper per inplace impl: a stable identity, so check mode can compare
        self._on_copies: dict[IrOpImpl, Callable[..., Any]] = {}
        self.install()
        _installed.add(self)

    def install(self) -> None:
        """(Re)generate the overload's ``__call__``, with the check if enabled."""
        self.checking = dispatch_check_enabled()
        call = make_eager_call(
            self.op.signature,
            self.op.name,
            torch_op=self.torch_op,
            calls=self.calls,
            miss=self.miss,
            scoped_get=self.scoped_get,
            verify=self.verify if self.checking else None,
        )
        self.owner.__call__ = call  # type: ignore[method-assign]

    def fn_for(self, impl: IrOpImpl) -> Callable[..., Any]:
        """What this overload runs when ``impl`` is selected."""
        if not (self.copy_activations and impl.inplace):
            return impl.impl_fn
        fn = self._on_copies.get(impl)
        if fn is None:
            fn = self._on_copies.setdefault(
                impl, functools.partial(self._call_on_copies, impl.impl_fn)
            )
        return fn

    def _call_on_copies(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*self.op._clone_activations(args))

    def miss(self, *args: Any) -> Callable[..., Any]:
        """The function to run for ``args`` (all parameters, positionally); caches it."""
        op = self.op
        if op._check_args(args) == "convert" or op._route(*args):
            # a value torch converts (e.g. a 0-d tensor for a float): torch's
            # semantics, uncached, so no key keeps it alive
            return self.torch_op
        since = generation()
        # through the selection cache: a new batch size selects nothing anew
        impl = op._cached_select(args)
        if self.checking:  # a selection-cache hit is a cached call too: re-check it
            impl = self._verify_selection(impl, args, since)
        fn = self.fn_for(impl)
        try:
            key = op._fast_key(*args)
        except Exception:  # e.g. a tensor without strides: not cached
            return fn
        if key_is_cacheable(key):
            store(self.calls, key, fn, since)
        return fn

    def verify(self, fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        """Check mode: ``fn`` (a cache hit) must be what an uncached selection runs."""
        op = self.op
        since = generation()
        expected_impl = op._select_impl(args)
        expected = self.fn_for(expected_impl)
        if fn is expected:
            return fn
        try:
            key = op._fast_key(*args)
        except Exception:
            return expected  # such a call is never cached: fn came from a concurrent change
        if not holds(self.calls, key, fn, since):
            return expected  # the priorities changed concurrently: not a mismatch
        cached = next((p for p, i in op._impls.items() if self.fn_for(i) is fn), repr(fn))
        raise self._mismatch(cached, args, expected_impl)

    def _verify_selection(self, impl: IrOpImpl, args: tuple[Any, ...], since: int) -> IrOpImpl:
        """Check mode, on a miss: the selection cache's ``impl`` (found through the
        coarser selection key, e.g. for a new batch size) must be ``select()``'s."""
        expected = self.op._select_impl(args)
        if impl is expected or generation() != since:  # changed meanwhile: not a mismatch
            return expected
        raise self._mismatch(impl.provider, args, expected)

    def _mismatch(self, cached: str, args: tuple[Any, ...], expected: IrOpImpl) -> DispatchMismatch:
        return DispatchMismatch(
            f"{envs.VLLM_IR_CHECK_DISPATCH}: the eager cache of op {self.op.name!r} runs "
            f"{cached!r} for {describe(args)}, but select() chooses "
            f"{expected.provider!r}. A supports_args reads a fact the dispatch key "
            "does not hold (see vllm_ir.dispatch_key); make it a function of the key's facts."
        )
