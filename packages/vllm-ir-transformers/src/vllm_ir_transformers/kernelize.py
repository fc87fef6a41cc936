"""``kernelize(model)``: analyse every module first, then swap, all or nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from vllm_ir_transformers import decoder, mlp, norm
from vllm_ir_transformers._checks import NotApplicable
from vllm_ir_transformers.report import Replacement, Report, Skip

__all__ = ["SUPPORTED_OPS", "is_kernelized", "kernelize", "undo"]

SUPPORTED_OPS = ("rms_norm", "silu_and_mul", "fused_add_rms_norm")
"""The ops ``kernelize`` can route layers through, in the order it applies them."""

REPORT_ATTR = "_vllm_ir_kernelize_report"


@dataclass
class _Plan:
    name: str
    module: nn.Module
    op: str
    apply: Callable[[], None]
    revert: Callable[[], None]


def _check_ops(ops: Iterable[str] | None) -> tuple[str, ...]:
    if ops is None:
        return SUPPORTED_OPS
    if isinstance(ops, str):
        raise TypeError(f"ops must be a list of op names, not the string {ops!r}")
    chosen = tuple(ops)
    unknown = [o for o in chosen if o not in SUPPORTED_OPS]
    if unknown:
        raise ValueError(
            f"unknown op(s) {', '.join(map(repr, unknown))} for kernelize; "
            f"supported: {', '.join(SUPPORTED_OPS)}"
        )
    return tuple(o for o in SUPPORTED_OPS if o in chosen)


def is_kernelized(model: nn.Module) -> bool:
    """Whether ``model`` (or a module inside it) has kernelized layers."""
    return any(
        REPORT_ATTR in m.__dict__ or any(k.startswith("_vllm_ir_") for k in m.__dict__)
        for m in model.modules()
    )


def kernelize(
    model: nn.Module, *, ops: Iterable[str] | None = None, dry_run: bool = False
) -> Report:
    """Route the layers of ``model`` that compute an IR op through that op.

    ``ops`` restricts the ops used (default: all of :data:`SUPPORTED_OPS`);
    ``dry_run=True`` analyses and reports without changing anything. Every
    layer is analysed (structure, weights and a probe of its forward) before
    any is changed; if applying a change fails, the changes already made are
    rolled back and the exception propagates. Returns a :class:`Report`; its
    :meth:`Report.undo` (or :func:`undo`) restores the model.

    Raises ``TypeError`` for a non-module, ``ValueError`` for an unknown op
    name or a model that is already kernelized.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"kernelize expects a torch.nn.Module, got {type(model).__name__}")
    chosen = _check_ops(ops)
    if is_kernelized(model):
        raise ValueError(f"{type(model).__name__} is already kernelized; call undo(model) first")
    report = Report(ops=chosen, dry_run=dry_run)
    plans = _plan(model, chosen, report)
    if dry_run:
        return report
    applied: list[_Plan] = []
    try:
        for plan in plans:
            plan.apply()
            applied.append(plan)
    except BaseException:
        for plan in reversed(applied):
            plan.revert()
        raise

    def _undo() -> None:
        for plan in reversed(plans):
            plan.revert()
        model.__dict__.pop(REPORT_ATTR, None)

    report._undo = _undo
    model.__dict__[REPORT_ATTR] = report
    return report


def undo(model: nn.Module) -> None:
    """Restore a kernelized ``model`` (same as ``report.undo()``)."""
    report = model.__dict__.get(REPORT_ATTR)
    if not isinstance(report, Report):
        raise ValueError(f"{type(model).__name__} was not kernelized (or was already restored)")
    report.undo()


def _plan(model: nn.Module, ops: tuple[str, ...], report: Report) -> list[_Plan]:
    plans: list[_Plan] = []
    norms: dict[int, tuple[norm.NormSpec | None, str | None]] = {}

    def skip(name: str, module: nn.Module, op: str, reason: str) -> None:
        report.skipped.append(Skip(name or "<root>", type(module).__name__, op, reason))

    def replace(
        name: str,
        module: nn.Module,
        op: str,
        how: str,
        apply: Callable[[], None],
        revert: Callable[[], None],
    ) -> None:
        report.replaced.append(Replacement(name or "<root>", type(module).__name__, op, how))
        plans.append(_Plan(name, module, op, apply, revert))

    modules = list(model.named_modules())
    with torch.no_grad():
        for name, module in modules:
            if norm.is_norm_candidate(module):
                try:
                    spec = norm.analyze_norm(module)
                    norms[id(module)] = (spec, None)
                except NotApplicable as e:
                    norms[id(module)] = (None, str(e))
                    if "rms_norm" in ops:
                        skip(name, module, "rms_norm", str(e))
                    continue
                if "rms_norm" in ops:
                    replace(
                        name,
                        module,
                        "rms_norm",
                        spec.how,
                        _bind(norm.apply_norm, module, spec),
                        _bind(norm.revert_norm, module),
                    )
        if "silu_and_mul" in ops:
            for name, module in modules:
                if not mlp.is_mlp_candidate(module):
                    continue
                try:
                    mspec = mlp.analyze_mlp(module)
                except NotApplicable as e:
                    skip(name, module, "silu_and_mul", str(e))
                    continue
                replace(
                    name,
                    module,
                    "silu_and_mul",
                    mspec.how,
                    _bind(mlp.apply_mlp, module, mspec),
                    _bind(mlp.revert_mlp, module),
                )
        if "fused_add_rms_norm" in ops:
            for name, module in modules:
                if not decoder.is_decoder_candidate(module):
                    continue
                post = module.post_attention_layernorm
                nspec, reason = norms.get(id(post), (None, "no 1-D weight and epsilon"))
                try:
                    dspec = decoder.analyze_decoder(module, nspec, reason)
                except NotApplicable as e:
                    skip(name, module, "fused_add_rms_norm", str(e))
                    continue
                how = f"residual add + post_attention_layernorm, {dspec.how}"
                replace(
                    name,
                    module,
                    "fused_add_rms_norm",
                    how,
                    _bind(decoder.apply_decoder, module, dspec),
                    _bind(decoder.revert_decoder, module),
                )
    return plans


def _bind(fn: Callable[..., None], *args: object) -> Callable[[], None]:
    return lambda: fn(*args)
