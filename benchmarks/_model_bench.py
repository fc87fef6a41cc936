"""What the compiled-model benchmarks share: one timer for a model step, and
the environment their reports start with.

The timer: on CUDA, device events around each call (the GPU's time, launches
overlapped); elsewhere the host's clock. Either way the median over ``rounds``
calls after ``warmup`` untimed ones, in microseconds. Not a benchmark itself
(``nox -s bench`` skips files starting with ``_``).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

Timer = Callable[[Callable[[], object], int, int], float]


def cuda_us(fn: Callable[[], object], warmup: int, rounds: int) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(rounds):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def host_us(fn: Callable[[], object], warmup: int, rounds: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def step_timer(device: str) -> Timer:
    """The timer for steps on ``device``."""
    return cuda_us if device == "cuda" else host_us


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's where the host runs the model."""
    return torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"


def environment(benchmark: str, device: str) -> dict[str, str]:
    """The head of a report: what ran, where, on which versions."""
    import vllm_ir as ir

    return {
        "benchmark": benchmark,
        "device": device_name(device),
        "device_type": device,
        "torch": torch.__version__,
        "vllm_ir": ir.__version__,
        "python": platform.python_version(),
    }


def resolve_device(
    args: argparse.Namespace, gpu_defaults: Mapping[str, Any], cpu_defaults: Mapping[str, Any]
) -> str:
    """``--device`` (CUDA when there is one), with the sizes left unset filled in
    from that device's defaults."""
    device: str = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for key, value in (gpu_defaults if device == "cuda" else cpu_defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return device


def model_shape(args: argparse.Namespace) -> dict[str, int]:
    """The decoder's sizes, as reports give them."""
    return {"layers": args.layers, "hidden": args.hidden, "intermediate": args.intermediate}
