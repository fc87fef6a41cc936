"""Autotuning against fixed priorities, compiled and eager, side by side in one run.

The model is the compile benchmark's decoder (``compile_pipeline.py``: an
``rms_norm``, then per layer a linear and ``fused_add_rms_norm.maybe_inplace``),
at a decode size (1 token) and a prefill size. For each size:

* compiled (``vllm_ir`` backend, FX graph cache off): runtime with
  ``autotune=True`` next to each fixed compiled priority (``native`` and every
  other provider of the two ops); compile time with autotuning on a cold tuning
  cache, on a warm one, and without autotuning; seconds spent tuning per
  distinct (op, metadata);
* eager: runtime under the priority config ``vllm-ir tune`` writes for these
  shapes, next to each fixed eager priority.

    python benchmarks/autotune.py [--layers 32] [--hidden 256] [--prefill 512] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import vllm_ir as ir
from torch._inductor import config as inductor_config
from vllm_ir._cli.tune import tune
from vllm_ir.compilation._autotune import Autotuner, WallClockTimer
from vllm_ir.testing import TinyDecoder

OPS = ("rms_norm", "fused_add_rms_norm")


def _providers() -> list[str]:
    found = set.intersection(*(set(ir.get_op(op).impls) for op in OPS))
    return ["native", *sorted(found - {"native"})]


def _compile(
    model: torch.nn.Module, backend: ir.VllmIRBackend, x: torch.Tensor
) -> tuple[Any, float]:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    start = time.perf_counter()
    compiled(x.clone())
    return compiled, time.perf_counter() - start


def _runtime_us(fns: dict[str, Any], x: torch.Tensor, rounds: int, number: int) -> dict[str, float]:
    """Median per call; the variants interleaved round by round (same machine state)."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn(x.clone())
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn(x.clone())
            samples[name].append((time.perf_counter() - start) / number * 1e6)
    return {k: round(statistics.median(v), 2) for k, v in samples.items()}


def _against_fixed(
    fns: dict[str, Any], x: torch.Tensor, rounds: int, number: int, variant: str
) -> dict[str, Any]:
    """``variant``'s runtime against the best fixed provider's, with every runtime."""
    runtime = _runtime_us(fns, x, rounds, number)
    fixed = {p: runtime[p] for p in _providers()}
    best = min(fixed, key=fixed.__getitem__)
    return {
        "tokens": x.shape[0],
        "runtime_us": runtime,
        "best_fixed": best,
        f"{variant}_over_best_fixed": round(runtime[variant] / fixed[best], 3),
    }


def compiled_size(model: TinyDecoder, x: torch.Tensor, rounds: int, number: int) -> dict[str, Any]:
    """Compile times are of kernel-cached compiles (the C++ compiler ran before, as in
    compile_pipeline.py), best of two, interleaved; the cold autotune compile once."""
    fixed_priority = {p: {op: [p] for op in OPS} for p in _providers()}
    for priority in fixed_priority.values():  # first compiles: pay the C++ compiler
        _compile(model, ir.VllmIRBackend(priority=priority), x)
    cold = ir.VllmIRBackend(autotune=Autotuner())
    fns: dict[str, Any] = {}
    compile_s: dict[str, float] = {}
    fns["autotune"], compile_s["autotune_cold"] = _compile(model, cold, x)
    _compile(model, ir.VllmIRBackend(autotune=Autotuner()), x)  # its kernels, compiled
    ctx = cold.pass_contexts[-1]
    records = list({id(r): r for r in ctx.autotuned.values()}.values())
    warm_backends = []
    lowering_ms: dict[str, float] = {}
    for _ in range(2):
        default = ir.VllmIRBackend()
        fns["default"], s_default = _compile(model, default, x)
        warm = ir.VllmIRBackend(autotune=Autotuner())
        warm_backends.append(warm)
        _, s_warm = _compile(model, warm, x)
        compile_s["default"] = min(compile_s.get("default", 1e9), s_default)
        compile_s["autotune_warm"] = min(compile_s.get("autotune_warm", 1e9), s_warm)
        for name, b in (("default", default), ("autotune_warm", warm)):
            ms = sum(v for k, v in b.pass_contexts[-1].timings_ms.items() if "lowering" in k)
            lowering_ms[name] = min(lowering_ms.get(name, 1e9), ms)
        for provider, priority in fixed_priority.items():
            fns[provider], s = _compile(model, ir.VllmIRBackend(priority=priority), x)
            compile_s[provider] = min(compile_s.get(provider, 1e9), s)
    row = _against_fixed(fns, x, rounds, number, "autotune")
    runtime = row["runtime_us"]
    return {
        **row,
        "autotune_over_default": round(runtime["autotune"] / runtime["default"], 3),
        "default_selection": default.pass_contexts[-1].selected_impls,
        "autotune_selection": ctx.selected_impls,
        "tuning": [
            {
                "op": r.op,
                "times_us": {p: round(t * 1e6, 2) for p, t in r.times_s.items()},
                "winner": r.winner,
                "nodes": len(r.nodes),
                "tuning_s": round(r.tuning_s, 3),
            }
            for r in records
        ],
        "compile_s": {k: round(v, 3) for k, v in compile_s.items()},
        "tuning_s_total": round(sum(r.tuning_s for r in records), 3),
        # the lowering passes' own time: what a warm tuning cache adds, without the
        # noise of a whole compile
        "lowering_ms": {k: round(v, 2) for k, v in lowering_ms.items()},
        "warm_cache_lowering_added_ms": round(
            lowering_ms["autotune_warm"] - lowering_ms["default"], 2
        ),
        "warm_cache_added_pct_of_compile": round(
            100
            * (lowering_ms["autotune_warm"] - lowering_ms["default"])
            / 1e3
            / compile_s["default"],
            2,
        ),
        "warm_cache_overhead_pct": round(
            100 * (compile_s["autotune_warm"] / compile_s["default"] - 1), 1
        ),
        "warm_from_cache": all(
            r.from_cache for b in warm_backends for r in b.pass_contexts[-1].autotuned.values()
        ),
    }


def eager_size(
    model: TinyDecoder, x: torch.Tensor, tuned: dict[str, list[str]], rounds: int, number: int
) -> dict[str, Any]:
    def under(priority: dict[str, list[str]]) -> Any:
        def run(inp: torch.Tensor) -> torch.Tensor:
            with ir.IrOpPriorityConfig(**priority).scope():
                return model(inp)

        return run

    fns = {p: under({op: [p] for op in OPS}) for p in _providers()}
    fns["tuned"] = under(tuned)
    return _against_fixed(fns, x, rounds, number, "tuned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/autotune.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    # a fresh tuning cache: the cold compile measures, the warm one reads
    os.environ["VLLM_IR_CACHE_DIR"] = tempfile.mkdtemp(prefix="vllm-ir-autotune-")
    model = TinyDecoder(args.hidden, args.layers).eval()
    sizes = {"decode": 1, "prefill": args.prefill}
    report: dict[str, Any] = {
        "benchmark": "autotune",
        "torch": torch.__version__,
        "vllm_ir": ir.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "layers": args.layers,
        "hidden": args.hidden,
        "providers": _providers(),
        "compiled": {},
        "eager": {},
    }
    shapes = {name: (tokens, args.hidden) for name, tokens in sizes.items()}
    with torch.no_grad():
        doc = tune([ir.get_op(op) for op in OPS], shapes, torch.float32, "cpu", WallClockTimer())
        report["eager_tuned_priority"] = doc["ir_op_priority"]
        for name, tokens in sizes.items():
            x = torch.randn(tokens, args.hidden)
            number = 20 if tokens == 1 else 2
            report["eager"][name] = eager_size(model, x, doc["ir_op_priority"], args.rounds, number)
            print(name, "eager", json.dumps(report["eager"][name]), flush=True)
        with inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
            for name, tokens in sizes.items():
                x = torch.randn(tokens, args.hidden)
                number = 20 if tokens == 1 else 2
                report["compiled"][name] = compiled_size(model, x, args.rounds, number)
                print(name, "compiled", json.dumps(report["compiled"][name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
