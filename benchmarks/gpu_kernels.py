"""Memory bandwidth and host time of the vllm-ir-cuda (``vllm_c``) kernels on a GPU.

For the core ops (``--ops``: norms, activations, RoPE, FP8 quantization), fp16
and bf16, hidden sizes {2048, 4096, 8192, 16384} and {1, 16, 256, 4096, 16384}
tokens, this times

* ``vllm_c``          — the vllm-ir-cuda impl (in place where the op allows),
* ``native``          — the op's native PyTorch function, eager,
* ``native_compiled`` — the native function under ``torch.compile`` (Inductor),
  the token dimension marked dynamic, as a served model compiles it,
* ``triton``          — the vllm-ir-triton impl, when that package is installed,

each impl called directly (``impl_fn``: no IR dispatch) and first compared with
native (``within_tolerance``). Timing, bandwidth (its share of the data-sheet peak
and of a device-to-device copy of the same bytes in the same run) and the host
time per call at decode sizes are described in ``_gpu_bench.py``.

Without a CUDA GPU it prints that it skipped and exits 0, writing nothing.

    python benchmarks/gpu_kernels.py [--out benchmarks/results/gpu_kernels.json]
        [--ops rms_norm silu_and_mul] [--hidden 4096 8192] [--tokens 1 4096] [--rounds 15]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import _gpu_bench as bench
import torch

DEFAULT_OUT = Path(__file__).parent / "results" / "gpu_kernels.json"
CHECKED = ("vllm_c", "triton")


def variants(op_name: str) -> dict[str, bench.Variant]:
    """Provider label -> function taking the op's arguments."""
    import vllm_ir as ir

    op = ir.get_op(op_name)
    found: dict[str, bench.Variant] = {}
    if "vllm_c" in op.impls and op.impls["vllm_c"].supported:
        found["vllm_c"] = op.impls["vllm_c"].impl_fn
    else:
        print(f"{op_name}: no supported vllm_c impl (is vllm-ir-cuda installed?)", file=sys.stderr)
    found["native"] = op.native
    if "triton" in op.impls and op.impls["triton"].supported:
        found["triton"] = op.impls["triton"].impl_fn
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    bench.add_arguments(parser, default_dtypes=("bfloat16", "float16"))
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("gpu_kernels: skipped: no CUDA GPU here (torch.cuda.is_available() is False)")
        return 0

    import vllm_ir as ir

    versions: dict[str, Any] = {"vllm_ir": ir.__version__}
    for module in ("vllm_ir_cuda", "vllm_ir_triton", "triton"):
        if importlib.util.find_spec(module) is not None:
            versions[module] = importlib.import_module(module).__version__
    name = torch.cuda.get_device_name(0)
    peak, source = bench.peak_gbps(name, args.peak_gbps)
    print(f"{name}: peak {peak} GB/s ({source})")
    results = bench.measure(args, "cuda", torch.cuda, variants, lambda label: label in CHECKED)
    return bench.report("gpu_kernels", args, "cuda", torch.cuda, results, versions)


if __name__ == "__main__":
    sys.exit(main())
