"""Kernel builds: clear errors before compiling, and cache keys that change with the inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm_ir._discovery import extension
from vllm_ir._discovery.build_cache import BuildCache


@pytest.fixture(autouse=True)
def _empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(extension.CACHE_ENV, str(tmp_path / "cache"))


def test_a_cached_build_loads_without_a_toolchain(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from torch.utils import cpp_extension

    source = tmp_path / "k.cpp"
    source.write_text("// kernel\n")
    key = f"k-0-torch{torch.__version__}-{extension.machine()}-{extension._digest([source], [])}"
    # a complete entry, as an earlier process published it (with its marker)
    cache = BuildCache(tmp_path / "cache" / "extensions")

    def build(directory: Path) -> Path:
        (directory / "k.so").write_bytes(b"")
        return directory / "k.so"

    library, _ = cache.get_or_build(key, "k.so", build)
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    assert extension.build_extension("k", "0", [source]) == library
    assert loaded == [str(library)]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "k.cpp"
    path.write_text("// kernel\n")
    return path


def test_missing_ninja_is_a_clear_error(monkeypatch, source: Path) -> None:  # type: ignore[no-untyped-def]
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    with pytest.raises(extension.ExtensionBuildError, match=r"needs ninja.*pip install ninja"):
        extension.build_extension("k", "0", [source])


def test_missing_compiler_is_a_clear_error(monkeypatch, source: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(extension.ExtensionBuildError, match="'no-such-compiler' not found"):
        extension.build_extension("k", "0", [source])


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch")
def test_cuda_kernels_need_a_cuda_torch(source: Path) -> None:
    with pytest.raises(extension.ExtensionBuildError, match="not a CUDA build"):
        extension.build_extension("k", "0", [source], with_cuda=True)


def test_cache_key_covers_sources_and_flags(source: Path, tmp_path: Path) -> None:
    base = extension._digest([source], ["-O3"])
    assert extension._digest([source], ["-O3"]) == base
    assert extension._digest([source], ["-O2"]) != base
    source.write_text("// changed\n")
    assert extension._digest([source], ["-O3"]) != base


def test_cache_root_follows_env(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(extension.CACHE_ENV, str(tmp_path))
    assert extension.cache_root() == tmp_path


def test_cache_key_covers_headers_beside_the_sources(source: Path) -> None:
    header = source.parent / "k.cuh"
    header.write_text("// v1\n")
    before = extension._digest([source], [])
    header.write_text("// v2\n")
    assert extension._digest([source], []) != before


def test_one_translation_unit_compiles_a_file_including_every_source(  # type: ignore[no-untyped-def]
    monkeypatch, tmp_path: Path
) -> None:
    from torch.utils import cpp_extension

    sources = [tmp_path / "a.cpp", tmp_path / "b.cpp"]
    for s in sources:
        s.write_text(f"// {s.name}\n")
    compiled: list[str] = []  # each compiled file's text (the build directory goes away)

    def load(**kwargs):  # type: ignore[no-untyped-def]
        compiled.extend(Path(s).read_text() for s in kwargs["sources"])
        library = Path(kwargs["build_directory"]) / "k.so"
        library.write_bytes(b"")
        return str(library)

    monkeypatch.setattr(extension, "_check_toolchain", lambda name, with_cuda: None)
    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(torch.ops, "load_library", lambda path: None)
    key = extension._digest(sources, [])
    extension.build_extension("k", "0", sources, one_translation_unit=True)
    [unity] = compiled
    includes = [line for line in unity.splitlines() if line.startswith("#")]
    assert includes == [f'#include "{s.resolve()}"' for s in sources]
    assert extension._digest(sources, []) == key  # the sources, not the unity file, are the key
    quoted = tmp_path / 'a "b".cpp'
    quoted.write_text("// kernel\n")
    with pytest.raises(extension.ExtensionBuildError, match="holds a quote or a newline"):
        extension.build_extension("k", "0", [quoted], one_translation_unit=True)
    with pytest.raises(ValueError, match="C\\+\\+ sources only"):
        extension.build_extension("k", "0", [tmp_path / "k.cu"], one_translation_unit=True)
