"""What :func:`~vllm_ir_transformers.kernelize` did, or would do, to a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Replacement", "Report", "Skip"]


@dataclass(frozen=True)
class Replacement:
    """A module whose forward now calls ``op`` (``how``: the mapping and its probe)."""

    name: str
    module_type: str
    op: str
    how: str


@dataclass(frozen=True)
class Skip:
    """A module that looked like a candidate for ``op`` and was left alone, and why."""

    name: str
    module_type: str
    op: str
    reason: str


@dataclass
class Report:
    """The replaced and skipped modules of one ``kernelize`` call.

    ``str(report)`` is a readable table; :meth:`as_dict` is JSON-ready.
    :meth:`undo` restores the model (not available for a dry run).
    """

    ops: tuple[str, ...]
    dry_run: bool
    replaced: list[Replacement] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    _undo: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def by_op(self) -> dict[str, int]:
        """Number of replaced modules per op."""
        counts: dict[str, int] = {}
        for r in self.replaced:
            counts[r.op] = counts.get(r.op, 0) + 1
        return counts

    def undo(self) -> None:
        """Restore the model exactly as it was before ``kernelize``."""
        if self._undo is None:
            raise RuntimeError(
                "nothing to undo: this report is from a dry run, or undo() already ran"
            )
        undo, self._undo = self._undo, None
        undo()

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops": list(self.ops),
            "dry_run": self.dry_run,
            "replaced": [vars(r) for r in self.replaced],
            "skipped": [vars(s) for s in self.skipped],
        }

    def __str__(self) -> str:
        verb = "would replace" if self.dry_run else "replaced"
        lines = [f"kernelize ({', '.join(self.ops)}): {verb} {len(self.replaced)} modules"]
        for r in self.replaced:
            lines.append(f"  {r.name} ({r.module_type}) -> {r.op}: {r.how}")
        lines.append(f"skipped {len(self.skipped)}")
        for s in self.skipped:
            lines.append(f"  {s.name} ({s.module_type}) [{s.op}]: {s.reason}")
        return "\n".join(lines)
