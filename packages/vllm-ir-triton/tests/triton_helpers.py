"""Helpers shared by the tests (a module name of its own: several packages' tests
run in one pytest process in the platform sessions, so ``conftest`` is ambiguous)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def gpu_device() -> str | None:
    """The torch device type of a GPU Triton may drive, or None."""
    if torch.cuda.is_available():
        return "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return None


DEVICE = gpu_device() or "cpu"
"""Where the tests put their tensors: the GPU, else the CPU (under the interpreter)."""

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def run_python(code: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; ``env`` values of None are removed."""
    full = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300
    )
