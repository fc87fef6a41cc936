"""The package as vllm-ir sees it: entry point, registrations, support, default priorities."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
import vllm_ir as ir
import vllm_ir_triton
from triton_helpers import DEVICE, run_python
from vllm_ir.provider import PlatformDefaults
from vllm_ir.testing import (
    Mode,
    add_platform_defaults,
    assert_discovered,
    effective_priority,
    platform_default_contributions,
    remove_platform_defaults,
)
from vllm_ir_triton import BATCH_INVARIANT_PROVIDER, DEFAULTS_RANK, PROVIDER, support

PACKAGE = f"vllm-ir-triton {vllm_ir_triton.__version__}"
OPS = (
    ir.ops.rms_norm,
    ir.ops.fused_add_rms_norm,
    ir.ops.vllm_rms_norm,
    ir.ops.vllm_fused_add_rms_norm,
)
OURS = [PROVIDER, BATCH_INVARIANT_PROVIDER]
TRITON_ONLY = {
    # op: (inplace, batch_invariant)
    ir.ops.silu_and_mul: (False, True),
    ir.ops.static_scaled_fp8_quant: (False, True),
    ir.ops.dynamic_per_token_fp8_quant: (False, True),
    ir.ops.rms_norm_static_fp8_quant: (False, False),
    ir.ops.fused_add_rms_norm_static_fp8_quant: (True, False),
}


def test_discovered_through_its_entry_point() -> None:
    assert_discovered(PROVIDER, "vllm_ir_triton:provider", vllm_ir_triton.provider, PACKAGE)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_impls_registered_and_attributed(op: ir.IrOp) -> None:
    for provider in OURS:
        impl = op.impls[provider]
        assert impl.package == PACKAGE
        assert impl.supported is support.platform_supported()
        assert impl.inplace is (op in (ir.ops.fused_add_rms_norm, ir.ops.vllm_fused_add_rms_norm))
        assert impl.batch_invariant is (provider == BATCH_INVARIANT_PROVIDER)


@pytest.mark.parametrize("op", TRITON_ONLY, ids=lambda op: op.name)
def test_triton_only_impls_registered_and_attributed(op: ir.IrOp) -> None:
    impl = op.impls[PROVIDER]
    assert impl.package == PACKAGE
    assert impl.supported is support.platform_supported()
    assert (impl.inplace, impl.batch_invariant) == TRITON_ONLY[op]
    assert BATCH_INVARIANT_PROVIDER not in op.impls


def test_triton_only_defaults() -> None:
    for op in TRITON_ONLY:
        for platform in ("cuda", "rocm", "xpu"):
            for mode, expected in (("eager", [PROVIDER]), ("compiled", ["native"])):
                ours = [
                    (providers, rank)
                    for source, providers, rank in platform_default_contributions(
                        op.name, mode, platform
                    )
                    if source == "vllm-ir-triton"
                ]
                assert ours == [(tuple(expected), DEFAULTS_RANK)], (op.name, platform, mode)
            assert _effective(op, "eager", platform)[-2:] == [PROVIDER, "native"]
        assert not [
            source
            for mode in ("eager", "compiled")
            for source, _, _ in platform_default_contributions(op.name, mode, "cpu")  # type: ignore[arg-type]
            if source == "vllm-ir-triton"
        ]


def test_supported_here() -> None:
    """These tests run either on a GPU or in the interpreter: the impls are offered."""
    assert support.platform_supported(), support.unsupported_reason()
    assert DEVICE in support.device_types()


def test_cheap_import_and_cpu_without_interpreter_unsupported() -> None:
    """In a fresh process: importing the package loads neither Triton nor the impls;
    without the interpreter the impls are unsupported on CPU, and selection falls back."""
    code = (
        "import json, sys, torch, vllm_ir as ir, vllm_ir_triton\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
        "assert 'vllm_ir_triton.impls' not in sys.modules\n"
        "from vllm_ir_triton import support\n"
        "x = torch.randn(2, 8)\n"
        "with ir.ops.rms_norm.set_priority(['triton']):\n"
        "    sel = ir.ops.rms_norm.select(x, None, 1e-6)\n"
        "print(json.dumps({'supported': ir.ops.rms_norm.impls['triton'].supported,\n"
        "    'reason': support.unsupported_reason(), 'chosen': sel.impl.provider,\n"
        "    'why': sel.decisions[0].reason}))\n"
    )
    # only this provider: another one installed beside (e.g. vllm-ir-cpu) would be
    # the CPU platform's default, chosen before native
    proc = run_python(
        code, TRITON_INTERPRET=None, VLLM_IR_PLATFORM="cpu", VLLM_IR_PROVIDERS="triton"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["supported"] is False
    assert "TRITON_INTERPRET=1" in result["reason"]
    assert result["chosen"] == "native"
    assert result["why"] == "not supported on this platform"


def test_unsupported_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled (not interpreted) kernels need the platform's device and Triton backend."""
    monkeypatch.setattr(support, "interpreted", lambda: False)
    assert "TRITON_INTERPRET=1" in (support.unsupported_reason("cpu") or "")
    monkeypatch.setattr(support, "_device_available", lambda platform: False)
    assert "sees no cuda device" in (support.unsupported_reason("cuda") or "")
    monkeypatch.setattr(support, "_device_available", lambda platform: True)
    monkeypatch.setattr(support, "_installed_backends", lambda: frozenset({"nvidia"}))
    assert support.unsupported_reason("cuda") is None
    assert "no 'amd' backend" in (support.unsupported_reason("rocm") or "")
    assert "no 'intel' backend" in (support.unsupported_reason("xpu") or "")
    assert support.device_types("cuda") == frozenset({"cuda"})
    assert support.device_types("xpu") == frozenset({"xpu"})
    assert support.device_types("cpu") == frozenset()


def test_support_per_platform() -> None:
    assert support.triton_backend_for("cuda") == "nvidia"
    assert support.triton_backend_for("rocm") == "amd"
    assert support.triton_backend_for("xpu") == "intel"
    assert support.triton_backend_for("cpu") is None
    assert support.GPU_PLATFORMS["rocm"][1] == "cuda"  # ROCm tensors are on torch's cuda device


@pytest.fixture
def vendor_defaults() -> Iterator[None]:
    """Stand-ins for the vendor packages' contributions, under names of their own."""
    sources = {
        "stand-in-cuda": PlatformDefaults(
            "cuda",
            eager={op.name: ["vllm_c"] for op in OPS},
            compiled={op.name: ["native"] for op in OPS},
            rank=100,
        ),
        # the seed's ROCm list, at the default rank
        "stand-in-rocm": PlatformDefaults(
            "rocm", eager={op.name: ["aiter", "vllm_c"] for op in OPS}
        ),
        "stand-in-xpu": PlatformDefaults("xpu", eager={op.name: ["xpu_kernels"] for op in OPS}),
        "stand-in-third-party": PlatformDefaults("cuda", eager={op.name: ["theirs"] for op in OPS}),
    }
    for source, defaults in sources.items():
        add_platform_defaults(source, [defaults])
    yield
    for source in sources:
        remove_platform_defaults(source)


def _effective(op: ir.IrOp, mode: Mode, platform: str) -> list[str]:
    return [e.provider for e in effective_priority(op.name, mode, platform=platform)]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_contributed_defaults(op: ir.IrOp) -> None:
    for platform in ("cuda", "rocm", "xpu"):
        for mode, expected in (("eager", OURS), ("compiled", ["native"])):
            ours = [
                (providers, rank)
                for source, providers, rank in platform_default_contributions(
                    op.name, mode, platform
                )
                if source == "vllm-ir-triton"
            ]
            assert ours == [(tuple(expected), DEFAULTS_RANK)], (platform, mode)
    assert not [
        source
        for mode in ("eager", "compiled")
        for source, _, _ in platform_default_contributions(op.name, mode, "cpu")  # type: ignore[arg-type]
        if source == "vllm-ir-triton"
    ]


@pytest.mark.usefixtures("vendor_defaults")
@pytest.mark.parametrize("op", OPS[:2], ids=lambda op: op.name)  # the ops the vendors declare
def test_triton_goes_after_the_vendor_providers(op: ir.IrOp) -> None:
    vendors = {
        "cuda": ["vllm_c", "theirs"],
        "rocm": ["aiter", "vllm_c"],
        "xpu": ["xpu_kernels"],
    }
    for platform, before in vendors.items():
        eager = _effective(op, "eager", platform)
        assert eager[-3:] == [*OURS, "native"], eager
        assert eager.index(PROVIDER) > max(eager.index(p) for p in before), eager
        assert _effective(op, "compiled", platform)[0] == "native"


def test_batch_invariant_mode_selects_the_invariant_impl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU platform's defaults, VLLM_BATCH_INVARIANT=1 skips ``triton`` for its sibling."""
    monkeypatch.setenv("VLLM_IR_PLATFORM", "cuda")
    if ir.ops.rms_norm.get_priority("eager")[:2] != OURS:
        pytest.skip("another provider comes first in the cuda defaults of this environment")
    x = torch.randn(2, 64, device=DEVICE)
    ir.invalidate_caches()
    assert ir.ops.rms_norm.selected_impl(x, None, 1e-6).provider == PROVIDER
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    ir.invalidate_caches()
    assert ir.ops.rms_norm.selected_impl(x, None, 1e-6).provider == BATCH_INVARIANT_PROVIDER
    fused = ir.ops.fused_add_rms_norm
    assert fused.selected_impl(x, x.clone(), None, 1e-6).provider == BATCH_INVARIANT_PROVIDER
