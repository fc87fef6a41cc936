"""The installed ``vllm-ir`` command and the conformance kit, with the example provider."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from vllm_ir.testing import assert_conforms, conformance_cases


def vllm_ir(*args: str) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("vllm-ir")
    assert executable, "the vllm-ir console script is not installed"
    env = {**os.environ, "VLLM_IR_PROVIDERS": "example", "VLLM_IR_PLATFORM": "cpu"}
    result = subprocess.run([executable, *args], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return result


def test_ops_shows_the_example_provider_and_its_package() -> None:
    out = vllm_ir("ops").stdout
    rows = [line.split() for line in out.splitlines()]
    assert ["rms_norm", "example", "yes"] in [r[:3] for r in rows]
    assert "vllm-ir-example-provider 0.1.0" in out
    assert "providers loaded: example (vllm-ir-example-provider 0.1.0)" in out


def test_explain_names_the_platform_default_of_the_package() -> None:
    out = vllm_ir("explain", "rms_norm", "--dtype", "fp32", "--shape", "4,64").stdout
    assert "1. example  <- cpu eager default of vllm-ir-example-provider" in out
    assert "selected: example" in out
    assert "compiled mode" in out


def test_demo_runs_with_the_example_provider() -> None:
    out = vllm_ir("demo", "--layers", "2", "--hidden", "32", "--tokens", "8", "--runs", "2").stdout
    assert "fused_add_rms_norm: priority ['example', 'native'] -> example" in out
    assert "fused_add_rms_norm: priority ['native'] -> native" in out
    assert "the compiled list is not the eager one" in out  # and the demo says why
    assert "max |compiled - all-native|" in out


@pytest.mark.parametrize(
    "case",
    conformance_cases("example", dtypes=(torch.float32, torch.bfloat16)),
    ids=str,
)
def test_example_provider_conforms(case) -> None:  # type: ignore[no-untyped-def]
    with torch._inductor.config.patch(fx_graph_cache=False):
        case.check()


def test_kit_passes_as_one_call() -> None:
    assert_conforms("example", dtypes=(torch.float32,), checks=("correctness", "mutation"))
