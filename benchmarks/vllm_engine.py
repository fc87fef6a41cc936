"""vLLM's CPU engine with the vllm-ir plugin off and on: output tokens per second.

Settings, compared side by side in each process:

* ``off``: vLLM alone (an engine built while the plugin is unregistered);
* ``off_native_rope``: vLLM alone with its RoPE layer on ``forward_native``
  (``custom_ops=["all", "-rotary_embedding"]``): every layer the plugin
  replaces then runs torch ops, as with ``native`` first (vLLM 0.32's CPU
  engine runs its norms and ``SiluAndMul`` as torch ops already; its RoPE is
  a C++ kernel). ``native`` against this setting is the plugin's own cost;
* ``native``: the plugin, every op it calls with ``native`` first;
* ``cpu_c``: the plugin, ``cpu_c`` first (the CPU platform's eager default).

Each process (``--processes``, fresh engines each) builds a tiny Llama-shaped
model's engine three times: with the plugin, without it, and without it with
vLLM's native RoPE (the order rotates from process to process: on this
machine an engine built later ran its matmuls 5-7 % faster, whichever it
was), and then runs ``--rounds`` rounds: one timed ``generate`` of
``--prompts`` prompts x ``--tokens`` new tokens (greedy, eager mode) per
setting, in an order that alternates round by round, so that load on the
machine hits every setting alike. ``native`` and ``cpu_c`` share the
plugin's engine: only the op priorities differ (``IrOp.set_priority`` around
the call). Reported per dtype:

* ``tokens_per_s``: each setting's median over all rounds, its ratio to
  ``off``'s median, and ``paired``: per process the median of each round's
  ratio to the same round's ``off``, then the geometric mean over processes
  (steadier on a shared machine; with a multiple of three processes every
  engine is built first, second and third equally often);
* ``layers``: per replaced layer class, its calls and milliseconds per
  ``generate`` and microseconds per call, from one extra ``generate`` per
  setting with forward hooks on those layers only (the hooks' own cost is in
  every setting alike).

Needs the ``vllm_engine`` session's environment (vLLM's CPU engine, the
project's wheels); without vLLM it says so and exits 0, writing nothing
(``nox -s bench`` runs every script).

    python benchmarks/vllm_engine.py [--processes 6] [--rounds 6] \\
        [--out benchmarks/results/vllm_engine.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENGINES: dict[str, list[str] | None] = {
    "on": None,
    "off": None,
    "off_native_rope": ["all", "-rotary_embedding"],
}
"""Engine -> its ``custom_ops`` (None: vLLM's default); only ``on`` has the plugin."""
SETTINGS: dict[str, tuple[str, list[str] | None]] = {
    "off": ("off", None),
    "off_native_rope": ("off_native_rope", None),
    "native": ("on", ["native"]),
    "cpu_c": ("on", ["cpu_c", "native"]),
}
"""Setting -> (its engine, the priority of every op the plugin calls)."""
LAYERS = ("RMSNorm", "SiluAndMul", "RotaryEmbedding")
"""The layer classes timed (vLLM's, or the plugin's ``Ir``-prefixed replacements)."""


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


@contextlib.contextmanager
def _priority(names: list[str] | None) -> Iterator[None]:
    import vllm_ir as ir
    from vllm_ir_vllm import OPS

    with contextlib.ExitStack() as stack:
        for op in OPS if names else ():
            stack.enter_context(getattr(ir.ops, op).set_priority(names))
        yield


def _hook_layers(model: Any, times: dict[str, list[float]]) -> list[Any]:
    """Forward hooks timing every layer of ``LAYERS``; returns their handles."""
    handles: list[Any] = []
    for module in model.modules():
        name = type(module).__name__.removeprefix("Ir")
        if name not in LAYERS:
            continue
        started: list[float] = []

        def pre(mod: Any, args: Any, started: list[float] = started) -> None:
            started.append(time.perf_counter())

        def post(
            mod: Any, args: Any, out: Any, started: list[float] = started, name: str = name
        ) -> None:
            times[name].append(time.perf_counter() - started.pop())

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


def measure(model: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """One process: the three engines, ``args.rounds`` alternating rounds, one hooked round."""
    import vllm_ir_vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.model_executor.layers import rotary_embedding
    from vllm.plugins import load_general_plugins

    def engine(name: str) -> Any:
        if name == "on":
            vllm_ir_vllm.register()
        else:
            vllm_ir_vllm.unregister()
        # vLLM hands a model the RoPE module an earlier one built with the same
        # arguments, its custom-op choice included: each engine builds its own
        rotary_embedding._ROPE_DICT.clear()
        custom_ops = ENGINES[name]
        return LLM(
            model,
            dtype=dtype,
            enforce_eager=True,
            skip_tokenizer_init=True,
            seed=0,
            max_model_len=256,
            max_num_seqs=args.prompts,
            **({} if custom_ops is None else {"compilation_config": {"custom_ops": custom_ops}}),
        )

    load_general_plugins()  # the plugin's vllm.general_plugins entry point, as vLLM runs it
    order = list(ENGINES)[args.rotate :] + list(ENGINES)[: args.rotate]
    built = {name: engine(name) for name in order}
    engines = {name: built[engine_name] for name, (engine_name, _) in SETTINGS.items()}
    batch = [
        TokensPrompt(prompt_token_ids=[(7 * i + j) % 2000 + 1 for j in range(16)])
        for i in range(args.prompts)
    ]
    params = SamplingParams(
        max_tokens=args.tokens, temperature=0.0, ignore_eos=True, detokenize=False
    )

    def generate(name: str) -> float:
        with _priority(SETTINGS[name][1]):
            start = time.perf_counter()
            outputs = engines[name].generate(batch, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
        return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed

    for name in SETTINGS:  # warm-up: first calls build kernels, select, fill caches
        generate(name)
    rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        order = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
        for name in order:
            rates[name].append(generate(name))
    layers: dict[str, dict[str, list[float]]] = {}
    for name in SETTINGS:
        times: dict[str, list[float]] = defaultdict(list)
        handles = engines[name].apply_model(lambda m, times=times: _hook_layers(m, times))[0]
        generate(name)
        for h in handles:
            h.remove()
        layers[name] = dict(times)
    return {"rates": rates, "layers": layers}


def _paired(results: list[dict[str, Any]], name: str) -> float:
    """``name``'s speed relative to ``off``: per process, the median of each round's
    ratio; then their geometric mean, in which every build position counts alike."""
    per_process = [
        statistics.median(a / b for a, b in zip(r["rates"][name], r["rates"]["off"], strict=True))
        for r in results
    ]
    return statistics.geometric_mean(per_process)


def _layer_table(samples: list[dict[str, list[float]]]) -> dict[str, Any]:
    """Per layer class: calls and ms per generate, µs per call (medians over processes)."""
    table = {}
    for name in LAYERS:
        per_process = [s[name] for s in samples if name in s]
        if not per_process:
            continue
        ms = statistics.median(sum(t) * 1e3 for t in per_process)
        calls = statistics.median(len(t) for t in per_process)
        table[name] = {
            "calls": calls,
            "ms_per_generate": ms,
            "us_per_call": ms * 1e3 / calls,
        }
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--rotate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("vllm_engine: vLLM is not installed (nox -s vllm_engine's venv has it): skipped")
        return 0
    if args.one:  # a child: one process's engines and rounds
        print("RESULT " + json.dumps(measure(args.one[0], args.one[1], args)))
        return 0
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine runs in the child's own thread
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    env = {k: v for k, v in env.items() if not k.startswith("VLLM_IR_PRIORITY")}
    env.pop("VLLM_PLUGINS", None)
    report: dict[str, Any] = {
        "benchmark": "vllm_engine",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "model": {
            "hidden": args.hidden,
            "layers": args.layers,
            "prompts": args.prompts,
            "new_tokens": args.tokens,
        },
        "processes": args.processes,
        "rounds_per_process": args.rounds,
        "tokens_per_s": {},
        "layers": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        make_model(model, args.hidden, args.layers)
        for dtype in args.dtypes.split(","):
            results = []
            for p in range(args.processes):
                child = [sys.executable, __file__, "--one", str(model), dtype]
                child += ["--rotate", str(p % len(ENGINES))]
                for flag in ("prompts", "tokens", "rounds"):
                    child += [f"--{flag}", str(getattr(args, flag))]
                done = subprocess.run(child, env=env, capture_output=True, text=True, check=False)
                line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                if done.returncode != 0 or not line:
                    sys.exit(f"{dtype}: {done.stderr[-2000:]}")
                results.append(json.loads(line[0].removeprefix("RESULT ")))
                print(
                    dtype, {k: round(statistics.median(v)) for k, v in results[-1]["rates"].items()}
                )
            rates = {name: [x for r in results for x in r["rates"][name]] for name in SETTINGS}
            off = statistics.median(rates["off"])
            report["tokens_per_s"][dtype] = {
                name: {
                    "median": statistics.median(v),
                    "vs_off": statistics.median(v) / off,
                    "paired_vs_off": _paired(results, name),
                    "samples": v,
                }
                for name, v in rates.items()
            }
            report["layers"][dtype] = {
                name: _layer_table([r["layers"][name] for r in results]) for name in SETTINGS
            }
    print(json.dumps({k: report[k] for k in ("tokens_per_s", "layers")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
