"""``vllm-ir demo``: a small decoder built from IR ops, eager and compiled.

Random weights, no downloads. Prints the impl selected per op (eager
selection and the compiled graph's lowering), the largest difference against
an all-native run, the clones the compiler removed, and tokens/s.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from vllm_ir._base.platform import current_platform
from vllm_ir._cli.args import allocating, apply_threads, check_fits
from vllm_ir._cli.bench import NOISY, is_noisy, spread
from vllm_ir._discovery.providers import load_errors, loaded_providers
from vllm_ir.config import IrOpPriorityConfig
from vllm_ir.ops import fused_add_rms_norm, rms_norm

__all__ = ["TinyDecoder", "run"]


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden))

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # h and residual are donated: neither is read after this call
        return fused_add_rms_norm.maybe_inplace(self.proj(h), residual, self.norm, 1e-6)


class TinyDecoder(torch.nn.Module):
    """``rms_norm``, then per layer a projection and ``fused_add_rms_norm.maybe_inplace``."""

    def __init__(self, hidden: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.input_norm = torch.nn.Parameter(torch.ones(hidden))
        self.layers = torch.nn.ModuleList(DecoderLayer(hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        h = rms_norm(x, self.input_norm, 1e-6)
        for layer in self.layers:
            h, residual = layer(h, residual)
        return h


def _tokens_per_s(fn: object, x: torch.Tensor, warmup: int, runs: int) -> list[float]:
    """Tokens/s of each of ``runs`` timed forward passes, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn(x.clone())  # type: ignore[operator]
    rates = []
    for _ in range(runs):
        inp = x.clone()  # the model donates its input: a fresh copy per pass, not timed
        start = time.perf_counter()
        fn(inp)  # type: ignore[operator]
        rates.append(x.shape[0] / (time.perf_counter() - start))
    return rates


def _rate_line(rates: list[float]) -> tuple[str, bool]:
    median, p10, p90 = spread(rates)
    return f"{median:,.0f} (p10-p90 {p10:,.0f}-{p90:,.0f})", is_noisy(median, p10, p90)


def run(args: argparse.Namespace) -> int:
    from vllm_ir.compilation import VllmIRBackend
    from vllm_ir.testing import inductor_caches_off

    torch.manual_seed(0)
    what = f"a {args.layers}-layer decoder of hidden size {args.hidden} for {args.tokens} tokens"
    fix = "give a smaller --hidden, --layers or --tokens"
    # the weights, and a few activations alive at once (input, residual, clones)
    numel = args.layers * args.hidden * (args.hidden + 2) + 8 * args.tokens * args.hidden
    check_fits(what, numel, torch.float32, "cpu", fix)
    with allocating(what, fix):
        model = TinyDecoder(args.hidden, args.layers).eval()
        x = torch.randn(args.tokens, args.hidden)
    ops = [rms_norm, fused_add_rms_norm]
    print(f"vllm-ir demo: {args.layers}-layer decoder, hidden {args.hidden}, {args.tokens} tokens")
    print(f"platform {current_platform()}, torch {torch.__version__}")
    print(apply_threads(args.threads))
    for name, provider in sorted(loaded_providers().items()):
        print(f"  provider {name}: {provider.package}")
    for name, error in sorted(load_errors().items()):
        print(f"  provider {name} failed to load: {error.cause}")
    with torch.inference_mode():
        probe = {
            "rms_norm": (x, model.input_norm, 1e-6),
            "fused_add_rms_norm": (x, x, model.input_norm, 1e-6),
        }
        print("\neager:")
        for op in ops:
            chosen = op.selected_impl(*probe[op.name]).provider
            print(f"  {op.name}: priority {op.get_priority('eager')} -> {chosen}")
        eager = model(x.clone())
        with IrOpPriorityConfig(**{op.name: ["native"] for op in ops}).scope():
            reference = model(x.clone())
        eager_tps = _tokens_per_s(model, x, args.warmup, args.runs)

    backend = VllmIRBackend(passes=args.passes)
    compiled = torch.compile(model, backend=backend)
    print("\ncompiled (torch.compile, backend vllm_ir):")
    # caches off, so the passes run and report what they did every time
    sys.stdout.flush()
    print(
        "compiling with the vllm_ir backend; in a fresh environment Inductor first builds "
        "its C++ kernels, which may take a minute ...",
        file=sys.stderr,
        flush=True,
    )
    with torch.inference_mode(), inductor_caches_off():
        start = time.perf_counter()
        out = compiled(x.clone())
        compile_s = time.perf_counter() - start
        compiled_tps = _tokens_per_s(compiled, x, args.warmup, args.runs)
    for op_name, nodes in backend.lowering_pass.selected_impls.items():
        chosen = ", ".join(sorted(set(nodes.values())))
        priority = ir_priority(op_name)
        print(f"  {op_name}: priority {priority} -> {chosen} ({len(nodes)} nodes)")
    differ = [op.name for op in ops if op.get_priority("eager") != op.get_priority("compiled")]
    if differ:
        print(
            f"  ({', '.join(differ)}: the compiled list is not the eager one: a platform's "
            "defaults choose per mode, often native under torch.compile, where Inductor "
            "fuses it with its neighbours; --ir-op-priority sets one list for both)"
        )
    ctx = backend.pass_contexts[0]
    print(
        f"  maybe_inplace calls functionalized: {ctx.functionalized}; "
        f"clones inserted {ctx.clones_inserted}, removed {ctx.clones_removed}"
    )
    fusions = ", ".join(f"{k} applied {ctx.fusions.get(k, 0)}x" for k in args.passes.enabled())
    print(f"  IR passes: {fusions or 'none enabled'}")
    print(f"  compile time: {compile_s:.1f} s")
    print("\nresults:")
    print(f"  max |eager - all-native|    = {(eager - reference).abs().max().item():.3e}")
    print(f"  max |compiled - all-native| = {(out - reference).abs().max().item():.3e}")
    eager_line, eager_noisy = _rate_line(eager_tps)
    compiled_line, compiled_noisy = _rate_line(compiled_tps)
    print(f"  tokens/s, median of {args.runs} passes after {args.warmup} warm-up:")
    print(f"    eager    {eager_line}")
    print(f"    compiled {compiled_line}")
    if eager_noisy or compiled_noisy:
        fewer = ", --threads 1" if torch.get_num_threads() != 1 else ""
        print(
            f"  the spread (p90 - p10) is over {NOISY:.0%} of the median: too large to trust; "
            f"the machine is busy or the passes too few. Rerun with more --runs{fewer}, "
            "or on an idle machine."
        )
    return 0


def ir_priority(op_name: str) -> list[str]:
    from vllm_ir._op.op import get_op

    return get_op(op_name).get_priority("compiled")
