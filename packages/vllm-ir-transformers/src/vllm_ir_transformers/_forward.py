"""Installing a replacement forward, and logging which module runs what.

The replacement is ``functools.partial(fn, module)`` of a module-level
function, stored as the instance's ``forward``. Unlike a bound method of a
local or private function, it pickles by reference (``torch.save(model)``
works) and ``copy.deepcopy`` maps its module to the copy, so a copied model
runs and restores its own layers. No tensor is stored with it: every call reads
the module's current parameters, so casts, loads and optimizer steps need no
bookkeeping.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from vllm_ir.provider import get_logger

__all__ = ["install", "log_use", "logger", "remove"]

logger = get_logger("vllm_ir.transformers")

# (dtype, outcome) pairs already logged per module: DEBUG logs each once
_logged: weakref.WeakKeyDictionary[nn.Module, set[tuple[Any, str]]] = weakref.WeakKeyDictionary()


def install(module: nn.Module, fn: Callable[..., Any]) -> None:
    module.forward = functools.partial(fn, module)  # type: ignore[method-assign]


def remove(module: nn.Module) -> None:
    module.__dict__.pop("forward", None)


def attach(module: nn.Module, state_attr: str, spec: Any, fn: Callable[..., Any]) -> None:
    """Route ``module`` through ``fn``, which finds ``spec`` in ``module.__dict__[state_attr]``."""
    module.__dict__[state_attr] = spec
    install(module, fn)


def detach(module: nn.Module, state_attr: str) -> None:
    """Undo :func:`attach`: the module's own forward again, its spec dropped."""
    remove(module)
    module.__dict__.pop(state_attr, None)


def debug_enabled() -> bool:
    """True in eager mode with DEBUG logging on (never inside a compiled graph)."""
    return not torch.compiler.is_compiling() and logger.isEnabledFor(logging.DEBUG)


def log_use(module: nn.Module, name: str, op: str, dtype: torch.dtype, outcome: str) -> None:
    """Log, once per module, dtype and outcome, what a replaced layer runs."""
    seen = _logged.setdefault(module, set())
    if (dtype, outcome) in seen:
        return
    seen.add((dtype, outcome))
    logger.debug(
        "%s (%s): %s, %s: %s",
        name,
        type(module).__name__,
        op,
        str(dtype).removeprefix("torch."),
        outcome,
    )
