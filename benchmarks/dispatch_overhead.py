"""Eager dispatch overhead of an IR op, side by side in one process.

For a decode-sized (1 x 4096) and a prefill-sized (256 x 4096) input this
times, round-robin so drift hits every variant alike, all running the *same*
impl — the one ``ir.ops.rms_norm`` selects with the installed providers
(both recorded in the JSON):

* ``direct``     — the selected impl called as a plain Python function,
* ``ir.ops``     — ``ir.ops.rms_norm(...)`` (cached selection, eager fast path),
* ``torch.ops``  — ``torch.ops.vllm_ir.rms_norm.default(...)`` (through the dispatcher),
* ``custom_op``  — the same impl wrapped by ``torch.library.custom_op``.

Overhead is the median per-call time minus ``direct``'s. Since the kernel's
own run-to-run noise is of the order of the overhead, a second table isolates
dispatch: a no-op impl selected by priority, against calling it directly. A
third times each part of the dispatch key (``vllm_ir._selection.key``) on the
decode tensors, one attribute read at a time. A fourth times
``op.maybe_inplace`` with a no-op inplace impl (the memory checks of donation):
``fused_add_rms_norm``, and ``rotary_embedding`` on separate query and key and on
the query and key columns of one ``qkv`` tensor (vLLM's layout, donated once
their layouts prove them apart).
Run:

    python benchmarks/dispatch_overhead.py [--out benchmarks/results/dispatch_overhead.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import statistics
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import vllm_ir as ir
from vllm_ir._selection.key import BATCH_CLASS
from vllm_ir.priority import scoped_state_var

SHAPES = {"decode": (1, 4096), "prefill": (256, 4096)}

# the impl the custom op wraps: set to the selected one before each measurement
_SELECTED: list[Callable[..., torch.Tensor]] = [ir.ops.rms_norm.native]


def _custom_op() -> Callable[..., torch.Tensor]:
    @torch.library.custom_op("vllm_ir_bench::rms_norm", mutates_args=())
    def rms_norm(
        x: torch.Tensor,
        weight: torch.Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> torch.Tensor:
        return _SELECTED[-1](x, weight, epsilon, variance_size)

    rms_norm.register_fake(ir.ops.rms_norm.native)
    return rms_norm  # type: ignore[return-value]


def measure(shape: tuple[int, int], rounds: int, number: int) -> dict[str, object]:
    x = torch.randn(*shape)
    w = torch.randn(shape[-1])
    eps = 1e-6
    selected = ir.ops.rms_norm.selected_impl(x, w, eps)
    impl = selected.impl_fn
    _SELECTED.append(impl)
    variants = {
        "direct": lambda: impl(x, w, eps),
        "ir.ops": lambda: ir.ops.rms_norm(x, w, eps),
        "torch.ops": lambda: torch.ops.vllm_ir.rms_norm.default(x, w, eps),
        "custom_op": lambda: CUSTOM_OP(x, w, eps),
    }
    for fn in variants.values():  # warm-up, and the selection cache
        for _ in range(200):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)  # no variant always runs first or after the same one
        for name in order:
            samples[name].append(timeit.timeit(variants[name], number=number) / number * 1e6)
    median = {name: statistics.median(s) for name, s in samples.items()}
    best = {name: min(s) for name, s in samples.items()}
    return {
        "shape": list(shape),
        "impl": selected.provider,
        "median_us": {k: round(v, 3) for k, v in median.items()},
        "min_us": {k: round(v, 3) for k, v in best.items()},
        "min_overhead_vs_direct_us": {
            k: round(v - best["direct"], 3) for k, v in best.items() if k != "direct"
        },
        "stdev_us": {k: round(statistics.stdev(s), 3) for k, s in samples.items()},
        "overhead_vs_direct_us": {
            k: round(v - median["direct"], 3) for k, v in median.items() if k != "direct"
        },
        "ratio_vs_direct": {k: round(v / median["direct"], 3) for k, v in median.items()},
    }


CUSTOM_OP = _custom_op()


def _noop(
    x: torch.Tensor, weight: torch.Tensor | None, epsilon: float, variance_size: int | None = None
) -> torch.Tensor:
    return x


def measure_dispatch_only(rounds: int, number: int) -> dict[str, object]:
    """Pure selection + call overhead: a no-op impl, selected by priority."""
    if "bench_noop" not in ir.ops.rms_norm.impls:
        ir.ops.rms_norm.register_impl("bench_noop")(_noop)
    x, w, eps = torch.randn(1, 4096), torch.randn(4096), 1e-6
    op = ir.ops.rms_norm
    variants = {
        "direct": lambda: _noop(x, w, eps),
        "ir.ops": lambda: ir.ops.rms_norm(x, w, eps),
        "ir.ops, bound": lambda: op(x, w, eps),
        "torch.ops": lambda: torch.ops.vllm_ir.rms_norm.default(x, w, eps),
    }
    with ir.ops.rms_norm.set_priority(["bench_noop"]):
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():
            fn()
        for _ in range(rounds):
            for name, fn in variants.items():
                samples[name].append(timeit.timeit(fn, number=number) / number * 1e9)
    best = {name: min(s) for name, s in samples.items()}
    return {
        "shape": [1, 4096],
        "min_ns": {k: round(v, 1) for k, v in best.items()},
        "overhead_vs_direct_ns": {k: round(v - best["direct"], 1) for k, v in best.items()},
    }


def _noop_fused(
    x: torch.Tensor,
    x_residual: torch.Tensor,
    weight: torch.Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return x, x_residual


def _noop_rotary(
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    return query, key


def measure_donation(rounds: int, number: int) -> dict[str, object]:
    """``maybe_inplace`` over a no-op inplace impl against calling it directly."""
    x, r, w = torch.randn(1, 4096), torch.randn(1, 4096), torch.randn(4096)
    qkv = torch.randn(1, 24 * 128)
    q_cols, k_cols, _ = qkv.split([16 * 128, 4 * 128, 4 * 128], dim=-1)
    q_cols, k_cols = q_cols.view(1, 16, 128), k_cols.view(1, 4, 128)
    q, k, cos = torch.randn(1, 16, 128), torch.randn(1, 4, 128), torch.randn(1, 128)
    fused, rotary = ir.ops.fused_add_rms_norm, ir.ops.rotary_embedding
    for op, fn in ((fused, _noop_fused), (rotary, _noop_rotary)):
        if "bench_noop" not in op.impls:
            op.register_impl("bench_noop", inplace=True)(fn)
    cases: dict[str, tuple[Any, Callable[..., Any], tuple[Any, ...]]] = {
        "fused_add_rms_norm": (fused, _noop_fused, (x, r, w, 1e-6)),
        "rotary_embedding": (rotary, _noop_rotary, (q, k, cos, cos, True)),
        "rotary_embedding, qkv columns": (rotary, _noop_rotary, (q_cols, k_cols, cos, cos, True)),
    }
    out: dict[str, object] = {}
    for label, (op, fn, args) in cases.items():
        variants = {
            "direct": functools.partial(fn, *args),
            "maybe_inplace": functools.partial(op.maybe_inplace, *args),
        }
        with op.set_priority(["bench_noop"]):
            best = {
                name: min(timeit.repeat(call, number=number, repeat=rounds)) / number * 1e9
                for name, call in variants.items()
            }
        out[label] = {
            "min_ns": {k: round(v, 1) for k, v in best.items()},
            "overhead_vs_direct_ns": round(best["maybe_inplace"] - best["direct"], 1),
        }
    return out


def measure_key_parts(rounds: int, number: int) -> dict[str, object]:
    """Nanoseconds per part of ``rms_norm``'s dispatch key, on the decode tensors."""
    x, w, eps = torch.randn(1, 4096), torch.randn(4096), 1e-6
    scoped_get = scoped_state_var().get
    op = ir.ops.rms_norm
    parts: dict[str, Callable[[], object]] = {
        "loop baseline": lambda: None,
        "scoped state + mode": lambda: scoped_get(),
        "dtype": lambda: x.dtype,
        "device": lambda: x.device,
        "shape": lambda: x.shape,
        "stride()": lambda: x.stride(),
        "data_ptr() % 16": lambda: x.data_ptr() % 16,
        "old key: ndim": lambda: x.ndim,
        "old key: layout": lambda: x.layout,
        "old key: is_contiguous()": lambda: x.is_contiguous(),
        "selection key: shape[1:]": lambda: x.shape[x.dim() > 1 :],
        "selection key: batch class": lambda: BATCH_CLASS.get(x.shape[:1], 2),
        "fast key of (x, weight, eps)": lambda: op.selector.fast_key(x, w, eps),
        "selection key of (x, weight, eps)": lambda: op.selection_key(x, w, eps),
    }
    best = {
        name: min(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e9
        for name, fn in parts.items()
    }
    base = best.pop("loop baseline")
    return {"ns_per_part": {k: round(v - base, 1) for k, v in best.items()}}


def _providers() -> dict[str, str]:
    return {name: p.package for name, p in sorted(ir.loaded_providers().items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/dispatch_overhead.json")
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, dict[str, object]] = {}
    with torch.inference_mode():
        for label, shape in SHAPES.items():
            number = args.number if label == "decode" else max(args.number // 20, 50)
            results[label] = measure(shape, args.rounds, number)
        results["dispatch_only"] = measure_dispatch_only(args.rounds, args.number * 10)
        results["key_parts"] = measure_key_parts(args.rounds, args.number * 10)
        results["donation"] = measure_donation(args.rounds, args.number * 5)
    report = {
        "benchmark": "dispatch_overhead",
        "torch": torch.__version__,
        "vllm_ir": ir.__version__,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        # a shared machine: the load during the run says how far to trust it
        "load_average_1_5_15min": [round(v, 2) for v in os.getloadavg()],
        "providers": _providers(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"providers: {report['providers'] or 'none'}")
    print(f"{'shape':>10} {'variant':>10} {'median us':>10} {'overhead us':>12} {'min us':>10}")
    for label in SHAPES:
        r: dict[str, Any] = results[label]
        print(f"{label} (impl {r['impl']}):")
        for name, t in r["median_us"].items():
            over = r["overhead_vs_direct_us"].get(name, 0.0)
            print(f"{label:>10} {name:>10} {t:>10.2f} {over:>12.2f} {r['min_us'][name]:>10.2f}")
    only: dict[str, Any] = results["dispatch_only"]
    print("dispatch only (no-op impl), min over rounds:")
    for name, t in only["min_ns"].items():
        print(f"{name:>21} {t:>10.0f} ns {only['overhead_vs_direct_ns'][name]:>10.0f} ns")
    print("dispatch key parts (per tensor unless noted), min over rounds:")
    parts: dict[str, Any] = results["key_parts"]
    for name, t in parts["ns_per_part"].items():
        print(f"{name:>34} {t:>8.1f} ns")
    print("maybe_inplace (no-op inplace impl, donated), min over rounds:")
    donation: dict[str, Any] = results["donation"]
    for name, row in donation.items():
        print(f"{name:>34} {row['overhead_vs_direct_ns']:>8.0f} ns over direct")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
