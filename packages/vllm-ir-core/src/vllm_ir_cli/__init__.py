"""The ``vllm-ir`` command's front end: parsing, ``--help``, ``--version``, argument errors.

Importing anything under ``vllm_ir`` imports the package and with it torch,
which takes seconds. This module is separate and imports neither, so
``vllm-ir --help``, ``--version`` and malformed command lines answer at
once; the commands (:mod:`vllm_ir._cli`) are imported only once the arguments
parse.

Every error is one line, ``vllm-ir: error: ...``, with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "split_selection_flags"]

from vllm_ir_cli.commands import COMMANDS, UsageError
from vllm_ir_cli.flags import (  # shared with vllm_ir.config
    BUILTIN_PASSES,
    PASS_FLAG,
    PRIORITY_FLAG,
    TORCH_WRAP_FLAG,
    ArgvCursor,
)


class _Parser(argparse.ArgumentParser):
    """Reports an argument error as one ``vllm-ir: error:`` line saying where to read more."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vllm-ir-core")
    except metadata.PackageNotFoundError:
        return "unknown (vllm-ir-core is not installed)"


class _Version(argparse.Action):
    """``--version``, looked up only when asked (reading package metadata takes time)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, nargs=0, help="show the version and exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(f"vllm-ir {_version()}")
        parser.exit()


def _int_at_least(low: int) -> type[int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            what = "a positive integer" if low == 1 else f"an integer >= {low}"
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    parse.__name__ = "int"
    return parse  # type: ignore[return-value]


POSITIVE = _int_at_least(1)
NON_NEGATIVE = _int_at_least(0)


def _model_spec(text: str) -> str:
    """``--model``'s value: an empty one (an unset variable in a script) is an
    error, not "no --model", which would tune every op instead."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"expected a model directory, a cached model name or module:callable, got {text!r}"
        )
    return text


_SELECTION_HELP = (
    "Kernel selection: --ir-op-priority.OP=a,b (repeatable) or "
    '--ir-op-priority \'{"OP": ["a", "b"]}\'. '
    f"Compile passes: --ir-pass.NAME=on|off, NAME one of {', '.join(BUILTIN_PASSES)} "
    "(e.g. --ir-pass.fuse_norm_quant=off). "
    f"Trace-through mode: {TORCH_WRAP_FLAG}=off (IR ops traced as their selected impls)."
)


def _add_ops(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ops", help="list every op and provider on this machine")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument(
        "--markdown",
        action="store_true",
        help="the table of ops (signature, semantics, activations, tolerances) as in the docs",
    )


def _add_explain(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explain", help="why an impl is selected for given arguments, in eager and compiled mode"
    )
    parser.add_argument("op", nargs="?", help="op name, e.g. rms_norm")
    parser.add_argument(
        "--plan",
        metavar="FILE.json",
        help="print a kernel plan saved with vllm_ir.plan(...).to_json(FILE) instead of an op",
    )
    parser.add_argument("--dtype", default="bf16", help="fp32, fp16 or bf16 (default bf16)")
    parser.add_argument("--shape", default="8,4096", help="activation shape (default 8,4096)")
    parser.add_argument("--device", default="cpu", help="device of the tensors (default cpu)")
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a non-tensor argument, as a Python literal (repeatable)",
    )
    parser.add_argument(
        "--autotune", action="store_true", help="compiled mode: measure as autotuning does"
    )
    parser.add_argument("--tuned", metavar="FILE", help="show the measurements in a tune file")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--compiled", action="store_true", help="compiled mode only")
    which.add_argument("--eager", action="store_true", help="eager mode only")


def _add_threads(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "--threads",
        type=NON_NEGATIVE,
        default=default,
        help=f"CPU threads for torch and Inductor's kernels (default {default}; "
        "0 keeps torch's own choice)",
    )


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="time every applicable impl of an op side by side")
    parser.add_argument("op")
    parser.add_argument(
        "--shapes",
        default="1x4096 64x4096",
        help="activation shapes, space separated (default '1x4096 64x4096')",
    )
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma separated (default fp32,bf16)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--rounds", type=POSITIVE, default=30, help="timed rounds of ~10 ms each (default 30)"
    )
    parser.add_argument(
        "--warmup", type=NON_NEGATIVE, default=20, help="untimed calls first (default 20)"
    )
    _add_threads(parser, 1)
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--no-compiled", action="store_true", help="skip native compiled by Inductor"
    )
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the results (needs matplotlib)")


def _add_demo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run a small IR model eager and compiled")
    parser.add_argument("--tokens", type=POSITIVE, default=64, help="batch size (default 64)")
    parser.add_argument("--hidden", type=POSITIVE, default=256, help="hidden size (default 256)")
    parser.add_argument("--layers", type=POSITIVE, default=4, help="decoder layers (default 4)")
    parser.add_argument(
        "--runs", type=POSITIVE, default=50, help="timed forward passes per mode (default 50)"
    )
    parser.add_argument(
        "--warmup", type=NON_NEGATIVE, default=5, help="untimed forward passes first (default 5)"
    )
    _add_threads(parser, 1)


def _add_tune(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune", help="measure candidate impls on this machine and write a priority config"
    )
    parser.add_argument("--ops", default="", help="comma-separated ops (default: all)")
    parser.add_argument(
        "--buckets",
        default=None,
        help="token bucket bounds, comma separated (default 16,256: decode <= 16 tokens, "
        "<= 256, larger); each bucket gets its own measured priority list",
    )
    parser.add_argument(
        "--hidden",
        type=POSITIVE,
        default=4096,
        help="the last dim of the activation when measuring buckets (default 4096)",
    )
    parser.add_argument(
        "--rounds",
        type=POSITIVE,
        default=10,
        help="interleaved rounds of ~10 ms per candidate and bucket (default 10)",
    )
    parser.add_argument(
        "--shapes",
        default=None,
        help="instead of buckets: NAME=SHAPE items, dims joined by x "
        "(e.g. decode=1x4096,prefill=4096x4096); writes one list per op for every size",
    )
    parser.add_argument("--dtype", default="bf16", help="fp32, fp16 or bf16 (default bf16)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--runs", type=POSITIVE, default=25, help="timed calls per candidate (default 25)"
    )
    parser.add_argument(
        "--out",
        help="the JSON file to write, merged into what it holds (the ops measured now replace "
        "their entries); {rank} in the name is this process's rank (RANK, LOCAL_RANK or "
        "torch.distributed's)",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="write into the local tuning cache ($VLLM_IR_CACHE_DIR/tuned.json) instead of "
        "--out: every later process on this machine applies it",
    )
    parser.add_argument(
        "--replace", action="store_true", help="overwrite --out instead of merging into it"
    )
    parser.add_argument(
        "--warmup", type=NON_NEGATIVE, default=3, help="untimed calls or steps first (default 3)"
    )
    _add_threads(parser, 1)
    model = parser.add_argument_group(
        "whole-model sweep (--model): end-to-end step time per op candidate and size bucket; "
        "--ops, --buckets, --rounds, --warmup, --threads and --out apply too"
    )
    model.add_argument(
        "--model",
        type=_model_spec,
        metavar="PATH_OR_NAME",
        help="a local Hugging Face model directory, or module:callable returning "
        "(model, example_inputs); writes a bucketed priority file (docs/cli.md)",
    )
    model.add_argument(
        "--tokens",
        default="1,16,256,1024",
        help="token counts to measure, ascending (default 1,16,256,1024)",
    )
    model.add_argument(
        "--unmeasured",
        choices=("below", "above"),
        default="below",
        help="what a size between measured token counts runs: the list chosen at the "
        "largest measured count below it (default), or its bucket's, chosen above it",
    )


def _add_plan(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="a model's kernel plan: what runs at each call site, what never does, what loses",
    )
    parser.add_argument("saved", nargs="?", help="a plan saved with vllm_ir.plan(...).to_json()")
    parser.add_argument(
        "--model",
        type=_model_spec,
        help="a model directory, a cached model name, or module:callable (as tune --model)",
    )
    parser.add_argument("--tokens", default="16", help="token counts to plan at (default 16)")
    parser.add_argument(
        "--tuned",
        metavar="FILE",
        help="a tune --model file: also list picks that lose to another candidate",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.05,
        help="how much faster another candidate must be for a pick to lose (default 0.05)",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the plans and findings here")
    _add_threads(parser, 1)  # as tune's: a tuned file's stamps are checked against it


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vllm-ir",
        description="Inspect, explain and benchmark vllm-ir kernel selection.",
        epilog=_SELECTION_HELP,
    )
    parser.add_argument("--version", action=_Version)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_ops, _add_explain, _add_bench, _add_demo, _add_tune, _add_plan):
        add(subparsers)
    for sub in subparsers.choices.values():
        sub.epilog = _SELECTION_HELP
    return parser


def split_selection_flags(argv: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """Split ``argv`` into ``--ir-op-priority*`` flags, ``--ir-pass.*`` flags and the rest.

    Only the syntax is checked here (values are validated against the ops and
    passes once torch is imported). A flag written ``--flag VALUE`` takes the
    next argument as its value, unless that is a command name or another
    flag: then the value was forgotten.

    >>> split_selection_flags(["--ir-op-priority.rms_norm=native", "ops", "--json"])
    (['--ir-op-priority.rms_norm=native'], [], ['ops', '--json'])
    """
    priority: list[str] = []
    passes: list[str] = []
    rest: list[str] = []
    cursor = ArgvCursor(argv)
    for arg in cursor:
        if arg == "--":
            rest.extend(cursor.rest())
            break
        if arg.startswith(PRIORITY_FLAG):
            target, example = priority, f"{PRIORITY_FLAG}.rms_norm=native"
        elif arg.startswith(PASS_FLAG + "."):
            target, example = passes, f"{PASS_FLAG}.fuse_norm_quant=off"
        else:
            rest.append(arg)
            continue
        flag, eq, _ = arg.partition("=")
        if eq:
            target.append(arg)
            continue
        value = cursor.take()
        if value is None or value.startswith("--") or value in COMMANDS:
            got = "nothing" if value is None else repr(value)
            raise UsageError(
                f"{flag} expects a value before the command, got {got}; write e.g. {example}"
            )
        target.append(f"{flag}={value}")
    return priority, passes, rest


_WRAP_VALUES = {"on": True, "off": False}


def take_torch_wrap_flag(argv: Sequence[str]) -> tuple[bool | None, list[str]]:
    """``--ir-torch-wrap=on|off`` (anywhere, like the selection flags) and the rest of ``argv``.

    >>> take_torch_wrap_flag(["--ir-torch-wrap=off", "demo"])
    (False, ['demo'])
    """
    value: bool | None = None
    rest: list[str] = []
    cursor = ArgvCursor(argv)
    for arg in cursor:
        if arg == "--":
            rest.extend(cursor.rest())
            break
        flag, eq, text = arg.partition("=")
        if flag != TORCH_WRAP_FLAG:
            rest.append(arg)
            continue
        if not eq:
            text = cursor.take() or ""
        if text.lower() not in _WRAP_VALUES:
            raise UsageError(
                f"{TORCH_WRAP_FLAG} takes on or off, got {text!r}; "
                f"write e.g. {TORCH_WRAP_FLAG}=off for trace-through mode"
            )
        value = _WRAP_VALUES[text.lower()]
    return value, rest


def _quiet_broken_pipe() -> int:
    """The reader stopped reading (``vllm-ir ... | head``): stop without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the final flush at exit must not fail again
    except (OSError, ValueError):
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vllm-ir``; returns the exit status (2 for bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            torch_wrap, argv = take_torch_wrap_flag(argv)
            priority, passes, rest = split_selection_flags(argv)
            args = build_parser().parse_args(rest)
            args.torch_wrap = torch_wrap
            command = importlib.import_module("vllm_ir._cli.main")
            status = int(command.run(args, priority, passes))
            sys.stdout.flush()
            return status
        except ValueError as e:  # UsageError, and the config's validation errors
            sys.stdout.flush()
            print(f"vllm-ir: error: {e}", file=sys.stderr)
            return 2
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        print("vllm-ir: interrupted", file=sys.stderr)
        return 130
