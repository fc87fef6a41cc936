"""``vllm-ir explain OP``: the effective priority list and every decision, per mode."""

from __future__ import annotations

import argparse
from typing import Any

from vllm_ir._base.platform import current_platform
from vllm_ir._base.platform import describe as describe_platform
from vllm_ir._base.torch_wrap import torch_wrap_enabled
from vllm_ir._cli import plan_cmd
from vllm_ir._cli.args import (
    UsageError,
    checked_call,
    parse_device,
    parse_dtype,
    parse_op,
    parse_shape,
)
from vllm_ir._op.op import IrOp
from vllm_ir.priority import MODES, Mode
from vllm_ir.selection import describe

__all__ = ["bucket_lines", "candidate_lines", "run"]


def bucket_lines(op: IrOp, call: tuple[Any, ...], mode: Mode) -> list[str]:
    """The size-bucket table of the effective priorities (empty without buckets):
    one line per bucket with its list, the call's bucket marked."""
    plan = op.size_plan(mode)
    if not plan:
        return []
    tokens = op.tokens(*call)
    mine = plan.index(tokens)
    act = op.activations[0] if op.activations else "-"
    dims = "dim" if op.feature_dims == 1 else f"{op.feature_dims} dims"
    lines = [f"size buckets (tokens: all but the last {dims} of {act}; this call: {tokens}):"]
    for i in range(len(plan)):
        bound = plan.upper(i)
        label = f"<= {bound}" if bound is not None else f"> {plan.bounds[-1]}"
        rep = bound if bound is not None else plan.bounds[-1] + 1
        listed = ", ".join(p.provider for p in op.get_priority_entries(mode, tokens=rep))
        marker = "   <- this call" if i == mine else ""
        lines.append(f"  {label:>10} tokens: {listed}{marker}")
    return lines


def candidate_lines(op: IrOp, call: tuple[Any, ...], mode: Mode) -> list[str]:
    """One line per registered impl: selected, rejected (why), not reached, or not listed.

    Entries after the selected one are not asked by selection; their line says
    what they would answer, so that a reordered list can be judged here.
    """
    found = op.candidates(*call, mode=mode)
    lines = []
    reached = True  # up to and including the selected entry: what selection asks
    for decision in found:
        provider = decision.provider
        would = "would accept" if decision.accepted else f"would be rejected: {decision.reason}"
        if not decision.listed:
            lines.append(
                f"{provider}: not on the priority list ({would}; "
                f"--ir-op-priority.{op.name}={provider} puts it first)"
            )
        elif not reached:
            lines.append(f"{provider}: not reached ({would})")
        elif decision.accepted:
            lines.append(f"{provider}: selected (first on the list that accepts)")
            reached = False
        else:
            lines.append(f"{provider}: rejected: {decision.reason}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.plan is not None:
        return plan_cmd.print_plan(args.plan, op=args.op)
    if args.op is None:
        raise UsageError("explain needs an op name (e.g. rms_norm) or --plan FILE.json")
    op = parse_op(args.op)
    dtype = parse_dtype(args.dtype)
    shape = parse_shape(args.shape)
    device = parse_device(args.device)
    call = checked_call(op, shape, dtype, device, args.arg)
    if args.tuned or args.autotune:
        # loads Inductor (about 3 CPU-seconds): only for what needs it, so a plain
        # ``explain`` starts as fast as ``import vllm_ir``
        from vllm_ir._cli import tune
    tuned = tune.read_tuned(args.tuned, op) if args.tuned else None  # checked before output
    modes: list[Mode] = ["compiled"] if args.compiled else ["eager"] if args.eager else list(MODES)
    print(f"{op.name}{describe(call)} on {current_platform()}")
    print(f"platform: {describe_platform()}")
    if not torch_wrap_enabled():
        print(
            "torch wrap off (trace-through): traced calls run the selected impl, "
            "with no IR node in the graph"
        )
    for mode in modes:
        if mode == "compiled":
            print("\ncompiled mode (Inductor lowering, on FakeTensors)")
            print(f"  IR passes before lowering: {', '.join(args.passes.enabled()) or 'none'}")
        else:
            print("\neager mode")
        for line in bucket_lines(op, call, mode):
            print(f"  {line}")
        tokens = op.tokens(*call) if op.size_plan(mode) else None
        print("  priority list:" if tokens is None else "  priority list (this call's bucket):")
        for i, entry in enumerate(op.get_priority_entries(mode, tokens=tokens), 1):
            print(f"    {i}. {entry.provider}  <- {entry.source}")
        print("  candidates:")
        for line in candidate_lines(op, call, mode):
            print(f"    {line}")
        print(f"  selected: {op.select(*call, mode=mode).impl.provider}")
        if mode == "compiled" and args.autotune:
            tune.explain_autotune(op, call)
    if tuned is not None:
        tune.explain_tuned(args.tuned, op, tuned)
    return 0
