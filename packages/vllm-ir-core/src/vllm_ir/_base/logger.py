"""The ``vllm_ir`` logger, whose level follows ``VLLM_LOGGING_LEVEL``."""

from __future__ import annotations

import logging

from vllm_ir import envs

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
    """Return the logger for module ``name`` (``__name__``; configured on first use).

    Every vllm-ir logger is under ``vllm_ir``, the one to filter on:

    >>> get_logger("vllm_ir.compilation._lowering").name
    'vllm_ir.compilation._lowering'
    """
    if not _configured:
        _configure()
    return logging.getLogger(name)
