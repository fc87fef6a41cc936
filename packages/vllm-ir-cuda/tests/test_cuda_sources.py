"""The kernel sources: torch-free, and compiling with the build's nvcc flags for each arch.

Every compile starts at once in one module fixture (nvcc per arch, and the
binding against torch's headers), so the slow part costs the longest single
compile, not their sum.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_ir_cuda import _build

NVCC = shutil.which("nvcc")
CXX = shutil.which(os.environ.get("CXX", "c++"))
TORCH_HEADERS = ("torch/", "ATen/", "c10/", "caffe2/")
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


@dataclass
class Compile:
    command: list[str]
    returncode: int
    output: str

    def explain(self) -> str:
        return f"$ {' '.join(self.command)}\n{self.output}"


def _cuda_files() -> list[Path]:
    return sorted(p for p in _build.CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h"))


def test_sources_are_where_the_build_looks() -> None:
    names = {p.name for p in _build.sources()}
    assert "binding.cpp" in names
    assert any(n.endswith(".cu") for n in names)
    assert all(p.exists() for p in _build.sources())


@pytest.mark.parametrize("path", _cuda_files(), ids=lambda p: p.name)
def test_cuda_sources_include_no_torch_headers(path: Path) -> None:
    includes = _INCLUDE.findall(path.read_text())
    torch_includes = [i for i in includes if i.startswith(TORCH_HEADERS)]
    assert not torch_includes, f"{path.name} includes torch headers {torch_includes}"
    allowed = {"cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cstdint"}
    local = {p.name for p in _build.CSRC.iterdir()}
    unexpected = [i for i in includes if i not in allowed and i not in local]
    assert not unexpected, f"{path.name} includes {unexpected}"


def test_only_the_binding_includes_torch() -> None:
    includes = _INCLUDE.findall((_build.CSRC / "binding.cpp").read_text())
    assert "torch/library.h" in includes
    assert "layernorm.h" in includes


def test_build_flags_target_sm80_and_sm90() -> None:
    flags = _build.cuda_flags()
    for arch in ("80", "90"):
        assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in flags
    assert "-gencode=arch=compute_90,code=compute_90" in flags  # PTX for newer GPUs
    # torch adds its own arch flags unless ours contain "arch": they must
    assert any("arch" in f for f in flags)


def _start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _torch_include_dirs(stub: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    dirs = [*include_paths("cpu"), str(stub)]
    python = sysconfig.get_path("include")
    if python:
        dirs.append(python)
    return dirs


def _binding_command(tmp: Path) -> list[str] | None:
    """Syntax check of binding.cpp against torch's headers, or None if impossible here.

    CPU wheels of torch ship the CUDA headers but not the generated
    ``c10/cuda/impl/cuda_cmake_macros.h``: a stub stands in for it.
    """
    if CXX is None:
        return None
    cuda_home = Path(NVCC).resolve().parent.parent if NVCC else None
    cuda_include = None
    for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", cuda_home):
        if candidate and (Path(candidate) / "include" / "cuda_runtime.h").exists():
            cuda_include = Path(candidate) / "include"
            break
    if cuda_include is None:
        return None
    stub = tmp / "stub"
    macros = stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    macros.parent.mkdir(parents=True)
    macros.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    includes = [f"-isystem{d}" for d in [*_torch_include_dirs(stub), str(cuda_include)]]
    return [
        CXX,
        "-fsyntax-only",
        "-std=c++20",
        "-Wall",
        *_build.cxx_flags(),
        *includes,
        str(_build.CSRC / "binding.cpp"),
    ]


@pytest.fixture(scope="module")
def compiles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Compile]]:
    tmp = tmp_path_factory.mktemp("nvcc")
    commands: dict[str, list[str]] = {}
    if NVCC is not None:
        for arch in _build.ARCHS:
            for source in _build.kernel_sources():
                out = tmp / f"{source.stem}.sm_{arch}.o"
                # -Xptxas -v reports registers and spills; it changes no code
                cmd = [*_build.nvcc_command(NVCC, source, out, (arch,)), "-Xptxas", "-v"]
                commands[f"sm_{arch}:{source.name}"] = cmd
    binding = _binding_command(tmp)
    if binding is not None:
        commands["binding"] = binding
    running = {key: _start(cmd) for key, cmd in commands.items()}
    results = {}
    for key, proc in running.items():
        output, _ = proc.communicate()
        results[key] = Compile(commands[key], proc.returncode, output)
    return results


def _arch_results(compiles: dict[str, Compile], arch: str) -> list[Compile]:
    return [c for key, c in compiles.items() if key.startswith(f"sm_{arch}:")]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", _build.ARCHS)
def test_kernels_compile_with_nvcc(compiles: dict[str, Compile], arch: str) -> None:
    results = _arch_results(compiles, arch)
    assert results
    for result in results:
        assert result.returncode == 0, result.explain()
        assert "warning" not in result.output.lower(), result.explain()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", _build.ARCHS)
def test_kernels_do_not_spill_registers(compiles: dict[str, Compile], arch: str) -> None:
    # every kernel is __launch_bounds__(1024): a spill would mean local memory traffic
    for result in _arch_results(compiles, arch):
        assert result.returncode == 0, result.explain()
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", result.output)
        assert spills, result.explain()
        assert all(s == ("0", "0") for s in spills), result.explain()


def test_binding_compiles_against_torch_headers(compiles: dict[str, Compile]) -> None:
    if "binding" not in compiles:
        pytest.skip("no C++ compiler or CUDA headers for the binding's syntax check")
    result = compiles["binding"]
    assert result.returncode == 0, result.explain()
