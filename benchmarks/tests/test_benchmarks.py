"""CPU smoke tests of the GPU benchmarks' code paths (tiny sizes, native and CPU impls):
``pytest benchmarks/tests``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _gpu_bench as bench
import compiled_priorities


class _Event:
    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3


_CPU_BACKEND = SimpleNamespace(
    Event=_Event,
    synchronize=lambda: None,
    get_device_properties=lambda i: SimpleNamespace(L2_cache_size=1 << 20),
    get_device_name=lambda i: "CPU stand-in",
)


def test_gpu_bench_measures_every_op_against_native_and_a_copy(tmp_path: Path) -> None:
    import vllm_ir as ir

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser, default_dtypes=("float32",))
    args = parser.parse_args(
        ["--hidden", "64", "--tokens", "1", "32", "--rounds", "1", "--warmup", "0", "--no-compiled"]
    )
    args.out = tmp_path / "out.json"

    def variants(op: str) -> dict[str, Any]:
        return {"native": ir.get_op(op).native}

    rows = bench.measure(args, "cpu", _CPU_BACKEND, variants, lambda label: True)  # type: ignore[arg-type]
    assert {r["op"] for r in rows} == set(bench.OPS)
    for r in rows:
        assert r["within_tolerance"] is True, r
        assert r["max_abs_err"] == 0.0, r
        assert r["time_us"] > 0
        assert r["copy_gbps"] > 0
        assert r["pct_of_copy"] > 0
        assert ("host_us" in r) == (r["tokens"] <= bench.HOST_TOKENS)
        assert r["bytes"] == bench.bytes_moved(r["op"], r["tokens"], 64, 4)
    assert bench.report("gpu_kernels", args, "cpu", _CPU_BACKEND, rows, {}) == 0  # type: ignore[arg-type]
    assert json.loads(args.out.read_text())["results"] == rows


def test_accuracy_flags_a_wrong_result() -> None:
    x = torch.randn(4, 64)
    scale = torch.tensor([0.02])
    wrong = bench.accuracy(
        "static_scaled_fp8_quant", lambda x, s: (2 * x / s).to(torch.float8_e4m3fn), (x, scale)
    )
    assert wrong["within_tolerance"] is False


def test_bytes_and_slug() -> None:
    assert bench.bytes_moved("rms_norm", 4096, 4096, 2) == 2 * 4096 * 4096 * 2 + 4096 * 2
    assert bench.device_slug("NVIDIA H200") == "nvidia-h200"


@pytest.mark.usefixtures("tmp_path")
def test_compiled_priorities_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "cp.json"
    argv = ["--out", str(out), "--device", "cpu", "--layers", "1", "--hidden", "32"]
    argv += ["--intermediate", "64", "--tokens", "2", "--rounds", "1", "--warmup", "0"]
    assert compiled_priorities.main(argv) == 0
    report = json.loads(out.read_text())
    by_name = {r["candidate"]: r for r in report["results"]}
    assert "native" in by_name
    for name, r in by_name.items():
        assert r["time_us"] > 0
        assert r["inductor_kernels"] >= 1
        assert r["close_to_eager"]
        for op, providers in r["selected"].items():
            assert providers == [name], (op, providers)


def test_cpu_timer_rows_and_reports(tmp_path: Path) -> None:
    """The shared CPU-benchmark helpers (benchmarks/_round_robin.py) that cpu_kernels,
    compiled_native and vllm-ir-cpu's quant_kernels build their rows and reports from."""
    import _round_robin as rr

    x = torch.randn(64, 64)
    row = rr.kernel_vs_native(torch.relu, torch.relu, torch.relu, (x,), rounds=2)
    assert set(row["median_us"]) == {"cpu_c", "native", "native_compiled"}
    assert row["native_over_cpu_c"] > 0
    assert row["compiled_over_cpu_c"] > 0
    assert "cpu_c" in rr.kernel_line("relu 64x64", row)
    model = rr.timing_row(
        rr.time_on_copies({"native": torch.relu, "cpu_c": torch.relu}, x, rounds=2),
        ("native_over_cpu_c", "native", "cpu_c"),
        dtype="fp32",
        tokens=64,
    )
    assert list(model) == ["dtype", "tokens", "median_us", "native_over_cpu_c"]
    assert set(model["median_us"]) == {"native", "cpu_c"}
    assert rr.timing_row({"a": 2.0, "b": 1.0}, ("a_over_b", "a", "b"))["a_over_b"] == 2.0
    assert rr.model_line("fp32 64x64", model).startswith("model fp32 64x64  native ")
    facts = rr.run_facts([0.0, 0.0, 0.0], rounds=2, elapsed=1.04)
    assert facts["seconds"] == 1.0
    assert facts["clock"] in ("thread_time", "perf_counter")
    out = tmp_path / "report.json"
    rr.write_report({"a": 1, "summary": {"b": 2}}, out, {"b": 2}, 1.0)
    assert json.loads(out.read_text()) == {"a": 1, "summary": {"b": 2}}


def test_quant_kernels_loads_the_shared_timer() -> None:
    # it loaded a timer that cpu_kernels.py no longer defines (AttributeError at import)
    import importlib.util

    pytest.importorskip("vllm_ir_cpu")
    path = Path(__file__).resolve().parents[2] / "packages/vllm-ir-cpu/benchmarks/quant_kernels.py"
    spec = importlib.util.spec_from_file_location("quant_kernels", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.timer.kernel_vs_native)
