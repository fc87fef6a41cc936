"""Runs vLLM engines on a tiny model one after another in this process: a JSON line each.

``python engine_worker.py MODEL_DIR RUNS_JSON``: ``RUNS_JSON`` is a list of runs,
each ``{"dtype": "float32"|"bfloat16", "mode": "eager"|"compiled", "impl":
"auto"|"transformers", "plugin": bool}`` and optionally ``"custom_ops"`` (vLLM's
``compilation_config.custom_ops``; compiled runs default to :data:`CUSTOM_OPS`) and
``"tp"`` (the tensor-parallel size).
Each run builds ``vllm.LLM`` with the vllm-ir plugin (``vllm_ir_vllm.register()``)
or not (``unregister()``), generates greedily from fixed token-id prompts and prints
``{"run": ..., "tokens": [[...], ...], "layers": [[class, count, impl], ...],
"rank_layers": [layers of each rank], "calls": {op: n}}`` (``calls``: the ``marker``
provider's calls during the run).
The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the
marker's counts are this process's.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # a test may set "1"
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# 1 GiB of KV cache per engine (vLLM's CPU default is 4): a process builds several, and
# vLLM does not give all of an engine's memory back when it is dropped
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPTS = [[1 + i, 5, 9, 33 + i, 17, 250 - i] for i in range(4)]
TOKENS = 12
CUSTOM_OPS = ["+rms_norm", "+silu_and_mul", "+rotary_embedding"]
"""Compiled runs enable vLLM's custom ops (Inductor's default disables them, and then
vLLM runs its native code, plugin or not)."""


def run_one(model: str, run: dict[str, Any]) -> dict[str, Any]:
    import vllm_ir_marker
    import vllm_ir_vllm
    from vllm import LLM, SamplingParams
    from vllm.distributed import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt

    if run["plugin"]:
        vllm_ir_vllm.register()
    else:
        vllm_ir_vllm.unregister()
    options: dict[str, Any] = {
        "dtype": run["dtype"],
        "enforce_eager": run["mode"] == "eager",
        "model_impl": run.get("impl", "auto"),
        "skip_tokenizer_init": True,
        "max_model_len": 64,
        "max_num_seqs": len(PROMPTS),
        "seed": 0,
        "tensor_parallel_size": run.get("tp", 1),
        # the report by method name, as on a default multiprocess engine
        "worker_extension_cls": "vllm_ir_vllm.report.LayerReportExtension",
    }
    if run["mode"] == "compiled" or "custom_ops" in run:
        options["compilation_config"] = {"custom_ops": run.get("custom_ops", CUSTOM_OPS)}
    before = dict(vllm_ir_marker.CALLS)
    llm = LLM(model, **options)
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params)
    reports = llm.collective_rpc("ir_layer_report")  # one per rank
    calls = {k: n - before.get(k, 0) for k, n in vllm_ir_marker.CALLS.items()}
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    return {
        "run": run,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "layers": reports[0],
        "rank_layers": reports,
        "calls": {k: n for k, n in calls.items() if n},
    }


def main(argv: list[str]) -> int:
    model, runs = argv[1], json.loads(argv[2])
    import vllm.plugins

    vllm.plugins.load_general_plugins()  # once per process; runs then register or unregister
    for run in runs:
        print("ENGINE-RUN " + json.dumps(run_one(model, run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
