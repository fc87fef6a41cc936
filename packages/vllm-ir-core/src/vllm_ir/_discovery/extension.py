"""Building a provider's C++/CUDA kernels: JIT with ninja, cached, process safe.

Provider packages ship sources and call :func:`build_extension` on first use
(or ahead of time, from their ``python -m <package> build`` command). The
shared library lands in a cache directory keyed by the package, its version,
torch's version and a hash of the sources and flags, so an upgrade never
loads a stale build. The cache (:mod:`vllm_ir._discovery.build_cache`) builds in a
private directory and publishes atomically under a lock the kernel releases
if its holder dies; it checks each entry (size and sha256) before loading it,
rebuilds a damaged one, and refuses directories or files that anyone but the
current user could have written.

The library registers its ops with ``TORCH_LIBRARY``; it is loaded with
``torch.ops.load_library``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from platform import machine

import torch

from vllm_ir import envs
from vllm_ir._base.logger import get_logger
from vllm_ir._discovery.build_cache import (
    BuildCache,
    BuildCacheError,
    check_private,
    check_trusted_parents,
    ensure_private_dir,
)

__all__ = ["CACHE_ENV", "ExtensionBuildError", "build_extension", "cache_problem", "cache_root"]

CACHE_ENV = envs.VLLM_IR_CACHE_DIR
"""Where built kernels live (default: ``~/.cache/vllm_ir``)."""

_LOCK_TIMEOUT_S = 30 * 60  # a cold CUDA build of several kernels takes minutes

logger = get_logger(__name__)


class ExtensionBuildError(RuntimeError):
    """A provider's kernels cannot be built here; the message says why and what to do."""


def cache_root() -> Path:
    configured = envs.cache_dir()
    return Path(configured) if configured else Path.home() / ".cache" / "vllm_ir"


def cache_problem() -> str | None:
    """Why a build could not use the cache root here, or ``None`` if it could:
    the checks :func:`build_extension` makes of it, creating nothing. A provider's
    ``supports_args`` asks it, so selection falls back instead of the call failing.

    >>> import os; os.environ["VLLM_IR_CACHE_DIR"] = "/tmp/vllm_ir_doc_cache"
    >>> cache_problem() is None
    True
    >>> del os.environ["VLLM_IR_CACHE_DIR"]
    """
    root = cache_root()
    try:
        check_trusted_parents(root)
        if os.path.lexists(root):
            check_private(root, follow_symlinks=True)
    except BuildCacheError as e:
        return str(e)
    except OSError as e:
        return f"cannot inspect build cache directory {root}: {e.strerror}"
    return None


_HEADER_SUFFIXES = {".h", ".hpp", ".cuh", ".inl"}


def _digest(sources: Sequence[Path], flags: Sequence[str]) -> str:
    """Sources, the headers beside them (an edited header must rebuild) and flags."""
    headers = {
        p
        for s in sources
        for p in Path(s).parent.iterdir()
        if p.suffix in _HEADER_SUFFIXES and p.is_file()
    }
    h = hashlib.sha256()
    for path in sorted({*map(Path, sources), *headers}):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update("\0".join(flags).encode())
    return h.hexdigest()[:16]


def _unity_includes(name: str, sources: Sequence[Path], with_cuda: bool) -> list[str]:
    """The paths a one-translation-unit build includes, checked before anything is built."""
    if with_cuda or any(s.suffix == ".cu" for s in sources):
        raise ValueError("one_translation_unit builds C++ sources only, not CUDA ones")
    includes = [str(s.resolve()) for s in sources]
    # an #include "..." takes its path verbatim (no escapes): no quote or newline in it
    unusable = [path for path in includes if '"' in path or "\n" in path]
    if unusable:
        raise ExtensionBuildError(
            f"{name}: source path {unusable[0]!r} holds a quote or a newline, which a "
            "one-translation-unit build cannot include; move the sources or pass "
            "one_translation_unit=False"
        )
    return includes


def _unity_source(directory: Path, name: str, includes: Sequence[str]) -> Path:
    """A file in the build directory that includes every source, in order."""
    unity = directory / f"{name}_unity.cpp"
    lines = [f'#include "{path}"' for path in includes]
    unity.write_text(
        "// one translation unit: torch's headers parsed once\n" + "\n".join(lines) + "\n"
    )
    return unity


def _check_toolchain(name: str, with_cuda: bool) -> None:
    from torch.utils import cpp_extension

    if with_cuda and torch.version.cuda is None:
        raise ExtensionBuildError(
            f"{name} holds CUDA kernels, but this torch ({torch.__version__}) is not a "
            "CUDA build; install a CUDA build of torch"
        )
    # ninja installed beside this interpreter counts even if its bin/ is not on PATH
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    if not cpp_extension.is_ninja_available():
        raise ExtensionBuildError(
            f"building {name} needs ninja, which is not on PATH; `pip install ninja`"
        )
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise ExtensionBuildError(
            f"building {name} needs a C++ compiler ({compiler!r} not found); install one "
            "(e.g. g++) or set CXX"
        )
    if with_cuda and cpp_extension.CUDA_HOME is None:
        raise ExtensionBuildError(
            f"building {name} needs the CUDA toolkit (nvcc), which was not found; "
            "install it or set CUDA_HOME"
        )


def build_extension(
    name: str,
    version: str,
    sources: Sequence[Path],
    *,
    extra_cflags: Sequence[str] = (),
    extra_cuda_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    with_cuda: bool = False,
    one_translation_unit: bool = False,
    verbose: bool = False,
) -> Path:
    """Build (or reuse) the shared library and load it into ``torch.ops``.

    Returns the library's path. Raises :class:`ExtensionBuildError` when a
    tool is missing, before trying to compile.

    ``one_translation_unit=True`` compiles C++ ``sources`` as one file that
    includes them all (a unity build): torch's headers are parsed once
    instead of once per source, about a third of the CPU time for a few
    kernel files. The sources must then not define the same internal name
    twice (the compiler says so). The cache key is the same either way.
    """
    sources = [Path(s) for s in sources]
    includes = _unity_includes(name, sources, with_cuda) if one_translation_unit else None
    flags = [*extra_cflags, *extra_cuda_cflags, *extra_ldflags]
    # the machine is in the key; instruction-set flags (e.g. -mavx512f) are in the digest
    key = f"{name}-{version}-torch{torch.__version__}-{machine()}-{_digest(sources, flags)}"

    def build(directory: Path) -> Path:
        _check_toolchain(name, with_cuda)
        logger.info("building %s for %s (first use; cached afterwards)", name, key)
        from torch.utils import cpp_extension

        compiled = sources if includes is None else [_unity_source(directory, name, includes)]
        # torch's own lock (FileBaton) lives in this private directory: uncontended
        built = cpp_extension.load(
            name=name,
            sources=[str(s) for s in compiled],
            extra_cflags=list(extra_cflags),
            extra_cuda_cflags=list(extra_cuda_cflags),
            extra_ldflags=list(extra_ldflags),
            build_directory=str(directory),
            with_cuda=with_cuda,
            is_python_module=False,
            verbose=verbose,
        )
        return Path(str(built))

    try:
        ensure_private_dir(cache_root(), follow_symlinks=True, check_parents=True)
        cache = BuildCache(cache_root() / "extensions", lock_timeout_s=_LOCK_TIMEOUT_S)
        # a cached build loads without compiler or ninja; a fresh one was loaded by build()
        library, _built = cache.get_or_build(
            key, f"{name}.so", build, lambda path: torch.ops.load_library(str(path))
        )
    except BuildCacheError as e:
        raise ExtensionBuildError(str(e)) from e
    return library
