"""Registration, supports_args, platform defaults and packaging of the vllm_c provider."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
import vllm_ir as ir
import vllm_ir_cuda
from torch._subclasses.fake_tensor import FakeTensorMode
from vllm_ir.testing import platform_default_contributions
from vllm_ir_cuda import layernorm, quant

RMS = ir.ops.rms_norm
FUSED = ir.ops.fused_add_rms_norm
PROVIDER = vllm_ir_cuda.PROVIDER


def test_impls_are_registered_with_their_flags() -> None:
    rms, fused = RMS.impls[PROVIDER], FUSED.impls[PROVIDER]
    assert rms.impl_fn is layernorm.rms_norm
    assert fused.impl_fn is layernorm.fused_add_rms_norm
    assert not rms.inplace
    assert fused.inplace
    assert rms.batch_invariant
    assert fused.batch_invariant
    assert rms.supports_args is layernorm.rms_norm_supports
    assert fused.supports_args is layernorm.fused_add_rms_norm_supports


def test_vllm_numerics_are_registered() -> None:
    """vLLM's numerics: vllm_rms_norm on the rms_norm kernel, the fused op on its own."""
    rms, fused = (
        ir.ops.vllm_rms_norm.impls[PROVIDER],
        ir.ops.vllm_fused_add_rms_norm.impls[PROVIDER],
    )
    assert rms.impl_fn is layernorm.rms_norm
    assert fused.impl_fn is layernorm.vllm_fused_add_rms_norm
    assert fused.inplace
    assert not rms.inplace
    assert rms.supports_args is layernorm.rms_norm_supports
    assert fused.supports_args is layernorm.fused_add_rms_norm_supports


def test_supported_follows_the_hardware() -> None:
    expected = torch.cuda.is_available() and torch.version.cuda is not None
    expected = expected and torch.version.hip is None
    assert layernorm.platform_supported() is expected
    assert RMS.impls[PROVIDER].supported is expected
    assert FUSED.impls[PROVIDER].supported is expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_not_supported_on_this_cpu_machine() -> None:
    assert RMS.impls[PROVIDER].supported is False
    assert FUSED.impls[PROVIDER].supported is False


def test_impls_are_attributed_to_the_package() -> None:
    for op in (RMS, FUSED):
        assert op.impls[PROVIDER].package.split()[0] == "vllm-ir-cuda"


def test_provider_spec() -> None:
    spec = vllm_ir_cuda.provider
    assert spec.name == "vllm_c"
    assert spec.api_version == 1 == ir.provider.API_VERSION
    (defaults,) = spec.defaults
    assert defaults.platform == "cuda"
    assert defaults.rank == 100
    core = {op.name for op in ir.ops.__dict__.values() if isinstance(op, ir.IrOp)}
    # every core op, gelu_and_mul and rotary_embedding included, has a vllm_c impl, but
    # rotary_embedding_fp32 (the rounding of vLLM's CPU RoPE kernel: no CUDA kernel yet)
    assert set(defaults.eager) == set(defaults.compiled) == core - {"rotary_embedding_fp32"}
    assert len(core) == 12
    assert all(v == ["vllm_c"] for v in defaults.eager.values())
    assert all(v == ["native"] for v in defaults.compiled.values())


def test_every_core_op_has_a_batch_invariant_impl() -> None:
    for name, impl_fn in quant.IMPLS.items():
        impl = ir.get_op(name).impls[PROVIDER]
        assert impl.impl_fn is impl_fn
        assert impl.batch_invariant
        assert impl.inplace == (name in ("fused_add_rms_norm_static_fp8_quant", "rotary_embedding"))
        assert impl.supported is layernorm.platform_supported()


def test_entry_point_names_the_provider() -> None:
    try:
        dist = metadata.distribution("vllm-ir-cuda")
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-ir-cuda is not installed (running from the source tree)")
    (ep,) = [e for e in dist.entry_points if e.group == "vllm_ir.providers"]
    assert ep.name == "vllm_c"
    assert ep.value == "vllm_ir_cuda:provider"
    assert ep.load() is vllm_ir_cuda.provider
    assert dist.version == vllm_ir_cuda.__version__ == "0.1.0"


# -- supports_args ---------------------------------------------------------


def _fake(*shape: int, dtype: torch.dtype, device: str = "cuda") -> torch.Tensor:
    with FakeTensorMode():
        return torch.empty(shape, dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_supports_args_accepts_what_the_kernels_compute(dtype: torch.dtype) -> None:
    x = _fake(4, 64, dtype=dtype)
    w = _fake(64, dtype=dtype)
    assert layernorm.rms_norm_supports(x, w, 1e-6) is True
    assert layernorm.rms_norm_supports(x, None, 1e-6) is True
    assert layernorm.rms_norm_supports(_fake(2, 3, 64, dtype=dtype), w, 1e-6) is True
    assert layernorm.fused_add_rms_norm_supports(x, x, w, 1e-6) is True
    assert layernorm.fused_add_rms_norm_supports(x, x, None, 1e-6) is True


@pytest.mark.parametrize(
    ("case", "x", "weight", "variance_size"),
    [
        ("variance_size", _fake(4, 64, dtype=torch.float16), None, 32),
        ("float64", _fake(4, 64, dtype=torch.float64), None, None),
        ("int8", _fake(4, 64, dtype=torch.int8), None, None),
        ("fp8", _fake(4, 64, dtype=torch.float8_e4m3fn), None, None),
        ("cpu", _fake(4, 64, dtype=torch.float16, device="cpu"), None, None),
        (
            "weight-dtype",
            _fake(4, 64, dtype=torch.float16),
            _fake(64, dtype=torch.float32),
            None,
        ),
        ("weight-2d", _fake(4, 64, dtype=torch.float16), _fake(1, 64, dtype=torch.float16), None),
        ("scalar-x", _fake(dtype=torch.float16), None, None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_supports_args_declines_what_the_kernels_cannot(
    case: str, x: torch.Tensor, weight: torch.Tensor | None, variance_size: int | None
) -> None:
    assert layernorm.rms_norm_supports(x, weight, 1e-6, variance_size) is False
    assert layernorm.fused_add_rms_norm_supports(x, x, weight, 1e-6, variance_size) is False


def test_fused_supports_args_declines_mismatched_residuals() -> None:
    x = _fake(4, 64, dtype=torch.bfloat16)
    assert not layernorm.fused_add_rms_norm_supports(
        x, _fake(4, 64, dtype=torch.float32), None, 0.1
    )
    assert not layernorm.fused_add_rms_norm_supports(x, _fake(64, dtype=torch.bfloat16), None, 0.1)


def test_supports_args_reads_no_sizes() -> None:
    # a symbolic batch size would turn any size comparison into a SymBool guard
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv())
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.empty(8, 64, dtype=torch.float16), symbolic_context=ctx)
    assert isinstance(x.shape[0], torch.SymInt)
    with mode:
        assert type(layernorm.supports_args_for("cpu")[0](x, None, 1e-6)) is bool
        assert type(layernorm.supports_args_for("cpu")[1](x, x, None, 1e-6)) is bool


# -- platform defaults and selection ---------------------------------------


def test_cuda_defaults_put_vllm_c_first_in_eager_and_native_when_compiled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "cuda")
    for op in (RMS, FUSED):
        assert op.get_priority()[0] == "vllm_c"
        eager = op.get_priority("eager")
        assert eager[0] == "vllm_c"
        assert eager[-1] == "native"
        assert op.get_priority("compiled")[0] == "native"
        (entry,) = [e for e in op.get_priority_entries("eager") if e.provider == "vllm_c"]
        assert entry.source == "cuda eager default of vllm-ir-cuda"


def _contributors(op_name: str, platform: str) -> set[str]:
    return {
        source
        for mode in ("eager", "compiled")
        for source, _, _ in platform_default_contributions(op_name, mode, platform)
    }


def test_defaults_are_contributed_for_cuda_only() -> None:
    for op_name in ("rms_norm", "fused_add_rms_norm"):
        assert "vllm-ir-cuda" in _contributors(op_name, "cuda")
        for platform in ("cpu", "rocm", "xpu"):
            assert "vllm-ir-cuda" not in _contributors(op_name, platform)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_cpu_machine_skips_vllm_c_even_with_cuda_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "cuda")
    ir.invalidate_caches()
    x, w = torch.randn(4, 64), torch.ones(64)
    for op, args in ((RMS, (x, w, 1e-6)), (FUSED, (x, x.clone(), w, 1e-6))):
        selection = op.select(*args, mode="eager")
        first = selection.decisions[0]
        assert first.entry.provider == "vllm_c"
        assert not first.accepted
        assert first.reason == "not supported on this platform"
        assert op.selected_impl(*args).provider != "vllm_c"
    torch.testing.assert_close(RMS(x, w, 1e-6), RMS.native(x, w, 1e-6))


# -- the build command -----------------------------------------------------


def _subprocess_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    # the same vllm_ir_cuda as this process, installed or from the source tree
    package_parent = str(Path(vllm_ir_cuda.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    env["VLLM_IR_CACHE_DIR"] = str(tmp_path / "cache")
    return env


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch")
def test_build_command_fails_clearly_without_cuda_torch(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vllm_ir_cuda", "build"],
        capture_output=True,
        text=True,
        env=_subprocess_env(tmp_path),
        timeout=120,
    )
    assert result.returncode == 1, result
    assert "cannot build the CUDA kernels here" in result.stderr
    assert "is not a CUDA build" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_importing_the_package_imports_no_kernels(tmp_path: Path) -> None:
    code = (
        "import sys, vllm_ir_cuda\n"
        "assert vllm_ir_cuda.provider.name == 'vllm_c'\n"
        "loaded = [m for m in ('vllm_ir_cuda.ops', 'vllm_ir_cuda.layernorm',"
        " 'vllm_ir._discovery.extension')"
        " if m in sys.modules]\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_subprocess_env(tmp_path),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
