"""The selection flags and the built-in IR passes, shared by the CLI and ``vllm_ir.config``.

Torch-free (this package imports nothing of ``vllm_ir``), so the command-line
front end can check flags without importing torch, and ``vllm_ir.config`` and
the compile backend read the same names: there is one list of built-in passes.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = [
    "AUTOTUNE_FLAG",
    "BUILTIN_PASSES",
    "DEFAULT_AUTOTUNE_BUCKETS",
    "DEFAULT_AUTOTUNE_MARGIN",
    "PASSES",
    "PASS_FLAG",
    "PRIORITY_FLAG",
    "TORCH_WRAP_FLAG",
]

PRIORITY_FLAG = "--ir-op-priority"
PASS_FLAG = "--ir-pass"
AUTOTUNE_FLAG = "--ir-autotune"
TORCH_WRAP_FLAG = "--ir-torch-wrap"
"""``--ir-torch-wrap=off``: trace-through mode (``vllm_ir.enable_torch_wrap(False)``)."""

DEFAULT_AUTOTUNE_MARGIN = 0.10
"""How much faster than Inductor-compiled native a kernel must be for autotuning to pick it."""

DEFAULT_AUTOTUNE_BUCKETS = (16, 256)
"""Autotuning's token buckets: decode (<= 16 tokens), <= 256, and larger."""

BUILTIN_PASSES = MappingProxyType({"fuse_norm_quant": True, "sequence_parallel": False})
"""The built-in IR passes of the compile backend, and whether each is on by default."""

PASSES = tuple(BUILTIN_PASSES)
"""The names of :data:`BUILTIN_PASSES`."""
