"""The vllm-ir command, end to end in subprocesses (as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def vllm_ir(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    result = subprocess.run(
        [sys.executable, "-m", "vllm_ir", *args], capture_output=True, text=True, env=env
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_ops_lists_every_op_and_provider() -> None:
    out = vllm_ir("ops").stdout
    assert "platform: cpu" in out
    rows = [line.split() for line in out.splitlines()]
    assert ["fused_add_rms_norm", "native", "yes", "no", "yes"] in [r[:5] for r in rows]
    assert ["rms_norm", "native", "yes", "no", "yes"] in [r[:5] for r in rows]
    data = json.loads(vllm_ir("ops", "--json").stdout)
    rows = {(r["op"], r["provider"]): r for r in data["impls"]}
    assert rows[("rms_norm", "native")]["batch_invariant"] is True
    assert data["failed_providers"] == {} or isinstance(data["failed_providers"], dict)


def test_explain_shows_sources_decisions_and_choice_per_mode() -> None:
    out = vllm_ir(
        "explain",
        "rms_norm",
        "--dtype",
        "fp32",
        "--shape",
        "4,64",
        "--arg",
        "variance_size=32",
        "--ir-op-priority.rms_norm=native",
    ).stdout
    assert "rms_norm(Tensor(float32, (4, 64), cpu), Tensor(float32, (64,), cpu), 1e-06, 32)" in out
    assert "eager mode" in out
    assert "compiled mode" in out
    assert "1. native  <- user (scoped)" in out
    assert out.count("selected: native") == 2
    only = vllm_ir("explain", "fused_add_rms_norm", "--compiled").stdout
    assert "eager mode" not in only
    assert "compiled mode" in only


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["explain", "no_such_op"], "unknown IR op 'no_such_op'; known ops:"),
        (["explain", "rms_norm", "--dtype", "int3"], "unknown dtype 'int3'"),
        (["explain", "rms_norm", "--shape", "8,x"], "malformed shape '8,x'"),
        (["explain", "rms_norm", "--shape", "0,8"], "every dimension must be positive"),
        (["explain", "rms_norm", "--arg", "nope=1"], "rms_norm has no parameter 'nope'"),
        (["--ir-op-priority.rms_norm=zzz", "ops"], "unknown provider(s) 'zzz' for op 'rms_norm'"),
        (["--ir-op-priority", "{bad", "ops"], "is not valid JSON"),
        (["bench", "rms_norm", "--dtypes", "fp8"], "unknown dtype 'fp8'"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    result = vllm_ir(*args, check=False)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_bench_times_impls_side_by_side(tmp_path: Path) -> None:
    out_file = tmp_path / "bench.json"
    result = vllm_ir(
        "bench",
        "rms_norm",
        "--shapes",
        "1x64 4x64",
        "--dtypes",
        "fp32",
        "--rounds",
        "3",
        "--warmup",
        "1",
        "--no-compiled",
        "--json",
        str(out_file),
    )
    assert "[2/2] 4x64 float32 native" in result.stderr  # progress
    assert "vs native eager" in result.stdout
    data = json.loads(out_file.read_text())
    assert [r["shape"] for r in data["results"]] == [[1, 64], [4, 64]]
    assert all(r["median_us"] > 0 and r["rounds"] == 3 for r in data["results"])


def test_demo_runs_eager_and_compiled() -> None:
    out = vllm_ir("demo", "--layers", "2", "--hidden", "32", "--tokens", "8", "--runs", "2").stdout
    assert "fused_add_rms_norm: priority ['native'] -> native" in out
    assert "fused_add_rms_norm: priority ['native'] -> native (2 nodes)" in out
    assert "maybe_inplace calls functionalized: 2" in out
    assert "max |compiled - all-native|" in out
    assert "tokens/s: eager" in out
