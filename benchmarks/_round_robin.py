"""Interleaved CPU timing shared by the CPU benchmarks (``_*.py``: a shared module).

Variants are timed round-robin in a shuffled order each round, so a burst of
other load hits every variant alike; the median over rounds is reported.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

Scope = Callable[[], contextlib.AbstractContextManager[Any]]


def clock() -> Callable[[], float]:
    """CPU time of this thread when it does all the work (one intra-op thread):
    time the machine's other load takes from the process is not counted.
    Wall time otherwise."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def time_round_robin(
    variants: Mapping[str, Callable[[], object]],
    rounds: int,
    min_sample_s: float,
    scopes: Mapping[str, Scope] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each variant, timed interleaved.

    ``scopes[name]`` (a priority scope, say) is entered once per sample of that
    variant, and the scope's first call is not timed: it selects, and misses
    the caches, once.
    """
    tick = clock()
    scopes = scopes or {}
    number = {}
    for name, fn in variants.items():  # warm-up, and a call count per sample
        with scopes.get(name, contextlib.nullcontext)():
            for _ in range(3):
                fn()
            start = tick()
            fn()
            once = max(tick() - start, 1e-7)
        number[name] = max(1, int(min_sample_s / once))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            fn, n = variants[name], number[name]
            scope = scopes.get(name)
            with scope() if scope is not None else contextlib.nullcontext():
                if scope is not None:
                    fn()
                start = tick()
                for _ in range(n):
                    fn()
                samples[name].append((tick() - start) / n)
    return {name: statistics.median(s) for name, s in samples.items()}


def kernel_vs_native(
    kernel: Callable[..., object],
    native: Callable[..., object],
    compiled: Callable[..., object],
    args: tuple[Any, ...],
    rounds: int,
    name: str = "cpu_c",
) -> dict[str, Any]:
    """One row's timings: ``kernel``, ``native`` and ``compiled`` (native) on ``args``.

    Returns ``median_us`` per variant and the ratios ``native_over_<name>``
    and ``compiled_over_<name>`` (> 1: the kernel is faster).
    """
    med = time_round_robin(
        {
            name: lambda: kernel(*args),
            "native": lambda: native(*args),
            "native_compiled": lambda: compiled(*args),
        },
        rounds,
        min_sample_s=0.01,
    )
    return {
        "median_us": {k: round(v * 1e6, 2) for k, v in med.items()},
        f"native_over_{name}": round(med["native"] / med[name], 2),
        f"compiled_over_{name}": round(med["native_compiled"] / med[name], 2),
    }


def kernel_line(label: str, row: Mapping[str, Any], name: str = "cpu_c") -> str:
    """The printed line of a :func:`kernel_vs_native` row."""
    return (
        f"{label}  {name} {row['median_us'][name]:>9.1f} us  "
        f"x{row[f'native_over_{name}']:>5.2f} vs native  "
        f"x{row[f'compiled_over_{name}']:>5.2f} vs compiled"
    )


def timing_row(
    seconds: Mapping[str, float], ratio: tuple[str, str, str], **facts: Any
) -> dict[str, Any]:
    """One row of a timing table: ``facts`` (op, dtype, sizes, ...), the median µs of
    each variant in ``seconds``, and ``ratio = (key, slower, faster)``: the key
    ``key`` holding ``seconds[slower] / seconds[faster]`` (> 1: ``faster`` is)."""
    key, slower, faster = ratio
    return {
        **facts,
        "median_us": {k: round(v * 1e6, 2) for k, v in seconds.items()},
        key: round(seconds[slower] / seconds[faster], 2),
    }


def model_line(label: str, row: Mapping[str, Any]) -> str:
    """The printed line of a compiled-model row (:func:`timing_row` of ``native`` over
    ``cpu_c``, from :func:`time_on_copies`)."""
    return (
        f"model {label}  native {row['median_us']['native']:>9.1f} us  cpu_c "
        f"{row['median_us']['cpu_c']:>9.1f} us  x{row['native_over_cpu_c']:.2f}"
    )


def run_facts(load_at_start: list[float], rounds: int, elapsed: float) -> dict[str, Any]:
    """What every CPU benchmark report says of the run: versions, machine, clock, load."""
    import os
    import platform

    import vllm_ir as ir

    return {
        "torch": torch.__version__,
        "vllm_ir": ir.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "clock": clock().__name__,
        "python": platform.python_version(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
        "rounds": rounds,
        "seconds": round(elapsed, 1),
    }


def write_report(report: Mapping[str, Any], out: Any, summary: Any, elapsed: float) -> None:
    """Write ``report`` as JSON to ``out`` (a path), print ``summary`` and where it went."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"{elapsed:.0f} s; wrote {out}")


def cpu_bench_parser(doc: str | None, out: Any) -> Any:
    """The options every CPU benchmark takes: ``--out`` (default ``out``), ``--rounds``,
    ``--quick`` and ``--threads``; add a benchmark's own before ``parse_cpu_bench_args``."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a small grid, for a smoke test")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads (default 1: on a shared 2-core machine, an OpenMP team "
        "whose second thread is descheduled stalls for milliseconds, swamping the kernels)",
    )
    return parser


def parse_cpu_bench_args(parser: Any) -> Any:
    """Parse the options and apply ``--threads``."""
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def time_on_copies(
    compiled: Mapping[str, Callable[[torch.Tensor], object]], x: torch.Tensor, rounds: int
) -> dict[str, float]:
    """Median seconds of each compiled model on a fresh copy of ``x``, net of the copy.

    Each call gets its own copy (a compiled graph may donate its input); the
    time of the copy alone is timed with them and taken off.
    """
    variants: dict[str, Callable[[], object]] = {
        p: lambda f=fn: f(x.clone()) for p, fn in compiled.items()
    }
    variants["copy_only"] = lambda: x.clone()
    med = time_round_robin(variants, rounds, min_sample_s=0.01)
    copy = med.pop("copy_only")
    return {k: max(v - copy, 1e-9) for k, v in med.items()}
