"""A small decoder built from IR ops, run in eager mode: which impl ran, and is it right?

Until the ``vllm-ir demo`` command exists this script is the main job. It
builds a 4-layer model from ``rms_norm`` and ``fused_add_rms_norm.maybe_inplace``
with random weights (no downloads), runs it under the effective priorities
(``--ir-op-priority.OP=a,b`` flags are accepted), and prints the selected impl
per op, the max difference against an all-native run, and tokens/s.

    python examples/demo.py [--ir-op-priority.rms_norm=native] [--tokens 64]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import vllm_ir as ir


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden))

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # maybe_inplace: h and residual are donated and never read again
        return ir.ops.fused_add_rms_norm.maybe_inplace(self.proj(h), residual, self.norm, 1e-6)


class TinyDecoder(torch.nn.Module):
    def __init__(self, hidden: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.input_norm = torch.nn.Parameter(torch.ones(hidden))
        self.layers = torch.nn.ModuleList(DecoderLayer(hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        h = ir.ops.rms_norm(x, self.input_norm, 1e-6)
        for layer in self.layers:
            h, residual = layer(h, residual)
        return h


def main(argv: list[str]) -> int:
    try:
        config, rest = ir.parse_ir_op_priority_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args(rest)

    torch.manual_seed(0)
    model = TinyDecoder(args.hidden).eval()
    x = torch.randn(args.tokens, args.hidden)
    ops = [ir.ops.rms_norm, ir.ops.fused_add_rms_norm]
    with torch.inference_mode(), config.scope():
        print(f"vllm-ir {ir.__version__} on {ir.current_platform()}, torch {torch.__version__}")
        for name, provider in sorted(ir.loaded_providers().items()):
            print(f"  provider {name}: {provider.package}")
        for name, error in sorted(ir.load_errors().items()):
            print(f"  provider {name} failed to load: {error.cause}")
        probe = torch.randn(args.tokens, args.hidden)
        samples = {
            "rms_norm": (probe, model.input_norm, 1e-6),
            "fused_add_rms_norm": (probe, probe, model.input_norm, 1e-6),
        }
        for op in ops:
            chosen = op.dispatch(*samples[op.name]).provider
            print(f"  {op.name}: priority {op.get_priority()} -> selected {chosen!r}")
        out = model(x.clone())
        with ir.IrOpPriorityConfig(**{op.name: ["native"] for op in ops}).scope():
            reference = model(x.clone())
        diff = (out - reference).abs().max().item()
        print(f"  max |output - all-native output| = {diff:.3e}")
        runs = 20
        start = time.perf_counter()
        for _ in range(runs):
            model(x.clone())
        elapsed = time.perf_counter() - start
        print(f"  eager: {runs * args.tokens / elapsed:,.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
