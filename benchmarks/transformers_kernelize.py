"""Decode tokens/s of tiny Hugging Face decoders, before and after ``kernelize``, side by side.

Per architecture (``--arch``: Llama, and Gemma with its tanh-GELU MLPs, MQA and
head size 256 as in Gemma-2B), four variants of one randomly initialised
model (float32, batch 1):

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

Also measured: the share of HF eager decode time spent in what kernelize
replaces (norm modules, MLP activations, and ``apply_rotary_pos_emb``), hook-
and wrapper-timed, and the Amdahl bound it sets.

    python benchmarks/transformers_kernelize.py [--arch llama gemma] [--quick] [--out PATH]

The first architecture's result is the file's top level (as before); every
architecture's is under ``by_arch``.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
import vllm_ir as ir
from vllm_ir_transformers import kernelize

OUT = Path(__file__).parent / "results" / "transformers_kernelize.json"
# transformers 5.25 renamed the KV cache argument and output field (the old name warns)
CACHE = (
    "cache"
    if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    else "past_key_values"
)


ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "llama"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "gemma"),
}
"""--arch -> (config class, model class, modeling module under transformers.models)."""


def _build(arch: str, hidden: int, layers: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    common = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        vocab_size=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "gemma":  # Gemma-2B's shape, scaled: MQA, head 256, 8x intermediate
        config = transformers.GemmaConfig(
            **common,
            intermediate_size=hidden * 8,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=256,
        )
        model = transformers.GemmaForCausalLM(config).eval()
        with torch.no_grad():  # Gemma initialises norm weights to zero
            for name, p in model.named_parameters():
                if p.dim() == 1 and "norm" in name:
                    p.normal_(0.0, 0.2)
        return model
    config = transformers.LlamaConfig(
        **common,
        intermediate_size=hidden * 8 // 3 // 32 * 32,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _decode(model: Callable, prompt: torch.Tensor, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds for ``steps`` greedy decode steps after a prefill; the tokens produced."""
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
        cache = getattr(out, CACHE)
        token = out.logits[:, -1:].argmax(-1)
        tokens = [token]
        start = time.perf_counter()
        for _ in range(steps):
            out = model(token, **{CACHE: cache}, use_cache=True)
            cache = getattr(out, CACHE)
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(token)
        elapsed = time.perf_counter() - start
    return elapsed, torch.cat(tokens, dim=1)


def _replaced_share(
    model: torch.nn.Module, names: list[str], prompt: torch.Tensor, steps: int, rope: Any
) -> float:
    """Share of ``model``'s decode time spent inside the modules ``names`` (hook-timed)
    and in the modeling module ``rope``'s ``apply_rotary_pos_emb`` (if given; timed by
    a wrapper put there for the measurement only).

    The most any kernel for them can gain is ``1 / (1 - share)`` (Amdahl).
    """
    spent = [0.0]
    original_rope = getattr(rope, "apply_rotary_pos_emb", None)

    def timed_rope(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original_rope(*args, **kwargs)  # type: ignore[misc]
        finally:
            spent[0] += time.perf_counter() - start

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
    if original_rope is not None:
        rope.apply_rotary_pos_emb = timed_rope
    try:
        _decode(model, prompt, 2)
        spent[0] = 0.0
        elapsed, _ = _decode(model, prompt, steps)
    finally:
        for h in handles:
            h.remove()
        if original_rope is not None:
            rope.apply_rotary_pos_emb = original_rope
    return spent[0] / elapsed


def _ratio(samples: dict[str, list[float]], num: str, den: str) -> float:
    return round(
        statistics.median(a / b for a, b in zip(samples[num], samples[den], strict=True)), 3
    )


def _run(arch: str, args: argparse.Namespace) -> dict[str, Any]:
    """One architecture's variants, timed; its result."""
    hf = _build(arch, args.hidden, args.layers)
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

    # What kernelize can gain at most: the HF time inside the norms, the MLP
    # activations and the RoPE function it replaces (the MLP's projections stay
    # GEMMs of the same size). Without rotary_embedding (before): norms and acts.
    norms = [r.name for r in report.replaced if r.op == "rms_norm"]
    modules = dict(hf.named_modules())
    acts = [
        f"{r.name}.act_fn"
        for r in report.replaced
        if r.op in ("silu_and_mul", "gelu_and_mul") and f"{r.name}.act_fn" in modules
    ]
    modeling = importlib.import_module(f"transformers.models.{ARCHS[arch][2]}.modeling_{arch}")
    has_rope = "rotary_embedding" in report.by_op()
    shares = [
        _replaced_share(hf, norms + acts, prompt, args.steps, modeling if has_rope else None)
        for _ in range(3)
    ]
    share = statistics.median(shares)
    share_before = statistics.median(
        _replaced_share(hf, norms + acts, prompt, args.steps, None) for _ in range(3)
    )

    probe = torch.randn(1, args.hidden)
    eager_impls = {
        "rms_norm": ir.ops.rms_norm.selected_impl(probe, probe[0], 1e-6).provider,
        "fused_add_rms_norm": ir.ops.fused_add_rms_norm.selected_impl(
            probe, probe, probe[0], 1e-6
        ).provider,
        "silu_and_mul": ir.ops.silu_and_mul.selected_impl(torch.randn(1, 64)).provider,
        "gelu_and_mul": ir.ops.gelu_and_mul.selected_impl(torch.randn(1, 64), "tanh").provider,
        "rotary_embedding": ir.ops.rotary_embedding.selected_impl(
            torch.randn(1, 8, 64), torch.randn(1, 1, 64), probe[:, :64], probe[:, :64], True
        ).provider,
    }
    result = {
        "benchmark": "transformers_kernelize",
        "model": {
            "arch": ARCHS[arch][1],
            "config": {
                k: getattr(hf.config, k)
                for k in (
                    "hidden_size",
                    "intermediate_size",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "hidden_act" if arch == "llama" else "hidden_activation",
                )
                if hasattr(hf.config, k)
            },
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
            "what": "hook-timed share of HF eager decode spent in the RMSNorm modules, "
            "MLP activations and apply_rotary_pos_emb calls kernelize replaces; even "
            "zero-cost kernels for them cannot speed decode up by more than the bound",
            "share_without_rope": round(share_before, 3),
            "samples": [round(x, 3) for x in shares],
        },
        "same_greedy_tokens_as_hf_eager": same_tokens,
        "warmup_s (incl. compile)": {k: round(v, 1) for k, v in compile_s.items()},
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", choices=sorted(ARCHS), default=["llama", "gemma"])
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

    results = {}
    for arch in args.arch:
        results[arch] = _run(arch, args)
    result = {**results[args.arch[0]], "by_arch": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    shown = ("decode_tokens_per_s", "ratios", "hf_eager_time_in_replaced_layers", "eager_impls")
    print(json.dumps({k: result[k] for k in shown}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
