"""Entry point of the ``vllm-ir`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vllm_ir._version import __version__
from vllm_ir.cli import bench, demo, explain, ops_cmd, tune
from vllm_ir.cli.args import UsageError, add_priority_help
from vllm_ir.config import parse_ir_op_priority_args, parse_ir_pass_args

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-ir", description="Inspect, explain and benchmark vllm-ir kernel selection."
    )
    parser.add_argument("--version", action="version", version=f"vllm-ir {__version__}")
    add_priority_help(parser)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (ops_cmd, explain, bench, demo, tune):
        module.add_parser(subparsers)
    for sub in subparsers.choices.values():
        add_priority_help(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vllm-ir``; returns the exit status (2 for bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config, rest = parse_ir_op_priority_args(argv)
        passes, rest = parse_ir_pass_args(rest)
        args = build_parser().parse_args(rest)
        args.passes = passes
        with config.scope():
            return int(args.func(args))
    except (UsageError, ValueError) as e:
        print(f"vllm-ir: error: {e}", file=sys.stderr)
        return 2
