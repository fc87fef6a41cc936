"""Compiled native in eager (``set_priority(["native"], compile=True)``) against plain eager native.

Each op is called the way model code calls it, ``ir.ops.<op>(...)``, through
the eager fast path, with ``native`` selected, in two variants timed
round-robin (order shuffled every round, median over rounds):

* ``native``           plain eager: the native function's unfused chain of kernels;
* ``native_compiled``  the same call inside ``set_priority(["native"], compile=True)``:
                       the native function through ``torch.compile`` (Inductor), one
                       compile per op, dtype and hidden size, token dimension unbacked.

``native / native_compiled`` > 1: compiling pays. Each group of token counts
after its first call runs under ``torch.compiler.set_stance("fail_on_recompile")``,
so the run also proves there is no recompile across token counts.

    python benchmarks/compiled_native.py [--quick] [--out benchmarks/results/compiled_native.json]

(Its own file, not a key of ``cpu_kernels.json``, which ``cpu_kernels.py`` rewrites.)
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import vllm_ir as ir
from _round_robin import (
    cpu_bench_parser,
    parse_cpu_bench_args,
    run_facts,
    time_round_robin,
    timing_row,
    write_report,
)

TOKENS = (1, 16, 64, 256, 1024)
HIDDEN = (1024, 4096)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul")
EPS = 1e-6


def _inputs(op: str, tokens: int, hidden: int, dtype: torch.dtype) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(tokens * hidden)
    if op == "silu_and_mul":
        return (torch.randn(tokens, 2 * hidden, generator=g).to(dtype),)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    if op == "rms_norm":
        return (x, w, EPS)
    return (x, torch.randn(tokens, hidden, generator=g).to(dtype), w, EPS)


def bench(tokens: tuple[int, ...], hidden: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for op_name in OPS:
        op = ir.get_op(op_name)

        def plain(op: ir.IrOp = op) -> contextlib.AbstractContextManager[Any]:
            return op.set_priority(["native"])

        def compiled(op: ir.IrOp = op) -> contextlib.AbstractContextManager[Any]:
            return op.set_priority(["native"], compile=True)

        for dtype_name, dtype in DTYPES.items():
            for h in hidden:
                # the first call of the group compiles (untimed); the rest must not recompile
                first = _inputs(op_name, tokens[0], h, dtype)
                start = time.perf_counter()
                with compiled():
                    expected = op.native(*first)
                    torch.testing.assert_close(op(*first), expected, **_tol(op, dtype))
                compile_s = time.perf_counter() - start
                with torch.compiler.set_stance("fail_on_recompile"):
                    for t in tokens:
                        args = _inputs(op_name, t, h, dtype)
                        with compiled():  # equal to eager's result, and no recompile
                            torch.testing.assert_close(
                                op(*args), op.native(*args), **_tol(op, dtype)
                            )
                        call = lambda a=args, f=op: f(*a)  # noqa: E731
                        variants = {"native": call, "native_compiled": call}
                        scopes = {"native": plain, "native_compiled": compiled}
                        row = timing_row(
                            time_round_robin(variants, rounds, 0.01, scopes),
                            ("native_over_compiled", "native", "native_compiled"),
                            op=op_name,
                            dtype=dtype_name,
                            tokens=t,
                            hidden=h,
                        )
                        row["compile_s"] = round(compile_s, 1) if t == tokens[0] else None
                        rows.append(row)
                        print(
                            f"{op_name:>20} {dtype_name} {t:>5}x{h:<5} native "
                            f"{row['median_us']['native']:>9.1f} us  compiled "
                            f"{row['median_us']['native_compiled']:>9.1f} us  "
                            f"x{row['native_over_compiled']:.2f}",
                            flush=True,
                        )
    return rows


def _tol(op: ir.IrOp, dtype: torch.dtype) -> dict[str, float]:
    t = op.tolerance(dtype)
    return {"atol": t.atol, "rtol": t.rtol}


def main() -> None:
    parser = cpu_bench_parser(__doc__, Path("benchmarks/results/compiled_native.json"))
    args = parse_cpu_bench_args(parser)
    start = time.perf_counter()
    load_at_start = [round(v, 2) for v in os.getloadavg()]
    tokens, hidden = ((1, 64), (1024,)) if args.quick else (TOKENS, HIDDEN)
    with torch.inference_mode():
        rows = bench(tokens, hidden, args.rounds)
    elapsed = time.perf_counter() - start

    def summary(selected: list[dict[str, Any]]) -> dict[str, Any] | None:
        ratios = [r["native_over_compiled"] for r in selected]
        if not ratios:
            return None
        return {
            "min": min(ratios),
            "median": round(statistics.median(ratios), 2),
            "max": max(ratios),
            "rows_where_compiled_wins": sum(r > 1 for r in ratios),
            "rows": len(ratios),
        }

    report = {
        "benchmark": "compiled_native",
        **run_facts(load_at_start, args.rounds, elapsed),
        "grid": {
            "ops": list(OPS),
            "tokens": list(tokens),
            "hidden": list(hidden),
            "dtypes": list(DTYPES),
        },
        "recompiles_across_tokens": "none: every group ran under set_stance('fail_on_recompile')",
        "summary": {
            "ratio": "native eager / compiled native in eager (> 1: compiling pays)",
            "tokens_le_16": summary([r for r in rows if r["tokens"] <= 16]),
            "tokens_ge_256": summary([r for r in rows if r["tokens"] >= 256]),
            "by_op": {op: summary([r for r in rows if r["op"] == op]) for op in OPS},
            "all": summary(rows),
        },
        "ops": rows,
    }
    write_report(report, args.out, report["summary"], elapsed)


if __name__ == "__main__":
    main()
