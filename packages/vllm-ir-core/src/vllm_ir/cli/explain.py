"""``vllm-ir explain OP``: the effective priority list and every decision, per mode."""

from __future__ import annotations

import argparse

from vllm_ir.cli import tune
from vllm_ir.cli.args import call_args_for, parse_assignments, parse_dtype, parse_op, parse_shape
from vllm_ir.dispatch import describe
from vllm_ir.platform import current_platform
from vllm_ir.priority import MODES, Mode

__all__ = ["add_parser"]


def run(args: argparse.Namespace) -> int:
    op = parse_op(args.op)
    dtype = parse_dtype(args.dtype)
    shape = parse_shape(args.shape)
    call = call_args_for(op, shape, dtype, args.device, parse_assignments(args.arg))
    modes: list[Mode] = ["compiled"] if args.compiled else ["eager"] if args.eager else list(MODES)
    print(f"{op.name}{describe(call)} on {current_platform()}")
    for mode in modes:
        if mode == "compiled":
            print("\ncompiled mode (Inductor lowering, on FakeTensors)")
            print(f"  IR passes before lowering: {', '.join(args.passes.enabled()) or 'none'}")
        else:
            print("\neager mode")
        print("  priority list:")
        for i, entry in enumerate(op.get_priority_entries(mode), 1):
            print(f"    {i}. {entry.provider}  <- {entry.source}")
        selection = op.select(*call, mode=mode)
        print("  candidates:")
        for decision in selection.decisions:
            mark = "accepted" if decision.accepted else "rejected"
            print(f"    {decision.entry.provider}: {mark} ({decision.reason})")
        print(f"  selected: {selection.impl.provider}")
        if mode == "compiled" and args.autotune:
            tune.explain_autotune(op, call)
    if args.tuned:
        tune.explain_tuned(args.tuned, op)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain", help="why an impl is selected for given arguments, in eager and compiled mode"
    )
    parser.add_argument("op", help="op name, e.g. rms_norm")
    parser.add_argument("--dtype", default="bf16", help="fp32, fp16 or bf16 (default bf16)")
    parser.add_argument("--shape", default="8,4096", help="activation shape (default 8,4096)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--arg", action="append", default=[], metavar="NAME=VALUE", help="a non-tensor argument"
    )
    parser.add_argument(
        "--autotune", action="store_true", help="compiled mode: measure as autotuning does"
    )
    parser.add_argument("--tuned", metavar="FILE", help="show the measurements in a tune file")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--compiled", action="store_true", help="compiled mode only")
    which.add_argument("--eager", action="store_true", help="eager mode only")
    parser.set_defaults(func=run)
