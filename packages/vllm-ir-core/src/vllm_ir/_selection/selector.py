"""One op's selection state: its impls, its two keys, its two caches, one miss path.

:class:`Selector` is what :class:`vllm_ir.IrOp` selects with. It owns

- the impls, by provider name (``native`` always among them), and their
  lifetime: :meth:`Selector.add` returns the registration's handle,
  :meth:`Selector.remove` drops the caches and tells the subscribers (the
  eager wrappers, the compiled eager calls) to forget the impl;
- the *selection key* (:meth:`Selector.key`): the argument facts
  ``supports_args`` may read (:mod:`vllm_ir._selection.key`), plus the size
  bucket when the effective table has buckets. Safe on FakeTensors: building
  it adds no guard;
- the *fast key* (:attr:`Selector.fast_key`): the exact facts the eager fast
  path caches what it runs on (:mod:`vllm_ir._selection.eager`);
- one selection cache per mode (eager and compiled priorities);
- the **one** miss routine, :meth:`Selector.miss`: read the generation,
  select, store unless the caches were invalidated meanwhile. The eager fast
  path, ``op.selected_impl()`` and the torch op's kernel all come through
  :meth:`Selector.impl_for`, so they run what :meth:`Selector.select` returns.

>>> import torch, vllm_ir as ir
>>> selector = ir.ops.rms_norm.selector
>>> x = torch.randn(4, 8)
>>> selector.impl_for((x, None, 1e-6, None)) is selector.select((x, None, 1e-6, None)).impl
True
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from vllm_ir._base.cache import (
    before_selection,
    generation,
    invalidating,
    register_cache,
    release_cache,
    store,
)
from vllm_ir._base.registration import RegistrationHandle
from vllm_ir._schema.arguments import make_argument_check
from vllm_ir._schema.impl import NATIVE, IrOpImpl, check_unregistered
from vllm_ir._selection.buckets import (
    AmbiguousBucket,
    SizePlan,
    guarded_bucket_tokens,
    static_bucket_tokens,
    tokens_of,
)
from vllm_ir._selection.hotpath import compile_source
from vllm_ir._selection.key import key_is_cacheable, make_key_fn
from vllm_ir.priority import Mode, bucket_bounds, scoped_state_var, selection_mode
from vllm_ir.selection import Candidates, Selection, candidates, describe, select

__all__ = ["Selector", "store_if_cacheable"]

_scoped_get = scoped_state_var().get
# a token count read from the arguments (the default of select/candidates)
_FROM_ARGS: Any = object()


def store_if_cacheable(
    cache: dict[Any, Any], key_fn: Callable[..., Any], args: tuple[Any, ...], value: Any, since: int
) -> None:
    """Cache ``value`` under ``key_fn(*args)``, unless the key cannot be built or
    hashed (a tensor without strides, a symbolic size) or the caches were
    invalidated after generation ``since``: the store step of every miss."""
    try:
        key = key_fn(*args)
    except Exception:  # e.g. a tensor without strides: not cached
        return
    if key_is_cacheable(key):
        store(cache, key, value, since)


class Selector:
    """The selection state and rule of one op (``op.selector``).

    ``args`` are always complete and positional (defaults applied), as the
    op's generated call and :meth:`IrOp.select` pass them.
    """

    def __init__(
        self,
        name: str,
        signature: inspect.Signature,
        native: IrOpImpl,
        *,
        tokens_at: int | None,
        feature_dims: int,
    ) -> None:
        self.name = name
        self._impls: dict[str, IrOpImpl] = {NATIVE: native}
        self._subscribers: list[Callable[[IrOpImpl], None]] = []
        self.tokens_at = tokens_at
        """Position of the argument the token count is read from (None: no activation)."""
        self.feature_dims = feature_dims
        self.check_args = make_argument_check(name, signature)
        """``check_args(args)``: ``"plain"`` (cacheable), ``"convert"`` (a value torch
        converts, e.g. a 0-d tensor for a float) or a ``TypeError``."""
        self._base_key = make_key_fn(signature, _scoped_get, compile_source, fast=False)
        self.fast_key = make_key_fn(signature, _scoped_get, compile_source, fast=True)
        """The eager fast path's exact key (:mod:`vllm_ir._selection.key`)."""
        self._caches: dict[Mode, dict[Any, IrOpImpl]] = {
            "eager": register_cache(),
            "compiled": register_cache(),
        }
        # (generation, scoped state) -> bucket bounds of the effective table
        self._plans: dict[tuple[int, Any], SizePlan] = {}

    # -- impls ------------------------------------------------------------

    @property
    def impls(self) -> Mapping[str, IrOpImpl]:
        """Provider name -> impl (read-only; registration goes through the op)."""
        return MappingProxyType(self._impls)

    def add(self, impl: IrOpImpl) -> RegistrationHandle:
        """Add ``impl`` (validated by the op) and drop every cached selection; the
        handle removes exactly this registration (not a later one of the name)."""
        check_unregistered(self.name, impl.provider, self._impls)
        with invalidating():
            self._impls[impl.provider] = impl
        return RegistrationHandle(
            f"impl {impl.provider!r} of op {self.name!r}",
            lambda: self.remove(impl.provider, impl),
        )

    def remove(self, provider: str, impl: IrOpImpl | None = None) -> None:
        """Remove ``provider``'s impl (``impl``: only if it is still that one) and
        drop every cached selection; each subscriber forgets what it built on it.
        ``native`` stays."""
        current = self._impls.get(provider)
        if provider == NATIVE or current is None or (impl is not None and current is not impl):
            return
        with invalidating():
            del self._impls[provider]
            for forget in self._subscribers:
                forget(current)

    def subscribe(self, forget: Callable[[IrOpImpl], None]) -> None:
        """Call ``forget(impl)`` when an impl leaves: the eager-call wrappers and
        the compiled eager calls hold its function (and all it closes over)."""
        self._subscribers.append(forget)

    # -- keys -------------------------------------------------------------

    def key(self, *args: Any) -> Any:
        """The selection key: the argument facts, and the bucket index when the
        effective table has buckets (the batch class alone does not fix it)."""
        key = self._base_key(*args)
        plan = self.size_plan()
        if not plan:
            return key
        tokens = self.tokens(*args)
        # a symbolic count stays in the key: unhashable, so never cached (no guard)
        return (*key, plan.index(tokens) if type(tokens) is int else tokens)

    def tokens(self, *args: Any) -> Any:
        """The call's token count (see :meth:`vllm_ir.IrOp.tokens`)."""
        idx = self.tokens_at
        if idx is None or idx >= len(args):
            return 1
        return tokens_of(args[idx], self.feature_dims)

    def size_plan(self) -> SizePlan:
        """The size buckets of the effective table in this context (false: no
        buckets); cached per cache generation and priority scope."""
        scope = _scoped_get()
        key = (generation(), None if scope is None else scope.state)
        try:
            return self._plans[key]
        except KeyError:
            pass
        before_selection()
        plan = SizePlan(bucket_bounds(self.name))
        if len(self._plans) > 64:  # states of old generations and closed scopes
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def _tokens_for_selection(self, args: tuple[Any, ...]) -> int | None:
        """The token count selection resolves buckets with (None: no buckets)."""
        plan = self.size_plan()
        if not plan:
            return None
        tokens = self.tokens(*args)
        if type(tokens) is int:
            return tokens
        return static_bucket_tokens(self.name, plan, tokens)

    # -- selecting --------------------------------------------------------

    def impl_for(self, args: tuple[Any, ...]) -> IrOpImpl:
        """The impl a call with ``args`` runs: the cache of the current mode, or :meth:`miss`."""
        try:
            return self._caches[selection_mode()][self.key(*args)]
        except Exception:  # a miss, an unhashable key, or arguments of the wrong shape
            return self.miss(args)

    def traced_impl(self, args: tuple[Any, ...]) -> IrOpImpl:
        """The impl a call traced from user code runs (trace-through): as
        :meth:`impl_for`, but a symbolic token count that spans buckets is guarded
        to its bucket, as a Python branch on a size would be, instead of raising
        :class:`~vllm_ir._selection.buckets.AmbiguousBucket`."""
        try:
            return self.impl_for(args)
        except AmbiguousBucket:
            tokens = guarded_bucket_tokens(self.size_plan(), self.tokens(*args))
            return self.select(args, tokens=tokens).impl

    def miss(self, args: tuple[Any, ...]) -> IrOpImpl:
        """Select for ``args`` and cache the answer (when the arguments allow it)."""
        cacheable = self.check_args(args) == "plain"
        before_selection()  # may invalidate: before reading the generation
        since = generation()
        mode = selection_mode()
        impl = self.select(args).impl
        if cacheable:
            store_if_cacheable(self._caches[mode], self.key, args, impl, since)
        return impl

    def select(self, args: tuple[Any, ...], *, tokens: int | None = _FROM_ARGS) -> Selection:
        """The uncached selection for ``args`` in the current mode, with the decision
        on each entry tried; ``tokens``: select as a call of that many tokens (the
        lowering selects each bucket of a dynamic token count so)."""
        before_selection()
        if tokens is _FROM_ARGS:
            tokens = self._tokens_for_selection(args)
        return select(
            self.name, self._impls, args, selection_mode(), lambda: describe(args), tokens=tokens
        )

    def candidates(self, args: tuple[Any, ...], *, tokens: int | None = _FROM_ARGS) -> Candidates:
        """The decision on every impl for ``args`` in the current mode (see
        :meth:`vllm_ir.IrOp.candidates`); ``tokens`` as for :meth:`select`."""
        before_selection()
        if tokens is _FROM_ARGS:
            tokens = self._tokens_for_selection(args)
        return candidates(self.name, self._impls, args, selection_mode(), tokens=tokens)

    # -- lifetime ---------------------------------------------------------

    def cache_of(self, mode: Mode) -> Mapping[Any, IrOpImpl]:
        """The selection cache of ``mode`` (read-only view: tests, benchmarks)."""
        return MappingProxyType(self._caches[mode])

    def release(self) -> None:
        """Stop tracking the caches (the op is going away)."""
        for cache in self._caches.values():
            release_cache(cache)
