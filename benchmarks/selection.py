"""Does choosing kernels per size bucket pay? Kernel crossovers, a compiled decoder, a plan.

Five sections, timed with ``vllm-ir tune --model``'s interleaved rounds
(:func:`vllm_ir._cli.tune_model.sample_interleaved`: every setting once per
round, the order rotating; ``vllm-ir bench``'s timer; a p10-p90 spread over
25 % of the median is flagged ``noisy``). Each compares a *bucketed* setting
with every *fixed* priority: a selection pass picks each bucket's fixed
priority (the overall fastest, unless another is faster in that bucket in 9
of 10 rounds: noise keeps the default, as ``vllm-ir tune --model`` keeps it),
an independent evaluation pass re-times them all side by side. Reported per
bucket: bucketed / best fixed (target <= 1.03), and over a decode+prefill mix
(each decode token count ``--decode-weight`` times per prefill): bucketed /
the best single fixed priority (target < 1). The ratios are paired: each
round's samples of the two settings, timed side by side, divided, and the
median over rounds reported with its p10-p90, so that the machine's drift
between rounds cancels. The decoder sections run in bf16 (``--decoder-dtype``),
the kernels section in fp32.

* ``kernels``: every CPU impl of ``rms_norm`` (``native``, ``cpu_c`` when
  vllm-ir-cpu is installed) across token counts 1..4096, eagerly, with the
  winner per token count and every pairwise crossover found (an impl faster
  at small counts and slower at large ones). Beside them, ``aten``: ATen's
  own fused CPU kernel (``torch.rms_norm``, one dispatcher call), registered
  here as a second real CPU impl, and ``inductor``: the native function
  compiled by Inductor (token dim dynamic) behind its Python wrapper, for
  eager calls, registered for this section only. ``kernels.bucketed``: the
  per-bucket winners (bounds 16, 256, 1024) as a bucketed ``rms_norm`` table,
  re-timed through the op's eager dispatch against every impl fixed.
  ``kernels.bucketed_crossing_pair``: the same, choosing only between the two
  impls of the first crossover found (``crossing_pair``), so that an impl
  faster than both at every size does not make the table one fixed priority.
* ``compiled_decoder``: the compile benchmark's decoder
  (``benchmarks/compiled_priorities.py``) compiled once per fixed priority
  (every op on ``native``, or on ``cpu_c``), the token dim dynamic, at decode
  and prefill sizes. The choice runs as ``bucketed_graph``: ONE compile under
  the bucketed table with ``bucket_dispatch="branches"`` (a ``torch.cond``
  branch per bucket whose impls differ); as ``bucketed_graphs``: the default
  ``bucket_dispatch="graphs"``, a compiled graph per size range picked per
  call (both refuse recompiles across sizes > 1; Dynamo gives size 1 its own
  graph); and as ``bucketed_switch``: the chosen fixed model per size (the
  same compiled model as a fixed setting: their difference measures the noise).
* ``eager_decoder``: the same decoder in eager mode, each fixed priority and
  the bucketed table (chosen by its own eager selection pass) in a scope.
* ``eager_decoder_crossing_pair``: the eager decoder choosing, for every op,
  between ``native`` and ``inductor`` (registered on each of its ops for this
  section), the pair that crosses on this CPU: ``native``'s ATen ops cost the
  least per call at decode, ``inductor``'s one fused kernel per op wins at
  prefill, where bf16 ``native`` upcasts and makes a pass per ATen op;
  ``cpu_c``, faster than both everywhere here, is left out of this one.
* ``plan``: the kernel plan (:func:`vllm_ir.plan`) of a kernelized tiny
  random Hugging Face Llama at a decode and a prefill size: every norm and MLP
  with the impl that ran (needs transformers and vllm-ir-transformers).

    python benchmarks/selection.py [--out benchmarks/results/selection.json] [--quick]
        [--threads 1] [--rounds 10] [--hidden 256] [--layers 4] [--decoder-dtype bfloat16]
        [--sections ...]

The JSON holds the load average at start and end (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_OUT = Path(__file__).parent / "results" / "selection.json"
BOUNDS = (16, 256)
KERNEL_BOUNDS = (16, 256, 1024)
"""The kernels section's buckets: one more bound, where the CPU crossovers measured are."""
WITHIN = 0.03
CROSSING_PAIR = ("native", "inductor")
"""The decoder's crossing pair: the two impls of each op with a crossover on this CPU."""
EPSILON = 1e-6


def _aten_rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """ATen's fused CPU kernel (``torch.rms_norm``): one dispatcher call."""
    return torch.rms_norm(x, (x.shape[-1],), weight, epsilon)


def _register_aten() -> None:
    import vllm_ir as ir

    if "aten" not in ir.ops.rms_norm.impls:
        ir.ops.rms_norm.register_impl(
            "aten",
            supports_args=lambda x, weight, epsilon, variance_size=None: (
                variance_size is None and x.dtype == torch.float32 and x.device.type == "cpu"
            ),
        )(_aten_rms_norm)


def _label(index: int, bounds: Sequence[int] = BOUNDS) -> str:
    from vllm_ir._selection.buckets import SizePlan

    return SizePlan(tuple(bounds)).label(index)


def _bucket(tokens: int, bounds: Sequence[int] = BOUNDS) -> str:
    """The bucket of ``tokens`` in a table with ``bounds`` (``<=16``, ``<=256``, ``>256``)."""
    from vllm_ir._selection.buckets import SizePlan

    return SizePlan(tuple(bounds)).label_of(tokens)


def _bound(fn: Callable[..., Any], call: tuple[Any, ...]) -> Callable[[], Any]:
    return lambda: fn(*call)


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _pass_timings(
    samples: dict[int, dict[str, list[float]]], tokens: Sequence[int]
) -> dict[str, dict[str, Any]]:
    """A pass's timings for the report: per token count, each setting's samples summarized."""
    from vllm_ir._cli.tune_model import summarize

    return {str(t): {n: asdict(summarize(v)) for n, v in samples[t].items()} for t in tokens}


def _register_inductor(op_names: Sequence[str] = ("rms_norm",)) -> Callable[[], None]:
    """Register ``inductor`` on each op: its native function compiled by Inductor (dynamic
    sizes), a real CPU kernel behind a Python wrapper's overhead; eager calls only.
    Returns its undo."""
    import functools

    import vllm_ir as ir
    from torch._subclasses.fake_tensor import is_fake

    registered = []
    for name in op_names:
        op = ir.get_op(name)
        if "inductor" in op.impls:
            continue
        compiled = torch.compile(op.native, dynamic=True)
        impl = functools.wraps(op.native)(lambda *a, _fn=compiled, **k: _fn(*a, **k))
        # not under torch.compile: a compiled function inside a traced graph is not a kernel
        real = functools.wraps(op.native)(lambda *a, **k: not is_fake(a[0]))
        op.register_impl("inductor", supports_args=real)(impl)
        registered.append(op)

    def undo() -> None:
        for op in registered:
            op.unregister_impl("inductor")

    return undo


def kernels(tokens: Sequence[int], hidden: int, rounds: int, decode_weight: int) -> dict[str, Any]:
    """rms_norm's CPU impls side by side per token count; winners and crossovers; the
    per-bucket winners as a bucketed table against each impl fixed."""
    undo = _register_inductor()
    try:
        return _kernels(tokens, hidden, rounds, decode_weight)
    finally:
        undo()


def _kernels(tokens: Sequence[int], hidden: int, rounds: int, decode_weight: int) -> dict[str, Any]:
    import vllm_ir as ir
    from vllm_ir._cli.tune_model import sample_interleaved, summarize

    op = ir.ops.rms_norm
    weight = torch.randn(hidden)
    rows = []
    picked: dict[int, dict[str, list[float]]] = {}
    for t in tokens:
        x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(t))
        call = (x, weight, EPSILON, None)
        impls = sorted(op.candidates(*call, mode="eager").accepted())
        want = op.native(*call)
        for name in impls:
            torch.testing.assert_close(op.impls[name].impl_fn(*call), want)
        steps = {name: _bound(op.impls[name].impl_fn, call) for name in impls}
        with torch.inference_mode():
            picked[t] = sample_interleaved(steps, rounds, warmup=3)
        times = {n: summarize(v) for n, v in picked[t].items()}
        best = min(times, key=lambda n: times[n].median_us)
        rows.append(
            {
                "tokens": t,
                "bucket": _bucket(t),
                "times_us": {n: asdict(v) for n, v in times.items()},
                "winner": best,
            }
        )
        line = ", ".join(f"{n} {v.median_us:.1f} us" for n, v in times.items())
        print(f"kernels {t:>5} tokens: {line} -> {best}", flush=True)
    crossovers = _crossovers(rows)
    # the impls with a crossover beyond the spread (or by medians), without the impls
    # faster than both at every size: the per-size choice among impls that cross
    crossing = crossovers or _crossovers(rows, beyond_spread=False)
    pair = sorted({crossing[0]["faster_small"], crossing[0]["faster_large"]}) if crossing else None
    return {
        "op": "rms_norm",
        "hidden": hidden,
        "rows": rows,
        "crossovers": crossovers,
        "crossovers_by_median": _crossovers(rows, beyond_spread=False),
        "bucketed": _kernels_bucketed(tokens, hidden, rounds, picked, decode_weight),
        "crossing_pair": pair,
        "bucketed_crossing_pair": _kernels_bucketed(
            tokens, hidden, rounds, picked, decode_weight, pair, _crossing_bounds(rows, pair)
        )
        if pair
        else None,
    }


def _kernels_bucketed(
    tokens: Sequence[int],
    hidden: int,
    rounds: int,
    picked: dict[int, dict[str, list[float]]],
    decode_weight: int,
    names: Sequence[str] | None = None,
    bounds: Sequence[int] = KERNEL_BOUNDS,
) -> dict[str, Any]:
    """The per-bucket winners of the rows above (the selection pass) as a bucketed
    table of rms_norm, against every impl fixed, re-timed through the op's eager
    dispatch (an independent evaluation pass; every call enters its setting's
    priority scope, the same cost for each setting). ``names``: choose among these
    impls only (default: every impl measured), in buckets with ``bounds``."""
    import vllm_ir as ir
    from vllm_ir._cli.tune_model import sample_interleaved

    op = ir.ops.rms_norm
    names = sorted(names or next(iter(picked.values())))
    choice = _choose(tokens, picked, names, bounds)
    labels = [_label(i, bounds) for i in range(len(bounds) + 1)]
    table = [{"max_tokens": b, "priority": [choice[labels[i]]]} for i, b in enumerate(bounds)]
    table.append({"priority": [choice[labels[-1]]]})
    settings = {n: ir.IrOpPriorityConfig(rms_norm=[n]) for n in names}
    settings["bucketed_table"] = ir.IrOpPriorityConfig(rms_norm=table)
    weight = torch.randn(hidden)
    print(f"kernels: bucketed table {table}", flush=True)

    def step(config: Any, x: Tensor) -> Callable[[], Any]:
        def run() -> Any:
            with config.scope():
                return op(x, weight, EPSILON)

        return run

    evaluated, ran = {}, {}
    with torch.inference_mode():
        for t in tokens:
            x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(t))
            with settings["bucketed_table"].scope():
                ran[str(t)] = op.selected_impl(x, weight, EPSILON).provider
            steps = {n: step(c, x) for n, c in settings.items()}
            evaluated[t] = sample_interleaved(steps, rounds, warmup=3)
    return {
        "impls": names,
        "bucket_bounds": list(bounds),
        "table": table,
        "ran_under_table": ran,
        "evaluation_pass": _pass_timings(evaluated, tokens),
        **_summary(tokens, evaluated, names, ["bucketed_table"], choice, decode_weight, bounds),
    }


def _crossing_bounds(rows: list[dict[str, Any]], pair: Sequence[str]) -> tuple[int, ...]:
    """Bucket bounds for choosing within ``pair``: the decode bound, and the last measured
    size before each change of the faster of the two (a tuner cuts where winners change)."""
    faster = [min(pair, key=lambda n: r["times_us"][n]["median_us"]) for r in rows]
    changes = {rows[i]["tokens"] for i in range(len(rows) - 1) if faster[i] != faster[i + 1]}
    return tuple(sorted({BOUNDS[0], *changes}))


def _crossovers(rows: list[dict[str, Any]], *, beyond_spread: bool = True) -> list[dict[str, Any]]:
    """Pairs (a, b) with a faster than b at the smallest token count and slower at the largest:
    beyond both spreads (a's p90 below b's p10, and the reverse), or by medians only."""
    if not rows:
        return []
    first, last = rows[0]["times_us"], rows[-1]["times_us"]
    low, high = ("p90_us", "p10_us") if beyond_spread else ("median_us", "median_us")
    found = []
    for a in first:
        for b in first:
            if a == b or a not in last or b not in last:
                continue
            small = first[a][low] < first[b][high]
            large = last[a][high] > last[b][low]
            if small and large:
                at = next(
                    r["tokens"]
                    for r in rows
                    if r["times_us"][a]["median_us"] > r["times_us"][b]["median_us"]
                )
                found.append({"faster_small": a, "faster_large": b, "first_tokens_b_wins": at})
    return found


def bucketed_table(
    fixed: dict[str, dict[str, list[str]]], choice: dict[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """The bucketed priority table running, in each bucket, that bucket's chosen fixed
    priority (an op the choice does not pin gets ``[]``: its defaults, as there)."""
    ops = sorted({op for p in fixed.values() for op in p})
    labels = [_label(i) for i in range(len(BOUNDS) + 1)]
    table = {}
    for op in ops:
        entries: list[dict[str, Any]] = []
        for i, label in enumerate(labels):
            entry: dict[str, Any] = {"priority": list(fixed[choice[label]].get(op, []))}
            if i < len(BOUNDS):
                entry = {"max_tokens": BOUNDS[i], **entry}
            entries.append(entry)
        table[op] = entries
    return table


def _paired_ratios(
    samples: dict[int, dict[str, list[float]]], tokens: Sequence[int], name: str, reference: str
) -> list[float]:
    """Per round: ``name``'s sample over ``reference``'s of the same round, geometric
    mean over ``tokens``."""
    rounds = min(len(v) for t in tokens for v in samples[t].values())
    return [
        _geomean([samples[t][name][r] / samples[t][reference][r] for t in tokens])
        for r in range(rounds)
    ]


def _choose(
    tokens: Sequence[int],
    picked: dict[int, dict[str, list[float]]],
    names: Sequence[str],
    bounds: Sequence[int] = BOUNDS,
) -> dict[str, str]:
    """Per bucket of ``tokens``, from the selection pass's samples: the default (the
    name with the lowest geometric-mean median over all token counts), unless
    another name is faster there in 9 of 10 rounds (its paired ratio to the
    default, geometric mean over the bucket's token counts, has its p90 below 1;
    the lowest such median wins). A difference within the noise keeps the default,
    as ``vllm-ir tune --model`` keeps it."""
    from vllm_ir._cli.bench import spread

    default = min(names, key=lambda n: _geomean([statistics.median(picked[t][n]) for t in tokens]))
    choice = {}
    for i in range(len(bounds) + 1):
        ts = [t for t in tokens if _bucket(t, bounds) == _label(i, bounds)]
        if not ts:
            continue
        faster = {}
        for n in names:
            if n == default:
                continue
            median, _, p90 = spread(_paired_ratios(picked, ts, n, default))
            if p90 < 1:
                faster[n] = median
        choice[_label(i, bounds)] = min(faster, key=faster.__getitem__) if faster else default
    # a bucket without a measured size keeps the choice of the bucket below it
    ordered: dict[str, str] = {}
    for i in range(len(bounds) + 1):
        below = ordered[_label(i - 1, bounds)] if i else default
        ordered[_label(i, bounds)] = choice.get(_label(i, bounds), below)
    return ordered


def _quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, p10, p90), rounded."""
    from vllm_ir._cli.bench import spread

    return tuple(round(v, 4) for v in spread(values))  # type: ignore[return-value]


def _summary(
    tokens: Sequence[int],
    samples: dict[int, dict[str, list[float]]],
    fixed: Sequence[str],
    bucketed: Sequence[str],
    choice: dict[str, str],
    decode_weight: int,
    bounds: Sequence[int] = BOUNDS,
) -> dict[str, Any]:
    """Per bucket, each bucketed setting over the best fixed priority there; over the
    decode+prefill mix, each bucketed setting over the best single fixed priority.

    The best fixed priority is the one with the lowest medians; the ratios are
    paired: round ``r``'s ratio divides the two settings' samples of round ``r``
    (timed side by side, :func:`~vllm_ir._cli.tune_model.sample_interleaved`),
    geometric mean over a bucket's token counts, and the figure is the median
    over rounds with its p10-p90. Pairing cancels the machine's drift between
    rounds, which independent medians do not."""
    from vllm_ir._cli.tune_model import summarize

    medians = {t: {n: statistics.median(v) for n, v in samples[t].items()} for t in tokens}
    rounds = range(min(len(v) for t in tokens for v in samples[t].values()))
    per_bucket = {}
    labels = [_label(i, bounds) for i in range(len(bounds) + 1)]
    for b in labels:
        ts = [t for t in tokens if _bucket(t, bounds) == b]
        if not ts:
            continue
        best_fixed = min(fixed, key=lambda n: _geomean([medians[t][n] for t in ts]))
        paired = {n: _quantiles(_paired_ratios(samples, ts, n, best_fixed)) for n in bucketed}
        per_bucket[b] = {
            "tokens": ts,
            "choice": choice[b],
            "best_fixed": best_fixed,
            "over_best_fixed": {n: q[0] for n, q in paired.items()},
            "over_best_fixed_p10_p90": {n: list(q[1:]) for n, q in paired.items()},
            "within_3pct": {n: q[0] <= 1 + WITHIN for n, q in paired.items()},
            "noisy": any(summarize(v).noisy for t in ts for v in samples[t].values()),
        }
    weights = {t: decode_weight if t <= BOUNDS[0] else 1 for t in tokens}
    names = [*fixed, *bucketed]
    mix = {n: sum(weights[t] * medians[t][n] for t in tokens) for n in names}
    per_round = {
        n: [sum(weights[t] * samples[t][n][r] for t in tokens) for r in rounds] for n in names
    }
    best_single = min(fixed, key=lambda n: mix[n])
    mix_ratios = {
        n: [a / b for a, b in zip(per_round[n], per_round[best_single], strict=True)]
        for n in bucketed
    }
    paired_mix = {n: _quantiles(r) for n, r in mix_ratios.items()}
    return {
        "buckets": per_bucket,
        "mix": {
            "weights": {str(t): w for t, w in weights.items()},
            "total_us": {n: round(v, 1) for n, v in mix.items()},
            "best_single_fixed": best_single,
            "over_best_single": {n: q[0] for n, q in paired_mix.items()},
            "over_best_single_p10_p90": {n: list(q[1:]) for n, q in paired_mix.items()},
            "faster": {n: q[0] < 1 for n, q in paired_mix.items()},
            "faster_in_9_of_10_rounds": {n: q[2] < 1 for n, q in paired_mix.items()},
            "share_of_rounds_faster": {
                n: round(sum(r < 1 for r in ratios) / len(ratios), 3)
                for n, ratios in mix_ratios.items()
            },
        },
        "choice_is_a_single_fixed_priority": len(set(choice.values())) == 1,
    }


def _lowered(backend: Any) -> dict[str, list[str]]:
    """Per op, what the backend's latest compile lowered its nodes to (``<=16:a;b``
    for a node branched per bucket)."""
    return {op: sorted(set(n.values())) for op, n in backend.lowering_pass.selected_impls.items()}


@dataclass(frozen=True)
class DecoderRun:
    """The decoder comparison's sizes and timing, shared by its compiled and eager forms."""

    tokens: Sequence[int]
    hidden: int
    intermediate: int
    layers: int
    rounds: int
    decode_weight: int
    """How many times a decode step (1 token) counts in the mix against a prefill."""
    dtype: torch.dtype = torch.bfloat16
    """The model's weights and activations: bf16, as LLM inference runs."""

    def setup(self) -> tuple[torch.nn.Module, dict[str, Any], dict[int, Tensor]]:
        """The decoder (eval mode), the fixed candidate priorities on CPU, and one input
        per token count (seeded by it)."""
        from compiled_priorities import Decoder, candidates

        model = Decoder(self.hidden, self.intermediate, self.layers).eval().to(self.dtype)
        fixed = candidates("cpu")
        inputs = {
            t: torch.randn(t, self.hidden, generator=torch.Generator().manual_seed(t)).to(
                self.dtype
            )
            for t in self.tokens
        }
        return model, fixed, inputs

    def passes(
        self,
        picked: dict[int, dict[str, list[float]]],
        evaluated: dict[int, dict[str, list[float]]],
        fixed: dict[str, Any],
        bucketed: list[str],
        choice: dict[str, str],
    ) -> dict[str, Any]:
        """The report's timings of the selection and evaluation passes, and their summary."""
        tokens = self.tokens
        return {
            "selection_pass": _pass_timings(picked, tokens),
            "evaluation_pass": _pass_timings(evaluated, tokens),
            **_summary(tokens, evaluated, list(fixed), bucketed, choice, self.decode_weight),
        }


def compiled_decoder(run: DecoderRun) -> dict[str, Any]:
    """Fixed priorities vs the per-bucket choice on the compiled decoder: the choice run
    as ONE graph under the bucketed table (a runtime branch per bucket, token dim
    dynamic, recompiles refused), and as the switch between the fixed models."""
    import vllm_ir as ir
    from vllm_ir._cli.tune_model import sample_interleaved
    from vllm_ir.testing import inductor_caches_off

    model, fixed, inputs = run.setup()
    tokens, rounds = run.tokens, run.rounds
    compiled: dict[str, Any] = {}
    selected: dict[str, Any] = {}

    def compile_with(name: str, priority: dict[str, Any], dispatch: Any = "graphs") -> None:
        backend = ir.VllmIRBackend(priority=priority, bucket_dispatch=dispatch)
        fn = torch.compile(model, backend=backend, dynamic=True)
        # one graph for every size > 1 (the token dim dynamic); Dynamo specializes
        # size 1 (its 0/1 rule), so one token gets a second graph of its own
        many = [x for t, x in inputs.items() if t > 1]
        fn(many[0])
        # what the dynamic graph lowered to, before a size-1 graph reuses the node names
        lowered = {"dynamic": _lowered(backend)}
        torch.compiler.set_stance("fail_on_recompile")
        try:
            for x in many[1:]:
                fn(x)  # warm-up at every size; a recompile would raise
        finally:
            torch.compiler.set_stance("default")
        for x in (x for t, x in inputs.items() if t == 1):
            fn(x)
            lowered["tokens_1"] = _lowered(backend)
        compiled[name] = fn
        selected[name] = lowered
        print(f"compiled decoder: {name} {selected[name]}", flush=True)

    with inductor_caches_off(), torch.no_grad():
        for name, priority in fixed.items():
            compile_with(name, priority)

        def steps_for(t: int, choice: dict[str, str] | None) -> dict[str, Callable[[], Any]]:
            x = inputs[t]
            steps = {n: (lambda fn=fn: fn(x)) for n, fn in compiled.items()}
            if choice is not None:
                steps["bucketed_switch"] = steps[choice[_bucket(t)]]
            return steps

        # selection pass: each bucket's best fixed priority
        picked = {t: sample_interleaved(steps_for(t, None), rounds, warmup=2) for t in tokens}
        choice = _choose(tokens, picked, list(fixed))
        table = bucketed_table(fixed, choice)
        print(f"compiled decoder: bucket choice {choice}", flush=True)
        compile_with("bucketed_graph", table, "branches")
        compile_with("bucketed_graphs", table)
        # evaluation pass: independent timings of every fixed priority and the bucketed choice
        evaluated = {t: sample_interleaved(steps_for(t, choice), rounds, warmup=2) for t in tokens}
    # the switch runs its choice's very compiled model: their difference is noise
    same_model = {}
    for t in tokens:
        same = statistics.median(evaluated[t][choice[_bucket(t)]])
        switch = statistics.median(evaluated[t]["bucketed_switch"])
        same_model[str(t)] = round(abs(switch / same - 1), 4)
    bucketed = ["bucketed_graph", "bucketed_graphs", "bucketed_switch"]
    return {
        "model": {
            "hidden": run.hidden,
            "intermediate": run.intermediate,
            "layers": run.layers,
            "dtype": str(run.dtype).removeprefix("torch."),
        },
        "fixed_priorities": fixed,
        "bucketed_table": table,
        "selected_by_lowering": selected,
        "recompiles": (
            "none across sizes > 1 (fail_on_recompile); size 1 has its own graph "
            "(Dynamo's 0/1 specialization)"
        ),
        "bucket_bounds": list(BOUNDS),
        **run.passes(picked, evaluated, fixed, bucketed, choice),
        "same_model_difference": same_model,
    }


def eager_decoder(run: DecoderRun, fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The same comparison in eager mode: each fixed priority in a scope, against the
    bucketed table (chosen by an eager selection pass) in a scope: the bucket is part
    of the eager selection key. ``fixed``: the candidate priorities (default: every
    CPU provider's)."""
    import vllm_ir as ir
    from vllm_ir._cli.tune_model import sample_interleaved

    model, candidates, inputs = run.setup()
    fixed = fixed or candidates
    tokens, rounds = run.tokens, run.rounds

    def step(priority: dict[str, Any], x: Tensor) -> Callable[[], Any]:
        config = ir.IrOpPriorityConfig(**priority)

        def run() -> Any:
            with config.scope():
                return model(x)

        return run

    with torch.no_grad():
        picked = {
            t: sample_interleaved({n: step(p, inputs[t]) for n, p in fixed.items()}, rounds, 2)
            for t in tokens
        }
        choice = _choose(tokens, picked, list(fixed))
        table = bucketed_table(fixed, choice)
        print(f"eager decoder: bucket choice {choice}", flush=True)
        evaluated = {}
        for t in tokens:
            steps = {n: step(p, inputs[t]) for n, p in fixed.items()}
            steps["bucketed_table"] = step(table, inputs[t])
            evaluated[t] = sample_interleaved(steps, rounds, warmup=2)
        with ir.IrOpPriorityConfig(**table).scope():
            ran = {t: ir.plan(model, inputs[t]).by_op() for t in tokens}
    return {
        "bucketed_table": table,
        "ran_under_table": {str(t): r for t, r in ran.items()},
        **run.passes(picked, evaluated, fixed, ["bucketed_table"], choice),
    }


def eager_decoder_crossing_pair(run: DecoderRun) -> dict[str, Any]:
    """The eager decoder choosing, for every op, between the kernels section's crossing
    pair: ``native`` (eager ATen ops: little overhead per call) and ``inductor`` (the
    native function compiled: one fused kernel behind a Python wrapper). ``cpu_c`` is
    left out: faster than both at every size on this CPU, it would make the choice one
    fixed priority (the ``eager_decoder`` section has it)."""
    from compiled_priorities import OPS

    undo = _register_inductor(OPS)
    try:
        fixed = {name: {op: [name] for op in OPS} for name in CROSSING_PAIR}
        return {"impls": list(CROSSING_PAIR), **eager_decoder(run, fixed)}
    finally:
        undo()


def plan_of_llama(tokens: Sequence[int]) -> dict[str, Any] | None:
    """The kernel plan of a kernelized tiny random Llama, per token count (None without
    transformers / vllm-ir-transformers)."""
    try:
        import transformers
        from vllm_ir_transformers import kernelize
        from vllm_ir_transformers.tiny import tiny_config
    except ImportError as e:
        print(f"plan: skipped ({e})")
        return None
    import vllm_ir as ir

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**tiny_config(token_ids=False))
    model = transformers.LlamaForCausalLM(config).eval()
    report = kernelize(model)
    plans = {}
    for t in tokens:
        shape = (t, 1) if t <= BOUNDS[0] else (1, t)
        with torch.inference_mode():
            plan = ir.plan(model, torch.randint(0, 128, shape), use_cache=False)
        print(plan.table(candidates=False), flush=True)
        plans[str(t)] = plan.to_dict()
    replaced = [r.name for r in report.replaced]
    listed = {s["site"] for p in plans.values() for s in p["sites"]}
    computed_inside = {
        s.name for s in report.current() if s.runs.startswith("not called")
    }  # post-attention norms, computed by their layer's fused_add_rms_norm
    return {
        "model": "LlamaForCausalLM (2 layers, hidden 64, random weights)",
        "replaced": replaced,
        "every_replaced_module_listed": all(n in listed or n in computed_inside for n in replaced),
        "computed_inside_fused_layers": sorted(computed_inside),
        "plans": plans,
    }


def _verdict(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with whether the timings behind it can be trusted."""
    decoder, eager = report["compiled_decoder"], report.get("eager_decoder")
    found: dict[str, Any] = {
        "kernel_crossover_found": bool(report["kernels"]["crossovers"]),
        "kernel_crossover_by_median": bool(report["kernels"]["crossovers_by_median"]),
    }
    noisy = False
    for section, name, key in (
        (report["kernels"]["bucketed"], "bucketed_table", "kernels_bucketed_table"),
        (
            report["kernels"]["bucketed_crossing_pair"],
            "bucketed_table",
            "kernels_crossing_pair_bucketed_table",
        ),
        (decoder, "bucketed_graph", "decoder_bucketed_graph"),
        (decoder, "bucketed_graphs", "decoder_bucketed_graphs"),
        (decoder, "bucketed_switch", "decoder_bucketed_switch"),
        (eager, "bucketed_table", "eager_decoder_bucketed_table"),
        (
            report.get("eager_decoder_crossing_pair"),
            "bucketed_table",
            "eager_decoder_crossing_pair_bucketed_table",
        ),
    ):
        if section is None:
            continue
        buckets = section["buckets"].values()
        single = section["choice_is_a_single_fixed_priority"]
        noisy = noisy or any(b["noisy"] for b in buckets)
        mix = section["mix"]
        found[key] = {
            "within_3pct_in_every_bucket": all(b["within_3pct"][name] for b in buckets),
            "faster_than_best_single_fixed_over_mix": mix["faster"][name] and not single,
            "faster_over_mix_in_9_of_10_rounds": mix["faster_in_9_of_10_rounds"][name]
            and not single,
            "share_of_rounds_faster_over_mix": mix["share_of_rounds_faster"][name],
            "choice_is_a_single_fixed_priority": single,
        }
    same = decoder["same_model_difference"].values()
    found["timings_noisy"] = noisy
    found["max_same_model_difference"] = max(same) if same else None
    found["note"] = (
        "some settings' samples spread over 25 % of their median: a ratio above is "
        "established only where its paired p10-p90 (over_best_fixed_p10_p90, "
        "over_best_single_p10_p90) stays on its side of the target, as "
        "faster_over_mix_in_9_of_10_rounds says for the mix; else rerun on an idle "
        "machine (more --rounds)"
        if noisy
        else "timings within the spread limit"
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="few sizes and rounds (smoke test)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--kernel-hidden", type=int, default=4096)
    parser.add_argument(
        "--decoder-dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help="the decoder sections' dtype (the kernels section runs fp32)",
    )
    parser.add_argument("--decode-weight", type=int, default=32)
    parser.add_argument(
        "--sections",
        default="kernels,decoder,eager,eager-crossing,plan",
        help="comma separated (default all)",
    )
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    torch.set_num_threads(args.threads)
    import vllm_ir as ir

    _register_aten()
    if args.quick:
        kernel_tokens, decoder_tokens, plan_tokens = [1, 64], [1, 300], [1]
        args.rounds, args.kernel_hidden = min(args.rounds, 3), 256
    else:
        kernel_tokens = [1, 4, 16, 64, 256, 1024, 4096]
        decoder_tokens = [1, 4, 16, 64, 256, 1024, 4096]
        plan_tokens = [1, 256]
    decoder = DecoderRun(
        decoder_tokens,
        args.hidden,
        args.intermediate,
        args.layers,
        args.rounds,
        args.decode_weight,
        getattr(torch, args.decoder_dtype),
    )
    report = {
        "benchmark": "selection",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "vllm_ir": ir.__version__,
        "threads": torch.get_num_threads(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "load_average_at_end": None,
        "cpus": os.cpu_count(),
        "timing": {
            "method": "interleaved rounds (vllm_ir._cli.tune_model.sample_interleaved), "
            "host clock, ~10 ms of calls per sample",
            "rounds": args.rounds,
            "noisy": "p90 - p10 over 25 % of the median",
            "ratios": "paired: each round's samples of two settings divided, the median "
            "over rounds with its p10-p90",
        },
        "kernels": kernels(kernel_tokens, args.kernel_hidden, args.rounds, args.decode_weight)
        if "kernels" in sections
        else None,
        "compiled_decoder": compiled_decoder(decoder) if "decoder" in sections else None,
        "eager_decoder": eager_decoder(decoder) if "eager" in sections else None,
        "eager_decoder_crossing_pair": eager_decoder_crossing_pair(decoder)
        if "eager-crossing" in sections
        else None,
        "plan": plan_of_llama(plan_tokens) if "plan" in sections else None,
    }
    report["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    both = report["kernels"] is not None and report["compiled_decoder"] is not None
    report["verdict"] = _verdict(report) if both else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    sections_out = {
        "kernels_bucketed": report["kernels"]["bucketed"] if report["kernels"] else None,
        "kernels_crossing_pair": report["kernels"]["bucketed_crossing_pair"]
        if report["kernels"]
        else None,
        "compiled_decoder": report["compiled_decoder"],
        "eager_decoder": report["eager_decoder"],
        "eager_decoder_crossing_pair": report["eager_decoder_crossing_pair"],
    }
    for key, section in sections_out.items():
        if section is None:
            continue
        for b, r in section["buckets"].items():
            ratios = ", ".join(f"{n} {v:.3f}" for n, v in r["over_best_fixed"].items())
            noisy = " (noisy)" if r["noisy"] else ""
            print(
                f"{key} bucket {b}: choice {r['choice']}; over best fixed "
                f"{r['best_fixed']}: {ratios}{noisy}"
            )
        mix = section["mix"]
        ratios = ", ".join(f"{n} {v:.3f}" for n, v in mix["over_best_single"].items())
        print(
            f"{key} decode+prefill mix, over best single fixed "
            f"({mix['best_single_fixed']}): {ratios}"
        )
    if report["kernels"] is not None:
        print(f"crossovers: {report['kernels']['crossovers'] or 'none'}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
