"""``vllm-ir tune``: measure each op's candidate impls here, write a priority config.

For eager deployments, where no compiler chooses: every impl eager selection
would accept is timed at each named shape (``native`` eagerly, as eager runs
it), and each op gets a priority list ordered by measurement. The output loads
with ``--ir-op-priority=@tuned.json`` or ``IrOpPriorityConfig.from_json``, and
keeps the measured times, which ``vllm-ir explain OP --tuned tuned.json`` shows.

By default each op is measured per token bucket (``--buckets``, default
16,256) and gets a bucketed priority entry (:mod:`vllm_ir._cli.tune_buckets`).
With ``--shapes`` instead, a priority list is per op, for every size: it
orders providers by their time relative to the fastest, averaged
geometrically over the shapes; each shape's own winner is recorded too.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from vllm_ir._cli import tune_buckets
from vllm_ir._cli.args import (
    UsageError,
    apply_threads,
    call_args_for,
    checked_call,
    parse_device,
    parse_dtype,
    parse_op,
    parse_shape,
)
from vllm_ir._cli.tuning_file import applying, output_path, stamped, write_tuning
from vllm_ir._discovery.stamps import environment
from vllm_ir._op.op import IrOp
from vllm_ir._selection.buckets import as_priority, format_bucket_text
from vllm_ir.compilation._autotune import (
    DEFAULT_MARGIN,
    WallClockTimer,
    candidates,
    decide,
    measure,
)
from vllm_ir.priority import without_tuned_tables

__all__ = [
    "explain_autotune",
    "explain_tuned",
    "parse_named_shapes",
    "read_tuned",
    "run",
    "tune",
    "tuned_problem",
]

_TIE = 0.02  # within 2 % of the fastest: a tie, the earlier priority keeps its place


def parse_named_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """``"decode=1x4096,prefill=4096x4096"`` (names optional) -> ``{name: shape}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, eq, shape = item.rpartition("=")
        if "," in shape or not shape:
            raise UsageError(f"--shapes item {item!r}: dims are joined by x, e.g. decode=1x4096")
        shapes[name if eq else shape] = parse_shape(shape)
    if not shapes:
        raise UsageError("--shapes is empty; e.g. --shapes decode=1x4096,prefill=4096x4096")
    return shapes


def tune(
    ops: list[IrOp],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: torch.dtype,
    device: str,
    timer: Any,
) -> dict[str, Any]:
    """The ``vllm-ir tune`` document (see module doc) for ``ops`` at ``shapes``."""
    priority: dict[str, list[str]] = {}
    measured: dict[str, Any] = {}
    for op in ops:
        per_shape: dict[str, Any] = {}
        order: list[str] = []
        for name, shape in shapes.items():
            call = call_args_for(op, shape, dtype, device)
            impls = candidates(op, call, mode="eager")
            order = order or [i.provider for i in impls]
            times = measure(op, impls, call, timer, compiled_native=False)
            per_shape[name] = {
                "shape": list(shape),
                "times_us": {p: round(t * 1e6, 3) for p, t in times.items()},
                "winner": decide(times, [i.provider for i in impls], 0.0, _TIE),
            }
        if len(order) < 2:
            continue  # nothing to choose: leave the op to its defaults
        priority[op.name] = _rank(order, per_shape)
        measured[op.name] = per_shape
    return {
        "ir_op_priority": priority,
        "measured": measured,
        "dtype": str(dtype).removeprefix("torch."),
        "device": device,
        "environment": environment(torch.device(device)),
    }


def _rank(order: list[str], per_shape: dict[str, Any]) -> list[str]:
    """Providers by geometric mean of time / fastest time over the shapes."""

    def score(provider: str) -> float:
        ratios = []
        for result in per_shape.values():
            times = result["times_us"]
            if provider not in times:
                return math.inf
            ratios.append(times[provider] / max(min(times.values()), 1e-9))
        return math.exp(sum(map(math.log, ratios)) / len(ratios))

    scores = {p: score(p) for p in order}
    best = min(scores.values())
    # ties keep priority order: quantize relative to the best
    return sorted(order, key=lambda p: (scores[p] > best * (1 + _TIE), scores[p], order.index(p)))


def _number(value: object) -> bool:
    """A JSON number that prints as a float (an integer too large for one does not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def tuned_problem(doc: object, op_name: str) -> str | None:
    """What keeps ``doc`` from being a ``vllm-ir tune`` document with ``op_name``'s
    results well formed (``None``: nothing). A ``tune --model`` document (its
    figures under ``_measurements``) is checked as one."""
    from vllm_ir._cli import tune_model

    if tune_model.is_sweep(doc):
        assert isinstance(doc, dict)
        return tune_model.sweep_problem(doc, op_name)
    if not isinstance(doc, dict) or "measured" not in doc:
        return "no 'measured' key"
    measured, priority = doc["measured"], doc.get("ir_op_priority")
    if not isinstance(measured, dict):
        return "'measured' is not an object"
    if not isinstance(priority, dict):
        return "'ir_op_priority' is missing or not an object"
    if op_name not in measured:
        return None
    providers = priority.get(op_name)
    try:
        as_priority(providers, op_name)
    except (TypeError, ValueError):
        providers = None
    if not isinstance(providers, list):
        return f"{op_name} is measured but has no list of provider names in 'ir_op_priority'"
    results = measured[op_name]
    if not isinstance(results, dict):
        return f"'measured.{op_name}' is not an object"
    for name, result in results.items():
        where = f"'measured.{op_name}.{name}'"
        if not isinstance(result, dict):
            return f"{where} is not an object"
        times, shape = result.get("times_us"), result.get("shape")
        if not isinstance(times, dict) or not all(_number(t) for t in times.values()):
            return f"{where} has no 'times_us' object of numbers"
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return f"{where} has no 'shape' list of integers"
        if not isinstance(result.get("winner"), str):
            return f"{where} has no 'winner'"
    return None


def read_tuned(path: str, op: IrOp) -> dict[str, Any]:
    """The ``vllm-ir tune`` document at ``path``, checked for ``op`` (a usage error if not)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else e
        raise UsageError(f"--tuned {path}: cannot read a vllm-ir tune file ({reason})") from None
    problem = tuned_problem(doc, op.name)
    if problem is not None:
        raise UsageError(
            f"--tuned {path}: not a well-formed vllm-ir tune file ({problem}); "
            "write one with `vllm-ir tune --out FILE` or `vllm-ir tune --model M --out FILE`"
        )
    assert isinstance(doc, dict)
    return doc


def explain_tuned(path: str, op: IrOp, doc: dict[str, Any] | None = None) -> None:
    """Print the measurements behind ``op``'s list in a ``vllm-ir tune`` file
    (``doc``: the file's document, already read by :func:`read_tuned`)."""
    from vllm_ir._cli import tune_model

    doc = read_tuned(path, op) if doc is None else doc
    if tune_model.is_sweep(doc):
        tune_model.explain_sweep(path, op.name, doc)
        return
    environment = doc.get("environment")
    device = environment.get("device") if isinstance(environment, dict) else None
    print(f"\ntuned in {path} ({doc.get('dtype')}, {device})")
    if op.name not in doc["measured"]:
        print(f"  {op.name}: not tuned (fewer than two candidates)")
        return
    spec = as_priority(doc["ir_op_priority"][op.name], op.name)
    text = format_bucket_text(spec) if not isinstance(spec, tuple) else ", ".join(spec)
    print(f"  priority: {text}")
    for name, result in doc["measured"][op.name].items():
        times = ", ".join(f"{p} {t:.1f} us" for p, t in result["times_us"].items())
        shape = "x".join(map(str, result["shape"]))
        undecided = "" if result.get("decided", True) else f" ({result.get('note', 'noisy')})"
        print(f"  {name} ({shape}): {times} -> {result['winner']}{undecided}")


def explain_autotune(op: IrOp, call: tuple[Any, ...], margin: float = DEFAULT_MARGIN) -> None:
    """Print what compiled-mode autotuning measures and decides for ``call``."""
    from vllm_ir.priority import compiled_selection

    with compiled_selection():
        impls = candidates(op, call)
    order = [i.provider for i in impls]
    print(f"  autotune candidates: {', '.join(order)}")
    if len(impls) < 2:
        print(f"  autotuned: {order[0]} (the only candidate)")
        return
    times = measure(op, impls, call, WallClockTimer())
    for p in order:
        note = " (Inductor-compiled, alone)" if p == "native" else ""
        print(f"    {p}: {times[p] * 1e6:.1f} us{note}")
    winner = decide(times, order, margin, _TIE)
    print(f"  autotuned: {winner} (a kernel must beat native by {margin:.0%})")


def run(args: argparse.Namespace) -> int:
    # measured against the defaults, not against the tuning file or cache being produced
    with without_tuned_tables():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # a whole model, end to end (an empty --model is refused by the parser)
    if getattr(args, "model", None) is not None:
        from vllm_ir._cli import tune_model

        return tune_model.run(args)
    ops = (
        [parse_op(name.strip()) for name in args.ops.split(",") if name.strip()]
        if args.ops
        else [op for name, op in sorted(IrOp.registry.items()) if op.has_input_generator]
    )
    if args.shapes is not None and args.buckets is not None:
        raise UsageError("give --buckets (one list per size range) or --shapes, not both")
    bounds = (
        None if args.shapes is not None else tune_buckets.parse_buckets(args.buckets or "16,256")
    )
    shapes = (
        parse_named_shapes(args.shapes)
        if bounds is None
        else {label: (n, args.hidden) for label, _b, n in tune_buckets.bucket_sizes(bounds)}
    )
    dtype = parse_dtype(args.dtype)
    if args.runs < 1:
        raise UsageError(f"--runs must be at least 1, got {args.runs}")
    # everything checked before any measurement, as bench does
    option, out = output_path(args.out, args.cache, kind="tune", replace=args.replace)
    device = parse_device(args.device)
    for op in ops:
        for shape in shapes.values():
            checked_call(op, shape, dtype, device)
    print(apply_threads(args.threads))
    if bounds is None:
        doc = tune(ops, shapes, dtype, device, WallClockTimer(warmup=args.warmup, runs=args.runs))
    else:
        priority, measured = tune_buckets.tune_buckets(
            ops, bounds, args.hidden, dtype, device, args.rounds, args.warmup
        )
        doc = {
            "ir_op_priority": priority,
            "measured": measured,
            "buckets": list(bounds),
            "dtype": str(dtype).removeprefix("torch."),
            "device": device,
            "environment": environment(torch.device(device)),
        }
    doc["threads"] = torch.get_num_threads()
    write_tuning(option, out, stamped(doc, device), replace=args.replace)
    for op_name, providers in doc["ir_op_priority"].items():
        winners = ", ".join(f"{n}: {r['winner']}" for n, r in doc["measured"][op_name].items())
        print(f"{op_name}: {format_bucket_text(as_priority(providers, op_name))}  ({winners})")
        for name, result in doc["measured"][op_name].items():
            if not result.get("decided", True):
                print(f"  {name}: {result['note']}")
    print(applying(option, out))
    return 0
