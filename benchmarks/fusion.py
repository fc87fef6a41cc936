"""The norm + FP8 quant fusion pass: compiled runtime and kernels, on vs off.

A decoder whose layers run ``fused_add_rms_norm.maybe_inplace`` and quantize
the normalized output to FP8 for the next (dequantizing) linear layer. Both
variants compile with the ``vllm_ir`` backend, one with ``fuse_norm_quant``
on, one off; runtimes are measured side by side in one run.

    python benchmarks/fusion.py [--layers 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import vllm_ir as ir
from torch._inductor import config as inductor_config
from torch._inductor import metrics
from torch._inductor.utils import run_and_get_code

HIDDEN, TOKENS = 256, 32


class QuantDecoder(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linears = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(layers))
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(HIDDEN))
        self.register_buffer("scale", torch.tensor([0.05]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, residual = x, x
        for linear in self.linears:
            h, residual = ir.ops.fused_add_rms_norm.maybe_inplace(
                linear(h), residual, self.weight, 1e-6
            )
            q = ir.ops.static_scaled_fp8_quant(h, self.scale)
            h = q.to(torch.float32) * self.scale  # what an FP8 GEMM would consume
        return h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fusion.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = QuantDecoder(args.layers).eval()
    x = torch.randn(TOKENS, HIDDEN)
    compiled, stats = {}, {}
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False):
        for label, on in (("fused", True), ("unfused", False)):
            torch._dynamo.reset()
            metrics.reset()
            backend = ir.VllmIRBackend(passes={"fuse_norm_quant": on})
            fn = torch.compile(model, backend=backend)
            _, code = run_and_get_code(fn, x.clone())
            source = "\n".join(code)
            compiled[label] = fn
            stats[label] = {
                "fusions": backend.pass_contexts[-1].fusions.get("fuse_norm_quant", 0),
                "kernels": metrics.generated_kernel_count,
                "buffers_allocated": source.count("empty_strided_cpu("),
            }
        reference = model(x.clone())
        for label, fn in compiled.items():
            stats[label]["max_abs_diff_vs_eager"] = (fn(x.clone()) - reference).abs().max().item()
        samples: dict[str, list[float]] = {k: [] for k in compiled}
        for _ in range(15):
            for label, fn in compiled.items():
                start = time.perf_counter()
                for _ in range(20):
                    fn(x.clone())
                samples[label].append((time.perf_counter() - start) / 20 * 1e6)
    for label in compiled:
        stats[label]["runtime_us_median"] = round(statistics.median(samples[label]), 2)
    report = {
        "benchmark": "fusion",
        "torch": torch.__version__,
        "vllm_ir": ir.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "layers": args.layers,
        "tokens": TOKENS,
        "hidden": HIDDEN,
        "results": stats,
        "runtime_ratio_fused_over_unfused": round(
            stats["fused"]["runtime_us_median"] / stats["unfused"]["runtime_us_median"], 3
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
