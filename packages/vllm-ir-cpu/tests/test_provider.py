"""The package as vllm-ir sees it: entry point, registrations, default priorities."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import vllm_ir as ir
import vllm_ir_cpu
from cpu_c_testing import on_cpu_platform, run_python
from vllm_ir.testing import assert_discovered
from vllm_ir_cpu import PROVIDER

PACKAGE = f"vllm-ir-cpu {vllm_ir_cpu.__version__}"


def test_discovered_through_its_entry_point() -> None:
    assert_discovered(PROVIDER, "vllm_ir_cpu:provider", vllm_ir_cpu.provider, PACKAGE)


INPLACE = {
    "fused_add_rms_norm",
    "vllm_fused_add_rms_norm",
    "fused_add_rms_norm_static_fp8_quant",
    "rotary_embedding",
    "rotary_embedding_fp32",
}
COMPILED_FIRST = {"static_scaled_fp8_quant": PROVIDER, "dynamic_per_token_fp8_quant": PROVIDER}
"""Ops whose compiled-mode default is not ``native`` (README "Default priorities")."""


def test_impls_registered_and_attributed() -> None:
    implemented = {name for name, op in ir.IrOp.registry.items() if PROVIDER in op.impls}
    assert implemented == set(vllm_ir_cpu.OPS)
    for name in vllm_ir_cpu.OPS:
        impl = ir.get_op(name).impls[PROVIDER]
        assert impl.package == PACKAGE
        assert impl.batch_invariant
        assert impl.inplace is (name in INPLACE)
        assert impl.supported is (ir.provider.current_platform() == "cpu")


@on_cpu_platform
def test_cpu_platform_defaults() -> None:
    for name in vllm_ir_cpu.OPS:
        op = ir.get_op(name)
        assert op.get_priority("eager") == [PROVIDER, "native"], name
        assert op.get_priority("compiled")[0] == COMPILED_FIRST.get(name, "native"), name


@on_cpu_platform
def test_batch_invariant_mode_keeps_cpu_c(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    ir.invalidate_caches()
    x = torch.randn(2, 8)
    assert ir.ops.rms_norm.selected_impl(x, None, 1e-6).provider == PROVIDER


def test_discovery_and_selection_do_not_build(tmp_path: Path) -> None:
    """Discovery and dispatch stay cheap: nothing is compiled until a kernel runs."""
    code = (
        "import json, time, torch, vllm_ir as ir\n"
        "start = time.perf_counter()\n"
        "providers = ir.loaded_providers()\n"
        "elapsed = time.perf_counter() - start\n"
        "from vllm_ir_cpu import build\n"
        "x = torch.randn(2, 8)\n"
        "provider = ir.ops.rms_norm.selected_impl(x, None, 1e-6).provider\n"
        "print(json.dumps({'providers': sorted(providers), 'loaded': build.is_loaded(),\n"
        "                  'provider': provider, 'seconds': elapsed}))\n"
    )
    proc = run_python(code, VLLM_IR_CACHE_DIR=str(tmp_path), VLLM_IR_PLATFORM="cpu")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert PROVIDER in result["providers"]
    assert result["provider"] == PROVIDER
    assert result["loaded"] is False
    assert not any(tmp_path.iterdir()), "something was built"
    assert result["seconds"] < 5, result


def test_importing_registers_nothing() -> None:
    code = (
        "import vllm_ir_cpu, sys\n"
        "assert 'vllm_ir_cpu.impls' not in sys.modules\n"
        "assert 'vllm_ir_cpu.library' not in sys.modules\n"
        "print('ok')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
