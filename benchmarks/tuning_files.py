"""Tuning files: what a size table costs where it guessed, and start-up with a stamped cache.

1. **Held-out sizes.** ``vllm-ir tune --model``'s sweep on the compile benchmark's
   decoder (``TinyDecoder``, as ``autotune.py``) at ``--tokens``: the table it
   writes, run against the best candidate per size — at the measured counts and
   at held-out counts between them (geometric midpoints), each side by side in
   one run (interleaved rounds). Reported per op: the worst ratio of the best
   candidate's step time to the table's (goal >= 0.97 at held-out sizes).
2. **Start-up.** A new process compiles the decoder with ``autotune=True`` and
   runs one step: time from the script's start to the first output, with an
   empty autotune cache (every (op, shape) is measured) and with the stamped
   cache a previous process wrote (same machine and software: every record
   valid), Inductor's caches empty in both. The two kinds of process
   alternate, ``--runs`` each.

    python benchmarks/tuning_files.py [--layers 8] [--hidden 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import vllm_ir as ir
from vllm_ir._cli.model_source import ModelSource
from vllm_ir._cli.tune_model import sweep
from vllm_ir.testing import TinyDecoder

OPS = ("rms_norm", "fused_add_rms_norm")

_FIRST_OUTPUT = """
import time
start = time.perf_counter()
import json, sys, torch, vllm_ir as ir
from vllm_ir.testing import TinyDecoder
hidden, layers, tokens = map(int, sys.argv[1:4])
torch.set_num_threads(1)
model = TinyDecoder(hidden, layers)
backend = ir.VllmIRBackend(autotune=True)
compiled = torch.compile(model, backend=backend)
with torch.no_grad():
    compiled(torch.randn(tokens, hidden))
first = time.perf_counter() - start
records = {id(r): r for c in backend.pass_contexts for r in c.autotuned.values()}
tuning = sum(r.tuning_s for r in records.values())
print(json.dumps({"first_output_s": first, "tuning_s": tuning}))
"""


def held_out(layers: int, hidden: int, tokens: list[int], rounds: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = TinyDecoder(hidden, layers)
    source = ModelSource(
        "TinyDecoder", model, lambda n: (torch.randn(n, hidden),), "IR ops called directly"
    )
    doc = sweep(source, tokens, [16, 256], rounds=rounds, warmup=2, ops=OPS, log=lambda _: None)
    judged = doc["_measurements"]["table_vs_best"]
    per_op = {}
    for op, table in judged.items():
        sizes = table["sizes"]
        held = {n: s["ratio"] for n, s in sizes.items() if s.get("held_out")}
        measured = {n: s["ratio"] for n, s in sizes.items() if not s.get("held_out")}
        per_op[op] = {
            "ratio_at_measured": measured,
            "ratio_at_held_out": held,
            "worst_held_out": min(held.values()) if held else None,
            "worst_measured": min(measured.values()) if measured else None,
        }
    worst = [v["worst_held_out"] for v in per_op.values() if v["worst_held_out"] is not None]
    return {
        "tokens": tokens,
        "held_out_tokens": doc["_measurements"]["held_out"],
        "table": doc["ir_op_priority"],
        "ops": per_op,
        "worst_held_out": min(worst) if worst else None,
        "goal": 0.97,
    }


def _first_output(env: dict[str, str], layers: int, hidden: int, tokens: int) -> dict[str, float]:
    """Seconds to the first output, and of them, seconds spent measuring candidates."""
    argv = [sys.executable, "-c", _FIRST_OUTPUT, str(hidden), str(layers), str(tokens)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def start_up(layers: int, hidden: int, tokens: int, runs: int) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_IR_")}
    with tempfile.TemporaryDirectory() as root:
        # one cache directory for every run: its kernel builds (C++ extensions) are
        # made once, and only its autotune records differ between the two kinds
        cache = Path(root, "cache")
        records_dir = cache / "autotune"
        primed = Path(root, "primed-autotune")

        def run(kind: str, index: int) -> dict[str, float]:
            shutil.rmtree(records_dir, ignore_errors=True)
            if kind == "stamped_cache":
                shutil.copytree(primed, records_dir)
            inductor = str(Path(root, f"inductor-{kind}-{index}"))  # empty for every run
            env = {**base, "VLLM_IR_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": inductor}
            return _first_output(env, layers, hidden, tokens)

        run("empty_cache", -1)  # builds the kernels and writes the records
        shutil.copytree(records_dir, primed)
        records = sum(len(json.loads(p.read_text())["entries"]) for p in primed.glob("*.json"))
        samples: dict[str, list[dict[str, float]]] = {"empty_cache": [], "stamped_cache": []}
        for i in range(runs):
            for kind in samples:
                samples[kind].append(run(kind, i))

    def median(kind: str, key: str) -> float:
        return round(statistics.median(s[key] for s in samples[kind]), 3)

    first = {k: median(k, "first_output_s") for k in samples}
    return {
        "tokens": tokens,
        "autotune_records": records,
        "first_output_s": {
            k: [round(s["first_output_s"], 3) for s in v] for k, v in samples.items()
        },
        "tuning_s": {k: [round(s["tuning_s"], 3) for s in v] for k, v in samples.items()},
        "median_s": first,
        "median_tuning_s": {k: median(k, "tuning_s") for k in samples},
        "stamped_over_empty": round(first["stamped_cache"] / first["empty_cache"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tokens", default="1,16,256,1024")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tuning_files.json"))
    parser.add_argument("--skip-held-out", action="store_true", help="only the start-up part")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = [int(t) for t in args.tokens.split(",")]
    result = {
        "benchmark": "tuning_files",
        "torch": torch.__version__,
        "vllm_ir": ir.__version__,
        "machine": platform.machine(),
        "threads": 1,
        "layers": args.layers,
        "hidden": args.hidden,
        "providers": {op: sorted(ir.get_op(op).impls) for op in OPS},
        "held_out": (
            json.loads(args.out.read_text())["held_out"]  # the last run's
            if args.skip_held_out and args.out.exists()
            else held_out(args.layers, args.hidden, tokens, args.rounds)
        ),
        "start_up": start_up(args.layers, args.hidden, 64, args.runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    h, s = result["held_out"], result["start_up"]
    print(
        f"held-out sizes {h['held_out_tokens']}: worst table/best {h['worst_held_out']} (goal 0.97)"
    )
    print(
        f"first output: empty autotune cache {s['median_s']['empty_cache']} s, stamped cache "
        f"{s['median_s']['stamped_cache']} s ({s['autotune_records']} records; measuring them: "
        f"{s['median_tuning_s']['empty_cache']} s vs {s['median_tuning_s']['stamped_cache']} s)"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
