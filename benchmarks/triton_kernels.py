"""Memory bandwidth of the vllm-ir-triton kernels on a GPU, next to native PyTorch.

For ``rms_norm`` and ``fused_add_rms_norm``, bf16 and fp16 (``--dtypes``),
hidden sizes {2048, 4096, 8192, 16384} and {1, 16, 256, 4096, 16384} tokens,
this times

* ``triton``                 — the fast Triton impl (in place for the fused op),
* ``triton_batch_invariant`` — the batch-invariant Triton impl,
* ``native``                 — the op's native PyTorch function, eager,
* ``native_compiled``        — the native function under ``torch.compile``
  (Inductor), the token dimension marked dynamic as a served model compiles it,

each impl called directly (``impl_fn``: the kernel launch and its thin
wrapper, no IR dispatch), with device events: warm-up calls, then
``--rounds`` rounds of back-to-back calls; the time per call is the median
over rounds. Bandwidth is the bytes the op must move (read x, [residual,]
weight; write out[, residual]) over that time, and its share of the device's
peak memory bandwidth (``--peak-gbps``, else a table of known GPUs).
Small shapes are bound by launch overhead and stay in L2 between calls;
``fits_in_l2`` marks them. Before timing, each Triton result is compared
with native on the same inputs (``max_abs_err`` and ``within_tolerance``).

Runs on CUDA, ROCm and XPU devices that Triton drives. Anywhere else (and
under ``TRITON_INTERPRET=1``) it prints that it skipped and exits 0, writing
nothing.

    python benchmarks/triton_kernels.py [--out benchmarks/results/triton_kernels.json]
        [--peak-gbps 4800] [--rounds 15] [--hidden 4096 8192] [--tokens 1 256]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

HIDDEN = (2048, 4096, 8192, 16384)
TOKENS = (1, 16, 256, 4096, 16384)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
OPS = ("rms_norm", "fused_add_rms_norm")
PROVIDERS = ("triton", "triton_batch_invariant")
EPSILON = 1e-6
DEFAULT_OUT = Path(__file__).parent / "results" / "triton_kernels.json"

# (substring of the device name, peak memory bandwidth in GB/s, from the vendors'
# data sheets); the first match wins, so more specific names come first
PEAK_GBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),  # SXM
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB", 1935.0),  # PCIe
    ("A100", 1555.0),  # 40GB
    ("L40S", 864.0),
    ("MI300X", 5300.0),
    ("MI250X", 3276.8),
    ("Max 1550", 3276.8),  # Intel Data Center GPU Max
)


def _device() -> tuple[str, ModuleType] | None:
    """(torch device type, its torch module) of a GPU Triton may drive, or None."""
    if torch.cuda.is_available():
        return "cuda", torch.cuda
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu", xpu
    return None


def skip_reason() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if _device() is None:
        return "no GPU here (neither torch.cuda nor torch.xpu is available)"
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"):
        return "TRITON_INTERPRET is set: the kernels would run in Triton's interpreter"
    try:
        from vllm_ir_triton import support
    except ImportError:
        return "vllm-ir-triton is not installed"
    return support.unsupported_reason()


def peak_gbps(device_name: str, override: float | None) -> tuple[float | None, str]:
    if override is not None:
        return override, "--peak-gbps"
    for key, gbps in PEAK_GBPS:
        if key in device_name:
            return gbps, f"table entry {key!r}"
    return None, "unknown device: pass --peak-gbps"


def bytes_moved(op: str, tokens: int, hidden: int, element_size: int) -> int:
    activations = 2 if op == "rms_norm" else 4  # x in, out; or x, residual in and out
    return (activations * tokens * hidden + hidden) * element_size


def time_per_call_us(
    backend: ModuleType, fn: Callable[[], object], rounds: int, warmup: int, target_ms: float
) -> float:
    """Median over rounds of the mean time of back-to-back calls, in microseconds."""
    for _ in range(warmup):
        fn()
    start, end = backend.Event(enable_timing=True), backend.Event(enable_timing=True)
    backend.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = max(1, min(1000, int(target_ms / max(start.elapsed_time(end), 1e-3))))
    samples = []
    for _ in range(rounds):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def _inputs(op: str, tokens: int, hidden: int, dtype: torch.dtype, device: str) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(tokens * 100003 + hidden)
    x = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device=device, dtype=dtype)
    if op == "rms_norm":
        return (x, w, EPSILON)
    return (x, torch.randn(tokens, hidden, generator=g).to(device=device, dtype=dtype), w, EPSILON)


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _accuracy(op: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> dict[str, Any]:
    """The Triton result against native on the same inputs (fresh copies for each)."""
    got, want = fn(*_clone(args)), op.native(*_clone(args))
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    err = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want, strict=True))
    tol = op.tolerance(args[0].dtype)
    ok = all(
        torch.allclose(g, w, atol=tol.atol, rtol=tol.rtol) for g, w in zip(got, want, strict=True)
    )
    return {"max_abs_err": err, "within_tolerance": ok}


def measure(args: argparse.Namespace, device: str, backend: ModuleType) -> list[dict[str, Any]]:
    import vllm_ir as ir

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    props = backend.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", None)
    peak, _ = peak_gbps(backend.get_device_name(0), args.peak_gbps)
    results = []
    for op_name in OPS:
        op = ir.get_op(op_name)
        impls = {p: op.impls[p].impl_fn for p in PROVIDERS}
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            for hidden in args.hidden:
                compiled = torch.compile(op.native)  # per hidden size; tokens are dynamic
                for tokens in args.tokens:
                    call_args = _inputs(op_name, tokens, hidden, dtype, device)
                    for t in call_args[: 1 if op_name == "rms_norm" else 2]:
                        torch._dynamo.maybe_mark_dynamic(t, 0)  # 1 token stays specialized
                    variants: dict[str, Callable[..., Any]] = {
                        **impls,
                        "native": op.native,
                        "native_compiled": compiled,
                    }
                    moved = bytes_moved(op_name, tokens, hidden, dtype.itemsize)
                    for label, fn in variants.items():
                        with torch.inference_mode():
                            accuracy = _accuracy(op, fn, call_args) if label in PROVIDERS else {}

                            def call(
                                fn: Callable[..., Any] = fn, call_args: tuple[Any, ...] = call_args
                            ) -> object:
                                return fn(*call_args)

                            us = time_per_call_us(
                                backend, call, args.rounds, args.warmup, args.target_ms
                            )
                        gbps = moved / (us * 1e-6) / 1e9
                        row = {
                            "op": op_name,
                            "provider": label,
                            "dtype": dtype_name,
                            "hidden": hidden,
                            "tokens": tokens,
                            "bytes": moved,
                            "fits_in_l2": None if l2_bytes is None else moved <= l2_bytes,
                            "time_us": round(us, 3),
                            "gbps": round(gbps, 1),
                            "pct_of_peak": round(100 * gbps / peak, 1) if peak else None,
                            **accuracy,
                        }
                        results.append(row)
                        print(
                            f"{op_name:>18} {dtype_name:>8} {hidden:>6} x {tokens:>6} "
                            f"{label:>22} {us:>9.2f} us {gbps:>8.1f} GB/s"
                            + (f" {row['pct_of_peak']:>5.1f}%" if peak else "")
                            + ("" if accuracy.get("within_tolerance", True) else "  MISMATCH")
                        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--peak-gbps", type=float, default=None, help="the device's peak bandwidth, GB/s"
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--target-ms", type=float, default=2.0, help="length of one round of back-to-back calls"
    )
    parser.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), default=["bfloat16", "float16"]
    )
    args = parser.parse_args(argv)

    reason = skip_reason()
    if reason is not None:
        print(f"triton_kernels: skipped: {reason}")
        return 0
    found = _device()
    assert found is not None
    device, backend = found

    import triton
    import vllm_ir as ir
    import vllm_ir_triton

    name = backend.get_device_name(0)
    peak, peak_source = peak_gbps(name, args.peak_gbps)
    print(f"{name}: peak {peak} GB/s ({peak_source})")
    results = measure(args, device, backend)
    mismatches = [r for r in results if r.get("within_tolerance") is False]
    report = {
        "benchmark": "triton_kernels",
        "device": name,
        "device_type": device,
        "peak_gbps": peak,
        "peak_source": peak_source,
        "l2_cache_bytes": getattr(backend.get_device_properties(0), "L2_cache_size", None),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm_ir": ir.__version__,
        "vllm_ir_triton": vllm_ir_triton.__version__,
        "python": platform.python_version(),
        "timing": {
            "method": "device events around back-to-back calls; median over rounds",
            "rounds": args.rounds,
            "warmup": args.warmup,
            "target_ms_per_round": args.target_ms,
        },
        "mismatches": len(mismatches),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    if mismatches:
        print(f"{len(mismatches)} Triton result(s) off native's tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
