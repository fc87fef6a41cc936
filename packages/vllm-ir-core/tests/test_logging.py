"""VLLM_LOGGING_LEVEL=DEBUG shows each selection and each rejection, with reasons."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.mark.slow
def test_debug_logging_of_selection() -> None:
    script = textwrap.dedent(
        """
        import torch, vllm_ir as ir
        from torch import Tensor
        from typing import Optional
        T = Optional[Tensor]

        def not_bf16(x, weight, epsilon, variance_size=None):
            return x.dtype != torch.bfloat16

        @ir.ops.rms_norm.register_impl("no_bf16", supports_args=not_bf16)
        def a(x: Tensor, weight: T, epsilon: float, variance_size: Optional[int] = None) -> Tensor:
            return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)

        @ir.ops.rms_norm.register_impl("absent", supported=False)
        def b(x: Tensor, weight: T, epsilon: float, variance_size: Optional[int] = None) -> Tensor:
            raise AssertionError

        with ir.ops.rms_norm.set_priority(["absent", "no_bf16"]):
            ir.ops.rms_norm(torch.ones(2, 8, dtype=torch.bfloat16), None, 1e-6)
        """
    )
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "DEBUG"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    log = result.stderr
    assert (
        "rms_norm (eager): rejected absent [user (scoped)]: not supported on this platform" in log
    )
    assert "rejected no_bf16 [user (scoped)]: arguments not supported" in log
    selected = "rms_norm (eager): selected native [native fallback]"
    assert f"{selected} for (Tensor(bfloat16, (2, 8), cpu), None, 1e-06, None)" in log


@pytest.mark.slow
def test_bad_logging_level_warns_and_is_ignored() -> None:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "LOUD"}
    script = "import torch, vllm_ir as ir; ir.ops.rms_norm(torch.ones(1, 4), None, 1e-6)"
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert "VLLM_LOGGING_LEVEL='LOUD' is not accepted; accepted values: DEBUG" in result.stderr
    assert "ignored, using the default" in result.stderr
