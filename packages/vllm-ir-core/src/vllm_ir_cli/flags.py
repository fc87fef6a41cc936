"""The selection flags and the built-in IR passes, shared by the CLI and ``vllm_ir.config``.

Torch-free (this package imports nothing of ``vllm_ir``), so the command-line
front end can check flags without importing torch, and ``vllm_ir.config`` and
the compile backend read the same names: there is one list of built-in passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import MappingProxyType

__all__ = [
    "AUTOTUNE_FLAG",
    "ArgvCursor",
    "BUILTIN_PASSES",
    "DEFAULT_AUTOTUNE_BUCKETS",
    "DEFAULT_AUTOTUNE_MARGIN",
    "PASS_FLAG",
    "PRIORITY_FLAG",
    "TORCH_WRAP_FLAG",
    "split_flag_values",
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


class ArgvCursor:
    """Walks ``argv`` once, for the flag splitters: a flag written ``--flag VALUE``
    takes its value with :meth:`take`.

    >>> cursor = ArgvCursor(["--a", "1", "b"])
    >>> [(arg, cursor.take() if arg == "--a" else None) for arg in cursor]
    [('--a', '1'), ('b', None)]
    """

    def __init__(self, argv: Sequence[str]) -> None:
        self._args = list(argv)
        self._next = 0

    def __iter__(self) -> Iterator[str]:
        while self._next < len(self._args):
            self._next += 1
            yield self._args[self._next - 1]

    def take(self) -> str | None:
        """Consume the argument after the current one, the current flag's value
        (``None`` at the end)."""
        value = self._args[self._next] if self._next < len(self._args) else None
        self._next += 1
        return value

    def rest(self) -> list[str]:
        """Consume and return the current argument and all after it (``--`` and what follows)."""
        left = self._args[self._next - 1 :]
        self._next = len(self._args)
        return left


def split_flag_values(
    argv: Sequence[str], prefix: str, expects: str
) -> tuple[list[tuple[str, str]], list[str]]:
    """``(flag, value)`` for each argument starting with ``prefix``, written
    ``--flag=VALUE`` or ``--flag VALUE``, and the other arguments in order.

    A separate value that is missing, or is the next flag (no value of these
    flags starts with ``--``), raises ``ValueError`` saying the flag ``expects``.

    >>> split_flag_values(["--ir-pass.a", "off", "-v", "--ir-pass.b=on"], "--ir-pass.", "on/off")
    ([('--ir-pass.a', 'off'), ('--ir-pass.b', 'on')], ['-v'])
    """
    found: list[tuple[str, str]] = []
    rest: list[str] = []
    cursor = ArgvCursor(argv)
    for arg in cursor:
        if not arg.startswith(prefix):
            rest.append(arg)
            continue
        flag, eq, value = arg.partition("=")
        if not eq:
            following = cursor.take()
            if following is None:
                raise ValueError(f"{flag} expects {expects}")
            if following.startswith("--"):
                raise ValueError(f"{flag} expects {expects}, got the next flag {following[:80]!r}")
            value = following
        found.append((flag, value))
    return found, rest
