"""What :func:`~vllm_ir_transformers.kernelize` did, or would do, to a model, and what
each replaced module runs *now*.

A :class:`Report` holds the modules it replaced and their verified specs (no
closures: it pickles and deep-copies with its model). :meth:`Report.current`
and ``str(report)`` recompute, each time they are called, what every module
runs for its current dtype and device: the op and the impl eager selection
picks, or the layer's own forward and why.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import vllm_ir as ir
from torch import nn

from vllm_ir_transformers import decoder, mlp, norm, rope
from vllm_ir_transformers._checks import dtype_name

__all__ = ["OPS", "PLAN_HINT", "REPORT_ATTR", "Replacement", "Report", "Skip", "Status"]

REPORT_ATTR = "_vllm_ir_kernelize_report"
"""Where the kernelized model keeps its report (in its ``__dict__``)."""

PLAN_HINT = (
    "kernel plan of a run (the impl each call site ran, and why not the others): "
    "report.plan(*example_inputs); save with .to_json('plan.json'), print with "
    "`vllm-ir explain --plan plan.json`"
)

OPS: dict[str, types.ModuleType] = {
    "rms_norm": norm,
    "silu_and_mul": mlp,
    "gelu_and_mul": mlp,
    "rotary_embedding": rope,
    "fused_add_rms_norm": decoder,
}
"""The module implementing each op's replacement: ``STATE_ATTR``, ``_forward``,
``inactive_reason``, ``probe_call``, ``revert_*``."""

_REVERT = {
    "rms_norm": norm.revert_norm,
    "silu_and_mul": mlp.revert_mlp,
    "gelu_and_mul": mlp.revert_mlp,
    "rotary_embedding": rope.revert_rope,
    "fused_add_rms_norm": decoder.revert_decoder,
}


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


@dataclass(frozen=True)
class Status:
    """What a replaced module runs now, for its parameters' current dtype and device.

    ``impl`` is the provider eager selection picks for a one-token call
    (``None`` when the op does not run); ``runs`` says what runs in words.
    """

    name: str
    module_type: str
    op: str
    dtype: str
    device: str
    impl: str | None
    runs: str


@dataclass
class _Target:
    name: str
    module: nn.Module
    op: str
    spec: Any
    post_norm: str | None = None
    """For a fused decoder layer: the name of its post-attention norm."""


@dataclass
class Report:
    """The replaced and skipped modules of one ``kernelize`` call.

    ``str(report)`` is a readable table, :meth:`current` what each module
    runs now, :meth:`as_dict` JSON-ready. :meth:`undo` restores the model
    (not available for a dry run).
    """

    ops: tuple[str, ...]
    dry_run: bool
    replaced: list[Replacement] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    _model: nn.Module | None = field(default=None, repr=False, compare=False)
    _targets: list[_Target] = field(default_factory=list, repr=False, compare=False)
    _undone: bool = field(default=False, repr=False, compare=False)

    def by_op(self) -> dict[str, int]:
        """Number of replaced modules per op."""
        counts: dict[str, int] = {}
        for r in self.replaced:
            counts[r.op] = counts.get(r.op, 0) + 1
        return counts

    @property
    def active(self) -> bool:
        """Whether the replacements are installed (not a dry run, not undone)."""
        return not self.dry_run and not self._undone

    def undo(self) -> None:
        """Restore the model exactly as it was before ``kernelize``."""
        if not self.active or self._model is None:
            raise RuntimeError(
                "nothing to undo: this report is from a dry run, or undo() already ran"
            )
        self._undone = True
        for target in reversed(self._targets):
            _REVERT[target.op](target.module)
        self._model.__dict__.pop(REPORT_ATTR, None)

    def current(self) -> list[Status]:
        """What every replaced module runs now (recomputed on each call)."""
        by_name = {t.name: t for t in self._targets}
        statuses = {t.name: _status(t, self) for t in self._targets}
        if self.active:
            for t in self._targets:
                post = statuses.get(t.post_norm or "")
                if post is None or statuses[t.name].impl is None:
                    continue
                # the fused layer computes this norm itself: its forward is not called
                fused = statuses[t.name]
                statuses[post.name] = Status(
                    post.name,
                    post.module_type,
                    post.op,
                    post.dtype,
                    post.device,
                    fused.impl,
                    f"not called: {t.name} computes it inside fused_add_rms_norm "
                    f"(eager impl {fused.impl})",
                )
        return [statuses[name] for name in by_name]

    def plan(self, *example_inputs: Any, **example_kwargs: Any) -> ir.Plan:
        """Run the model once on the example inputs and return its kernel plan
        (:func:`vllm_ir.plan`): every IR op call site by module path, with the impl
        that ran and why every other candidate did not. ``.to_json(FILE)`` saves
        it; ``vllm-ir explain --plan FILE`` prints it."""
        if self._model is None:
            raise RuntimeError("this report has no model to run (it was unpickled without one)")
        return ir.plan(self._model, *example_inputs, **example_kwargs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops": list(self.ops),
            "dry_run": self.dry_run,
            "undone": self._undone,
            "replaced": [vars(r) for r in self.replaced],
            "now": [vars(s) for s in self.current()],
            "skipped": [vars(s) for s in self.skipped],
        }

    def __str__(self) -> str:
        verb = "would replace" if self.dry_run else "replaced"
        if self._undone:
            verb = "replaced (since undone: the model runs its own forwards)"
        lines = [f"kernelize ({', '.join(self.ops)}): {verb} {len(self.replaced)} modules"]
        now = {s.name: s for s in self.current()}
        for r in self.replaced:
            lines.append(f"  {r.name} ({r.module_type}) -> {r.op}: {r.how}")
            s = now.get(r.name)
            if s is not None:
                lines.append(f"      now ({s.dtype}, {s.device}): {s.runs}")
        lines.append(f"left alone {len(self.skipped)}")
        for k in self.skipped:
            lines.append(f"  {k.name} ({k.module_type}) [{k.op}]: {k.reason}")
        if self.active:
            lines.append(PLAN_HINT)
        return "\n".join(lines)


def _status(target: _Target, report: Report) -> Status:
    module, op = target.module, target.op
    handler = OPS[op]
    args = handler.probe_call(module, target.spec)
    dtype, device = args[0].dtype, args[0].device

    def status(impl: str | None, runs: str) -> Status:
        return Status(
            target.name, type(module).__name__, op, dtype_name(dtype), str(device), impl, runs
        )

    if report._undone:
        return status(None, "own forward (undone)")
    installed = module.__dict__.get("forward")
    ours = getattr(installed, "func", None) is handler._forward
    if not report.dry_run and not ours:
        return status(None, "own forward: its forward was replaced after kernelize")
    reason = handler.inactive_reason(module, target.spec, dtype)
    prefix = "would run" if report.dry_run else "runs"
    if reason is not None:
        return status(None, f"{prefix} its own forward: {reason}")
    try:
        impl = getattr(ir.ops, op).selected_impl(*args).provider
    except Exception as e:  # the report must print whatever the selection does
        return status(None, f"selection failed ({type(e).__name__}: {e})")
    return status(impl, f"{prefix} {op}, eager impl {impl}")
