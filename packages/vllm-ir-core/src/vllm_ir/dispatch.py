"""Deprecated name of :mod:`vllm_ir.selection` (it holds selection, not dispatching).

Kept for one release: ``import vllm_ir.dispatch`` warns and gives the same
objects as :mod:`vllm_ir.selection`.
"""

from __future__ import annotations

import warnings

from vllm_ir.selection import *  # noqa: F403
from vllm_ir.selection import NO_DATA_POINTER, __all__, describe  # noqa: F401

warnings.warn(
    "vllm_ir.dispatch is deprecated: use vllm_ir.selection (the old name goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
