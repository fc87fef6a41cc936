"""Timing that can be trusted on a busy machine: one machinery for ``vllm-ir bench``,
``vllm-ir tune`` and per-bucket autotuning.

* :func:`time_call` — microseconds per call, one sample per round of ~10 ms;
* :func:`time_interleaved` — several callables timed round-robin, so a burst
  of load from another process hits every candidate alike, not one;
* :func:`spread` / :func:`is_noisy` — median, p10, p90, and whether the
  spread (p90 - p10) exceeds :data:`NOISY` of the median;
* :func:`decide_or_refuse` — the fastest, unless noise makes the ranking
  meaningless: then the priority order stands, and the reason says so.

The thread count is the caller's to fix (``torch.set_num_threads``) and to
report (``torch.get_num_threads()``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "NOISY",
    "Verdict",
    "Timing",
    "decide_or_refuse",
    "is_noisy",
    "spread",
    "time_call",
    "time_interleaved",
]

NOISY = 0.25
"""A spread (p90 - p10) above this fraction of the median is flagged as too large to trust."""

_ROUND_S = 0.01  # each sample times ~10 ms of calls


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _calls_per_round(fn: Callable[[], Any], device: str, warmup: int) -> int:
    """``warmup`` untimed calls, then one timed call sizes a round to ~10 ms."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(10_000, int(_ROUND_S / once)))


def _sample(fn: Callable[[], Any], device: str, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / number * 1e6


def time_call(fn: Callable[[], Any], device: str, rounds: int, warmup: int) -> list[float]:
    """Microseconds per call, one sample per round; calls per round sized to ~10 ms.

    ``warmup`` untimed calls first (caches, allocator, lazy initialization),
    then one more timed call sizes the rounds.
    """
    number = _calls_per_round(fn, device, warmup)
    return [_sample(fn, device, number) for _ in range(rounds)]


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]], device: str, rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Microseconds per call of each of ``fns``, sampled round-robin: round ``r``
    times every callable once before round ``r + 1`` starts."""
    numbers = {name: _calls_per_round(fn, device, warmup) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_sample(fn, device, numbers[name]))
    return samples


def spread(samples: Sequence[float]) -> tuple[float, float, float]:
    """``(median, p10, p90)`` of ``samples`` (p10 = p90 = median for fewer than 2)."""
    median = statistics.median(samples)
    if len(samples) < 2:
        return median, median, median
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return median, deciles[0], deciles[-1]


def is_noisy(median: float, p10: float, p90: float) -> bool:
    return median > 0 and (p90 - p10) / median > NOISY


@dataclass(frozen=True)
class Timing:
    """One candidate's samples, summarized (seconds)."""

    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, samples: Sequence[float], scale: float = 1.0) -> Timing:
        median, p10, p90 = spread(samples)
        return cls(median * scale, p10 * scale, p90 * scale)

    @property
    def noisy(self) -> bool:
        return is_noisy(self.median, self.p10, self.p90)

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "p10": self.p10, "p90": self.p90, "noisy": self.noisy}


@dataclass(frozen=True)
class Verdict:
    """The winner, and whether the measurement decided it (else: priority order)."""

    winner: str
    decided: bool
    note: str


def decide_or_refuse(timings: Mapping[str, Timing], order: Sequence[str], winner: str) -> Verdict:
    """Keep ``winner`` (the fastest by median, as the caller's rule chose it) only if
    noise cannot explain its lead over the priority list's first candidate.

    When ``winner`` differs from ``order[0]`` and either timing is noisy and their
    p10-p90 ranges overlap, the measurement cannot tell them apart: ``order[0]``
    (what selection runs unmeasured) is kept, and the note says why.
    """
    first = order[0]
    if winner == first:
        return Verdict(winner, True, "")
    a, b = timings[winner], timings[first]
    overlap = a.p90 >= b.p10
    if (a.noisy or b.noisy) and overlap:
        worst = max((t.p90 - t.p10) / t.median for t in (a, b) if t.median > 0)
        note = (
            f"too noisy to decide: {winner} vs {first} spread {worst:.0%} of the median "
            f"(over {NOISY:.0%}) and their p10-p90 ranges overlap; kept the priority "
            "order. Rerun on an idle machine, with more rounds or fewer threads"
        )
        return Verdict(first, False, note)
    return Verdict(winner, True, "")
