"""What the GPU kernel benchmarks share: the ops' inputs and bytes, device-event timing,
a device-to-device copy of the same bytes as the attainable bandwidth, host time per call,
and the report (one table line and one JSON row per result).

Imported by ``gpu_kernels.py`` (vllm_c) and ``triton_kernels.py`` (vllm-ir-triton);
not a benchmark itself (``nox -s bench`` skips files starting with ``_``).

Each result has

* ``time_us``: device events around back-to-back calls, the median over rounds of
  the mean per call (small shapes are bound by the host's launch rate: see ``host_us``);
* ``gbps``: the bytes the op must move (every input read once, every output written
  once) over that time; ``pct_of_peak``: its share of the data-sheet peak (a table
  of known GPUs, or ``--peak-gbps``); ``pct_of_copy``: its share of what
  ``dst.copy_(src)`` of the same number of bytes (half read, half written) reached
  in the same run — the bandwidth a kernel can actually attain on that device;
* ``host_us`` (at most :data:`HOST_TOKENS` tokens): host time per call, with no
  synchronization between calls: what a decode step pays per op when launches,
  not the GPU, are the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

HIDDEN = (2048, 4096, 8192, 16384)
TOKENS = (1, 16, 256, 4096, 16384)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EPSILON = 1e-6
HOST_TOKENS = 16
"""Results with at most this many tokens also report the host time per call."""

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

Variant = Callable[..., Any]


def gpu() -> tuple[str, ModuleType] | None:
    """(torch device type, its torch module) of an available GPU, or None."""
    if torch.cuda.is_available():
        return "cuda", torch.cuda
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu", xpu
    return None


def peak_gbps(device_name: str, override: float | None) -> tuple[float | None, str]:
    if override is not None:
        return override, "--peak-gbps"
    for key, gbps in PEAK_GBPS:
        if key in device_name:
            return gbps, f"table entry {key!r}"
    return None, "unknown device: pass --peak-gbps"


HEAD_SIZE = 128
"""rotary_embedding: heads of 128 channels, all rotated; query has ``hidden / 128``
heads, key a quarter of them (grouped-query attention), cos/sin one row per token."""


def rotary_heads(hidden: int) -> tuple[int, int]:
    """(query heads, key heads) of rotary_embedding at ``hidden``."""
    heads = max(hidden // HEAD_SIZE, 1)
    return heads, max(heads // 4, 1)


def bytes_moved(op: str, tokens: int, hidden: int, element_size: int) -> int:
    """Bytes ``op`` must read and write at least once; ``hidden`` is the output row
    length (``silu_and_mul`` reads rows of ``2 * hidden``)."""
    e, es, w = tokens * hidden, element_size, hidden * element_size
    q_heads, k_heads = rotary_heads(hidden)
    return {
        "gelu_and_mul": 3 * e * es,
        # query and key read and written in place, cos and sin read
        "rotary_embedding": (2 * (q_heads + k_heads) + 2) * tokens * HEAD_SIZE * es,
        "rms_norm": 2 * e * es + w,
        "fused_add_rms_norm": 4 * e * es + w,
        "silu_and_mul": 3 * e * es,
        "static_scaled_fp8_quant": e * es + e + 4,
        "dynamic_per_token_fp8_quant": e * es + e + 4 * tokens,
        "rms_norm_static_fp8_quant": e * es + e + w + 4,
        "fused_add_rms_norm_static_fp8_quant": 3 * e * es + e + w + 4,
    }[op]


def inputs(op: str, tokens: int, hidden: int, dtype: torch.dtype, device: str) -> tuple[Any, ...]:
    """The op's arguments (seeded, made on the CPU then moved: the same on every device)."""
    g = torch.Generator().manual_seed(tokens * 100003 + hidden)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    x = rand(tokens, hidden)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device=device, dtype=dtype)
    scale = torch.tensor([0.02], device=device)
    return {
        "rms_norm": lambda: (x, w, EPSILON),
        "fused_add_rms_norm": lambda: (x, rand(tokens, hidden), w, EPSILON),
        "silu_and_mul": lambda: (rand(tokens, 2 * hidden),),
        "gelu_and_mul": lambda: (rand(tokens, 2 * hidden), "none"),
        "rotary_embedding": lambda: (
            rand(tokens, rotary_heads(hidden)[0], HEAD_SIZE),
            rand(tokens, rotary_heads(hidden)[1], HEAD_SIZE),
            rand(tokens, HEAD_SIZE).cos(),
            rand(tokens, HEAD_SIZE).sin(),
            True,
        ),
        "static_scaled_fp8_quant": lambda: (x, scale),
        "dynamic_per_token_fp8_quant": lambda: (x, None),
        "rms_norm_static_fp8_quant": lambda: (x, w, EPSILON, scale),
        "fused_add_rms_norm_static_fp8_quant": lambda: (
            x,
            rand(tokens, hidden),
            w,
            EPSILON,
            scale,
        ),
    }[op]()


def activations(op: str, args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The token-sized arguments (marked dynamic for ``native_compiled``)."""
    n = 2 if op.startswith("fused_add") else 1
    return [a for a in args[:n] if isinstance(a, torch.Tensor)]


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


def host_us_per_call(
    backend: ModuleType, fn: Callable[[], object], rounds: int, calls: int = 100
) -> float:
    """Median over rounds of the host time per call of ``calls`` unsynchronized calls, in µs."""
    samples = []
    for _ in range(rounds):
        backend.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    backend.synchronize()
    return statistics.median(samples)


class CopyBandwidth:
    """GB/s of ``dst.copy_(src)`` moving a given number of bytes, measured once per size."""

    def __init__(self, backend: ModuleType, device: str, args: argparse.Namespace) -> None:
        self.backend, self.device, self.args = backend, device, args
        self.cache: dict[int, float] = {}

    def __call__(self, moved: int) -> float:
        if moved not in self.cache:
            src = torch.empty(max(moved // 2, 1), dtype=torch.uint8, device=self.device)
            dst = torch.empty_like(src)
            us = time_per_call_us(
                self.backend,
                lambda: dst.copy_(src),
                self.args.rounds,
                self.args.warmup,
                self.args.target_ms,
            )
            self.cache[moved] = 2 * src.numel() / (us * 1e-6) / 1e9
        return self.cache[moved]


def _clone(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def accuracy(op_name: str, fn: Variant, args: tuple[Any, ...]) -> dict[str, Any]:
    """``fn``'s result against native on fresh copies of the same inputs, within the op's
    promise (``vllm_ir._schema.tolerances``: FP8 outputs within the op's FP8 steps)."""
    import vllm_ir as ir
    from vllm_ir._schema.tolerances import fp8_steps_apart

    op = ir.get_op(op_name)
    got, want = fn(*_clone(args)), op.native(*_clone(args))
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    tol = op.tolerance(args[0].dtype)
    err, ok = 0.0, True
    fp8_limit = 1 if op_name.startswith(("rms_norm", "fused")) else 0
    for g, w in zip(gots, wants, strict=True):
        if g.dtype == torch.float8_e4m3fn:
            steps = int(fp8_steps_apart(g, w).max()) if g.numel() else 0
            ok &= steps <= fp8_limit
            err = max(err, float(steps))
        else:
            # a NaN where native has none is an infinite error (max() would drop it)
            diff = (g.float() - w.float()).abs().nan_to_num(nan=float("inf"))
            err = max(err, diff.max().item() if g.numel() else 0.0)
            ok &= torch.allclose(g, w, atol=tol.atol, rtol=tol.rtol)
    return {"max_abs_err": err, "within_tolerance": bool(ok)}


def add_arguments(parser: argparse.ArgumentParser, *, default_dtypes: Iterable[str]) -> None:
    parser.add_argument(
        "--peak-gbps", type=float, default=None, help="the device's peak bandwidth, GB/s"
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--target-ms", type=float, default=2.0, help="length of one round of back-to-back calls"
    )
    from vllm_ir import ops  # every built-in op

    parser.add_argument("--ops", nargs="+", choices=ops.__all__, default=ops.__all__)
    parser.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(default_dtypes))
    parser.add_argument(
        "--no-compiled", action="store_true", help="skip native_compiled (saves compile time)"
    )


def measure(
    args: argparse.Namespace,
    device: str,
    backend: ModuleType,
    variants: Callable[[str], dict[str, Variant]],
    checked: Callable[[str], bool] = lambda label: False,
) -> list[dict[str, Any]]:
    """Every (op, dtype, hidden, tokens, variant) of ``args``; ``variants(op)`` gives the
    label -> function of each op (``native_compiled`` is added unless ``--no-compiled``);
    labels for which ``checked`` holds are first compared with native (``accuracy``)."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    props = backend.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", None)
    peak, _ = peak_gbps(backend.get_device_name(0), args.peak_gbps)
    copy = CopyBandwidth(backend, device, args)
    results = []
    for op_name in args.ops:
        fns = variants(op_name)
        if not fns:
            continue
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            for hidden in args.hidden:
                all_fns = dict(fns)
                if not args.no_compiled:
                    import vllm_ir as ir

                    # one compiled function per shape family; the token dimension is dynamic
                    all_fns["native_compiled"] = torch.compile(ir.get_op(op_name).native)
                for tokens in args.tokens:
                    call_args = inputs(op_name, tokens, hidden, dtype, device)
                    if tokens > 1:
                        for t in activations(op_name, call_args):
                            torch._dynamo.maybe_mark_dynamic(t, 0)
                    moved = bytes_moved(op_name, tokens, hidden, dtype.itemsize)
                    copy_gbps = copy(moved)
                    for label, fn in all_fns.items():
                        results.append(
                            _one(
                                args, backend, op_name, label, fn, call_args, moved, copy_gbps,
                                peak, l2_bytes, dtype_name, hidden, tokens, checked(label),
                            )
                        )  # fmt: skip
    return results


def _one(
    args: argparse.Namespace,
    backend: ModuleType,
    op_name: str,
    label: str,
    fn: Variant,
    call_args: tuple[Any, ...],
    moved: int,
    copy_gbps: float,
    peak: float | None,
    l2_bytes: int | None,
    dtype_name: str,
    hidden: int,
    tokens: int,
    check: bool,
) -> dict[str, Any]:
    with torch.inference_mode():
        extra = accuracy(op_name, fn, call_args) if check else {}

        def call(fn: Variant = fn, call_args: tuple[Any, ...] = call_args) -> object:
            return fn(*call_args)

        us = time_per_call_us(backend, call, args.rounds, args.warmup, args.target_ms)
        if tokens <= HOST_TOKENS:
            extra["host_us"] = round(host_us_per_call(backend, call, args.rounds), 2)
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
        "gbps": _figures(gbps),
        "pct_of_peak": _figures(100 * gbps / peak) if peak else None,
        "copy_gbps": _figures(copy_gbps),
        "pct_of_copy": _figures(100 * gbps / copy_gbps),
        **extra,
    }
    host = f" host {row['host_us']:>6.1f} us" if "host_us" in row else ""
    print(
        f"{op_name:>36} {dtype_name:>8} {tokens:>6} x {hidden:>6} {label:>22} "
        f"{us:>9.2f} us {gbps:>8.1f} GB/s {row['pct_of_copy']:>5.1f}% of copy"
        + (f" {row['pct_of_peak']:>5.1f}% of peak" if peak else "")
        + host
        + ("" if row.get("within_tolerance", True) else "  MISMATCH"),
        flush=True,
    )
    return row


def report(
    name: str,
    args: argparse.Namespace,
    device_type: str,
    backend: ModuleType,
    results: list[dict[str, Any]],
    versions: dict[str, str | None],
) -> int:
    """Write the JSON report to ``args.out``; 1 if any checked result was off native."""
    device = backend.get_device_name(0)
    peak, peak_source = peak_gbps(device, args.peak_gbps)
    mismatches = [r for r in results if r.get("within_tolerance") is False]
    out = {
        "benchmark": name,
        "device": device,
        "device_type": device_type,
        "peak_gbps": peak,
        "peak_source": peak_source,
        "l2_cache_bytes": getattr(backend.get_device_properties(0), "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **versions,
        "python": platform.python_version(),
        "timing": {
            "method": "device events around back-to-back calls; median over rounds",
            "rounds": args.rounds,
            "warmup": args.warmup,
            "target_ms_per_round": args.target_ms,
            "copy": "dst.copy_(src) of the same bytes (half read, half written), same run",
            "host_us": f"host time per call, 100 unsynchronized calls, <= {HOST_TOKENS} tokens",
        },
        "mismatches": len(mismatches),
        "results": results,
    }
    path: Path = args.out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    if mismatches:
        print(f"{name}: {len(mismatches)} result(s) off native's promise", file=sys.stderr)
        return 1
    return 0


def _figures(value: float) -> float:
    """Three significant figures: a slow small case keeps a nonzero rate."""
    return float(f"{value:.3g}")


def device_slug(name: str) -> str:
    """A file-name part naming the device: ``NVIDIA H200`` -> ``nvidia-h200``."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())
