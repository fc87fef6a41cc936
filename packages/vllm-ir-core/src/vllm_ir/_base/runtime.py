"""The process's vllm-ir state, in one owner: :data:`RUNTIME`.

Everything a selection depends on besides its arguments and the scoped
priorities lives on one object, as a plugin manager owns its plugins:

- ``ops``: the declared IR ops by name (:attr:`vllm_ir.IrOp.registry` is a
  read-only view);
- ``caches``: every selection cache, their lock, the *generation* that
  invalidates them and the before-selection hooks (:mod:`vllm_ir._base.cache`);
- ``discovery``: what provider discovery loaded, what failed, and the load in
  progress (:mod:`vllm_ir._discovery.providers`);
- ``priorities``: the process-wide priorities and the platform defaults
  (:mod:`vllm_ir.priority`);
- ``platforms``: the registered platforms and the cached detection
  (:mod:`vllm_ir._base.platform`);
- ``compiled_eager``: the compiled calls of impls run compiled in eager mode
  (:mod:`vllm_ir._selection.compiled_eager`);
- ``eager_calls``: every op's generated eager call
  (:mod:`vllm_ir._selection.eager`);
- ``snapshot_contributors`` and ``torch_wrap_hooks``: who snapshots state for
  a registration rollback (:mod:`vllm_ir._base.registration`) and who rebuilds
  wrappers when trace-through changes (:mod:`vllm_ir._base.torch_wrap`).

The modules named above hold the rules; this one holds the data, imports
nothing of vllm-ir, and is the place a test or a tool looks to see the whole
state. There is one default instance per process, and one after-fork hook
(:meth:`Runtime.after_fork_in_child`): a lock held at ``fork()`` by a thread
the child does not have would stay held in the child for ever.

>>> from vllm_ir._base.runtime import RUNTIME
>>> import vllm_ir as ir
>>> RUNTIME.ops["rms_norm"] is ir.ops.rms_norm
True
>>> RUNTIME.caches.generation >= 0
True
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RUNTIME",
    "CacheState",
    "CompiledEagerState",
    "DiscoveryState",
    "PlatformState",
    "PriorityStore",
    "Runtime",
]


@dataclass
class CacheState:
    """The selection caches and their generation (rules: :mod:`vllm_ir._base.cache`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    caches: list[dict[Any, Any]] = field(default_factory=list)
    generation: int = 0
    """Read without the lock on the miss path (an int read is atomic)."""
    before_selection: list[Any] = field(default_factory=list)
    """Hooks run before every selection (provider discovery registers one)."""

    def clear_then_advance(self) -> None:
        """Empty every cache, then advance the generation; the caller holds ``lock``.

        Clear first: a lock-free reader that sees the new generation must not
        find a previous generation's entry still in a cache and store it again
        as current.
        """
        for cache in self.caches:
            cache.clear()
        self.generation += 1

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.clear_then_advance()


@dataclass
class DiscoveryState:
    """What provider discovery did (rules: :mod:`vllm_ir._discovery.providers`)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    loaded_once: bool = False
    loading: bool = False
    loaded: dict[str, Any] = field(default_factory=dict)
    """Entry-point name -> ``LoadedProvider``."""
    errors: dict[str, Any] = field(default_factory=dict)
    """Entry-point name -> ``ProviderLoadError``."""
    registrations: dict[str, Any] = field(default_factory=dict)
    """Entry-point name -> the ``RegistrationLog`` of what it registered."""
    in_progress: tuple[str, str, float] | None = None
    """The provider loading now: entry point, package, start time."""
    current_log: Any = None
    """The registrations of the provider loading now."""

    def after_fork_in_child(self) -> None:
        """Discovery usable in a child forked while another thread ran it."""
        if self.lock._is_owned():  # type: ignore[attr-defined]
            return  # this thread was discovering: it carries on in the child
        self.lock = threading.RLock()
        if not self.loading:
            return
        # the discovering thread does not exist here: undo its half-made
        # provider and let the child's first call discover again
        log, self.current_log = self.current_log, None
        if log is not None:
            log.remove()
        self.loading = False
        self.loaded_once = False
        self.in_progress = None


@dataclass
class PriorityStore:
    """Process-wide priorities and platform defaults (rules: :mod:`vllm_ir.priority`)."""

    process: Any = None
    """The process-wide ``PriorityState`` (replaced whole, never edited)."""
    applied: tuple[Any, ...] = ()
    """The process-wide settings it folds, in order (``vllm_ir.priority._Applied``)."""
    process_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the process-wide settings change."""
    platform_defaults: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Source (a provider or platform package) -> its ``PlatformDefaults``."""
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Tuned layer (``vllm_ir.priority.TUNED_LAYERS``) -> source -> its table (op -> entry)."""
    tuned_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a tuned table is added or removed."""
    tuned_files_loaded: bool = False
    """Whether ``VLLM_IR_TUNING_FILE`` and the local tuning cache were read (once)."""
    tuned_files_lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while they are read (re-entered by a selection their loading makes)."""
    tuned_files_loading: bool = False
    tuned_files_applied: list[Any] = field(default_factory=list)
    """The handles of what that load applied (undone if a fork cut it short)."""
    tuning_file_locks: dict[int, int] = field(default_factory=dict)
    """Lock file descriptor of a tuning-file writer (``flock``) -> the thread holding it."""
    scope_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a priority scope closes (its children refresh with it)."""
    intern_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a ``PriorityState`` is interned."""

    def after_fork_in_child(self) -> None:
        """The tuning files loadable and writable in a child forked while another
        thread loaded or wrote them (that thread does not exist in the child)."""
        me = threading.get_ident()
        for fd, holder in list(self.tuning_file_locks.items()):
            if holder != me:
                # flock belongs to the open file: the child's copy would hold the
                # lock for as long as the child lives, against its own writes too
                del self.tuning_file_locks[fd]
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.tuned_files_lock._is_owned():  # type: ignore[attr-defined]
            return  # this thread was loading: it carries on in the child
        self.tuned_files_lock = threading.RLock()
        if self.tuned_files_loading:
            # the child's first selection loads again (undoing what was applied)
            self.tuned_files_loading = False
            self.tuned_files_loaded = False


@dataclass
class PlatformState:
    """Registered platforms and the detection (rules: :mod:`vllm_ir._base.platform`)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    registered: dict[str, Any] = field(default_factory=dict)
    """Platform name -> ``RegisteredPlatform``."""
    detected: list[str] = field(default_factory=list)
    """The cached detection: one name, or empty before the first."""


@dataclass
class CompiledEagerState:
    """Compiled calls of impls run compiled in eager mode
    (rules: :mod:`vllm_ir._selection.compiled_eager`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    variants: dict[Any, dict[Any, Any]] = field(default_factory=dict)
    """``(op name, impl)`` -> compiled call per argument key (None: not compilable)."""


@dataclass
class Runtime:
    """The ops, selection caches, discovery state and priorities of one process."""

    ops: dict[str, Any] = field(default_factory=dict)
    caches: CacheState = field(default_factory=CacheState)
    discovery: DiscoveryState = field(default_factory=DiscoveryState)
    priorities: PriorityStore = field(default_factory=PriorityStore)
    platforms: PlatformState = field(default_factory=PlatformState)
    compiled_eager: CompiledEagerState = field(default_factory=CompiledEagerState)
    eager_calls: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    """Every op's generated eager call (``EagerCall``), rebuilt when trace-through changes."""
    snapshot_contributors: list[Any] = field(default_factory=list)
    """Functions that snapshot state for a registration rollback."""
    torch_wrap_hooks: list[Any] = field(default_factory=list)
    """Called with the new trace-through setting."""

    def after_fork_in_child(self) -> None:
        """Every lock new, the caches of the parent dropped, a half-done provider
        load undone: the one ``os.register_at_fork`` hook of vllm-ir."""
        self.caches.after_fork_in_child()
        self.discovery.after_fork_in_child()
        self.priorities.scope_lock = threading.Lock()
        self.priorities.process_lock = threading.Lock()
        self.priorities.intern_lock = threading.Lock()
        self.priorities.after_fork_in_child()
        self.priorities.tuned_lock = threading.Lock()
        self.platforms.lock = threading.RLock()
        self.compiled_eager.lock = threading.Lock()


RUNTIME = Runtime()
"""The process's runtime (the only instance vllm-ir itself uses)."""

os.register_at_fork(after_in_child=lambda: RUNTIME.after_fork_in_child())
