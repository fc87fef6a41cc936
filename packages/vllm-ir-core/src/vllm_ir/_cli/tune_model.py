"""``vllm-ir tune --model PATH_OR_NAME``: sweep a whole model, write a bucketed priority file.

For each token count (``--tokens``) the model's kernel plan
(:func:`vllm_ir.plan`) says which IR ops it calls and which impls accept each
call. Then, one op at a time with the others at their defaults, the
end-to-end step time is measured with each candidate first on that op's
priority list, interleaved with the default (every round times each setting
once, in rotating order, so a load spike hits all settings alike; the timing
itself is ``vllm-ir bench``'s). Per op and size bucket (``--buckets``) a
candidate replaces the default only when it is faster at every token count of
the bucket by more than the spread of both (its p90 below the default's p10);
a spread above ``bench``'s limit refuses to decide and says so. Finally the
combined winners are re-measured against the defaults.

The file written has the bucketed priority format under ``ir_op_priority``
(``{"rms_norm": [{"max_tokens": 16, "priority": [...]}, {"priority": [...]}]}``:
ascending bounds, the last entry for the rest) and the figures under
``_measurements``; priority loaders read ``ir_op_priority`` of such a
document and ignore the other keys.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from vllm_ir._cli.args import UsageError, apply_threads
from vllm_ir._cli.bench import NOISY, is_noisy, spread, time_call
from vllm_ir._cli.model_source import ModelSource, load_model
from vllm_ir._cli.table import render_table
from vllm_ir._cli.tuning_file import applying, output_path, stamped, write_tuning
from vllm_ir._discovery.stamps import environment
from vllm_ir._op.op import get_op
from vllm_ir._selection.buckets import SizePlan, as_priority, priority_for_tokens
from vllm_ir.priority import scoped_priority

__all__ = [
    "DEFAULT",
    "Timing",
    "bucket_table",
    "decide_bucket",
    "explain_sweep",
    "is_sweep",
    "measure_interleaved",
    "parse_ints",
    "priority_for",
    "run",
    "sample_interleaved",
    "summarize",
    "sweep",
    "sweep_problem",
]

DEFAULT = "default"
"""The setting with every op at its current priority."""


@dataclass(frozen=True)
class Timing:
    """Microseconds per step: median and p10-p90 over the interleaved rounds."""

    median_us: float
    p10_us: float
    p90_us: float
    noisy: bool
    rounds: int


def parse_ints(option: str, text: str) -> list[int]:
    """``"1,16,256"`` -> ``[1, 16, 256]`` (positive, ascending, no repeats)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected integers joined by commas") from None
    if not values or any(v < 1 for v in values) or values != sorted(set(values)):
        raise UsageError(f"{option} {text!r}: give positive integers in ascending order")
    return values


def _scoped(step: Callable[[], Any], priority: dict[str, list[str]]) -> Callable[[], Any]:
    checked = {op: get_op(op).check_providers(p) for op, p in priority.items()}

    def run() -> Any:
        with scoped_priority(checked):
            return step()

    return run


def sample_interleaved(
    steps: dict[str, Callable[[], Any]], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Microseconds per call of every setting, one sample per round (~10 ms of calls,
    ``bench``'s :func:`~vllm_ir._cli.bench.time_call`), the order rotating between
    rounds: sample ``r`` of each setting comes from the same round, so ratios of
    samples pair settings that ran side by side."""
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].extend(time_call(steps[name], "cpu", rounds=1, warmup=0))
    return samples


def summarize(values: Sequence[float]) -> Timing:
    """The median and p10-p90 of one setting's samples, flagged noisy past ``bench``'s limit."""
    median, p10, p90 = spread(values)
    return Timing(
        round(median, 2), round(p10, 2), round(p90, 2), is_noisy(median, p10, p90), len(values)
    )


def measure_interleaved(
    steps: dict[str, Callable[[], Any]], rounds: int, warmup: int
) -> dict[str, Timing]:
    """Every setting's :func:`sample_interleaved` samples, summarized."""
    samples = sample_interleaved(steps, rounds, warmup)
    return {name: summarize(values) for name, values in samples.items()}


TOO_NOISY = "too noisy to decide"
"""How a decision the timings could not make starts (the summary counts them)."""


def decide_bucket(
    per_tokens: dict[int, dict[str, Timing]], default: dict[int, str]
) -> tuple[str | None, str]:
    """The provider to put first for a bucket, or None to keep the defaults; and why.

    ``per_tokens[t][provider]``: the step time with ``provider`` first (the
    default's under ``DEFAULT``); ``default[t]``: the provider that runs by default.
    """
    if not per_tokens:
        return None, "no token count measured in this bucket: defaults kept"
    common = set.intersection(*(set(v) for v in per_tokens.values())) - {DEFAULT}

    def score(p: str) -> float:
        ratios = [v[p].median_us / v[DEFAULT].median_us for v in per_tokens.values()]
        return math.exp(sum(map(math.log, ratios)) / len(ratios))

    if not common:
        return None, "one candidate only: defaults kept"
    best = min(sorted(common), key=score)
    involved = [v[name] for v in per_tokens.values() for name in (best, DEFAULT)]
    noisy = [t for t in involved if t.noisy]
    if noisy:
        worst = max((t.p90_us - t.p10_us) / t.median_us for t in noisy)
        fewer = ", --threads 1" if torch.get_num_threads() != 1 else ""
        return None, (
            f"{TOO_NOISY} (spread {worst:.0%} of the median > {NOISY:.0%}): defaults "
            f"kept; rerun with more --rounds{fewer}, or on an idle machine"
        )
    if all(default[t] == best for t in per_tokens):
        return None, f"the default ({best}) is fastest"
    if all(v[best].p90_us < v[DEFAULT].p10_us for v in per_tokens.values()):
        return best, f"{best} is faster at every size ({score(best):.2f}x the default's time)"
    return None, (
        f"{best} ({score(best):.2f}x the default's time) is within the spread of the default: "
        "defaults kept"
    )


def priority_for(op: str, first: str | None) -> list[str]:
    """The op's effective eager list now, with ``first`` moved to the front."""
    current = get_op(op).get_priority("eager")
    return current if first is None else [first, *(p for p in current if p != first)]


def bucket_table(lists: Sequence[list[str]], bounds: Sequence[int]) -> list[dict[str, Any]]:
    """The bucketed priority format: ``max_tokens`` per bound, the last entry for the rest."""
    table: list[dict[str, Any]] = [
        {"max_tokens": bound, "priority": p} for bound, p in zip(bounds, lists, strict=False)
    ]
    table.append({"priority": lists[len(bounds)]})
    return table


UNMEASURED = ("below", "above")
"""What a size between measured token counts gets: the decision of the largest
measured count below it (default), or of its bucket, decided at counts above it."""


def below_table(
    lists: Sequence[list[str]], bounds: Sequence[int], tokens: Sequence[int]
) -> list[dict[str, Any]]:
    """The table that gives a size no measurement reached the list decided at the
    largest measured count below it, never a decision made only at larger sizes
    (a size rounded up to a tuned bucket can run a kernel chosen for much more
    work). Sizes below every measured count take the smallest one's list.

    ``lists[b]`` is the decision of bucket ``b`` of ``bounds``, made at the
    ``tokens`` inside it:

    >>> below_table([["a"], ["b"]], (16,), (1, 16, 256))  # 17 to 255 were not measured
    [{'max_tokens': 255, 'priority': ['a']}, {'priority': ['b']}]
    """
    plan = SizePlan(tuple(bounds))
    # (first size, list): from each measured count up, its bucket's decision
    starts = sorted((t, lists[plan.index(t)]) for t in set(tokens))
    segments: list[tuple[int | None, list[str]]] = []  # (last size or None, list)
    for i, (_, chosen) in enumerate(starts):
        last = starts[i + 1][0] - 1 if i + 1 < len(starts) else None
        if segments and segments[-1][1] == chosen:
            segments[-1] = (last, chosen)  # neighbours with one list: one entry
        else:
            segments.append((last, chosen))
    table: list[dict[str, Any]] = [
        {"max_tokens": last, "priority": chosen} for last, chosen in segments[:-1]
    ]
    table.append({"priority": segments[-1][1]})
    return table


def sweep(
    source: ModelSource,
    tokens: Sequence[int],
    bounds: Sequence[int],
    *,
    rounds: int,
    warmup: int,
    ops: Sequence[str] = (),
    log: Callable[[str], None] = print,
    unmeasured: str = "below",
) -> dict[str, Any]:
    """The ``tune --model`` document (see the module doc). Steps run under
    ``torch.inference_mode()``, as served models do (no autograd bookkeeping).
    ``unmeasured``: what sizes between measured counts get (:data:`UNMEASURED`)."""
    with torch.inference_mode():
        return _sweep(
            source,
            tokens,
            bounds,
            rounds=rounds,
            warmup=warmup,
            ops=ops,
            log=log,
            unmeasured=unmeasured,
        )


def _sweep(
    source: ModelSource,
    tokens: Sequence[int],
    bounds: Sequence[int],
    *,
    rounds: int,
    warmup: int,
    ops: Sequence[str],
    log: Callable[[str], None],
    unmeasured: str,
) -> dict[str, Any]:
    from vllm_ir._tools.planning import plan

    steps = {t: source.call(t) for t in tokens}
    plans = {t: _plan(plan, source, t) for t in tokens}
    used = sorted({s.op for p in plans.values() for s in p})
    chosen = [op for op in used if not ops or op in ops]
    measured = _measure(chosen, steps, plans, rounds, warmup, log)
    default_ran, timings = measured.default_ran, measured.timings
    table: dict[str, list[dict[str, Any]]] = {}
    per_op: dict[str, Any] = {}
    buckets_of = SizePlan(tuple(bounds))
    for op in chosen:
        lists, buckets = [], {}
        for b in range(len(buckets_of)):
            in_bucket = [t for t in tokens if buckets_of.index(t) == b]
            per_tokens = {t: _op_timings(timings[t], op, default_ran[op].get(t)) for t in in_bucket}
            first, why = decide_bucket(per_tokens, default_ran[op])
            lists.append(priority_for(op, first))
            label = buckets_of.label(b)
            buckets[label] = {
                "tokens": in_bucket,
                "first": first,
                "reason": why,
                "default_ran": {str(t): default_ran[op].get(t) for t in in_bucket},
                "times_us": {
                    str(t): {p: asdict(v) for p, v in times.items()}
                    for t, times in per_tokens.items()
                },
            }
        if unmeasured == "below":
            table[op] = below_table(lists, bounds, tokens)
        else:
            table[op] = bucket_table(lists, bounds)
        per_op[op] = buckets
    combined = _combined(plan, source, steps, table, rounds, warmup, log)
    held_out = midpoints(tokens)
    between = None
    if held_out:
        held_steps = {t: source.call(t) for t in held_out}
        held_plans = {t: _plan(plan, source, t) for t in held_out}
        between = _measure(chosen, held_steps, held_plans, rounds, warmup, log)
    against_best = {op: _table_against_best(op, table[op], measured, between) for op in chosen}
    return {
        "ir_op_priority": table,
        "_measurements": {
            "model": source.name,
            "kernelized": source.kernelized,
            "threads": torch.get_num_threads(),
            "rounds": rounds,
            "warmup": warmup,
            "tokens": list(tokens),
            "bucket_bounds": list(bounds),
            "unmeasured": unmeasured,
            "ops": per_op,
            "combined": combined,
            "held_out": held_out,
            "table_vs_best": against_best,
            "environment": environment(torch.device(_device_type(source))),
        },
    }


def _plan(plan: Callable[..., Any], source: ModelSource, tokens: int) -> Any:
    inputs = source.example_inputs(tokens)
    with torch.inference_mode():
        if isinstance(inputs, dict):
            return plan(source.model, **inputs)
        return plan(source.model, *inputs)


def _op_timings(times: dict[str, Timing], op: str, default: str | None) -> dict[str, Timing]:
    """The settings varying ``op``, by provider; the default also under its provider."""
    mine = {k.split("=", 1)[1]: v for k, v in times.items() if k.startswith(f"{op}=")}
    mine[DEFAULT] = times[DEFAULT]
    if default is not None:
        mine[default] = times[DEFAULT]
    return mine


def midpoints(tokens: Sequence[int]) -> list[int]:
    """Sizes held out of the decisions, to judge the table where it guessed: the
    geometric midpoint of each pair of neighbouring measured counts (when one
    lies strictly between them).

    >>> midpoints([1, 16, 256, 1024])
    [4, 64, 512]
    """
    ordered = sorted(set(tokens))
    middles = [(a, round(math.sqrt(a * b)), b) for a, b in itertools.pairwise(ordered)]
    return [m for a, m, b in middles if a < m < b]


@dataclass
class _Measured:
    """Per op and token count: what ran by default and every impl that accepted the
    call; per token count: every setting's timing."""

    default_ran: dict[str, dict[int, str]]
    accepted: dict[str, dict[int, list[str]]]
    timings: dict[int, dict[str, Timing]]


def _measure(
    chosen: Sequence[str],
    steps: dict[int, Callable[[], Any]],
    plans: dict[int, Any],
    rounds: int,
    warmup: int,
    log: Callable[[str], None],
) -> _Measured:
    """Time, at each token count of ``steps``, the step with each impl its plan says
    accepts the call first on one op's list (the others at their defaults),
    interleaved with the default."""
    found = _Measured({op: {} for op in chosen}, {op: {} for op in chosen}, {})
    for t, step in steps.items():
        for s in plans[t]:
            if s.op in found.accepted:
                found.default_ran[s.op].setdefault(t, s.ran)
                accepting = found.accepted[s.op].setdefault(t, [])
                for c in s.candidates:
                    if c.status != "rejected" and c.provider not in accepting:
                        accepting.append(c.provider)
        settings: dict[str, Callable[[], Any]] = {DEFAULT: step}
        for op in chosen:
            for p in found.accepted[op].get(t, []):
                if p != found.default_ran[op].get(t):
                    settings[f"{op}={p}"] = _scoped(step, {op: [p]})
        log(f"tokens {t}: {len(settings)} settings x {rounds} interleaved rounds")
        found.timings[t] = measure_interleaved(settings, rounds, warmup)
    return found


def _table_against_best(
    op: str, entries: list[dict[str, Any]], measured: _Measured, held_out: _Measured | None
) -> dict[str, Any]:
    """Per size, measured and held out: what the written table runs, the fastest
    candidate there, and the table's speed as a share of the best (1: the best)."""
    sizes: dict[str, Any] = {}
    for figures, is_held_out in ((measured, False), (held_out, True)):
        if figures is None:  # no held-out size lies between the measured ones
            continue
        for t, times in figures.timings.items():
            accepting = figures.accepted[op].get(t, [])
            default = figures.default_ran[op].get(t)
            mine = _op_timings(times, op, default)
            runs = next((p for p in _list_at(entries, op, t) if p in accepting), default)
            if runs not in mine:
                continue
            best = min((p for p in mine if p != DEFAULT), key=lambda p: mine[p].median_us)
            ratio = mine[best].median_us / mine[runs].median_us
            sizes[str(t)] = {
                "table": runs,
                "best": best,
                "ratio": round(ratio, 3),
                "held_out": is_held_out,
            }
    worst = {
        kind: min(
            ((s, f["ratio"]) for s, f in sizes.items() if f["held_out"] == held),
            key=lambda x: x[1],
            default=None,
        )
        for kind, held in (("measured", False), ("held_out", True))
    }
    return {"sizes": sizes, "worst": worst}


def _list_at(entries: list[dict[str, Any]], op: str, tokens: int) -> tuple[str, ...]:
    """The list a written table gives a call of ``tokens`` tokens."""
    return priority_for_tokens(as_priority(entries, f"priority of op {op!r}"), tokens)


def _combined(
    plan: Callable[..., Any],
    source: ModelSource,
    steps: dict[int, Callable[[], Any]],
    table: dict[str, list[dict[str, Any]]],
    rounds: int,
    warmup: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every op's bucket winner at once, re-measured against the defaults per token count."""
    result: dict[str, Any] = {}
    for t, step in steps.items():
        tuned = {op: list(_list_at(entries, op, t)) for op, entries in table.items()}
        if all(p == priority_for(op, None) for op, p in tuned.items()):
            result[str(t)] = {"same_as_default": True}
            continue
        with scoped_priority({op: get_op(op).check_providers(p) for op, p in tuned.items()}):
            ran = _plan(plan, source, t).by_op()
        log(f"tokens {t}: combined winners vs defaults")
        times = measure_interleaved({DEFAULT: step, "tuned": _scoped(step, tuned)}, rounds, warmup)
        result[str(t)] = {
            "default_us": asdict(times[DEFAULT]),
            "tuned_us": asdict(times["tuned"]),
            "speedup": round(times[DEFAULT].median_us / times["tuned"].median_us, 3),
            "tuned_ran": ran,
        }
    return result


def run(args: argparse.Namespace) -> int:
    tokens = parse_ints("--tokens", args.tokens)
    bounds = parse_ints("--buckets", args.buckets or "16,256")
    option, out = output_path(args.out, args.cache, kind="tune --model", replace=args.replace)
    ops = [name.strip() for name in args.ops.split(",") if name.strip()]
    for name in ops:
        try:
            get_op(name)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
    print(apply_threads(args.threads))
    source = load_model(args.model, bounds[0])
    print(f"{args.model}: {source.kernelized}")
    doc = sweep(
        source,
        tokens,
        bounds,
        rounds=args.rounds,
        warmup=args.warmup,
        ops=ops,
        unmeasured=args.unmeasured,
    )
    if not doc["ir_op_priority"]:
        raise UsageError(
            f"--model {args.model}: it calls no IR op (or none of --ops); nothing to tune"
        )
    doc = write_tuning(option, out, stamped(doc, _device_type(source)), replace=args.replace)
    _print(doc)
    variable = getattr(source.model, "ir_priority_variable", None)
    print(applying(option, out, variable if isinstance(variable, str) else None))
    return 0


def _device_type(source: ModelSource) -> str:
    """Where the model's parameters are (its steps run there): what the stamps name."""
    parameters = getattr(source.model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first.device.type if isinstance(first, torch.Tensor) else "cpu"


def _print(doc: dict[str, Any]) -> None:
    figures = doc["_measurements"]
    rows = []
    for op, buckets in figures["ops"].items():
        for label, b in buckets.items():
            rows.append(
                [op, label, ",".join(map(str, b["tokens"])), b["first"] or "-", b["reason"]]
            )
    print(render_table(["op", "bucket", "tokens", "put first", "decision"], rows))
    print(
        "put first: the provider moved to the front of the op's list in that bucket "
        "(-: the list stays as it is)"
    )
    for op, judged in figures.get("table_vs_best", {}).items():
        print(f"{op}: {_worst_line(judged['worst'])}")
    bounds = figures["bucket_bounds"]
    for t, c in figures["combined"].items():
        if c.get("same_as_default"):
            label = SizePlan(tuple(bounds)).label_of(int(t))
            print(f"tokens {t}: {_kept_summary(figures['ops'], label)}")
            continue
        noisy = (
            " (too noisy to trust)" if c["default_us"]["noisy"] or c["tuned_us"]["noisy"] else ""
        )
        print(
            f"tokens {t}: default {c['default_us']['median_us']:.1f} us, tuned "
            f"{c['tuned_us']['median_us']:.1f} us ({c['speedup']:.2f}x){noisy}"
        )


def _worst_line(worst: dict[str, Any]) -> str:
    """``the table runs at >= 0.98 of the best at measured sizes (worst at 256 tokens),
    >= 0.91 of the best at held-out sizes (worst at 64 tokens)``: the best candidate
    measured at that size, one op moved at a time."""
    parts = []
    for kind, words in (("measured", "measured sizes"), ("held_out", "held-out sizes")):
        if worst.get(kind) is not None:
            size, ratio = worst[kind]
            parts.append(f">= {ratio:.2f} of the best at {words} (worst at {size} tokens)")
    return "the table runs at " + ", ".join(parts) if parts else "nothing measured"


def _kept_summary(ops: dict[str, Any], label: str) -> str:
    """Why nothing changed in bucket ``label``: the defaults won, or could not be judged."""
    reasons = [buckets[label]["reason"] for buckets in ops.values() if label in buckets]
    noisy = sum(r.startswith(TOO_NOISY) for r in reasons)
    if noisy == len(reasons):
        why = f"the defaults stay, every decision {TOO_NOISY}"
    elif noisy:
        why = f"the defaults stay ({noisy} of {len(reasons)} decisions {TOO_NOISY})"
    else:
        why = "the defaults won in its bucket"
    return f"{why}: nothing to re-measure"


# -- explain --tuned on a sweep's file ---------------------------------------------


def is_sweep(doc: object) -> bool:
    """Whether ``doc`` is a ``tune --model`` document (its figures under ``_measurements``)."""
    return isinstance(doc, dict) and "_measurements" in doc and "measured" not in doc


def sweep_problem(doc: dict[str, Any], op_name: str) -> str | None:
    """What keeps ``doc`` from being a well-formed sweep document for ``op_name``
    (``None``: nothing; an op the sweep did not measure is fine)."""
    from vllm_ir._selection.buckets import as_priority

    figures, priority = doc["_measurements"], doc.get("ir_op_priority")
    if not isinstance(figures, dict) or not isinstance(figures.get("ops"), dict):
        return "'_measurements' has no 'ops' object"
    if not isinstance(priority, dict):
        return "'ir_op_priority' is missing or not an object"
    buckets = figures["ops"].get(op_name)
    if buckets is None:
        return None
    try:
        as_priority(priority.get(op_name), op_name)
    except (TypeError, ValueError) as e:
        return f"{op_name} is measured but its 'ir_op_priority' entry is not valid ({e})"
    if not isinstance(buckets, dict):
        return f"'_measurements.ops.{op_name}' is not an object"
    for label, b in buckets.items():
        where = f"'_measurements.ops.{op_name}.{label}'"
        if not isinstance(b, dict) or not isinstance(b.get("times_us"), dict):
            return f"{where} has no 'times_us' object"
        if not isinstance(b.get("reason"), str):
            return f"{where} has no 'reason'"
    return None


def explain_sweep(path: str, op_name: str, doc: dict[str, Any]) -> None:
    """Print a sweep's decision for ``op_name`` per bucket, with the step times behind it."""
    from vllm_ir._selection.buckets import as_priority, format_bucket_text

    figures = doc["_measurements"]
    print(f"\ntuned in {path} (tune --model {figures.get('model')}, end-to-end step times)")
    buckets = figures["ops"].get(op_name)
    if buckets is None:
        print(f"  {op_name}: not called by the model (or not swept)")
        return
    print(f"  priority: {format_bucket_text(as_priority(doc['ir_op_priority'][op_name], op_name))}")
    for label, b in buckets.items():
        print(f"  {label}: {b['reason']}")
        for tokens, times in b["times_us"].items():
            each = ", ".join(
                f"{p} {t['median_us']:.1f} us" for p, t in times.items() if isinstance(t, dict)
            )
            print(f"    tokens {tokens}: {each}")
