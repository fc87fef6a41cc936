"""Memory bandwidth of the RMSNorm kernels on a GPU, against the device's peak.

For ``rms_norm`` and ``fused_add_rms_norm``, fp16 and bf16, hidden sizes
{2048, 4096, 8192, 16384} and {1, 16, 256, 4096, 16384} tokens, this times

* ``vllm_c``          — the vllm-ir-cuda impl (CUDA kernels; in place for the fused op),
* ``native``          — the op's native PyTorch function, eager,
* ``native_compiled`` — the native function under ``torch.compile`` (Inductor),
  the token dimension marked dynamic, as a served model compiles it,
* ``triton*``         — the vllm-ir-triton impls, when that package is installed,

with CUDA events: warm-up calls, then ``--rounds`` rounds of back-to-back
calls; the time per call is the median over rounds. Bandwidth is the bytes
the op must move (read x, [residual,] weight; write out[, residual]) over
that time, and its share of the device's peak memory bandwidth (a table of
known GPUs, or ``--peak-gbps``). Small shapes are bound by launch overhead
and stay in L2 across calls; ``fits_in_l2`` marks them.

Without a CUDA GPU it prints that it skipped and exits 0, writing nothing.

    python benchmarks/gpu_kernels.py [--out benchmarks/results/gpu_kernels.json]
        [--peak-gbps 4800] [--rounds 15] [--hidden 4096 8192] [--tokens 1 256]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HIDDEN = (2048, 4096, 8192, 16384)
TOKENS = (1, 16, 256, 4096, 16384)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
OPS = ("rms_norm", "fused_add_rms_norm")
EPSILON = 1e-6
DEFAULT_OUT = Path(__file__).parent / "results" / "gpu_kernels.json"
DEVICE = "cuda"

# (substring of torch.cuda.get_device_name(), peak memory bandwidth in GB/s);
# the first match wins, so more specific names come first
PEAK_GBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),  # SXM
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB", 1935.0),  # PCIe
    ("A100", 1555.0),  # 40GB
)


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


def time_per_call_us(fn: Callable[[], object], rounds: int, warmup: int, target_ms: float) -> float:
    """Median over rounds of the mean time of back-to-back calls, in microseconds."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
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


def _inputs(op: str, tokens: int, hidden: int, dtype: torch.dtype) -> tuple[Any, ...]:
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEVICE)).to(dtype)
    if op == "rms_norm":
        return (x, w, EPSILON)
    return (x, torch.randn_like(x), w, EPSILON)


def providers(op_name: str) -> dict[str, Callable[..., Any]]:
    """Provider label -> function taking the op's arguments."""
    import vllm_ir as ir

    op = ir.get_op(op_name)
    found: dict[str, Callable[..., Any]] = {}
    impls = op.impls
    if "vllm_c" in impls:
        found["vllm_c"] = impls["vllm_c"].impl_fn
    else:
        print(f"{op_name}: no vllm_c impl (is vllm-ir-cuda installed?)", file=sys.stderr)
    found["native"] = op.native
    if importlib.util.find_spec("vllm_ir_triton") is not None:
        for name, impl in sorted(impls.items()):
            if name.startswith("triton"):
                found[name] = impl.impl_fn
    return found


def compiled_native(op_name: str) -> Callable[..., Any]:
    import vllm_ir as ir

    return torch.compile(ir.get_op(op_name).native)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    peak, _ = peak_gbps(torch.cuda.get_device_name(0), args.peak_gbps)
    results = []
    for op_name in OPS:
        fns = providers(op_name)
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            for hidden in args.hidden:
                # one compiled function per shape family; the token dimension is dynamic
                compiled = compiled_native(op_name)
                for tokens in args.tokens:
                    call_args = _inputs(op_name, tokens, hidden, dtype)
                    for t in call_args[: 1 if op_name == "rms_norm" else 2]:
                        torch._dynamo.maybe_mark_dynamic(t, 0)  # 1 token stays specialized
                    variants = {**fns, "native_compiled": compiled}
                    moved = bytes_moved(op_name, tokens, hidden, dtype.itemsize)
                    for label, fn in variants.items():

                        def call(
                            fn: Callable[..., Any] = fn, call_args: tuple[Any, ...] = call_args
                        ) -> object:
                            return fn(*call_args)

                        with torch.inference_mode():
                            us = time_per_call_us(call, args.rounds, args.warmup, args.target_ms)
                        gbps = moved / (us * 1e-6) / 1e9
                        row = {
                            "op": op_name,
                            "provider": label,
                            "dtype": dtype_name,
                            "hidden": hidden,
                            "tokens": tokens,
                            "bytes": moved,
                            "fits_in_l2": moved <= l2_bytes,
                            "time_us": round(us, 3),
                            "gbps": round(gbps, 1),
                            "pct_of_peak": round(100 * gbps / peak, 1) if peak else None,
                        }
                        results.append(row)
                        print(
                            f"{op_name:>18} {dtype_name:>8} {hidden:>6} x {tokens:>6} "
                            f"{label:>16} {us:>9.2f} us {gbps:>8.1f} GB/s"
                            + (f" {row['pct_of_peak']:>5.1f}%" if peak else "")
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
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("gpu_kernels: skipped: no CUDA GPU here (torch.cuda.is_available() is False)")
        return 0

    import vllm_ir as ir

    device = torch.cuda.get_device_name(0)
    peak, peak_source = peak_gbps(device, args.peak_gbps)
    print(f"{device}: peak {peak} GB/s ({peak_source})")
    results = measure(args)
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "vllm_ir": ir.__version__}
    if importlib.util.find_spec("vllm_ir_cuda") is not None:
        import vllm_ir_cuda

        versions["vllm_ir_cuda"] = vllm_ir_cuda.__version__
    report = {
        "benchmark": "gpu_kernels",
        "device": device,
        "peak_gbps": peak,
        "peak_source": peak_source,
        "l2_cache_bytes": torch.cuda.get_device_properties(0).L2_cache_size,
        **versions,
        "python": platform.python_version(),
        "timing": {
            "method": "CUDA events around back-to-back calls; median over rounds",
            "rounds": args.rounds,
            "warmup": args.warmup,
            "target_ms_per_round": args.target_ms,
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
