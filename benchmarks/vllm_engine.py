"""vLLM's CPU engine with the vllm-ir plugin off and on: output tokens per second.

Settings, each in its own process (a fresh engine: vLLM builds a model's layers
once), alternating round by round so that other load hits every setting alike:

* ``off``: vLLM alone (``VLLM_PLUGINS=``);
* ``native``: the plugin, every op it calls with ``native`` first;
* ``cpu_c``: the plugin, ``cpu_c`` first (the CPU platform's eager default).

Per process: a tiny Llama-shaped model of random weights (made once, ``--hidden``,
``--layers``), ``vllm.LLM`` in eager mode, one untimed ``generate``, then
``--repeats`` timed ones of ``--prompts`` prompts x ``--tokens`` new tokens
(greedy); the median output tokens/s. Reported per dtype: each setting's median
over rounds and its ratio to ``off``. Needs the ``vllm_engine`` session's
environment (vLLM's CPU engine, the project's wheels); without vLLM it says so
and exits 0, writing nothing (``nox -s bench`` runs every script).

    python benchmarks/vllm_engine.py [--rounds 2] [--out benchmarks/results/vllm_engine.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OPS = ("vllm_rms_norm", "vllm_fused_add_rms_norm", "silu_and_mul", "rotary_embedding")
SETTINGS: dict[str, dict[str, str]] = {
    "off": {"VLLM_PLUGINS": ""},
    "native": {f"VLLM_IR_PRIORITY_{op.upper()}": "native" for op in OPS},
    "cpu_c": {f"VLLM_IR_PRIORITY_{op.upper()}": "cpu_c,native" for op in OPS},
}


def make_model(path: Path, hidden: int, layers: int) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=2048,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        max_position_embeddings=512,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(path)


def measure(model: str, dtype: str, prompts: int, tokens: int, repeats: int) -> float:
    """Output tokens/s of this process's engine: the median of ``repeats`` generates."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model,
        dtype=dtype,
        enforce_eager=True,
        skip_tokenizer_init=True,
        seed=0,
        max_model_len=256,
        max_num_seqs=prompts,
    )
    batch = [
        TokensPrompt(prompt_token_ids=[(7 * i + j) % 2000 + 1 for j in range(16)])
        for i in range(prompts)
    ]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate(batch, params, use_tqdm=False)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
    return statistics.median(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("vllm_engine: vLLM is not installed (nox -s vllm_engine's venv has it): skipped")
        return 0
    if args.one:  # a child: one engine, one number
        rate = measure(args.one[0], args.one[1], args.prompts, args.tokens, args.repeats)
        print(f"TOKENS-PER-S {rate}")
        return 0
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    env = {k: v for k, v in env.items() if not k.startswith("VLLM_IR_PRIORITY")}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        make_model(model, args.hidden, args.layers)
        samples: dict[str, dict[str, list[float]]] = {}
        for dtype in args.dtypes.split(","):
            samples[dtype] = {name: [] for name in SETTINGS}
            for r in range(args.rounds):
                order = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
                for name in order:
                    child = [
                        sys.executable,
                        __file__,
                        "--one",
                        str(model),
                        dtype,
                        "--prompts",
                        str(args.prompts),
                        "--tokens",
                        str(args.tokens),
                        "--repeats",
                        str(args.repeats),
                    ]
                    done = subprocess.run(
                        child,
                        env={**env, **SETTINGS[name]},
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    rate = [ln for ln in done.stdout.splitlines() if ln.startswith("TOKENS-PER-S")]
                    if done.returncode != 0 or not rate:
                        sys.exit(f"{name} {dtype}: {done.stderr[-2000:]}")
                    samples[dtype][name].append(float(rate[0].split()[1]))
                    print(dtype, name, samples[dtype][name][-1], flush=True)
    report: dict[str, Any] = {
        "benchmark": "vllm_engine",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "model": {
            "hidden": args.hidden,
            "layers": args.layers,
            "prompts": args.prompts,
            "new_tokens": args.tokens,
        },
        "rounds": args.rounds,
        "tokens_per_s": {},
    }
    for dtype, by_setting in samples.items():
        off = statistics.median(by_setting["off"])
        report["tokens_per_s"][dtype] = {
            name: {
                "median": statistics.median(v),
                "samples": v,
                "vs_off": statistics.median(v) / off,
            }
            for name, v in by_setting.items()
        }
    print(json.dumps(report["tokens_per_s"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
