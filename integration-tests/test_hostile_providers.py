"""Deliberately bad provider packages, installed next to a good one.

Each of ``vllm-ir-hostile-provider``'s entry points fails to load in its own
way; the example provider and core keep working, and every bad one is
listed in ``load_errors()`` and by ``vllm-ir ops``, with its registrations
rolled back.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import vllm_ir as ir
from conftest import HOSTILE_PROVIDERS
from vllm_ir_hostile import TORCH_NAMESPACE

EXPECTED_CAUSES = {
    "hostile_defaults": "TypeError: ProviderSpec 'hostile_defaults': defaults must be a sequence",
    "hostile_exit": "SystemExit: vllm-ir-hostile-provider: argparse rejected",
    "hostile_partial": "RuntimeError: vllm-ir-hostile-provider: failure after a partial",
    "hostile_signature": "TypeError: impl 'hostile_signature' of op 'rms_norm': parameter 3 is "
    "named 'eps', the op's is 'epsilon'",
}


def test_each_bad_provider_is_reported_on_one_line() -> None:
    errors = ir.load_errors()
    for name in HOSTILE_PROVIDERS:
        assert errors[name].package == "vllm-ir-hostile-provider 0.1.0"
        assert errors[name].cause.startswith(EXPECTED_CAUSES[name]), errors[name].cause
        assert "\n" not in errors[name].cause
        assert name not in ir.loaded_providers()


def test_the_good_provider_and_core_keep_working() -> None:
    assert "example" in ir.loaded_providers()
    x, w = torch.randn(4, 96), torch.ones(96)
    impl = ir.ops.rms_norm.selected_impl(x, w, 1e-6)
    assert impl.provider == "example"
    torch.testing.assert_close(ir.ops.rms_norm(x, w, 1e-6), ir.ops.rms_norm.native(x, w, 1e-6))
    torch.testing.assert_close(
        ir.ops.silu_and_mul(torch.ones(2, 8)), ir.ops.silu_and_mul.native(torch.ones(2, 8))
    )


def test_partial_registration_is_rolled_back_entirely() -> None:
    ir.load_errors()
    assert not {"hostile_partial", "hostile_signature"} & set(ir.ops.rms_norm.impls)
    assert ir.ops.rms_norm.tolerance(torch.float32) == ir.Tolerance(atol=1e-5, rtol=1e-5)
    assert "hostile_partial" not in ir.ops.rms_norm.get_priority()
    assert not hasattr(getattr(torch.ops, TORCH_NAMESPACE), "kernel")


def test_vllm_ir_ops_lists_the_bad_providers() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ir", "ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for name in HOSTILE_PROVIDERS:
        assert name in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
