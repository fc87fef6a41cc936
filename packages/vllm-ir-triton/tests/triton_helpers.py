"""Helpers shared by the tests (a module name of its own: several packages' tests
run in one pytest process in the platform sessions, so ``conftest`` is ambiguous)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

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


def run_size_mismatch(op: Any, provider: str, args: tuple[Any, ...]) -> tuple[Any, Any]:
    """``(got, want)``: ``op`` on ``args`` (moved to :data:`DEVICE`, cloned) through
    ``provider``'s impl, which ``supports_args`` selects (it cannot see sizes), and the
    native result. For sizes the kernels do not take: the impl must hand them to native."""
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    with op.set_priority([provider]):
        assert op.selected_impl(*args).provider == provider
        got = op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    return got, op.native(*args)
