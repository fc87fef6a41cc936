"""The cpu_c kernels against native PyTorch, eager and compiled, side by side in one run.

Three tables, all timed round-robin (order shuffled every round, so drift and
other load on the machine hit every variant alike), median over rounds:

* ``ops``: each op on ``tokens x hidden`` inputs, for the variants
    - ``cpu_c``           the package's impl (the C++ kernel behind a Python call),
    - ``native``          the op's native function, eager,
    - ``native_compiled`` ``torch.compile`` of the native function (Inductor; the
                          token dimension dynamic, as in a served model);
  with ``native / cpu_c`` and ``native_compiled / cpu_c`` ratios (> 1: cpu_c faster).
  ``fused_add_rms_norm``'s ``cpu_c`` runs in place, as ``maybe_inplace`` lets it.
* ``model``: what decides the compiled-mode defaults. A small graph (rms_norm,
  then per layer an elementwise op standing for the layer's work and
  ``fused_add_rms_norm.maybe_inplace``) compiled by the ``vllm_ir`` backend with
  ``native`` or ``cpu_c`` selected for both ops: Inductor fuses the native
  functions with their neighbours, while a kernel is an opaque call.
* ``build``: cold JIT build of the kernels into an empty cache, and a warm load
  from the cache, each in a fresh interpreter.
* ``new_ops``: ``gelu_and_mul`` (``approximate`` none and tanh, ``tokens x 2I``)
  and ``rotary_embedding`` (neox; Llama-3-8B heads 32/8 x 128 and Gemma-2B
  heads 8/1 x 256), the same three variants side by side; ``cpu_c`` of
  ``rotary_embedding`` writes in place, as ``maybe_inplace`` lets it.

    python benchmarks/cpu_kernels.py [--quick] [--only new_ops] [--out PATH]

``--only new_ops`` measures that table alone and keeps the file's other sections.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import vllm_ir as ir
import vllm_ir_cpu
from _round_robin import (
    clock,
    cpu_bench_parser,
    kernel_line,
    kernel_vs_native,
    model_line,
    parse_cpu_bench_args,
    run_facts,
    time_on_copies,
    timing_row,
    write_report,
)
from vllm_ir_cpu import build, impls

TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
HIDDEN = (1024, 4096, 8192)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
EPS = 1e-6
BUDGET_S = 300.0
"""The whole run should fit in about five minutes on the 2-core reference machine."""


def _inputs(op: str, tokens: int, hidden: int, dtype: torch.dtype) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(tokens * hidden)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    if op == "rms_norm":
        return (x, w, EPS)
    return (x, torch.randn(tokens, hidden, generator=g).to(dtype), w, EPS)


def bench_ops(
    tokens: tuple[int, ...], hidden: tuple[int, ...], rounds: int, deadline: float
) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for op_name in ("rms_norm", "fused_add_rms_norm"):
        op = ir.get_op(op_name)
        kernel = impls.rms_norm if op_name == "rms_norm" else impls.fused_add_rms_norm
        for dtype_name, dtype in DTYPES.items():
            for h in hidden:
                # fresh compiled function per group: static for tokens=1, then one
                # graph with a dynamic token dimension (Dynamo's automatic dynamic)
                torch._dynamo.reset()
                compiled = torch.compile(op.native)
                for t in tokens:
                    label = f"{op_name} {dtype_name} {t}x{h}"
                    if time.perf_counter() > deadline:
                        skipped.append(label)
                        continue
                    args = _inputs(op_name, t, h, dtype)
                    row = {"op": op_name, "dtype": dtype_name, "tokens": t, "hidden": h}
                    row |= kernel_vs_native(kernel, op.native, compiled, args, rounds)
                    rows.append(row)
                    print(kernel_line(f"{label:>32}", row), flush=True)
    return rows, skipped


NEW_OP_TOKENS = (1, 4, 16, 64, 256)
GELU_WIDTHS = (2048, 8192)
"""The intermediate size I (the input is ``tokens x 2I``)."""
ROPE_SHAPES = ((32, 8, 128), (8, 1, 256))
"""(heads, kv heads, head size): Llama-3-8B, Gemma-2B."""


def _rope_inputs(
    tokens: int, heads: int, kv: int, head: int, dtype: torch.dtype
) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(tokens * head)
    q = torch.randn(tokens, heads, head, generator=g).to(dtype)
    k = torch.randn(tokens, kv, head, generator=g).to(dtype)
    angle = torch.rand(tokens, head // 2, generator=g) * 100
    cos, sin = (torch.cat((f(angle), f(angle)), dim=-1).to(dtype) for f in (torch.cos, torch.sin))
    return (q, k, cos, sin, True)


def bench_new_ops(tokens: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    """gelu_and_mul and rotary_embedding: cpu_c, native eager, compiled native."""
    groups: list[tuple[str, str, Callable[[int, torch.dtype], tuple[Any, ...]]]] = []
    for width in GELU_WIDTHS:
        for approximate in ("none", "tanh"):
            groups.append(
                (
                    "gelu_and_mul",
                    f"{approximate} 2x{width}",
                    lambda t, d, w=width, a=approximate: (
                        torch.randn(t, 2 * w, generator=torch.Generator().manual_seed(t)).to(d),
                        a,
                    ),
                )
            )
    for heads, kv, head in ROPE_SHAPES:
        groups.append(
            (
                "rotary_embedding",
                f"neox {heads}/{kv}x{head}",
                lambda t, d, h=heads, k=kv, s=head: _rope_inputs(t, h, k, s, d),
            )
        )
    rows: list[dict[str, Any]] = []
    for dtype_name, dtype in DTYPES.items():
        for op_name, shape, make in groups:
            op = ir.get_op(op_name)
            kernel = impls.gelu_and_mul if op_name == "gelu_and_mul" else impls.rotary_embedding
            torch._dynamo.reset()
            compiled = torch.compile(op.native)
            for t in tokens:
                args = make(t, dtype)
                row = {"op": op_name, "dtype": dtype_name, "tokens": t, "shape": shape}
                row |= kernel_vs_native(kernel, op.native, compiled, args, rounds)
                rows.append(row)
                print(kernel_line(f"{op_name} {dtype_name} {t} {shape:>16}", row), flush=True)
    return rows


def _new_ops_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"target": "cpu_c >= 2x native eager at decode sizes (tokens <= 16)"}
    for op_name in ("gelu_and_mul", "rotary_embedding"):
        mine = [r for r in rows if r["op"] == op_name]
        decode = [r for r in mine if r["tokens"] <= 16]
        summary[op_name] = {
            "decode_min_native_over_cpu_c": min(r["native_over_cpu_c"] for r in decode),
            "decode_min_compiled_over_cpu_c": min(r["compiled_over_cpu_c"] for r in decode),
            "all_median_native_over_cpu_c": statistics.median(r["native_over_cpu_c"] for r in mine),
            "all_min_compiled_over_cpu_c": min(r["compiled_over_cpu_c"] for r in mine),
        }
    return summary


class _Model(torch.nn.Module):
    """rms_norm, then per layer ``h * a + b`` (fusable work) and fused add + RMSNorm."""

    def __init__(self, hidden: int, dtype: torch.dtype, layers: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
        self.scales = [1 + 0.1 * torch.randn(hidden, generator=g).to(dtype) for _ in range(layers)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        h = ir.ops.rms_norm(x, self.weight, EPS)
        for scale in self.scales:
            h = h * scale + 0.5
            h, residual = ir.ops.fused_add_rms_norm.maybe_inplace(h, residual, self.weight, EPS)
        return h


def bench_model(
    tokens: tuple[int, ...], hidden: int, layers: int, rounds: int
) -> list[dict[str, Any]]:
    rows = []
    for dtype_name, dtype in DTYPES.items():
        model = _Model(hidden, dtype, layers).eval()
        compiled = {}
        for provider in ("native", "cpu_c"):
            torch._dynamo.reset()
            priority = {"rms_norm": [provider], "fused_add_rms_norm": [provider]}
            fn = torch.compile(model, backend=ir.VllmIRBackend(priority=priority))
            compiled[provider] = fn
        for t in tokens:
            x = torch.randn(t, hidden).to(dtype)
            row = timing_row(
                time_on_copies(compiled, x, rounds),
                ("native_over_cpu_c", "native", "cpu_c"),
                dtype=dtype_name,
                tokens=t,
                hidden=hidden,
                layers=layers,
            )
            rows.append(row)
            print(model_line(f"{dtype_name} {t}x{hidden}x{layers}L", row), flush=True)
    return rows


def bench_build() -> dict[str, Any]:
    """Cold build into an empty cache, then a warm load, each in a fresh interpreter."""
    code = (
        "import time; t0 = time.perf_counter()\n"
        "from vllm_ir_cpu import build; t1 = time.perf_counter()\n"
        "build.build(); t2 = time.perf_counter()\n"
        "print(t1 - t0, t2 - t1)\n"
    )
    result: dict[str, Any] = {"flags": build.compile_flags()}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "VLLM_IR_CACHE_DIR": cache}
        for label in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            _import_s, build_s = map(float, out.stdout.split())
            result[f"{label}_s"] = round(build_s, 3)
            print(f"build {label}: {build_s:.2f} s", flush=True)
    return result


def main() -> None:
    parser = cpu_bench_parser(__doc__, Path("benchmarks/results/cpu_kernels.json"))
    parser.add_argument("--no-build", action="store_true", help="skip the cold build timing")
    parser.add_argument(
        "--only",
        choices=["new_ops"],
        help="measure this table alone, keeping the other sections of --out",
    )
    args = parse_cpu_bench_args(parser)

    start = time.perf_counter()
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    build.build()  # not timed here: see the build section
    if args.only == "new_ops":
        _only_new_ops(args, start, load_at_start)
        return
    tokens, hidden = (TOKENS[:3], HIDDEN[:1]) if args.quick else (TOKENS, HIDDEN)
    with torch.inference_mode():
        build_times = None if args.no_build else bench_build()
        model_tokens = (1, 16, 64, 256, 1024) if not args.quick else (1, 16)
        model_rows = bench_model(model_tokens, 4096, 4, args.rounds)
        deadline = start + BUDGET_S
        op_rows, skipped = bench_ops(tokens, hidden, args.rounds, deadline)
        new_rows = bench_new_ops(NEW_OP_TOKENS[:2] if args.quick else NEW_OP_TOKENS, args.rounds)
    elapsed = time.perf_counter() - start

    small = [r for r in op_rows if r["tokens"] <= 64]
    report = {
        "benchmark": "cpu_kernels",
        **run_facts(load_at_start, args.rounds, elapsed),
        "vllm_ir_cpu": vllm_ir_cpu.__version__,
        "cpu_capability": build.cpu_capability(),
        "grid": {
            "tokens": list(tokens),
            "hidden": list(hidden),
            "dtypes": list(DTYPES),
            "trimmed": [f"{s} (over the {BUDGET_S:.0f} s budget)" for s in skipped],
        },
        "summary": {
            "tokens_le_64": {
                "min_native_over_cpu_c": min(r["native_over_cpu_c"] for r in small),
                "min_compiled_over_cpu_c": min(r["compiled_over_cpu_c"] for r in small),
                "target": "cpu_c >= 2x native eager, and not slower than compiled native",
            },
            "all": {
                "min_native_over_cpu_c": min(r["native_over_cpu_c"] for r in op_rows),
                "median_native_over_cpu_c": statistics.median(
                    r["native_over_cpu_c"] for r in op_rows
                ),
                "min_compiled_over_cpu_c": min(r["compiled_over_cpu_c"] for r in op_rows),
                "median_compiled_over_cpu_c": statistics.median(
                    r["compiled_over_cpu_c"] for r in op_rows
                ),
            },
        },
        "build": build_times,
        "model": model_rows,
        "ops": op_rows,
        "new_ops": {"summary": _new_ops_summary(new_rows), "rows": new_rows},
    }
    write_report(report, args.out, report["summary"], elapsed)


def _only_new_ops(args: argparse.Namespace, start: float, load_at_start: list[float]) -> None:
    with torch.inference_mode():
        rows = bench_new_ops(NEW_OP_TOKENS[:2] if args.quick else NEW_OP_TOKENS, args.rounds)
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    report["new_ops"] = {
        "summary": _new_ops_summary(rows),
        "rows": rows,
        "measured_alone": {
            "threads": torch.get_num_threads(),
            "clock": clock().__name__,
            "rounds": args.rounds,
            "seconds": round(time.perf_counter() - start, 1),
            "load_average_at_start": load_at_start,
            "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["new_ops"]["summary"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
