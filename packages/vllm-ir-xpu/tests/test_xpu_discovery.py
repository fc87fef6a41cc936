"""The installed package as a user meets it: discovered, and explained by ``vllm-ir``.

Run in fresh interpreters, without stand-ins: on this machine the provider
loads, registers its impls unsupported, and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(
        "xpu_kernels" not in {ep.name for ep in metadata.entry_points(group="vllm_ir.providers")},
        reason="vllm-ir-xpu is not installed (its entry point is not registered)",
    ),
    pytest.mark.skipif(
        hasattr(torch, "xpu") and torch.xpu.is_available(),
        reason="checks the unsupported report on a machine without an XPU",
    ),
]


def _vllm_ir(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "vllm_ir", *args],
        capture_output=True,
        text=True,
        env=environ,
        check=False,
    )


def test_explain_on_xpu_shows_xpu_kernels_first_and_why_it_is_skipped() -> None:
    done = _vllm_ir(
        "explain",
        "fused_add_rms_norm",
        "--eager",
        VLLM_IR_PLATFORM="xpu",
        VLLM_LOGGING_LEVEL="INFO",
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "1. xpu_kernels  <- xpu eager default of vllm-ir-xpu" in out
    assert "xpu_kernels: rejected: not supported on this platform: torch" in out
    assert "selected: xpu_kernels" not in out  # native, or another installed provider
    # the reason, logged when the provider registered its impls
    assert "provider 'xpu_kernels' registered as unsupported: torch" in done.stderr
    assert "torch.xpu.is_available() is False" in done.stderr


def test_ops_lists_the_impls_unsupported_and_the_provider_loaded() -> None:
    done = _vllm_ir("ops", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["providers"]["xpu_kernels"].startswith("vllm-ir-xpu")
    assert "xpu_kernels" not in report["failed_providers"]
    rows = {(r["op"], r["provider"]): r for r in report["impls"]}
    for op in ("rms_norm", "fused_add_rms_norm"):
        row = rows[(op, "xpu_kernels")]
        assert row["supported"] is False
        assert row["package"].startswith("vllm-ir-xpu")
    assert rows[("fused_add_rms_norm", "xpu_kernels")]["inplace"] is True
