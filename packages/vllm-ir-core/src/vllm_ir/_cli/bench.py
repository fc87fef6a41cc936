"""``vllm-ir bench OP``: every applicable impl timed side by side, plus native compiled."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from vllm_ir._base.timing import NOISY, is_noisy, spread, time_call
from vllm_ir._cli.args import (
    UsageError,
    apply_threads,
    checked_call,
    parse_device,
    parse_dtype,
    parse_op,
    parse_shape,
    writable_file,
)
from vllm_ir._cli.table import render_table
from vllm_ir._op.op import IrOp

__all__ = ["NOISY", "is_noisy", "run", "spread", "time_call"]

COMPILED = "native (compiled)"


def _candidates(op: IrOp, call: tuple[Any, ...]) -> dict[str, Callable[..., Any]]:
    """The impls selection accepts for ``call`` (``VLLM_BATCH_INVARIANT`` included), by name."""
    found = op.candidates(*call, mode="eager")
    return {
        provider: op.impls[provider].impl_fn
        for provider in sorted(found.accepted())
        if provider in op.impls
    }


def run(args: argparse.Namespace) -> int:
    op = parse_op(args.op)
    shapes = [parse_shape(s) for s in re.split(r"[\s;]+", args.shapes.strip()) if s]
    dtypes = [parse_dtype(d) for d in args.dtypes.split(",")]
    device = parse_device(args.device)
    json_path = writable_file("--json", args.json) if args.json else None
    plot_path = writable_file("--plot", args.plot) if args.plot else None
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
            call = checked_call(op, shape, dtype, device, args.arg)
            impls = _candidates(op, call)
            if compiled_native is not None:
                impls[COMPILED] = compiled_native
            jobs.extend((shape, dtype, name, fn, call) for name, fn in impls.items())
    print(apply_threads(args.threads))
    print(f"warm-up: {args.warmup} calls; then {args.rounds} rounds of ~10 ms per impl")
    records = []
    for i, (shape, dtype, name, fn, call) in enumerate(jobs, 1):
        label = f"{'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')} {name}"
        note = (
            " (compiles first: may take a minute in a fresh environment)"
            if name == COMPILED
            else ""
        )
        print(f"[{i}/{len(jobs)}] {label}{note}", file=sys.stderr, flush=True)
        with torch.inference_mode():
            samples = time_call(partial(fn, *call), device, args.rounds, args.warmup)
        median, p10, p90 = spread(samples)
        records.append(
            {
                "op": op.name,
                "shape": list(shape),
                "dtype": str(dtype).removeprefix("torch."),
                "impl": name,
                "median_us": round(median, 3),
                "p10_us": round(p10, 3),
                "p90_us": round(p90, 3),
                "noisy": is_noisy(median, p10, p90),
                "rounds": len(samples),
            }
        )
    _print(records)
    if json_path is not None:
        data = {"device": device, "threads": torch.get_num_threads(), "results": records}
        try:
            json_path.write_text(json.dumps(data, indent=2) + "\n")
        except OSError as e:
            raise UsageError(f"--json {args.json}: cannot write: {e.strerror}") from None
        print(f"wrote {args.json}")
    if plot_path is not None:
        _plot(records, plot_path)
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
                f"{r['p10_us']:.2f}-{r['p90_us']:.2f}",
                speedup,
                "too noisy to trust" if r["noisy"] else "",
            ]
        )
    headers = ["shape", "dtype", "impl", "median us", "p10-p90 us", "vs native eager", "note"]
    print(render_table(headers, rows))
    print("vs native eager: native eager's median over this impl's (2.00x: twice as fast)")
    noisy = sum(bool(r["noisy"]) for r in records)
    if noisy:
        fewer = ", --threads 1" if torch.get_num_threads() != 1 else ""
        print(
            f"\n{noisy} of {len(records)} timings spread over {NOISY:.0%} of their median "
            "(p90 - p10): the machine is busy or the rounds too few. Rerun with more "
            f"--rounds{fewer}, or on an idle machine before comparing them."
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
