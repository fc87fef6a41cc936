"""Building and loading the C++ kernels: JIT, cached, on first use.

The sources ship inside the package (``vllm_ir_cpu/csrc``) and are compiled by
:func:`vllm_ir.provider.build_extension` into ``$VLLM_IR_CACHE_DIR/extensions``
(default ``~/.cache/vllm_ir``), keyed by this package's version, torch's
version, the sources and the flags. The flags name the instruction set picked
for this CPU, so a cache shared between machines (CI) never hands an AVX-512
build to an AVX2-only CPU.

Nothing here runs at import: :func:`build` is called by the first real kernel
call, by the compiler's lowering when it traces an impl, or by
``python -m vllm_ir_cpu build``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from vllm_ir.provider import get_logger

from vllm_ir_cpu._version import __version__

__all__ = [
    "LIBRARY_NAME",
    "SOURCES",
    "build",
    "compile_flags",
    "is_loaded",
    "toolchain_problem",
]

__vllm_ir_caches__ = ("_library", "_lock")
"""Built or loaded on first use: not part of the impls' code fingerprint."""

LIBRARY_NAME = "vllm_ir_cpu_kernels"
"""The shared library's name (and the build cache key's prefix)."""

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES: tuple[Path, ...] = (
    CSRC / "layernorm.cpp",
    CSRC / "quant.cpp",
    CSRC / "activation.cpp",
    CSRC / "rotary.cpp",
)
"""The kernels' translation units; the headers beside them (``common.h``) are in the
build key too."""

# The instruction sets of at::vec that torch itself dispatches to on x86, with
# the flags and macros Inductor's C++ backend uses for them.
_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "AVX512": (
        "-mavx512f",
        "-mavx512dq",
        "-mavx512vl",
        "-mavx512bw",
        "-mfma",
        "-mf16c",
        "-DCPU_CAPABILITY_AVX512",
    ),
    "AVX2": ("-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2"),
}

logger = get_logger("vllm_ir.cpu_c")

_lock = threading.Lock()
_library: Path | None = None


def _after_fork_in_child() -> None:
    # a child forked while another thread builds would inherit this lock held
    # by a thread it does not have (the build's file lock still serializes builds)
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def cpu_capability() -> str:
    """The vector ISA torch uses on this CPU (``ATEN_CPU_CAPABILITY`` overrides)."""
    return str(torch.backends.cpu.get_cpu_capability())


def compile_flags(capability: str | None = None) -> list[str]:
    """C++ flags: -O3, OpenMP, and the vector ISA for ``capability``.

    An ISA torch does not vectorize for here (``DEFAULT``, or a non-x86 CPU)
    gets at::vec's portable fallback, which the compiler vectorizes as it can.
    """
    isa = _ISA_FLAGS.get(capability or cpu_capability(), ())
    return ["-O3", "-fopenmp", *isa]


def _ninja_dir() -> str | None:
    """The ``bin`` directory of the ``ninja`` pip package, if installed."""
    try:
        import ninja  # type: ignore[import-not-found]
    except ImportError:
        return None
    directory = getattr(ninja, "BIN_DIR", None)
    return str(directory) if directory else None


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch runs ``ninja`` from PATH; an unactivated venv has its ninja elsewhere."""
    directory = _ninja_dir()
    if shutil.which("ninja") is not None or directory is None:
        yield
        return
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([directory, old]) if old else directory
    try:
        yield
    finally:
        os.environ["PATH"] = old


@functools.cache
def toolchain_problem() -> str | None:
    """Why the kernels cannot be built here, or ``None`` if they can.

    A cheap check (PATH lookups, no subprocess), so the IR impls' argument
    predicates can decline, and dispatch fall back to native, on a machine
    without a compiler instead of failing on the first call.
    """
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return (
            f"no C++ compiler ({compiler!r} not found on PATH); install one (e.g. g++) or set CXX"
        )
    if shutil.which("ninja") is None and _ninja_dir() is None:
        return "ninja is not installed; `pip install ninja`"
    return None


def is_loaded() -> bool:
    """Whether the kernels are loaded into ``torch.ops.vllm_ir_cpu`` in this process."""
    return _library is not None


def build(*, verbose: bool = False) -> Path:
    """Build the kernels (or reuse the cached build), load them, return the library path.

    Idempotent and thread safe; concurrent processes are serialized by the
    build cache's file lock. Raises :class:`vllm_ir.provider.ExtensionBuildError`
    when the toolchain is missing.
    """
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is not None:
            return _library
        from vllm_ir.provider import build_extension

        # the C++ side only implements ops: their schemas must exist first
        from vllm_ir_cpu import library as _schemas  # noqa: F401

        flags = compile_flags()
        with _ninja_on_path():
            path = build_extension(
                LIBRARY_NAME,
                __version__,
                SOURCES,
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],
                # torch's headers parsed once, not per file: 12 CPU-seconds instead of 40
                one_translation_unit=True,
                verbose=verbose,
            )
        logger.debug("cpu_c kernels loaded from %s", path)
        _library = path
        return path
