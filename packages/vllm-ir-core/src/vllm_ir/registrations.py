"""Which provider package is registering right now, and undoing what it registered.

Provider discovery (:mod:`vllm_ir.providers`) loads each package inside
:func:`recording_registrations`; ``register_op`` and ``register_impl``
attribute what they create to the package being loaded and record it, so a
package that fails half-way is rolled back in full.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["ProviderLoad", "current_load", "recording_registrations"]


@dataclass
class ProviderLoad:
    """Registrations made while one provider package loads: undo callbacks, in order."""

    package: str
    undo: list[Callable[[], None]] = field(default_factory=list)


_provider_load: contextvars.ContextVar[ProviderLoad | None] = contextvars.ContextVar(
    "vllm_ir_provider_load", default=None
)


def current_load() -> ProviderLoad | None:
    """The provider package being loaded in this context, if any."""
    return _provider_load.get()


@contextlib.contextmanager
def recording_registrations(package: str) -> Iterator[ProviderLoad]:
    """Attribute registrations to ``package``; undo them all if the block raises."""
    load = ProviderLoad(package)
    token = _provider_load.set(load)
    try:
        yield load
    except BaseException:
        for undo in reversed(load.undo):
            undo()
        raise
    finally:
        _provider_load.reset(token)
