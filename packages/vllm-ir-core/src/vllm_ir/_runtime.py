"""The process's vllm-ir state, in one owner: :data:`RUNTIME`.

Everything a selection depends on besides its arguments and the scoped
priorities lives on one object, as a plugin manager owns its plugins:

- ``ops``: the declared IR ops by name (:attr:`vllm_ir.IrOp.registry` is a
  read-only view);
- ``caches``: every selection cache, their lock, the *generation* that
  invalidates them and the before-selection hooks (:mod:`vllm_ir._cache`);
- ``discovery``: what provider discovery loaded, what failed, and the load in
  progress (:mod:`vllm_ir._providers`);
- ``priorities``: the process-wide priorities and the platform defaults
  (:mod:`vllm_ir.priority`).

The modules named above hold the rules; this one holds the data, imports
nothing of vllm-ir, and is the place a test or a tool looks to see the whole
state. There is one default instance per process.

>>> from vllm_ir._runtime import RUNTIME
>>> import vllm_ir as ir
>>> RUNTIME.ops["rms_norm"] is ir.ops.rms_norm
True
>>> RUNTIME.caches.generation >= 0
True
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RUNTIME", "CacheState", "DiscoveryState", "PriorityStore", "Runtime"]


@dataclass
class CacheState:
    """The selection caches and their generation (rules: :mod:`vllm_ir._cache`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    caches: list[dict[Any, Any]] = field(default_factory=list)
    generation: int = 0
    """Read without the lock on the miss path (an int read is atomic)."""
    before_selection: list[Any] = field(default_factory=list)
    """Hooks run before every selection (provider discovery registers one)."""


@dataclass
class DiscoveryState:
    """What provider discovery did (rules: :mod:`vllm_ir._providers`)."""

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


@dataclass
class PriorityStore:
    """Process-wide priorities and platform defaults (rules: :mod:`vllm_ir.priority`)."""

    process: Any = None
    """The process-wide ``PriorityState`` (replaced whole, never edited)."""
    platform_defaults: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Source (a provider or platform package) -> its ``PlatformDefaults``."""


@dataclass
class Runtime:
    """The ops, selection caches, discovery state and priorities of one process."""

    ops: dict[str, Any] = field(default_factory=dict)
    caches: CacheState = field(default_factory=CacheState)
    discovery: DiscoveryState = field(default_factory=DiscoveryState)
    priorities: PriorityStore = field(default_factory=PriorityStore)


RUNTIME = Runtime()
"""The process's runtime (the only instance vllm-ir itself uses)."""
