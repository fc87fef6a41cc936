"""cpu_c's silu_and_mul and FP8 kernels against native PyTorch, eager and compiled.

The method of the repository's ``benchmarks/cpu_kernels.py`` (whose timing
helper this imports): one intra-op thread, per-thread CPU time, variants timed
round-robin in shuffled order, median over rounds. Two tables:

* ``ops``: each op on ``tokens x hidden`` inputs: ``cpu_c`` (the impl),
  ``native`` eager, ``native_compiled`` (``torch.compile`` of the native
  function, Inductor), with the ratios ``native / cpu_c`` and
  ``native_compiled / cpu_c`` (> 1: cpu_c faster). ``fused_add_rms_norm_static_fp8_quant``'s
  ``cpu_c`` writes the residual in place, as ``maybe_inplace`` lets it.
* ``model``: what decides the compiled-mode defaults. Small graphs of a few
  layers, compiled by the ``vllm_ir`` backend with ``native`` or ``cpu_c``
  selected for the op under test, each op between elementwise neighbours that
  Inductor can fuse with a native function but not with a kernel:
    - ``silu``: ``x * a + 0.5`` (standing for the gate/up GEMM), ``silu_and_mul``,
      accumulated;
    - ``static_quant`` / ``dynamic_quant``: ``h * a + 0.5``, quantize, dequantize;
    - ``norm_quant``: ``rms_norm`` then per layer ``fused_add_rms_norm.maybe_inplace``
      and a static quant, which the ``fuse_norm_quant`` pass rewrites into
      ``rms_norm_static_fp8_quant`` and ``fused_add_rms_norm_static_fp8_quant``.

    python packages/vllm-ir-cpu/benchmarks/quant_kernels.py [--quick] [--out FILE]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import vllm_ir as ir
import vllm_ir_cpu
from vllm_ir_cpu import build, impls

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


# the repository's shared CPU timer (benchmarks/_round_robin.py)
sys.path.insert(0, str(ROOT / "benchmarks"))
import _round_robin as timer  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
EPS = 1e-6
FP8 = torch.float8_e4m3fn
SCALE = torch.tensor([0.02])

OP_IMPLS: dict[str, Callable[..., Any]] = {
    "silu_and_mul": impls.silu_and_mul,
    "static_scaled_fp8_quant": impls.static_scaled_fp8_quant,
    "dynamic_per_token_fp8_quant": impls.dynamic_per_token_fp8_quant,
    "rms_norm_static_fp8_quant": impls.rms_norm_static_fp8_quant,
    "fused_add_rms_norm_static_fp8_quant": impls.fused_add_rms_norm_static_fp8_quant,
}


def _inputs(op: str, tokens: int, hidden: int, dtype: torch.dtype) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(tokens * hidden)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    if op == "silu_and_mul":
        return (torch.randn(tokens, 2 * hidden, generator=g).to(dtype),)
    if op == "static_scaled_fp8_quant":
        return (x, SCALE)
    if op == "dynamic_per_token_fp8_quant":
        return (x,)
    if op == "rms_norm_static_fp8_quant":
        return (x, w, EPS, SCALE)
    return (x, torch.randn(tokens, hidden, generator=g).to(dtype), w, EPS, SCALE)


def bench_ops(tokens: tuple[int, ...], hidden: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for op_name, kernel in OP_IMPLS.items():
        op = ir.get_op(op_name)
        for dtype_name, dtype in DTYPES.items():
            torch._dynamo.reset()
            compiled = torch.compile(op.native)
            for t in tokens:
                args = _inputs(op_name, t, hidden, dtype)
                row = {"op": op_name, "dtype": dtype_name, "tokens": t, "hidden": hidden}
                row |= timer.kernel_vs_native(kernel, op.native, compiled, args, rounds)
                rows.append(row)
                print(
                    timer.kernel_line(f"{op_name:>36} {dtype_name} {t:>5}x{hidden}", row),
                    flush=True,
                )
    return rows


class _Model(torch.nn.Module):
    def __init__(self, kind: str, hidden: int, dtype: torch.dtype, layers: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.kind = kind
        width = 2 * hidden if kind == "silu" else hidden
        self.weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
        self.scales = [(1 + 0.1 * torch.randn(width, generator=g)).to(dtype) for _ in range(layers)]
        self.qscale = SCALE.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.kind == "silu":
            out = torch.zeros_like(x[..., : x.shape[-1] // 2])
            for a in self.scales:
                out = out + ir.ops.silu_and_mul(x * a + 0.5)
            return out
        if self.kind in ("static_quant", "dynamic_quant"):
            h = x
            for a in self.scales:
                h = h * a + 0.5
                if self.kind == "static_quant":
                    q, s = ir.ops.static_scaled_fp8_quant(h, self.qscale), self.qscale
                else:
                    q, s = ir.ops.dynamic_per_token_fp8_quant(h)
                h = (q.to(torch.float32) * s).to(dtype)
            return h
        # norm_quant: fused by the fuse_norm_quant pass
        residual = x
        q = ir.ops.static_scaled_fp8_quant(ir.ops.rms_norm(x, self.weight, EPS), self.qscale)
        for a in self.scales:
            h = (q.to(torch.float32) * self.qscale).to(dtype) * a + 0.5
            h, residual = ir.ops.fused_add_rms_norm.maybe_inplace(h, residual, self.weight, EPS)
            q = ir.ops.static_scaled_fp8_quant(h, self.qscale)
        return q


MODEL_OPS = {
    "silu": ["silu_and_mul"],
    "static_quant": ["static_scaled_fp8_quant"],
    "dynamic_quant": ["dynamic_per_token_fp8_quant"],
    "norm_quant": [
        "rms_norm_static_fp8_quant",
        "fused_add_rms_norm_static_fp8_quant",
        # any node left unfused
        "rms_norm",
        "fused_add_rms_norm",
        "static_scaled_fp8_quant",
    ],
}


def bench_model(
    tokens: tuple[int, ...], hidden: int, layers: int, rounds: int
) -> list[dict[str, Any]]:
    rows = []
    for kind, ops in MODEL_OPS.items():
        for dtype_name, dtype in DTYPES.items():
            model = _Model(kind, hidden, dtype, layers).eval()
            compiled = {}
            backends = {}
            for provider in ("native", "cpu_c"):
                torch._dynamo.reset()
                backend = ir.VllmIRBackend(priority={op: [provider] for op in ops})
                compiled[provider] = torch.compile(model, backend=backend)
                backends[provider] = backend
            for t in tokens:
                width = 2 * hidden if kind == "silu" else hidden
                x = torch.randn(t, width).to(dtype)
                net = timer.time_on_copies(compiled, x, rounds)  # compiles on the first call
                selected = backends["cpu_c"].lowering_pass.selected_impls
                row = timer.timing_row(
                    net,
                    ("native_over_cpu_c", "native", "cpu_c"),
                    model=kind,
                    dtype=dtype_name,
                    tokens=t,
                    hidden=hidden,
                    layers=layers,
                    cpu_c_lowered=sorted(
                        op for op, nodes in selected.items() if "cpu_c" in nodes.values()
                    ),
                )
                rows.append(row)
                print(
                    timer.model_line(f"{kind:>13} {dtype_name} {t:>5}x{hidden}x{layers}L", row),
                    flush=True,
                )
    return rows


def main() -> None:
    parser = timer.cpu_bench_parser(__doc__, HERE / "results" / "quant_kernels.json")
    args = timer.parse_cpu_bench_args(parser)

    start = time.perf_counter()
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    build.build()
    hidden = 4096
    op_tokens = (1, 16) if args.quick else (1, 16, 256, 1024)
    model_tokens = (1, 16) if args.quick else (1, 16, 64, 256, 1024)
    with torch.inference_mode():
        model_rows = bench_model(model_tokens, hidden, 4, args.rounds)
        op_rows = bench_ops(op_tokens, hidden, args.rounds)
    elapsed = time.perf_counter() - start

    by_model: dict[str, list[float]] = {}
    for r in model_rows:
        by_model.setdefault(r["model"], []).append(r["native_over_cpu_c"])
    report = {
        "benchmark": "quant_kernels",
        **timer.run_facts(load_at_start, args.rounds, elapsed),
        "vllm_ir_cpu": vllm_ir_cpu.__version__,
        "cpu_capability": build.cpu_capability(),
        "summary": {
            "model_native_over_cpu_c": {
                k: {"min": min(v), "max": max(v)} for k, v in by_model.items()
            },
            "ops_native_over_cpu_c": {
                "min": min(r["native_over_cpu_c"] for r in op_rows),
                "median": statistics.median(r["native_over_cpu_c"] for r in op_rows),
            },
            "ops_compiled_over_cpu_c": {
                "min": min(r["compiled_over_cpu_c"] for r in op_rows),
                "median": statistics.median(r["compiled_over_cpu_c"] for r in op_rows),
            },
        },
        "model": model_rows,
        "ops": op_rows,
    }
    timer.write_report(report, args.out, report["summary"], elapsed)


if __name__ == "__main__":
    main()
