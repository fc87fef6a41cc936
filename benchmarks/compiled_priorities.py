"""Which provider should a compiled model use? A small decoder under each candidate.

The model: ``layers`` decoder layers of ``rms_norm`` / ``fused_add_rms_norm.maybe_inplace``
around linears, with ``silu_and_mul`` in the MLP (the attention is a linear stand-in).
It is compiled with ``torch.compile(backend=VllmIRBackend(priority=...))`` once per
candidate compiled priority — ``native`` (the compiled default: Inductor sees and fuses
the native functions), and each provider available here that implements these ops
(``vllm_c``, ``triton`` on a GPU; ``cpu_c`` on the CPU) — and run at a decode and a
prefill size. For each it reports, side by side:

* ``time_us``: the median forward time (CUDA events on a GPU, the host clock on the
  CPU) over ``--rounds`` calls after warm-up;
* ``inductor_kernels``: the kernels Inductor generated for the graph
  (``torch._inductor.metrics.generated_kernel_count``, caches off);
* ``device_kernels`` (CUDA): the kernels one forward launches, from the profiler;
* ``selected``: the provider the lowering chose per IR op.

On a GPU (defaults: 4 layers, hidden 4096, intermediate 7168, bf16, 8 and 2048
tokens) it is the measurement the CUDA compiled defaults are to be chosen from. On
the CPU it runs tiny sizes in float32 with ``native`` and ``cpu_c`` (if vllm-ir-cpu
is installed), so the code path is exercised everywhere.

    python benchmarks/compiled_priorities.py [--out benchmarks/results/compiled_priorities.json]
        [--layers 4] [--hidden 4096] [--intermediate 7168] [--tokens 8 2048] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _model_bench import device_name, environment, model_shape, resolve_device, step_timer
from torch import Tensor, nn

DEFAULT_OUT = Path(__file__).parent / "results" / "compiled_priorities.json"
OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul")
CANDIDATES = ("native", "vllm_c", "triton", "cpu_c")
EPSILON = 1e-6
GPU_DEFAULTS = {"layers": 4, "hidden": 4096, "intermediate": 7168, "tokens": [8, 2048]}
CPU_DEFAULTS = {"layers": 2, "hidden": 64, "intermediate": 128, "tokens": [4, 32]}


class Layer(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.attn = nn.Linear(hidden, hidden, bias=False)  # stands in for attention
        self.up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.attn_norm = nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.mlp_norm = nn.Parameter(1 + 0.1 * torch.randn(hidden))


class Decoder(nn.Module):
    """Pre-norm decoder layers with a residual stream updated in place (``maybe_inplace``)."""

    def __init__(self, hidden: int, intermediate: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Layer(hidden, intermediate) for _ in range(layers))
        self.norm = nn.Parameter(1 + 0.1 * torch.randn(hidden))

    def forward(self, x: Tensor) -> Tensor:
        import vllm_ir as ir

        fused = ir.ops.fused_add_rms_norm.maybe_inplace
        residual = x.clone()
        h = ir.ops.rms_norm(x, self.norm, EPSILON)
        for layer in self.layers:
            h, residual = fused(layer.attn(h), residual, layer.attn_norm, EPSILON)
            h = layer.down(ir.ops.silu_and_mul(layer.up(h)))
            h, residual = fused(h, residual, layer.mlp_norm, EPSILON)
        return h


def candidates(device: str) -> dict[str, dict[str, list[str]]]:
    """Candidate name -> the priority pinning each op of the model it implements."""
    import vllm_ir as ir

    found: dict[str, dict[str, list[str]]] = {}
    for provider in CANDIDATES:
        if provider.startswith("triton") and device == "cpu":
            continue  # Triton's interpreter: correct, but no measurement of anything
        if provider == "vllm_c" and device == "cpu":
            continue
        priority = {
            name: [provider]
            for name in OPS
            if provider == "native"
            or (provider in ir.get_op(name).impls and ir.get_op(name).impls[provider].supported)
        }
        if priority:
            found[provider] = priority
    return found


def _device_kernels(fn: Callable[[], object]) -> int:
    """Kernels one call launches on the GPU (profiler, CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(
        1
        for e in prof.events()
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        and "memcpy" not in e.name.lower()
        and "memset" not in e.name.lower()
    )


def measure(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    import vllm_ir as ir
    from torch._inductor import metrics
    from vllm_ir.testing import inductor_caches_off

    timer = step_timer(device)
    model = Decoder(args.hidden, args.intermediate, args.layers).to(device, dtype).eval()
    results = []
    reference: dict[int, Tensor] = {}
    for name, priority in candidates(device).items():
        for tokens in args.tokens:
            x = torch.randn(tokens, args.hidden, generator=torch.Generator().manual_seed(tokens))
            x = x.to(device, dtype)
            torch._dynamo.reset()
            metrics.reset()
            backend = ir.VllmIRBackend(priority=priority)
            compiled = torch.compile(model, backend=backend, dynamic=False)
            with inductor_caches_off(), torch.no_grad():
                out = compiled(x)  # compiles
                kernels = metrics.generated_kernel_count
                with ir.IrOpPriorityConfig(**priority).scope():  # eager reference, same impls
                    eager = model(x)
                us = timer(lambda: compiled(x), args.warmup, args.rounds)  # noqa: B023
                launched = _device_kernels(lambda: compiled(x)) if device == "cuda" else None  # noqa: B023
            if tokens not in reference:
                reference[tokens] = out.float()
            tol = ir.ops.rms_norm.tolerance(dtype)
            scale = max(1.0, float(eager.float().abs().max()))
            row = {
                "candidate": name,
                "priority": priority,
                "tokens": tokens,
                "time_us": round(us, 2),
                "inductor_kernels": kernels,
                "device_kernels": launched,
                "selected": {
                    op: sorted(set(nodes.values()))
                    for op, nodes in backend.lowering_pass.selected_impls.items()
                },
                "max_abs_diff_vs_eager": float((out.float() - eager.float()).abs().max()),
                "max_abs_diff_vs_native_compiled": float(
                    (out.float() - reference[tokens]).abs().max()
                ),
                # the layers compound per-op rounding: a loose bound, scaled by the output
                "close_to_eager": bool(
                    torch.allclose(out.float(), eager.float(), atol=8 * tol.atol * scale, rtol=0.05)
                ),
            }
            results.append(row)
            print(
                f"{name:>8} {tokens:>6} tokens {us:>10.1f} us  inductor kernels {kernels:>3}"
                + (f"  device kernels {launched:>3}" if launched is not None else "")
                + f"  selected {row['selected']}",
                flush=True,
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--tokens", type=int, nargs="+", default=None)
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    device = resolve_device(args, GPU_DEFAULTS, CPU_DEFAULTS)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))

    name = device_name(device)
    print(f"compiled_priorities on {name}: {args.layers} layers, hidden {args.hidden}, "
          f"intermediate {args.intermediate}, {dtype}")  # fmt: skip
    results = measure(args, device, dtype)
    report = {
        **environment("compiled_priorities", device),
        "model": {
            **model_shape(args),
            "dtype": str(dtype).removeprefix("torch."),
        },
        "timing": {
            "method": "CUDA events per forward" if device == "cuda" else "host clock per forward",
            "statistic": "median",
            "rounds": args.rounds,
            "warmup": args.warmup,
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    bad = [r for r in results if not r["close_to_eager"]]
    if bad:
        print(f"{len(bad)} compiled result(s) far from eager", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
