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
