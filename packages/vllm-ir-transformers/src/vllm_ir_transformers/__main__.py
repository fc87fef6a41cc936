"""``python -m vllm_ir_transformers demo``: a tiny random Llama, kernelized, eager and compiled.

No downloads: the model is built from a ``LlamaConfig``. Prints the kernelize
report, the impl each op selects in eager mode and in the compiled graph, the
largest logit difference to the unmodified model, and greedy tokens.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Sequence

import torch
import vllm_ir as ir

from vllm_ir_transformers import kernelize
from vllm_ir_transformers.tiny import tiny_config


def demo(args: argparse.Namespace) -> int:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**tiny_config(args.hidden, args.layers, vocab=256))
    reference = transformers.LlamaForCausalLM(config).eval()
    model = copy.deepcopy(reference)
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    print(f"tiny Llama: hidden {args.hidden}, {args.layers} layers (random weights)")
    report = kernelize(model)
    print(report)
    with torch.inference_mode():
        want = reference(ids).logits
        got = model(ids).logits
        hidden = torch.randn(1, args.hidden)
        weight = model.model.norm.weight
        print("\neager selection:")
        for name, call in (
            ("rms_norm", (hidden, weight, 1e-6)),
            ("fused_add_rms_norm", (hidden, hidden, weight, 1e-6)),
            ("silu_and_mul", (torch.randn(1, 2 * args.hidden),)),
        ):
            op = getattr(ir.ops, name)
            print(f"  {name}: priority {op.get_priority()} -> {op.selected_impl(*call).provider}")
        print(f"  max |logits - unmodified| = {(got - want).abs().max().item():.3e}")
        want_tokens = reference.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
        got_tokens = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
        print(f"  greedy tokens equal: {torch.equal(want_tokens, got_tokens)}")

    if args.eager_only:
        return 0
    from vllm_ir.compilation import VllmIRBackend

    backend = VllmIRBackend()
    compiled = torch.compile(model, backend=backend)
    print('\ncompiled (torch.compile, backend="vllm_ir"):')
    with torch.inference_mode():
        start = time.perf_counter()
        out = compiled(ids).logits
        print(f"  compile + first call: {time.perf_counter() - start:.1f} s")
    for name, nodes in sorted(backend.lowering_pass.selected_impls.items()):
        chosen = ", ".join(sorted(set(nodes.values())))
        print(f"  {name}: {len(nodes)} nodes -> {chosen}")
    print(f"  max |logits - unmodified| = {(out - want).abs().max().item():.3e}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_ir_transformers")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="kernelize a tiny random Llama; run it eager and compiled")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=5)
    p.add_argument("--eager-only", action="store_true", help="skip the torch.compile part")
    p.set_defaults(func=demo)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
