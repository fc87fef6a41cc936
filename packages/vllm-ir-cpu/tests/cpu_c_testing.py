"""Helpers shared by the test modules (a uniquely named module: ``conftest`` is
not importable reliably when several packages' tests run in one session)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import vllm_ir as ir

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

on_cpu_platform = pytest.mark.skipif(
    ir.provider.current_platform() != "cpu",
    reason=f"cpu_c is offered on the cpu platform only; this is {ir.provider.current_platform()}",
)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``env`` added to this one's environment."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
