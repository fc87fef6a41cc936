"""Registrations as undoable handles, and recording them to roll a provider back.

Every registration vllm-ir offers (an op, an impl, an input generator, platform
defaults) records a :class:`RegistrationHandle` in the active
:func:`recording_registrations` scope. Provider discovery loads each provider
inside such a scope; if the load fails, everything it registered is undone, in
reverse order, together with the state it may have changed directly (tolerance
tables, process-wide priorities, ``torch.library`` definitions), which is
snapshotted when the scope opens and restored where it differs.

Tests use the same scope to register freely and undo it all afterwards:

>>> import torch, vllm_ir as ir
>>> from vllm_ir.provider import recording_registrations
>>> with recording_registrations("doc") as log:
...     @ir.ops.rms_norm.register_impl("doc_kernel")
...     def doc_kernel(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
...                    variance_size: int | None = None) -> torch.Tensor:
...         return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)
>>> "doc_kernel" in ir.ops.rms_norm.impls
True
>>> log.remove()
>>> "doc_kernel" in ir.ops.rms_norm.impls
False
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from vllm_ir._base import torch_private as _torch_private
from vllm_ir._base.logger import get_logger
from vllm_ir._base.runtime import RUNTIME

__all__ = [
    "RegistrationHandle",
    "RegistrationLog",
    "current_registration_log",
    "on_snapshot",
    "record",
    "recording_registrations",
]

logger = get_logger(__name__)


class RegistrationHandle:
    """Undoes one registration: :meth:`remove` (alias :meth:`destroy`), once.

    Modelled on ``torch.library``'s ``RegistrationHandle`` and pluggy's
    ``unregister``: whoever registered something can take it back without
    knowing how it is stored.
    """

    __slots__ = ("_lock", "_undo", "description")

    def __init__(self, description: str, undo: Callable[[], None]) -> None:
        self.description = description
        self._undo: Callable[[], None] | None = undo
        self._lock = threading.Lock()

    @property
    def removed(self) -> bool:
        return self._undo is None

    def remove(self) -> None:
        """Undo the registration; later calls do nothing."""
        with self._lock:
            undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    destroy = remove  # torch's spelling

    def __repr__(self) -> str:
        state = "removed" if self.removed else "active"
        return f"RegistrationHandle({self.description}, {state})"


Restore = Callable[[], "str | None"]
"""Puts one piece of state back as it was; returns what it restored (``None``: unchanged)."""

_contributors: list[Callable[[], Restore]] = RUNTIME.snapshot_contributors  # data: the runtime


def on_snapshot(capture: Callable[[], Restore]) -> None:
    """Add state that a failed provider load rolls back, besides its registrations.

    ``capture()`` is called when a :func:`recording_registrations` scope opens
    and returns the function that restores what it captured. The modules that
    own such state (tolerance tables, process-wide priorities) register here,
    so this module imports nothing of vllm-ir.
    """
    _contributors.append(capture)


@dataclass
class _Snapshot:
    """State that code can change without a registration call, as it was before a load."""

    restores: list[Restore]
    torch_defs: frozenset[str]
    torch_impls: frozenset[str]

    @classmethod
    def take(cls) -> _Snapshot:
        return cls(
            restores=[capture() for capture in _contributors],
            torch_defs=_torch_private.defined_ops(),
            torch_impls=_torch_private.implemented_ops(),
        )

    def restore(self) -> list[str]:
        """Put back what changed since :meth:`take`; returns what was restored."""
        restored: list[str] = []
        for put_back in self.restores:
            what = put_back()
            if what:
                restored.append(what)
        new_defs = set(_torch_private.defined_ops() - self.torch_defs)
        new_impls = set(_torch_private.implemented_ops() - self.torch_impls)
        if new_defs or new_impls:
            restored += _torch_private.destroy_libraries_defining(new_defs, new_impls)
        return restored


@dataclass
class RegistrationLog:
    """The handles recorded in one :func:`recording_registrations` scope."""

    package: str | None
    handles: list[RegistrationHandle] = field(default_factory=list)

    def remove(self) -> None:
        """Undo every recorded registration, newest first; keeps going past failures."""
        for handle in reversed(self.handles):
            try:
                handle.remove()
            except Exception as e:  # one failed undo must not leave the rest in place
                logger.warning("undoing %s failed: %s: %s", handle.description, type(e).__name__, e)


_current: contextvars.ContextVar[RegistrationLog | None] = contextvars.ContextVar(
    "vllm_ir_registration_log", default=None
)


def current_registration_log() -> RegistrationLog | None:
    """The log of the innermost open :func:`recording_registrations` scope."""
    return _current.get()


def record(handle: RegistrationHandle) -> RegistrationHandle:
    """Add ``handle`` to the active scope's log (if any); returns it."""
    log = _current.get()
    if log is not None:
        log.handles.append(handle)
    return handle


@contextlib.contextmanager
def recording_registrations(package: str | None = None) -> Iterator[RegistrationLog]:
    """Record the registrations made in this block (this thread / task only).

    ``package`` (``"name version"``) is credited as the origin of the impls
    registered in the block. If the block raises anything — ``SystemExit``
    and ``KeyboardInterrupt`` included — every recorded registration is
    undone, as is any change to the tolerance tables, the process-wide
    priorities and ``torch.library`` made meanwhile; then the exception
    propagates. On success the log is kept, so its registrations can be
    undone later with :meth:`RegistrationLog.remove`.
    """
    log = RegistrationLog(package)
    snapshot = _Snapshot.take()
    token = _current.set(log)
    try:
        yield log
    except BaseException:
        _current.reset(token)  # undo outside the scope: nothing is recorded twice
        log.remove()
        restored = snapshot.restore()
        if restored:
            logger.debug("rolled back for %s: %s", package, ", ".join(restored))
        raise
    else:
        _current.reset(token)
