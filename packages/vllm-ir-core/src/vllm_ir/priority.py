"""Priority lists: who asked for which provider, and the effective order.

The effective list of an op is, in order:

1. the user's providers (scoped with :meth:`IrOp.set_priority` /
   :meth:`IrOpPriorityConfig.scope`, else process-wide via ``apply()``),
2. the platform defaults contributed by installed providers, minus those
   already named, for the selection mode (``eager`` or ``compiled``),
3. ``native``, unless already named.

Scoped state lives in one :class:`contextvars.ContextVar`, so each thread and
each asyncio task sees its own scopes; threads without a scope see the
process-wide priorities. The same variable holds the selection mode
(:func:`compiled_selection`), so the eager cache keys on both with one read.

The variable holds a :class:`Scope` per open ``with`` block, whose ``state``
is the interned :class:`PriorityState` in force (what caches key on). A
generator that holds a scope across ``yield`` shares its caller's context,
so scopes can close out of order (two interleaved streaming generators) or
from another context (a generator finalized by another thread or task),
where ``ContextVar.reset`` cannot restore the caller. Such a close marks the
scope closed: its ``state``, and that of every scope opened inside it,
becomes the state without it, in every context that still holds it, so the
caller's priorities are restored either way and no error is raised.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from vllm_ir._base.cache import before_selection, invalidating
from vllm_ir._base.platform import current_platform, platform_problem
from vllm_ir._base.registration import RegistrationHandle, on_snapshot, record
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._base.text import typed_repr
from vllm_ir._schema.impl import NATIVE
from vllm_ir._selection.buckets import (
    BucketedPriority,
    PrioritySpec,
    as_priority,
    merged_bounds,
    priority_for_tokens,
)

__all__ = [
    "Mode",
    "PlatformDefaults",
    "PriorityEntry",
    "PriorityState",
    "Scope",
    "TUNED_LAYERS",
    "add_platform_defaults",
    "add_tuned_table",
    "bucket_bounds",
    "compiled_selection",
    "current_state",
    "effective_priority",
    "freeze_priority",
    "platform_default_contributions",
    "process_priorities",
    "remove_platform_defaults",
    "scoped_priority",
    "scoped_state",
    "selection_mode",
    "selection_mode_scope",
    "apply_process_priority",
    "isolated_process_priorities",
    "set_process_priority",
    "tuned_contributions",
    "user_priority",
    "without_tuned_tables",
]

Mode = Literal["eager", "compiled"]
MODES: tuple[Mode, ...] = ("eager", "compiled")


@dataclass(frozen=True)
class PriorityEntry:
    """One provider of an effective priority list and where it came from."""

    provider: str
    source: str


@dataclass(frozen=True)
class PlatformDefaults:
    """Default priorities a provider contributes for one platform.

    ``eager`` applies to eager mode and Dynamo-only compilation; ``compiled``
    applies when Inductor compiles the graph, where ``native`` usually comes
    first because Inductor fuses it and opaque kernels are fusion barriers.
    Contributions from several providers are merged by descending ``rank``,
    then by provider package name, keeping the first occurrence of each entry.

    >>> PlatformDefaults("cuda", eager={"rms_norm": ["vllm_c"]}).eager
    {'rms_norm': ['vllm_c']}
    """

    platform: str
    eager: Mapping[str, Sequence[str] | BucketedPriority] = field(default_factory=dict)
    compiled: Mapping[str, Sequence[str] | BucketedPriority] = field(default_factory=dict)
    rank: int = 0

    def __post_init__(self) -> None:
        # checked here, not at selection: a malformed entry would otherwise
        # break every call of the ops it names, in every thread
        where = f"PlatformDefaults({self.platform!r})"
        problem = platform_problem(self.platform)  # built in, declared or installed
        if problem is not None:
            raise ValueError(
                f"PlatformDefaults.platform {problem}, got {typed_repr(self.platform)}"
            )
        if isinstance(self.rank, bool) or not isinstance(self.rank, int):
            raise TypeError(f"{where}.rank must be an int, got {typed_repr(self.rank)}")
        for mode in MODES:
            table = getattr(self, mode)
            if not isinstance(table, Mapping):
                raise TypeError(
                    f"{where}.{mode} must map op names to lists of provider names, "
                    f"got {typed_repr(table)}"
                )
            checked: dict[str, list[str] | BucketedPriority] = {}
            for op_name, providers in table.items():
                if not isinstance(op_name, str):
                    raise TypeError(
                        f"{where}.{mode} keys must be op names, got {typed_repr(op_name)}"
                    )
                spec = as_priority(providers, f"{where}.{mode}[{op_name!r}]")
                # a plain list stays a list, as given; buckets are validated once, here
                checked[op_name] = spec if isinstance(spec, BucketedPriority) else list(spec)
            object.__setattr__(self, mode, checked)

    def for_mode(self, mode: Mode) -> Mapping[str, Sequence[str] | BucketedPriority]:
        return self.eager if mode == "eager" else self.compiled


# the data lives on the runtime (vllm_ir._base.runtime); this module holds the rules
_store = RUNTIME.priorities


class PriorityState:
    """An immutable, interned set of user priorities (op name -> providers),
    and the selection mode they apply in.

    Interning makes equal states the same object, so selection caches can key
    on identity while repeated scopes with the same lists keep hitting them.
    An op's entry is a tuple of providers, or a :class:`BucketedPriority`.
    """

    __slots__ = ("__weakref__", "mode", "origin", "priorities")
    # weak: a state lives while a scope or a cached selection holds it
    _interned: ClassVar[weakref.WeakValueDictionary[tuple[object, ...], PriorityState]] = (
        weakref.WeakValueDictionary()
    )

    priorities: Mapping[str, PrioritySpec]
    origin: str
    mode: Mode

    def __new__(
        cls,
        priorities: Mapping[str, Sequence[str] | BucketedPriority],
        origin: str,
        mode: Mode = "eager",
    ) -> PriorityState:
        frozen = {op: _frozen(spec) for op, spec in sorted(priorities.items())}
        key = (origin, mode, *frozen.items())
        with _store.intern_lock:
            state = cls._interned.get(key)
            if state is None:
                state = object.__new__(cls)
                state.priorities = frozen
                state.origin = origin
                state.mode = mode
                cls._interned[key] = state
        return state

    def __repr__(self) -> str:
        return (
            f"PriorityState({dict(self.priorities)!r}, origin={self.origin!r}, mode={self.mode!r})"
        )


def freeze_priority(spec: object) -> PrioritySpec:
    """A hashable entry: buckets as they are, a list of names as a tuple, bucket
    objects (the JSON form) as :class:`BucketedPriority` (validated)."""
    if isinstance(spec, BucketedPriority):
        return spec
    return as_priority(spec, "priority")


_frozen = freeze_priority


_EMPTY_PROCESS = PriorityState({}, "user (process-wide)")
_EMPTY_SCOPE = PriorityState({}, "user (scoped)")
_store.process = _EMPTY_PROCESS
_store.applied = ()


class Scope:
    """One open priority or mode scope: what it overrides, and the state in force.

    ``state`` is ``parent``'s state with ``overrides`` and ``mode`` applied
    while the scope is open, and ``parent``'s state once it was closed out of
    order or from another context (``None``: no scope, eager mode).
    """

    __slots__ = ("__weakref__", "children", "closed", "mode", "overrides", "parent", "state")

    def __init__(
        self,
        parent: Scope | None,
        overrides: Mapping[str, PrioritySpec] | None,
        mode: Mode | None,
    ) -> None:
        self.parent = parent
        self.overrides = overrides
        self.mode = mode
        self.closed = False
        # weak, so a long-lived outer scope does not keep every inner one alive;
        # dead entries are pruned whenever the list doubles
        self.children: list[weakref.ref[Scope]] = []
        self.state: PriorityState | None = None
        with _store.scope_lock:  # a concurrent close of the parent refreshes this one too
            if parent is not None:
                parent._adopt(self)
            self._refresh()

    def _adopt(self, child: Scope) -> None:
        children = self.children
        children.append(weakref.ref(child))
        if len(children) >= 64 and len(children) & (len(children) - 1) == 0:
            children[:] = [c for c in children if c() is not None]

    def _refresh(self) -> None:
        base = self.parent.state if self.parent is not None else None
        if self.closed:
            self.state = base
            return
        outer = base or _EMPTY_SCOPE
        if self.overrides is None:  # a mode scope keeps the outer priorities and origin
            self.state = PriorityState(outer.priorities, outer.origin, self.mode or outer.mode)
        else:
            merged = {**outer.priorities, **self.overrides}
            self.state = PriorityState(merged, "user (scoped)", outer.mode)

    def close_elsewhere(self) -> None:
        """Close out of order: this scope and those opened inside it stop applying it."""
        with _store.scope_lock:
            self.closed = True
            pending = [self]
            while pending:  # parents before children
                scope = pending.pop()
                scope._refresh()
                pending.extend(c for ref in scope.children if (c := ref()) is not None)


# None: no scope and eager mode, the common case, cheap to key on
_scoped_state: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "vllm_ir_scoped_priority", default=None
)


def scoped_state_var() -> contextvars.ContextVar[Scope | None]:
    """The context variable holding the innermost open :class:`Scope`
    (``None``: no scope, eager mode); its ``.state`` is the scoped state and
    mode in force. Selection depends on the process-wide state only through
    it and this variable, so caches key on that state."""
    return _scoped_state


def scoped_state() -> PriorityState | None:
    """The scoped state in force in this context (``None``: no scope, eager mode)."""
    scope = _scoped_state.get()
    return None if scope is None else scope.state


def current_state() -> PriorityState:
    """The scoped user priorities in force in this context (empty outside scopes)."""
    return scoped_state() or _EMPTY_SCOPE


def user_priority(op_name: str) -> tuple[PrioritySpec, str]:
    """The user's entry for ``op_name`` (providers, or buckets) and its origin: the
    innermost scope naming the op, else the process-wide setting (empty if neither)."""
    scoped = scoped_state()
    if scoped is not None and op_name in scoped.priorities:
        return scoped.priorities[op_name], scoped.origin
    return _store.process.priorities.get(op_name, ()), _store.process.origin


@contextlib.contextmanager
def _open_scope(overrides: Mapping[str, PrioritySpec] | None, mode: Mode | None) -> Iterator[Scope]:
    scope = Scope(_scoped_state.get(), overrides, mode)
    token = _scoped_state.set(scope)
    try:
        yield scope
    finally:
        _exit_scope(scope, token)


def _exit_scope(scope: Scope, token: contextvars.Token[Scope | None]) -> None:
    """Restore the state outside ``scope``, however it is being closed.

    In order, in the context that opened it: ``reset`` (other contexts that
    copied this one keep the scope, as context variables do). Out of order
    (a generator's scope closed while a later one is open) or from another
    context (``reset`` refuses the token): the scope is marked closed, so
    every context holding it or a scope inside it stops applying it.
    """
    if _scoped_state.get() is scope:
        try:
            _scoped_state.reset(token)
            return
        except ValueError:  # the token belongs to another context (a copy of it)
            pass
    scope.close_elsewhere()


@contextlib.contextmanager
def scoped_priority(
    priorities: Mapping[str, Sequence[str] | BucketedPriority],
) -> Iterator[PriorityState]:
    """Within the block, ``priorities`` override the current lists op by op.

    Nestable; the previous state is restored on exit, exceptions included,
    also when the block is a generator's, suspended across ``yield`` and
    closed out of order or from another context (see the module doc). Ops
    the scopes do not name keep following the process-wide lists, even
    when those change while the scope is open. Callers validate op and
    provider names first (see ``IrOpPriorityConfig``).
    """
    overrides = {op: _frozen(p) for op, p in priorities.items()}
    scope = Scope(_scoped_state.get(), overrides, None)
    token = _scoped_state.set(scope)
    try:
        yield scope.state  # type: ignore[misc]
    finally:
        _exit_scope(scope, token)


@dataclass(frozen=True, eq=False)
class _Applied:
    """One process-wide setting: its lists, whether it drops those set before it,
    whether a handle may take it back, and the thread that made it."""

    priorities: Mapping[str, PrioritySpec]
    replace: bool
    removable: bool
    thread: int = field(default_factory=threading.get_ident)


def _publish(applied: tuple[_Applied, ...]) -> None:
    """Make ``applied`` the process-wide settings (the caller holds ``process_lock``).

    The lists in force are the settings folded in order: each one's lists over
    the ones before, or alone where it replaces them. Settings no handle can
    take back end the history before a replacing one.
    """
    for i in reversed(range(len(applied))):
        if applied[i].replace and not applied[i].removable:
            applied = applied[i:]
            break
    merged: dict[str, PrioritySpec] = {}
    for setting in applied:
        if setting.replace:
            merged = {}
        merged.update(setting.priorities)
    state = PriorityState(merged, "user (process-wide)")
    # a selection that read the generation before this may see either state;
    # store() refuses it either way
    with invalidating():
        _store.applied = applied
        _store.process = state


def apply_process_priority(
    priorities: Mapping[str, Sequence[str] | BucketedPriority], *, replace: bool = False
) -> Callable[[], None]:
    """Set priorities for every thread; returns the function that takes back
    exactly this setting, in any order with others (what ``apply()``'s handle calls).

    >>> undo_a = apply_process_priority({"rms_norm": ["native"]})
    >>> undo_b = apply_process_priority({"silu_and_mul": ["native"]})
    >>> undo_a(); sorted(process_priorities())
    ['silu_and_mul']
    >>> undo_b(); sorted(process_priorities())
    []
    """
    setting = _Applied({op: _frozen(p) for op, p in priorities.items()}, replace, True)
    with _store.process_lock:  # read-modify-write: concurrent settings all land
        _publish((*_store.applied, setting))

    def take_back() -> None:
        with _store.process_lock:
            if setting in _store.applied:
                _publish(tuple(s for s in _store.applied if s is not setting))

    return take_back


def set_process_priority(
    priorities: Mapping[str, Sequence[str] | BucketedPriority], *, replace: bool = False
) -> None:
    """Set priorities for every thread, for the ops its scopes do not name.

    ``replace=True`` drops the lists of ops not in ``priorities``;
    ``set_process_priority({}, replace=True)`` clears them all, the settings of
    live ``apply()`` handles included. No handle takes this setting back.
    """
    setting = _Applied({op: _frozen(p) for op, p in priorities.items()}, replace, False)
    with _store.process_lock:
        applied = _store.applied
        last = applied[-1] if applied else None
        if last is not None and not last.removable and not replace:
            # two settings no one takes back are one: the history stays short
            setting = _Applied({**last.priorities, **setting.priorities}, last.replace, False)
            applied = applied[:-1]
        _publish((*applied, setting))


@contextlib.contextmanager
def isolated_process_priorities() -> Iterator[None]:
    """No process-wide list within the block; after it, the settings before it,
    each still taken back by its handle."""
    with _store.process_lock:
        saved = _store.applied
        _publish(())
    try:
        yield
    finally:
        with _store.process_lock:
            _publish(saved)


def process_priorities() -> Mapping[str, PrioritySpec]:
    """The process-wide user lists (op name -> providers) set with ``apply()``."""
    return _store.process.priorities


def selection_mode() -> Mode:
    """``compiled`` while the lowering pass selects impls, else ``eager``."""
    return current_state().mode


@contextlib.contextmanager
def selection_mode_scope(mode: Mode) -> Iterator[None]:
    """Within the block, select as ``mode`` (keeping the scoped priorities)."""
    if mode not in MODES:
        raise ValueError(f"selection mode must be one of {', '.join(MODES)}, got {mode!r}")
    if current_state().mode == mode:
        yield
        return
    with _open_scope(None, mode):
        yield


@contextlib.contextmanager
def compiled_selection() -> Iterator[None]:
    """Select with the platform defaults for Inductor-compiled graphs.

    The eager call path honours it too: ``op(x)`` inside the block runs what
    the lowering pass would select.
    """
    with selection_mode_scope("compiled"):
        yield


def add_platform_defaults(source: str, defaults: Sequence[PlatformDefaults]) -> None:
    """Record the default priorities contributed by provider package ``source``.

    Undone with the rest of a provider's registrations if its load fails.
    """
    defaults = tuple(defaults)
    for d in defaults:
        if not isinstance(d, PlatformDefaults):
            raise TypeError(
                f"platform defaults of {source!r} must be "
                f"vllm_ir.provider.PlatformDefaults, got {typed_repr(d)}"
            )
    previous = _store.platform_defaults.get(source)
    with invalidating():
        _store.platform_defaults[source] = defaults

    def undo() -> None:
        if _store.platform_defaults.get(source) is defaults:
            if previous is None:
                remove_platform_defaults(source)
            else:
                with invalidating():
                    _store.platform_defaults[source] = previous

    record(RegistrationHandle(f"platform defaults of {source!r}", undo))


TUNED_LAYERS = ("tuning file", "tuning cache", "provider table")
"""The tuned layers, highest first, between the user's settings and the platform
defaults; they apply in eager mode (what ``vllm-ir tune`` measures), not under
Inductor, where the compiled defaults and autotuning choose."""


def add_tuned_table(
    layer: str, source: str, table: Mapping[str, Sequence[str] | BucketedPriority]
) -> RegistrationHandle:
    """Set ``source``'s table (op -> providers or buckets) in the tuned ``layer``
    (one of :data:`TUNED_LAYERS`), replacing what ``source`` had there. Within a
    layer the table added last comes first. The handle removes the table (if it
    is still the one there); undone with a provider's registrations if its load
    fails."""
    if layer not in TUNED_LAYERS:
        raise ValueError(f"tuned layer must be one of {', '.join(TUNED_LAYERS)}, got {layer!r}")
    frozen = {
        op: _frozen(as_priority(spec, f"{layer} {source}: {op}")) for op, spec in table.items()
    }
    # copy on write: a selection in another thread may be reading the tables
    with _store.tuned_lock, invalidating():
        others = {s: t for s, t in _store.tuned.get(layer, {}).items() if s != source}
        _store.tuned = {**_store.tuned, layer: {source: frozen, **others}}

    def undo() -> None:
        with _store.tuned_lock:
            sources = _store.tuned.get(layer, {})
            if sources.get(source) is frozen:
                kept = {s: t for s, t in sources.items() if s != source}
                with invalidating():
                    _store.tuned = {**_store.tuned, layer: kept}

    handle = RegistrationHandle(f"{layer} {source!r}", undo)
    record(handle)
    return handle


def tuned_contributions(op_name: str, mode: Mode) -> list[tuple[str, PrioritySpec]]:
    """``(origin, providers or buckets)`` of the tuned layers for ``op_name``,
    highest first (none under Inductor: see :data:`TUNED_LAYERS`)."""
    if mode != "eager":
        return []
    tuned = _store.tuned  # one snapshot: replaced whole, never edited
    return [
        (f"{layer} {source}", table[op_name])
        for layer in TUNED_LAYERS
        for source, table in tuned.get(layer, {}).items()
        if op_name in table
    ]


@contextlib.contextmanager
def without_tuned_tables() -> Iterator[None]:
    """The tuned layers set aside for the block: ``vllm-ir tune`` measures against
    the defaults, not against the table it is producing. The tables a first
    selection would load (``VLLM_IR_TUNING_FILE``, the local cache) are loaded
    first, so they are set aside too."""
    before_selection()
    with _store.tuned_lock, invalidating():
        saved, _store.tuned = _store.tuned, {}
    try:
        yield
    finally:
        with _store.tuned_lock, invalidating():
            _store.tuned = saved


def remove_platform_defaults(source: str) -> None:
    if source in _store.platform_defaults:
        with invalidating():
            _store.platform_defaults.pop(source, None)


def platform_default_contributions(
    op_name: str, mode: Mode, platform: str | None = None
) -> list[tuple[str, PrioritySpec, int]]:
    """``(source, providers or buckets, rank)`` for ``op_name``, in merge order."""
    platform = platform or current_platform()
    found = [
        (source, _frozen(d.for_mode(mode)[op_name]), d.rank)
        for source, contributions in _store.platform_defaults.items()
        for d in contributions
        if d.platform == platform and op_name in d.for_mode(mode)
    ]
    return sorted(found, key=lambda item: (-item[2], item[0]))


def effective_priority(
    op_name: str,
    mode: Mode | None = None,
    *,
    state: PriorityState | None = None,
    platform: str | None = None,
    tokens: int | None = None,
) -> tuple[PriorityEntry, ...]:
    """The ordered providers to try for ``op_name``, each with its origin.

    The layers, highest first: the user's entry (a scope, else the process-wide
    setting), the tuned layers (:data:`TUNED_LAYERS`, eager mode), every platform
    default by rank, the native fallback. Each source is resolved for a call of
    ``tokens`` tokens first, then they are merged: a bucketed source
    contributes the providers of the bucket the call falls into. ``tokens=None``
    (no call in view) resolves bucketed sources to their catch-all bucket.

    >>> [e.provider for e in effective_priority("some_op", "eager", platform="cpu")]
    ['native']
    """
    mode = mode or selection_mode()
    platform = platform or current_platform()
    entries: list[PriorityEntry] = []
    seen: set[str] = set()

    def add(provider: str, source: str) -> None:
        if provider not in seen:
            seen.add(provider)
            entries.append(PriorityEntry(provider, source))

    user, origin = _user_entry(op_name, state)
    for provider in priority_for_tokens(user, tokens):
        add(provider, origin)
    for tuned_origin, spec in tuned_contributions(op_name, mode):
        for provider in priority_for_tokens(spec, tokens):
            add(provider, tuned_origin)
    for source, spec, _rank in platform_default_contributions(op_name, mode, platform):
        for provider in priority_for_tokens(spec, tokens):
            add(provider, f"{platform} {mode} default of {source}")
    add(NATIVE, "native fallback")
    return tuple(entries)


def _user_entry(op_name: str, state: PriorityState | None) -> tuple[PrioritySpec, str]:
    if state is None:
        return user_priority(op_name)
    return state.priorities.get(op_name, ()), state.origin


def bucket_bounds(
    op_name: str,
    mode: Mode | None = None,
    *,
    state: PriorityState | None = None,
    platform: str | None = None,
) -> tuple[int, ...]:
    """The bucket bounds of ``op_name``'s effective table: the union of every
    source's bounds (empty: one list for every size). Within each bucket
    :func:`effective_priority` gives one list."""
    mode = mode or selection_mode()
    platform = platform or current_platform()
    user, _origin = _user_entry(op_name, state)
    tuned = [spec for _o, spec in tuned_contributions(op_name, mode)]
    defaults = [spec for _s, spec, _r in platform_default_contributions(op_name, mode, platform)]
    return merged_bounds([user, *tuned, *defaults])


def _snapshot_process_priorities() -> Callable[[], str | None]:
    before = set(_store.applied)
    thread = threading.get_ident()

    def restore() -> str | None:
        # the settings this thread made since: another thread's stay
        with _store.process_lock:
            kept = tuple(s for s in _store.applied if s in before or s.thread != thread)
            if kept == _store.applied:
                return None
            _publish(kept)
        return "process-wide priorities"

    return restore


def _snapshot_tuned_tables() -> Callable[[], str | None]:
    before = {layer: dict(sources) for layer, sources in _store.tuned.items()}

    def restore() -> str | None:
        now = {layer: sources for layer, sources in _store.tuned.items() if sources}
        if now == {layer: sources for layer, sources in before.items() if sources}:
            return None
        with invalidating():
            _store.tuned = before
        return "tuned tables"

    return restore


# a failed provider load puts back the process-wide priorities it changed
on_snapshot(_snapshot_process_priorities)
on_snapshot(_snapshot_tuned_tables)
