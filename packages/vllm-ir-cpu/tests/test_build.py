"""The JIT build: where it goes, its flags, the command, and its errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cpu_c_testing import run_python
from vllm_ir.provider import cache_root
from vllm_ir_cpu import build


def test_library_lives_in_the_cache_dir(kernels: Path) -> None:
    assert build.is_loaded()
    assert kernels.is_file()
    assert kernels.is_relative_to(cache_root() / "extensions")
    assert kernels.parent.name.startswith(f"{build.LIBRARY_NAME}-{build.__version__}-torch")


def test_sources_ship_inside_the_package() -> None:
    assert build.SOURCES
    for source in build.SOURCES:
        assert source.is_file()
        assert source.parent.parent == Path(build.__file__).parent


def test_flags_name_the_instruction_set() -> None:
    avx512 = build.compile_flags("AVX512")
    assert "-DCPU_CAPABILITY_AVX512" in avx512
    assert "-mavx512bw" in avx512
    assert "-DCPU_CAPABILITY_AVX2" in build.compile_flags("AVX2")
    portable = build.compile_flags("DEFAULT")
    assert portable == ["-O3", "-fopenmp"]
    # the ISA is part of the flags, hence of the cache key: no AVX-512 build for an AVX2 CPU
    assert len({tuple(f) for f in (avx512, build.compile_flags("AVX2"), portable)}) == 3


def test_toolchain_problem_names_the_missing_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    build.toolchain_problem.cache_clear()
    monkeypatch.setenv("CXX", "no-such-compiler")
    try:
        assert "'no-such-compiler' not found" in (build.toolchain_problem() or "")
    finally:
        monkeypatch.undo()
        build.toolchain_problem.cache_clear()


def test_ninja_from_the_pip_package_is_put_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    monkeypatch.setattr(build, "_ninja_dir", lambda: str(tmp_path))
    before = os.environ["PATH"]
    with build._ninja_on_path():
        assert os.environ["PATH"].split(os.pathsep)[0] == str(tmp_path)
    assert os.environ["PATH"] == before


def test_build_command_prints_the_library(kernels: Path) -> None:
    proc = run_python("import sys, vllm_ir_cpu.__main__ as m; sys.exit(m.main(['build']))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(kernels)
    assert "-fopenmp" in proc.stderr


def test_build_command_without_a_compiler_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_python(
        "import sys, vllm_ir_cpu.__main__ as m; sys.exit(m.main(['build']))",
        CXX="no-such-compiler",
        VLLM_IR_CACHE_DIR=str(tmp_path),
    )
    assert proc.returncode == 1
    assert "error:" in proc.stderr
    assert "'no-such-compiler' not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_build_cache_the_build_would_refuse_falls_back_to_native(tmp_path: Path) -> None:
    """A world-writable VLLM_IR_CACHE_DIR: the build refuses it, so ``cpu_c``
    declines and the call runs native with one warning, never an
    ExtensionBuildError at the call (reliability-v4 15's second half)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    proc = run_python(
        "import torch, vllm_ir as ir\n"
        "print(ir.ops.rms_norm.selected_impl(torch.randn(2, 64), None, 1e-6).provider)\n"
        "ir.ops.rms_norm(torch.randn(2, 64), None, 1e-6)\n",
        VLLM_IR_CACHE_DIR=str(cache),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["native"]
    refused = [line for line in proc.stderr.splitlines() if "cannot be built" in line]
    assert len(refused) == 1, proc.stderr
    assert "writable by group or others" in refused[0]
