"""An out-of-tree platform installed as a wheel: ``vllm-ir-nova-platform`` (device: the CPU).

Subprocess tests: each starts discovery afresh with its own ``VLLM_*``
variables (the in-process tests pin ``VLLM_IR_PLATFORM=cpu``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

NOVA_PACKAGE = "vllm-ir-nova-platform 0.1.0"


def run(args: list[str], *, code: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    command = [sys.executable, "-c", args[0]] if code else [sys.executable, "-m", "vllm_ir", *args]
    return subprocess.run(
        command, env={**base, **env}, capture_output=True, text=True, timeout=180, check=False
    )


def test_detected_platform_applies_its_defaults_and_shows_in_the_cli() -> None:
    ops = run(["ops", "--json"], VLLM_IR_NOVA_PRESENT="1")
    assert ops.returncode == 0, ops.stderr
    data = json.loads(ops.stdout)
    assert data["platform"] == "nova"
    assert data["platform_device_type"] == "cpu"
    assert data["declared_platforms"]["nova"]["package"] == NOVA_PACKAGE
    explain = run(["explain", "rms_norm", "--eager", "--dtype", "fp32"], VLLM_IR_NOVA_PRESENT="1")
    assert explain.returncode == 0, explain.stderr
    assert f"platform: nova (declared by {NOVA_PACKAGE}, device cpu)" in explain.stdout
    assert "1. nova_kernels  <- nova eager default of vllm-ir-nova-platform" in explain.stdout
    assert "selected: nova_kernels" in explain.stdout


def test_undetected_platform_leaves_cpu_but_is_listed() -> None:
    out = run(["ops"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("platform: cpu (built in, device cpu)")
    assert f"declared platforms: nova ({NOVA_PACKAGE})" in out.stdout


def test_env_override_accepts_the_installed_platform_and_refuses_unknown_ones() -> None:
    code = (
        "import torch, vllm_ir as ir\n"
        "x, w = torch.randn(4, 64), torch.ones(64)\n"
        "print(ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider)\n"
    )
    out = run([code], code=True, VLLM_IR_PLATFORM="nova")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "nova_kernels"
    bad = run(["ops"], VLLM_IR_PLATFORM="nvoa")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "vllm-ir: error: VLLM_IR_PLATFORM='nvoa' is not accepted; accepted values: cuda, rocm, "
        "xpu, cpu (any case), or a platform an installed package declares; installed "
        "platforms: nova"
    ]
