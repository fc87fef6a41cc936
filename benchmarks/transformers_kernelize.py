"""Decode tokens/s of a tiny Hugging Face Llama, before and after ``kernelize``, side by side.

Four variants of one randomly initialised ``LlamaForCausalLM`` (float32, batch 1):

* ``hf_eager``            the transformers model as built;
* ``hf_compiled``         ``torch.compile`` of it (Inductor);
* ``kernelized_eager``    after ``vllm_ir_transformers.kernelize`` (eager selection:
                          ``cpu_c`` kernels when vllm-ir-cpu is installed);
* ``kernelized_compiled`` the kernelized model under ``torch.compile(backend="vllm_ir")``.

Each timed sample prefills a prompt, then decodes ``--steps`` tokens one at a time
with the KV cache; tokens/s counts the decode steps only. Samples of the variants
are interleaved (order shuffled every round) so load on the shared machine hits
them alike; the median over rounds is reported. The compiled variants are
compiled with ``dynamic=True`` so the growing cache length does not recompile.

    python benchmarks/transformers_kernelize.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
import vllm_ir as ir
from vllm_ir_transformers import kernelize

OUT = Path(__file__).parent / "results" / "transformers_kernelize.json"


def _build(hidden: int, layers: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 32 * 32,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _decode(model: Callable, prompt: torch.Tensor, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds for ``steps`` greedy decode steps after a prefill; the tokens produced."""
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
        cache = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        tokens = [token]
        start = time.perf_counter()
        for _ in range(steps):
            out = model(token, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(token)
        elapsed = time.perf_counter() - start
    return elapsed, torch.cat(tokens, dim=1)


def _replaced_share(
    model: torch.nn.Module, names: list[str], prompt: torch.Tensor, steps: int
) -> float:
    """Share of ``model``'s decode time spent inside the modules ``names`` (hook-timed).

    The most any kernel for them can gain is ``1 / (1 - share)`` (Amdahl).
    """
    spent = [0.0]
    started: dict[int, float] = {}

    def pre(module: torch.nn.Module, _: object) -> None:
        started[id(module)] = time.perf_counter()

    def post(module: torch.nn.Module, _: object, __: object) -> None:
        spent[0] += time.perf_counter() - started.pop(id(module))

    modules = dict(model.named_modules())
    handles = [
        h
        for n in names
        for h in (modules[n].register_forward_pre_hook(pre), modules[n].register_forward_hook(post))
    ]
    try:
        _decode(model, prompt, 2)
        spent[0] = 0.0
        elapsed, _ = _decode(model, prompt, steps)
    finally:
        for h in handles:
            h.remove()
    return spent[0] / elapsed


def _ratio(samples: dict[str, list[float]], num: str, den: str) -> float:
    return round(
        statistics.median(a / b for a, b in zip(samples[num], samples[den], strict=True)), 3
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 8, 3
    torch.set_num_threads(args.threads)

    hf = _build(args.hidden, args.layers)
    kernelized = copy.deepcopy(hf)
    report = kernelize(kernelized)
    prompt = torch.randint(3, 1024, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    variants: dict[str, Callable] = {
        "hf_eager": hf,
        "hf_compiled": torch.compile(hf, dynamic=True),
        "kernelized_eager": kernelized,
        "kernelized_compiled": torch.compile(kernelized, backend="vllm_ir", dynamic=True),
    }

    compile_s, tokens = {}, {}
    for name, model in variants.items():  # warm-up: kernel builds, compilation
        start = time.perf_counter()
        _decode(model, prompt, 2)
        compile_s[name] = time.perf_counter() - start
        _, tokens[name] = _decode(model, prompt, args.steps)
    same_tokens = {name: bool(torch.equal(t, tokens["hf_eager"])) for name, t in tokens.items()}

    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            elapsed, _ = _decode(variants[name], prompt, args.steps)
            samples[name].append(args.steps / elapsed)
    tps = {name: statistics.median(s) for name, s in samples.items()}

    # What kernelize can gain at most: the HF time inside the norms and the MLP
    # activations it replaces (the MLP's projections stay GEMMs of the same size).
    norms = [r.name for r in report.replaced if r.op == "rms_norm"]
    modules = dict(hf.named_modules())
    acts = [
        f"{r.name}.act_fn"
        for r in report.replaced
        if r.op == "silu_and_mul" and f"{r.name}.act_fn" in modules
    ]
    share = statistics.median(
        _replaced_share(hf, norms + acts, prompt, args.steps) for _ in range(3)
    )

    probe = torch.randn(1, args.hidden)
    eager_impls = {
        "rms_norm": ir.ops.rms_norm.dispatch(probe, probe[0], 1e-6).provider,
        "fused_add_rms_norm": ir.ops.fused_add_rms_norm.dispatch(
            probe, probe, probe[0], 1e-6
        ).provider,
        "silu_and_mul": ir.ops.silu_and_mul.dispatch(torch.randn(1, 64)).provider,
    }
    result = {
        "benchmark": "transformers_kernelize",
        "model": {
            "arch": "LlamaForCausalLM",
            "hidden": args.hidden,
            "layers": args.layers,
            "dtype": "float32",
            "batch": 1,
            "prompt": args.prompt,
            "decode_steps": args.steps,
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
        },
        "kernelize": report.by_op(),
        "eager_impls": eager_impls,
        "rounds": args.rounds,
        "decode_tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "decode_tokens_per_s_samples": {k: [round(x, 1) for x in v] for k, v in samples.items()},
        # median of the per-round ratios: a round's samples are taken back to back,
        # so load that drifts between rounds cancels
        "ratios": {
            "kernelized_eager / hf_eager": _ratio(samples, "kernelized_eager", "hf_eager"),
            "kernelized_compiled / hf_compiled": _ratio(
                samples, "kernelized_compiled", "hf_compiled"
            ),
            "kernelized_compiled / hf_eager": _ratio(samples, "kernelized_compiled", "hf_eager"),
        },
        "hf_eager_time_in_replaced_layers": {
            "share": round(share, 3),
            "amdahl_bound_kernelized_eager / hf_eager": round(1 / (1 - share), 3),
            "what": "hook-timed share of HF eager decode spent in the RMSNorm modules "
            "and MLP activations kernelize replaces; even zero-cost kernels for them "
            "cannot speed decode up by more than the bound",
        },
        "same_greedy_tokens_as_hf_eager": same_tokens,
        "warmup_s (incl. compile)": {k: round(v, 1) for k, v in compile_s.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    shown = ("decode_tokens_per_s", "ratios", "hf_eager_time_in_replaced_layers", "eager_impls")
    print(json.dumps({k: result[k] for k in shown}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
