"""The selection caches, their bound, and the generation that invalidates them.

Every op overload keeps plain dicts from a call's selection key to what the
call runs (plain dicts: the interpreter specializes subscripts of exact dicts
only, so a hit costs one lookup). Anything that can change a selection — a
registration, a process-wide priority, provider discovery, an explicit
:func:`invalidate_caches` — bumps the *generation* and clears every cache.

A selection is computed outside any lock (it calls ``supports_args``), so a
thread may finish selecting under priorities that another thread replaced in
the meantime. :func:`store` therefore takes the generation read *before* the
selection started and stores nothing if it has moved on: no selection made
under old priorities survives their change, in any thread.

Caches are bounded: at most :data:`MAX_ENTRIES` keys per cache; storing
into a full cache evicts the oldest entry first (insertion order), so a
workload cycling through more layouts than that re-selects, but memory stays
bounded. Keys hold only metadata (dtypes, devices, sizes, strides, scalars),
never tensors.

Before the first selection: what can add impls the first selection must see
(provider discovery) registers itself with :func:`on_before_selection`, and
every selection entry point calls :func:`before_selection` first. Discovery
thus sits above the op machinery instead of the op importing it.

Fork safety: a child forked while another thread held the lock (in an
invalidation, say) would inherit it locked, with no thread to release it.
The child therefore gets a new lock, and — since the invalidation may have
stopped half-way — starts a new generation with every cache cleared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from vllm_ir._base.runtime import RUNTIME

__all__ = [
    "MAX_ENTRIES",
    "before_selection",
    "generation",
    "invalidate_caches",
    "invalidating",
    "on_before_selection",
    "register_cache",
    "release_cache",
    "holds",
    "store",
]

MAX_ENTRIES = 1024
"""Most keys one cache holds; the oldest is evicted first beyond that."""

# the data lives on the runtime (vllm_ir._base.runtime); this module holds the rules
_state = RUNTIME.caches


def on_before_selection(hook: Callable[[], None]) -> None:
    """Run ``hook`` before every selection (it must return at once after its first run)."""
    if hook not in _state.before_selection:
        _state.before_selection.append(hook)


def before_selection() -> None:
    """Run the hooks of :func:`on_before_selection` (provider discovery, once)."""
    for hook in _state.before_selection:
        hook()


def register_cache() -> dict[Any, Any]:
    """A new selection cache that :func:`invalidate_caches` will clear."""
    cache: dict[Any, Any] = {}
    with _state.lock:
        _state.caches.append(cache)
    return cache


def release_cache(cache: dict[Any, Any]) -> None:
    """Stop tracking ``cache`` (its op was unregistered)."""
    with _state.lock:
        _state.caches[:] = [c for c in _state.caches if c is not cache]
        cache.clear()


def generation() -> int:
    """The current generation; read it before selecting, pass it to :func:`store`."""
    return _state.generation


def settled_generation() -> int:
    """The generation once any invalidation in progress has finished: a selection
    that saw new inputs compares this with the generation it started under."""
    with _state.lock:
        return _state.generation


def invalidate_caches() -> None:
    """Forget every cached selection, and re-read ``VLLM_BATCH_INVARIANT`` and
    ``VLLM_IR_PLATFORM`` at the next selection (call after changing them)."""
    with _state.lock:
        _state.clear_then_advance()


@contextlib.contextmanager
def invalidating() -> Iterator[None]:
    """Change selection inputs (priorities, registrations) in the block, then
    invalidate: atomic with respect to :func:`store`, so no thread sees the
    new inputs under the old generation."""
    with _state.lock:
        yield
        _state.clear_then_advance()


def store(cache: dict[Any, Any], key: Any, value: Any, since: int) -> bool:
    """Cache ``value`` under ``key`` unless the caches were invalidated after
    generation ``since`` (the selection may be stale); returns whether it stored."""
    with _state.lock:
        if _state.generation != since:
            return False
        if len(cache) >= MAX_ENTRIES and key not in cache:
            del cache[next(iter(cache))]
        cache[key] = value
        return True


def holds(cache: dict[Any, Any], key: Any, value: Any, since: int) -> bool:
    """Whether ``cache`` still maps ``key`` to ``value`` in generation ``since``
    (waits for a change in progress, so it never sees its inputs half-updated)."""
    with _state.lock:
        return _state.generation == since and key in cache and cache[key] is value
