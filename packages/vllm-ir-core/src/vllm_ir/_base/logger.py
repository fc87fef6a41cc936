"""The ``vllm_ir`` logger, whose level follows ``VLLM_LOGGING_LEVEL``."""

from __future__ import annotations

import logging

from vllm_ir import envs
from vllm_ir._base.moved_modules import public_name

__all__ = ["get_logger"]

_ROOT = "vllm_ir"
_configured = False


def _configure() -> None:
    global _configured
    _configured = True
    root = logging.getLogger(_ROOT)
    # a bad value warns and reads as unset: a typo in an environment variable
    # must not make the library unimportable
    level = envs.logging_level()
    if level is None:
        return
    root.setLevel(level)
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


def get_logger(name: str) -> logging.Logger:
    """Return the logger for module ``name`` (configured on first use).

    A module that got a private name logs under its old one, so logger names
    stay what users filter on; other names are kept as given:

    >>> get_logger("vllm_ir.compilation._lowering").name, get_logger("my_kernels._impls").name
    ('vllm_ir.compilation.lowering', 'my_kernels._impls')
    """
    if not _configured:
        _configure()
    return logging.getLogger(public_name(name))
