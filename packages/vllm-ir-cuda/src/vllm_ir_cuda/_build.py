"""Building and loading the CUDA kernels, once per process, on first use.

:func:`load` compiles ``csrc/`` with :func:`vllm_ir.provider.build_extension`
(JIT with ninja, cached per package version, torch version, sources and
flags; process safe) and loads the library, whose ``TORCH_LIBRARY_IMPL``
registers the CUDA implementations of ``torch.ops.vllm_ir_cuda.*``. Nothing
here runs at import or provider discovery: :mod:`vllm_ir_cuda.ops` calls
:func:`load` on the first kernel call with CUDA tensors, and
``python -m vllm_ir_cuda build`` calls it ahead of time.

The flags live here so that the tests compile the kernels with exactly the
flags of the build (see :func:`nvcc_command`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from vllm_ir_cuda._version import __version__

__all__ = [
    "ARCHS",
    "CSRC",
    "LIBRARY_NAME",
    "cuda_flags",
    "cxx_flags",
    "headers",
    "is_loaded",
    "kernel_sources",
    "load",
    "nvcc_command",
    "sources",
]

__vllm_ir_caches__ = ("_library", "_lock")
"""Built or loaded on first use: not part of the impls' code fingerprint."""

CSRC = Path(__file__).parent / "csrc"
"""The CUDA (``*.cu``, ``*.cuh``, ``*.h``) and binding (``binding.cpp``) sources."""

LIBRARY_NAME = "vllm_ir_cuda_kernels"

ARCHS: tuple[str, ...] = ("80", "90")
"""Compute capabilities built to machine code (A100, H100/H200); the last one is
also embedded as PTX, which newer GPUs compile at load time."""

_HEADER_SUFFIXES = (".cuh", ".h")

_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # a child forked while another thread builds would inherit this lock held
    # by a thread it does not have
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
_library: Path | None = None


def kernel_sources() -> list[Path]:
    """The ``.cu`` translation units: pure CUDA, no torch headers."""
    return sorted(CSRC.glob("*.cu"))


def headers() -> list[Path]:
    return sorted(p for p in CSRC.iterdir() if p.suffix in _HEADER_SUFFIXES)


def sources() -> list[Path]:
    """Every translation unit of the library: the kernels and the torch binding."""
    return [*kernel_sources(), CSRC / "binding.cpp"]


def _headers_digest() -> str:
    # build_extension's cache key hashes the translation units only: the
    # headers they include enter it through this define
    h = hashlib.sha256()
    for path in headers():
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def gencode_flags(archs: Sequence[str] = ARCHS, *, ptx: bool = True) -> list[str]:
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    if ptx:
        flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


def cuda_flags(archs: Sequence[str] = ARCHS, *, ptx: bool = True) -> list[str]:
    """nvcc flags the build adds to torch's own (``COMMON_NVCC_FLAGS``, ``-fPIC``)."""
    return [
        "-O3",
        "-std=c++20",
        "-lineinfo",
        f"-DVLLM_IR_CUDA_HEADERS={_headers_digest()}",
        *gencode_flags(archs, ptx=ptx),
    ]


def cxx_flags() -> list[str]:
    return ["-O3", f"-DVLLM_IR_CUDA_HEADERS={_headers_digest()}"]


def nvcc_command(nvcc: str, source: Path, output: Path, archs: Sequence[str] = ARCHS) -> list[str]:
    """``nvcc -c`` of one kernel source with the build's flags for ``archs``.

    Torch's include directories are left out on purpose: the kernels must
    compile without them.
    """
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    return [
        nvcc,
        "-c",
        str(source),
        "-o",
        str(output),
        *COMMON_NVCC_FLAGS,
        "-Xcompiler",
        "-fPIC",
        *cuda_flags(archs, ptx=False),
    ]


def is_loaded() -> bool:
    return _library is not None


def load(*, verbose: bool = False) -> Path:
    """Build the kernels (or reuse the cached build) and load them; returns the library.

    Raises :class:`vllm_ir.provider.ExtensionBuildError` when they cannot be
    built here (no CUDA build of torch, no nvcc, no ninja ...), before compiling.
    """
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            from vllm_ir.provider import build_extension

            _library = build_extension(
                LIBRARY_NAME,
                __version__,
                sources(),
                extra_cflags=cxx_flags(),
                extra_cuda_cflags=cuda_flags(),
                with_cuda=True,
                verbose=verbose,
            )
    return _library
