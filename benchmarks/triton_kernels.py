"""Memory bandwidth and host time of the vllm-ir-triton kernels on a GPU, next to native.

For the seven core ops (``--ops``; ``rms_norm`` and ``fused_add_rms_norm`` by
both Triton providers), bf16 and fp16 (``--dtypes``), hidden sizes {2048,
4096, 8192, 16384} and {1, 16, 256, 4096, 16384} tokens, this times

* ``triton``                 — the fast Triton impl (in place where the op allows),
* ``triton_batch_invariant`` — the batch-invariant Triton impl (the norms),
* ``native``                 — the op's native PyTorch function, eager,
* ``native_compiled``        — the native function under ``torch.compile``
  (Inductor), the token dimension marked dynamic as a served model compiles it,

each impl called directly (``impl_fn``: the kernel launch and its thin wrapper,
no IR dispatch), each Triton result first compared with native on the same
inputs (``max_abs_err``, ``within_tolerance``: FP8 outputs in FP8 steps).
Timing, bandwidth (its share of the data-sheet peak and of a device-to-device
copy of the same bytes in the same run) and the host time per call at decode
sizes are described in ``_gpu_bench.py``.

Runs on CUDA, ROCm and XPU devices that Triton drives. Anywhere else (and
under ``TRITON_INTERPRET=1``) it prints that it skipped and exits 0, writing
nothing.

    python benchmarks/triton_kernels.py [--out benchmarks/results/triton_kernels.json]
        [--ops rms_norm silu_and_mul] [--hidden 4096 8192] [--tokens 1 4096] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import _gpu_bench as bench

DEFAULT_OUT = Path(__file__).parent / "results" / "triton_kernels.json"
PROVIDERS = ("triton", "triton_batch_invariant")


def skip_reason() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if bench.gpu() is None:
        return "no GPU here (neither torch.cuda nor torch.xpu is available)"
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"):
        return "TRITON_INTERPRET is set: the kernels would run in Triton's interpreter"
    try:
        from vllm_ir_triton import support
    except ImportError:
        return "vllm-ir-triton is not installed"
    return support.unsupported_reason()


def variants(op_name: str) -> dict[str, bench.Variant]:
    import vllm_ir as ir

    op = ir.get_op(op_name)
    found = {p: op.impls[p].impl_fn for p in PROVIDERS if p in op.impls}
    return {**found, "native": op.native}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    bench.add_arguments(parser, default_dtypes=("bfloat16", "float16"))
    args = parser.parse_args(argv)

    reason = skip_reason()
    if reason is not None:
        print(f"triton_kernels: skipped: {reason}")
        return 0
    found = bench.gpu()
    assert found is not None
    device, backend = found

    import triton
    import vllm_ir as ir
    import vllm_ir_triton
    from vllm_ir_triton import direct

    name = backend.get_device_name(0)
    peak, source = bench.peak_gbps(name, args.peak_gbps)
    print(f"{name}: peak {peak} GB/s ({source}); direct relaunch: {direct.ENABLED}")
    results = bench.measure(args, device, backend, variants, lambda label: label in PROVIDERS)
    versions = {
        "triton": triton.__version__,
        "vllm_ir": ir.__version__,
        "vllm_ir_triton": vllm_ir_triton.__version__,
        "direct_relaunch": str(direct.ENABLED),
    }
    return bench.report("triton_kernels", args, device, backend, results, versions)


if __name__ == "__main__":
    sys.exit(main())
