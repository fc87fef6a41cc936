"""``vllm-ir tune`` per token bucket: one measured priority list per size range.

For each op and each bucket (``--buckets 16,256``: <= 16 tokens, <= 256,
larger), the candidates eager selection accepts are timed on an activation
of ``tokens x --hidden`` (the bucket's upper bound; the last bucket at
:data:`~vllm_ir.compilation._autotune.LAST_BUCKET_FACTOR` times the largest
bound), round-robin over ``--rounds`` rounds (:func:`vllm_ir._base.timing.time_interleaved`)
with the thread count fixed (``--threads``, reported). The bucket's list is the
winner first, then the others by median time; a bucket whose timings are too
noisy to rank keeps the priority order and says so. The result is a bucketed
``ir_op_priority`` entry (a plain list when every bucket agrees).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from vllm_ir._base.timing import Timing, decide_or_refuse, time_interleaved
from vllm_ir._cli.args import UsageError, call_args_for
from vllm_ir._op.op import IrOp
from vllm_ir.compilation._autotune import LAST_BUCKET_FACTOR, candidates, check_buckets, decide

__all__ = ["bucket_sizes", "parse_buckets", "tune_buckets"]

_TIE = 0.02  # within 2 % of the fastest: a tie, the earlier priority keeps its place


def parse_buckets(text: str) -> tuple[int, ...]:
    """``"16,256"`` -> ``(16, 256)``, checked (positive, strictly ascending)."""
    try:
        bounds = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--buckets {text!r}: expected token bounds, e.g. 16,256") from None
    try:
        return check_buckets(bounds)
    except ValueError as e:
        raise UsageError(f"--buckets {text!r}: {e}") from None


def bucket_sizes(bounds: tuple[int, ...]) -> list[tuple[str, int | None, int]]:
    """``(label, max_tokens, tokens measured)`` per bucket, the last without a bound."""
    sizes: list[tuple[str, int | None, int]] = [(f"<={b}", b, b) for b in bounds]
    sizes.append((f">{bounds[-1]}", None, bounds[-1] * LAST_BUCKET_FACTOR))
    return sizes


def _ranked(timings: dict[str, Timing], order: list[str], winner: str, decided: bool) -> list[str]:
    if not decided:
        return list(order)
    rest = sorted((p for p in order if p != winner), key=lambda p: timings[p].median)
    return [winner, *rest]


def tune_buckets(
    ops: list[IrOp],
    bounds: tuple[int, ...],
    hidden: int,
    dtype: torch.dtype,
    device: str,
    rounds: int,
    warmup: int = 3,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(ir_op_priority, measured)`` for ``ops``, one bucket table per op (see module doc)."""
    priority: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    for op in ops:
        table: list[dict[str, Any]] = []
        results: dict[str, Any] = {}
        for label, bound, tokens in bucket_sizes(bounds):
            call = call_args_for(op, (tokens, hidden), dtype, device)
            impls = candidates(op, call, mode="eager")
            order = [i.provider for i in impls]
            fns = {i.provider: partial(i.impl_fn, *call) for i in impls}
            with torch.inference_mode():
                samples = time_interleaved(fns, device, rounds, warmup)
            timings = {p: Timing.of(s, 1e-6) for p, s in samples.items()}
            fastest = decide({p: t.median for p, t in timings.items()}, order, 0.0, _TIE)
            verdict = decide_or_refuse(timings, order, fastest)
            ranked = _ranked(timings, order, verdict.winner, verdict.decided)
            table.append(
                {"max_tokens": bound, "priority": ranked} if bound else {"priority": ranked}
            )
            results[label] = {
                "shape": [tokens, hidden],
                "tokens": tokens,
                "times_us": {p: round(t.median * 1e6, 3) for p, t in timings.items()},
                "p10_us": {p: round(t.p10 * 1e6, 3) for p, t in timings.items()},
                "p90_us": {p: round(t.p90 * 1e6, 3) for p, t in timings.items()},
                "noisy": sorted(p for p, t in timings.items() if t.noisy),
                "winner": verdict.winner,
                "decided": verdict.decided,
                **({"note": verdict.note} if verdict.note else {}),
            }
        measured[op.name] = results
        if all(len(r["times_us"]) < 2 for r in results.values()):
            # one candidate in every bucket: its figures, and the list it is alone on
            for r in results.values():
                r.setdefault("note", "one candidate: nothing to choose")
        lists = [b["priority"] for b in table]
        priority[op.name] = lists[0] if all(x == lists[0] for x in lists) else table
    return priority, measured
