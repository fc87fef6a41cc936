"""``kernelize(model)``: analyse every module first, then swap, all or nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from vllm_ir_transformers import _forward as fwd
from vllm_ir_transformers import decoder, mlp, norm, rope
from vllm_ir_transformers._checks import NotApplicable, Probed
from vllm_ir_transformers.report import (
    _REVERT,
    REPORT_ATTR,
    Replacement,
    Report,
    Skip,
    _Target,
)

__all__ = ["SUPPORTED_OPS", "is_kernelized", "kernelize", "undo"]

SUPPORTED_OPS = (
    "rms_norm",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding",
    "fused_add_rms_norm",
)
"""The ops ``kernelize`` can route layers through, in the order it applies them."""


def _apply(target: _Target) -> None:
    # looked up on each call (not a table bound at import), so the functions can be patched
    functions: dict[str, Callable[[Any, Any], None]] = {
        "rms_norm": norm.apply_norm,
        "silu_and_mul": mlp.apply_mlp,
        "gelu_and_mul": mlp.apply_mlp,
        "rotary_embedding": rope.apply_rope,
        "fused_add_rms_norm": decoder.apply_decoder,
    }
    functions[target.op](target.module, target.spec)


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


def _marked(module: nn.Module) -> bool:
    return any(k.startswith("_vllm_ir_") for k in module.__dict__)


def _reports(model: nn.Module) -> list[tuple[str, Report]]:
    """The kernelize calls made on ``model`` or on modules inside it: (name, report)."""
    found = []
    for name, m in model.named_modules():
        report = m.__dict__.get(REPORT_ATTR)
        if isinstance(report, Report):
            found.append((name, report))
    return found


def is_kernelized(model: nn.Module) -> bool:
    """Whether ``model`` (or a module inside it) has kernelized layers."""
    return any(_marked(m) for m in model.modules())


def kernelize(
    model: nn.Module, *, ops: Iterable[str] | None = None, dry_run: bool = False
) -> Report:
    """Route the layers of ``model`` that compute an IR op through that op.

    ``ops`` restricts the ops used (default: all of :data:`SUPPORTED_OPS`);
    ``dry_run=True`` analyses and reports without changing anything. Every
    layer is analysed (structure, weights and a probe of its forward in each
    float dtype) before any is changed; if applying a change fails, the
    changes already made are rolled back and the exception propagates.
    Returns a :class:`Report`; its :meth:`Report.undo` (or :func:`undo`)
    restores the model.

    Raises ``TypeError`` for a non-module, ``ValueError`` for an unknown op
    name or a model that is already kernelized (itself, a module inside it,
    or a model it is part of).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"kernelize expects a torch.nn.Module, got {type(model).__name__}")
    chosen = _check_ops(ops)
    kind = type(model).__name__
    if REPORT_ATTR in model.__dict__:
        raise ValueError(f"{kind} is already kernelized; call undo(model) first")
    inner = [name for name, _ in _reports(model)]
    if inner:
        raise ValueError(
            f"{kind} contains kernelized modules ({', '.join(inner)}); call undo(model) "
            "first (it restores them)"
        )
    if is_kernelized(model):
        raise ValueError(
            f"{kind} is already kernelized as part of a larger model; call undo() on the "
            "model that was passed to kernelize first"
        )
    report = Report(ops=chosen, dry_run=dry_run, _model=model)
    _plan(model, chosen, report)
    if dry_run:
        return report
    applied: list[_Target] = []
    try:
        for target in report._targets:
            _apply(target)
            applied.append(target)
    except BaseException:
        for target in reversed(applied):
            _REVERT[target.op](target.module)
        raise
    model.__dict__[REPORT_ATTR] = report
    return report


def undo(model: nn.Module) -> None:
    """Restore a kernelized ``model`` (same as ``report.undo()``).

    Also restores modules inside ``model`` that were kernelized on their own.
    """
    found = _reports(model)
    if not found:
        kind = type(model).__name__
        if is_kernelized(model):
            raise ValueError(
                f"{kind} was not passed to kernelize itself but is part of a kernelized "
                "model; call undo() on that model"
            )
        raise ValueError(f"{kind} was not kernelized (or was already restored)")
    for _, report in found:
        report.undo()


def _plan(model: nn.Module, ops: tuple[str, ...], report: Report) -> None:
    norms: dict[int, tuple[norm.NormSpec | None, str | None]] = {}

    def skip(name: str, module: nn.Module, op: str, reason: str) -> None:
        report.skipped.append(Skip(name or "<root>", type(module).__name__, op, reason))
        fwd.logger.debug(
            "kernelize: %s (%s) [%s] left alone: %s",
            name or "<root>",
            type(module).__name__,
            op,
            reason,
        )

    def replace(name: str, module: nn.Module, op: str, spec: Probed, **extra: str) -> None:
        label = name or "<root>"
        spec = dataclasses.replace(spec, name=label)
        how = spec.how
        if op == "fused_add_rms_norm":
            how = f"residual add + post_attention_layernorm, {how}"
        report.replaced.append(Replacement(label, type(module).__name__, op, how))
        report._targets.append(_Target(label, module, op, spec, **extra))
        fwd.logger.debug("kernelize: %s (%s) -> %s: %s", label, type(module).__name__, op, how)

    modules = list(model.named_modules())
    # a forward already set on the instance (accelerate's hooks, another library's patch)
    # would be dropped by ours: such modules are left alone
    patched = {id(m) for _, m in modules if "forward" in m.__dict__}
    patched_reason = (
        "its forward is already replaced on the instance (hooks of accelerate or another library?)"
    )

    def cannot(name: str, module: nn.Module, op: str) -> bool:
        if id(module) in patched:
            skip(name, module, op, patched_reason)
            return True
        return False

    with torch.no_grad():
        for name, module in modules:
            if norm.is_norm_candidate(module):
                if cannot(name, module, "rms_norm"):
                    norms[id(module)] = (None, patched_reason)
                    continue
                try:
                    spec = norm.analyze_norm(module)
                    norms[id(module)] = (spec, None)
                except NotApplicable as e:
                    norms[id(module)] = (None, str(e))
                    if "rms_norm" in ops:
                        skip(name, module, "rms_norm", str(e))
                    continue
                if "rms_norm" in ops:
                    replace(name, module, "rms_norm", spec)
        gated = [o for o in mlp.GATED_OPS if o in ops]
        if gated:
            # reported under the op the MLP's activation maps to (or the first one chosen)
            label = gated[0]
            for name, module in modules:
                moe = mlp.moe_experts_reason(module)
                if moe is not None:
                    skip(name, module, label, moe)
                    continue
                if not mlp.is_mlp_candidate(module) or cannot(name, module, label):
                    continue
                try:
                    mspec = mlp.analyze_mlp(module)
                except NotApplicable as e:
                    skip(name, module, label, str(e))
                    continue
                if mspec.op not in ops:
                    skip(name, module, mspec.op, f"its activation maps to {mspec.op}, not chosen")
                    continue
                replace(name, module, mspec.op, mspec)
        if "rotary_embedding" in ops:
            for name, module in modules:
                if not rope.is_rope_candidate(module) or cannot(name, module, "rotary_embedding"):
                    continue
                try:
                    rspec = rope.analyze_rope(module)
                except NotApplicable as e:
                    skip(name, module, "rotary_embedding", str(e))
                    continue
                replace(name, module, "rotary_embedding", rspec)
        if "fused_add_rms_norm" in ops:
            names = {id(m): n for n, m in modules}
            for name, module in modules:
                if not decoder.is_decoder_candidate(module):
                    continue
                if cannot(name, module, "fused_add_rms_norm"):
                    continue
                post = module.post_attention_layernorm
                nspec, reason = norms.get(id(post), (None, "no 1-D weight and epsilon"))
                try:
                    dspec = decoder.analyze_decoder(module, nspec, reason)
                except NotApplicable as e:
                    skip(name, module, "fused_add_rms_norm", str(e))
                    continue
                post_name = names[id(post)] or "<root>"
                replace(name, module, "fused_add_rms_norm", dspec, post_norm=post_name)
