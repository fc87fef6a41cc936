"""``vllm-ir bench OP``: every applicable impl timed side by side, plus native compiled."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from vllm_ir.cli.args import (
    UsageError,
    call_args_for,
    parse_assignments,
    parse_dtype,
    parse_op,
    parse_shape,
)
from vllm_ir.cli.table import render_table
from vllm_ir.op import IrOp

__all__ = ["add_parser", "time_call"]

COMPILED = "native (compiled)"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], device: str, rounds: int, warmup: int) -> list[float]:
    """Microseconds per call, one sample per round; calls per round sized to ~10 ms."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, min(10_000, int(0.01 / once)))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - start) / number * 1e6)
    return samples


def _candidates(op: IrOp, call: tuple[Any, ...]) -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for provider, impl in sorted(op.impls.items()):
        if not impl.supported:
            continue
        if impl.supports_args is not None and impl.supports_args(*call) is not True:
            continue
        found[provider] = impl.impl_fn
    return found


def run(args: argparse.Namespace) -> int:
    op = parse_op(args.op)
    shapes = [parse_shape(s) for s in re.split(r"[\s;]+", args.shapes.strip()) if s]
    dtypes = [parse_dtype(d) for d in args.dtypes.split(",")]
    overrides = parse_assignments(args.arg)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install matplotlib") from None
    compiled_native = None
    if not args.no_compiled:
        compiled_native = torch.compile(op.native, backend="inductor", dynamic=False)
    jobs: list[tuple[tuple[int, ...], torch.dtype, str, Callable[..., Any], tuple[Any, ...]]] = []
    for shape in shapes:
        for dtype in dtypes:
            call = call_args_for(op, shape, dtype, args.device, overrides)
            impls = _candidates(op, call)
            if compiled_native is not None:
                impls[COMPILED] = compiled_native
            jobs.extend((shape, dtype, name, fn, call) for name, fn in impls.items())
    records = []
    for i, (shape, dtype, name, fn, call) in enumerate(jobs, 1):
        label = f"{'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')} {name}"
        print(f"[{i}/{len(jobs)}] {label}", file=sys.stderr, flush=True)
        with torch.inference_mode():
            samples = time_call(partial(fn, *call), args.device, args.rounds, args.warmup)
        records.append(
            {
                "op": op.name,
                "shape": list(shape),
                "dtype": str(dtype).removeprefix("torch."),
                "impl": name,
                "median_us": round(statistics.median(samples), 3),
                "stdev_us": round(statistics.stdev(samples), 3) if len(samples) > 1 else 0.0,
                "rounds": len(samples),
            }
        )
    _print(records)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": args.device, "results": records}, indent=2) + "\n"
        )
        print(f"wrote {args.json}")
    if args.plot:
        _plot(records, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def _print(records: list[dict[str, Any]]) -> None:
    native = {
        (tuple(r["shape"]), r["dtype"]): r["median_us"] for r in records if r["impl"] == "native"
    }
    rows = []
    for r in records:
        base = native.get((tuple(r["shape"]), r["dtype"]))
        speedup = f"{base / r['median_us']:.2f}x" if base else "-"
        rows.append(
            [
                "x".join(map(str, r["shape"])),
                r["dtype"],
                r["impl"],
                f"{r['median_us']:.2f}",
                f"{r['stdev_us']:.2f}",
                speedup,
            ]
        )
    print(
        render_table(["shape", "dtype", "impl", "median us", "stdev us", "vs native eager"], rows)
    )


def _plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({("x".join(map(str, r["shape"])), r["dtype"]) for r in records})
    impls = sorted({r["impl"] for r in records})
    width = 0.8 / max(len(impls), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(groups)), 4))
    for j, impl in enumerate(impls):
        values = [
            next(
                (
                    r["median_us"]
                    for r in records
                    if (("x".join(map(str, r["shape"])), r["dtype"]) == g and r["impl"] == impl)
                ),
                0,
            )
            for g in groups
        ]
        ax.bar([i + j * width for i in range(len(groups))], values, width, label=impl)
    ax.set_xticks([i + width * (len(impls) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{s}\n{d}" for s, d in groups])
    ax.set_ylabel("median us per call (lower is better)")
    ax.set_title(records[0]["op"] if records else "")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="time every applicable impl of an op side by side")
    parser.add_argument("op")
    parser.add_argument(
        "--shapes",
        default="1x4096 64x4096",
        help="activation shapes, space separated (default '1x4096 64x4096')",
    )
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma separated (default fp32,bf16)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--no-compiled", action="store_true", help="skip native compiled by Inductor"
    )
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the results (needs matplotlib)")
    parser.set_defaults(func=run)
