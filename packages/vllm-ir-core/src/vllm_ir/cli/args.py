"""Parsing the arguments shared by the commands, and building op call arguments."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from vllm_ir.op import IrOp, get_op

__all__ = ["DTYPES", "UsageError", "call_args_for", "parse_dtype", "parse_op", "parse_shape"]

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


class UsageError(ValueError):
    """Bad command-line input: printed without a traceback, exit status 2."""


def parse_op(name: str) -> IrOp:
    try:
        return get_op(name)
    except KeyError as e:
        raise UsageError(e.args[0]) from None


def parse_dtype(text: str) -> torch.dtype:
    try:
        return DTYPES[text.strip().lower()]
    except KeyError:
        raise UsageError(
            f"unknown dtype {text!r}; use one of {', '.join(sorted(set(DTYPES)))}"
        ) from None


def parse_shape(text: str) -> tuple[int, ...]:
    """``"8,4096"`` or ``"8x4096"`` -> ``(8, 4096)``."""
    parts = text.replace("x", ",").split(",")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"malformed shape {text!r}; expected e.g. 8,4096 or 8x4096") from None
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"malformed shape {text!r}: every dimension must be positive")
    return shape


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["variance_size=64"]`` -> ``{"variance_size": 64}`` (Python literals)."""
    import ast

    values = {}
    for item in items:
        name, eq, raw = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--arg expects NAME=VALUE, got {item!r}")
        try:
            values[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise UsageError(f"--arg {name}: {raw!r} is not a Python literal") from None
    return values


def call_args_for(
    op: IrOp,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    overrides: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """Arguments for one call of ``op``: activations of ``shape``, other tensors
    shaped like in the op's first sample input but with ``shape``'s last dim,
    non-tensor arguments from the sample (``overrides`` by name win)."""
    sample = next(op.sample_inputs(dtype, device))
    names = list(op.signature.parameters)
    overrides = dict(overrides or {})
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise UsageError(
            f"{op.name} has no parameter {unknown[0]!r}; parameters: {', '.join(names)}"
        )
    args: list[Any] = []
    for i, name in enumerate(names):
        if name in overrides:
            args.append(overrides[name])
            continue
        value = sample.args[i] if i < len(sample.args) else op.signature.parameters[name].default
        if isinstance(value, torch.Tensor):
            if name in op.activations:
                value = torch.randn(*shape, dtype=dtype, device=device)
            else:
                value = torch.randn(*value.shape[:-1], shape[-1], dtype=dtype, device=device)
        args.append(value)
    return tuple(args)


def add_priority_help(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Kernel selection: --ir-op-priority.OP=a,b (repeatable) or "
        '--ir-op-priority \'{"OP": ["a", "b"]}\'. '
        "Compile passes: --ir-pass.NAME=on|off (e.g. --ir-pass.fuse_norm_quant=off)."
    )
