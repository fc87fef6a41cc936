"""An FP8 decoder compiled two ways: plain ``torch.compile`` against vllm-ir's norm-quant fusion.

Each layer normalizes, quantizes statically to FP8 and multiplies with
``torch._scaled_mm`` (an attention stand-in, the MLP's up and down projections),
the residual stream updated by ``fused_add_rms_norm``:

    h = rms_norm(x)
    per layer: a = mm(quant(h)); h, r = add_norm(a, r)
               u = mm(quant(h)); d = mm(quant(silu_and_mul(u))); h, r = add_norm(d, r)

Two builds of the same model and weights, side by side:

* ``inductor``: the native functions (plain PyTorch), ``torch.compile`` with
  Inductor, which fuses norm and quantization itself;
* ``vllm_ir``: the IR ops, ``torch.compile(backend=VllmIRBackend(priority=...,
  passes={"fuse_norm_quant": True}))``: every norm followed by its quantization
  becomes ``rms_norm_static_fp8_quant`` / ``fused_add_rms_norm_static_fp8_quant``,
  run by ``--provider``'s kernels (default ``vllm_c``).

Per token count (the token dimension dynamic: one compile per build) it reports
the forward replayed from a CUDA graph (``graph_us``, CUDA events, median), the
kernels of one forward from the profiler summed by kind (``matmul_us``: the
``_scaled_mm`` GEMMs; ``other_us``: norms, quantization, activation, copies) and
the ratios ``inductor / vllm_ir`` of each. Outputs are compared with the eager
native model (``close_to_eager``).

Without a CUDA GPU it runs tiny sizes on the CPU (host clock, no graphs, no
profiler) so the code path is exercised; the numbers mean nothing there.

    python benchmarks/fp8_decoder.py [--out benchmarks/results/fp8_decoder.json]
        [--tokens 256 1024 4096] [--layers 4] [--hidden 4096] [--intermediate 14336]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _model_bench import device_name, environment, model_shape, resolve_device, step_timer
from torch import Tensor, nn

DEFAULT_OUT = Path(__file__).parent / "results" / "fp8_decoder.json"
EPSILON = 1e-6
FP8 = torch.float8_e4m3fn
GPU_DEFAULTS = {"layers": 4, "hidden": 4096, "intermediate": 14336, "tokens": [256, 1024, 4096]}
CPU_DEFAULTS = {"layers": 2, "hidden": 64, "intermediate": 128, "tokens": [16, 32]}
IR_OPS = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
)
GEMM_MARKERS = ("gemm", "xmma", "cutlass", "nvjet", "scaled_mm", "sm90", "sm100", "cublas")


class FP8Linear(nn.Module):
    """``x_fp8 @ W^T`` by ``torch._scaled_mm``, per-tensor scales, bf16 out."""

    def __init__(self, d_in: int, d_out: int, dtype: torch.dtype) -> None:
        super().__init__()
        w = torch.randn(d_out, d_in) / d_in**0.5
        w_scale = w.abs().max() / 448.0
        self.register_buffer("weight", (w / w_scale).to(FP8))  # (out, in): .t() is column-major
        self.register_buffer("w_scale", w_scale.reshape(1).float())
        self.register_buffer("x_scale", torch.tensor([0.05]))
        self.out_dtype = dtype

    def forward(self, q: Tensor) -> Tensor:
        return torch._scaled_mm(
            q, self.weight.t(), scale_a=self.x_scale, scale_b=self.w_scale,
            out_dtype=self.out_dtype,
        )  # fmt: skip


class Layer(nn.Module):
    def __init__(self, hidden: int, intermediate: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.attn = FP8Linear(hidden, hidden, dtype)
        self.up = FP8Linear(hidden, 2 * intermediate, dtype)
        self.down = FP8Linear(intermediate, hidden, dtype)
        self.mlp_norm = nn.Parameter((1 + 0.1 * torch.randn(hidden)).to(dtype))
        self.next_norm = nn.Parameter((1 + 0.1 * torch.randn(hidden)).to(dtype))


class FP8Decoder(nn.Module):
    """``ops``: a namespace of the five functions (``vllm_ir.ops`` or the native ones)."""

    def __init__(self, layers: int, hidden: int, intermediate: int, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Layer(hidden, intermediate, dtype) for _ in range(layers))
        self.norm = nn.Parameter((1 + 0.1 * torch.randn(hidden)).to(dtype))
        self.ops: Any = None

    def forward(self, x: Tensor) -> Tensor:
        ops = self.ops
        residual = x
        h = ops.rms_norm(x, self.norm, EPSILON)
        for layer in self.layers:
            a = layer.attn(ops.static_scaled_fp8_quant(h, layer.attn.x_scale))
            h, residual = ops.fused_add_rms_norm(a, residual, layer.mlp_norm, EPSILON)
            u = layer.up(ops.static_scaled_fp8_quant(h, layer.up.x_scale))
            g = ops.silu_and_mul(u)
            d = layer.down(ops.static_scaled_fp8_quant(g, layer.down.x_scale))
            h, residual = ops.fused_add_rms_norm(d, residual, layer.next_norm, EPSILON)
        return h


class NativeOps:
    """The ops' native functions: what plain ``torch.compile`` sees."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        import vllm_ir as ir

        return ir.get_op(name).native


def _graph_replay(fn: Callable[[], Tensor]) -> Callable[[], None]:
    """``fn`` captured once in a CUDA graph (after warm-up on a side stream); replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _kernel_us(fn: Callable[[], object], calls: int = 5) -> dict[str, Any]:
    """Device time per forward of the GEMMs and of every other kernel (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    sums = {"matmul_us": 0.0, "other_us": 0.0}
    names: dict[str, float] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = e.device_time / calls if hasattr(e, "device_time") else e.cuda_time / calls
        sums["matmul_us" if is_gemm(e.name) else "other_us"] += us
        names[e.name[:80]] = names.get(e.name[:80], 0.0) + us
    top = sorted(names.items(), key=lambda kv: -kv[1])[:16]
    return {
        **{k: round(v, 2) for k, v in sums.items()},
        "kernels": {k: round(v, 2) for k, v in top},
    }


def is_gemm(kernel: str) -> bool:
    """A GEMM library kernel (cuBLAS, CUTLASS) or an Inductor matmul template.

    Inductor names a pointwise or reduction kernel after every op fused into it
    (``triton_poi_fused__scaled_mm_...``): those are norms and quantization, not GEMMs.
    """
    name = kernel.lower()
    if name.startswith("triton_") and not name.startswith("triton_tem"):
        return False
    return any(m in name for m in GEMM_MARKERS)


Build = tuple[Any, Callable[[nn.Module], Callable[..., Tensor]]]


def _builds(provider: str) -> tuple[dict[str, Build], Any]:
    """Build name -> (the ops the model calls, how to compile it); and vllm-ir's backend."""
    import vllm_ir as ir

    priority = {name: [provider, "native"] for name in IR_OPS}
    backend = ir.VllmIRBackend(priority=priority, passes={"fuse_norm_quant": True})

    def plain(model: nn.Module) -> Callable[..., Tensor]:
        return torch.compile(model, dynamic=True)

    def vllm_ir(model: nn.Module) -> Callable[..., Tensor]:
        return torch.compile(model, backend=backend, dynamic=True)

    return {"inductor": (NativeOps(), plain), "vllm_ir": (ir.ops, vllm_ir)}, backend


def measure(args: argparse.Namespace, device: str, dtype: torch.dtype) -> dict[str, Any]:
    model = FP8Decoder(args.layers, args.hidden, args.intermediate, dtype).to(device).eval()
    builds, backend = _builds(args.provider)
    timer = step_timer(device)
    inputs = {
        t: torch.randn(t, args.hidden, generator=torch.Generator().manual_seed(t)).to(device, dtype)
        for t in args.tokens
    }
    model.ops = NativeOps()
    with torch.no_grad():
        eager = {t: model(x).float() for t, x in inputs.items()}
    rows: list[dict[str, Any]] = []
    for name, (ops, compile_with) in builds.items():
        torch._dynamo.reset()
        model.ops = ops
        compiled = compile_with(model)
        with torch.no_grad():
            for tokens, x in inputs.items():
                t0 = time.perf_counter()
                out = compiled(x).float()
                first_s = time.perf_counter() - t0
                row: dict[str, Any] = {"build": name, "tokens": tokens}
                row["first_call_s"] = round(first_s, 2)
                row["plain_us"] = round(timer(lambda: compiled(x), args.warmup, args.rounds), 2)  # noqa: B023
                if device == "cuda":
                    replay = _graph_replay(lambda: compiled(x))  # noqa: B023
                    row["graph_us"] = round(timer(replay, args.warmup, args.rounds), 2)
                    row.update(_kernel_us(lambda: compiled(x)))  # noqa: B023
                diff = (out - eager[tokens]).abs()
                scale = float(eager[tokens].abs().max())
                row["max_abs_diff_vs_eager"] = float(diff.max())
                row["close_to_eager"] = bool(float(diff.max()) <= 0.1 * max(scale, 1.0))
                rows.append(row)
                print(json.dumps(row), flush=True)
    chosen = backend.lowering_pass.selected_impls
    selected = {op: sorted(set(nodes.values())) for op, nodes in chosen.items()}
    return {"rows": rows, "selected": selected, "ratios": _ratios(rows)}


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per token count: inductor / vllm_ir of each timing (> 1: vllm-ir faster)."""
    by = {(r["build"], r["tokens"]): r for r in rows}
    out = []
    for tokens in sorted({r["tokens"] for r in rows}):
        a, b = by.get(("inductor", tokens)), by.get(("vllm_ir", tokens))
        if a is None or b is None:
            continue
        ratio = {"tokens": tokens}
        for key in ("plain_us", "graph_us", "matmul_us", "other_us"):
            if key in a and key in b and b[key]:
                ratio[key.removesuffix("_us")] = round(a[key] / b[key], 3)
        if "matmul_us" in a and "graph_us" in a and a["graph_us"]:
            ratio["matmul_share_inductor"] = round(a["matmul_us"] / a["graph_us"], 3)
        out.append(ratio)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--provider", default="vllm_c")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--tokens", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    device = resolve_device(args, GPU_DEFAULTS, CPU_DEFAULTS)
    if device == "cpu" and args.provider == "vllm_c":
        args.provider = "native"
    dtype = torch.bfloat16

    name = device_name(device)
    print(f"fp8_decoder on {name}: {args.layers} layers, hidden {args.hidden}, "
          f"intermediate {args.intermediate}, provider {args.provider}")  # fmt: skip
    result = measure(args, device, dtype)
    report = {
        **environment("fp8_decoder", device),
        "model": {
            **model_shape(args),
            "dtype": "bfloat16",
            "provider": args.provider,
        },
        "timing": {
            "graph_us": "forward replayed from a CUDA graph, CUDA events, median",
            "plain_us": "forward called directly, CUDA events (host clock on the CPU), median",
            "kernels": "profiler device time per forward, GEMMs vs the rest",
            "rounds": args.rounds,
            "warmup": args.warmup,
        },
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for r in result["ratios"]:
        print("inductor / vllm_ir:", r)
    print(f"wrote {args.out}")
    if not all(r["close_to_eager"] for r in result["rows"]):
        print("a compiled result is far from eager", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
