"""The kernel build cache under crashes, damage and other users' files."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from vllm_ir._discovery import build_cache, extension
from vllm_ir._discovery.build_cache import MARKER, BuildCache, BuildCacheError, UnsafeCacheError


def _writer(content: bytes):  # type: ignore[no-untyped-def]
    def build(directory: Path) -> Path:
        path = directory / "lib.so"
        path.write_bytes(content)
        return path

    return build


def test_build_publishes_once_then_loads_from_cache(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache")
    loaded: list[Path] = []
    path, built = cache.get_or_build("k", "lib.so", _writer(b"v1"), loaded.append)
    assert built
    assert path.read_bytes() == b"v1"
    assert not loaded
    assert (path.parent / MARKER).exists()
    again, built = cache.get_or_build("k", "lib.so", _writer(b"v2"), loaded.append)
    assert (again, built) == (path, False)
    assert loaded == [path]
    assert again.read_bytes() == b"v1"
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == oct(0o700)


def test_failed_build_publishes_nothing(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)

    def failing(directory: Path) -> Path:
        (directory / "lib.so").write_bytes(b"half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        cache.get_or_build("k", "lib.so", failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.lock"]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda entry: os.truncate(entry / "lib.so", 2), "truncated"),
        (lambda entry: (entry / "lib.so").write_bytes(b"evil-bytes!!!!"), "sha256"),
        (lambda entry: (entry / MARKER).unlink(), "no completion marker"),
        (lambda entry: (entry / MARKER).write_text("{"), "unreadable"),
        # json recurses per level: RecursionError, not a crash
        (lambda entry: (entry / MARKER).write_text("[" * 100_000 + "]" * 100_000), "unreadable"),
    ],
)
def test_damaged_entry_is_quarantined_and_rebuilt(tmp_path: Path, caplog, damage, reason) -> None:  # type: ignore[no-untyped-def]
    cache = BuildCache(tmp_path)
    path, _ = cache.get_or_build("k", "lib.so", _writer(b"original-bytes"))
    damage(path.parent)
    loaded: list[Path] = []
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        again, built = cache.get_or_build("k", "lib.so", _writer(b"rebuilt-bytes"), loaded.append)
    assert built
    assert not loaded
    assert again.read_bytes() == b"rebuilt-bytes"
    assert reason in caplog.text
    assert "moved to" in caplog.text
    assert len(list((tmp_path / ".quarantine").iterdir())) == 1


def test_planted_file_without_marker_is_never_loaded(tmp_path: Path) -> None:
    # what r07 planted: the right name in the right place, no marker
    entry = tmp_path / "k"
    entry.mkdir(mode=0o700)
    (entry / "lib.so").write_bytes(b"planted")
    loaded: list[Path] = []
    path, built = BuildCache(tmp_path).get_or_build("k", "lib.so", _writer(b"ours"), loaded.append)
    assert built
    assert not loaded
    assert path.read_bytes() == b"ours"


@pytest.mark.parametrize("where", ["root", "entry", "file"])
def test_writable_by_others_is_refused(tmp_path: Path, where: str) -> None:
    cache = BuildCache(tmp_path / "cache")
    path, _ = cache.get_or_build("k", "lib.so", _writer(b"x"))
    target = {"root": tmp_path / "cache", "entry": path.parent, "file": path}[where]
    target.chmod(0o777 if where != "file" else 0o666)
    with pytest.raises(UnsafeCacheError) as info:
        cache.get_or_build("k", "lib.so", _writer(b"y"), lambda p: pytest.fail("loaded"))
    message = str(info.value)
    assert str(target) in message
    assert "chmod go-w" in message
    assert "VLLM_IR_CACHE_DIR" in message
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_entry_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)
    path, _ = cache.get_or_build("k", "lib.so", _writer(b"x"))
    os.chown(path.parent, 12345, 12345)
    with pytest.raises(UnsafeCacheError, match="owned by uid 12345, not by you"):
        cache.get_or_build("k", "lib.so", _writer(b"y"), lambda p: pytest.fail("loaded"))


def test_extension_refuses_a_world_writable_cache_root(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a shared temp-like dir (r07)
    monkeypatch.setenv(extension.CACHE_ENV, str(shared))
    with pytest.raises(extension.ExtensionBuildError, match=f"refusing build cache path {shared}"):
        extension.build_extension("never_built", "0.1", [Path(__file__)])


def _refuse_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every open for writing under the cache fail as on a read-only mount."""
    real_open = os.open

    def open_(path, flags, *args):  # type: ignore[no-untyped-def]
        if flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(build_cache.os, "open", open_)


@pytest.mark.parametrize("lock_file", [True, False])
def test_a_read_only_cache_serves_its_verified_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lock_file: bool
) -> None:
    """A pre-built, read-only cache (an image layer, a read-only mount) loads."""
    cache = BuildCache(tmp_path / "cache")
    path, _ = cache.get_or_build("k", "lib.so", _writer(b"prebuilt"))
    if not lock_file:
        (tmp_path / "cache" / "k.lock").unlink()
    _refuse_writes(monkeypatch)
    loaded: list[Path] = []
    again, built = cache.get_or_build("k", "lib.so", _writer(b"never"), loaded.append)
    assert (again, built, loaded) == (path, False, [path])


def test_a_read_only_cache_without_the_entry_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = BuildCache(tmp_path / "cache")
    path, _ = cache.get_or_build("k", "lib.so", _writer(b"prebuilt"))
    os.truncate(path, 2)
    _refuse_writes(monkeypatch)
    for key in ("k", "other"):
        with pytest.raises(BuildCacheError, match="is read-only and its entry") as info:
            cache.get_or_build(key, "lib.so", _writer(b"never"), lambda p: pytest.fail("loaded"))
        assert "VLLM_IR_CACHE_DIR" in str(info.value)
    assert path.read_bytes() == b"pr"  # nothing was moved or rewritten


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod a-w")
def test_a_chmod_read_only_cache_loads(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache")
    path, _ = cache.get_or_build("k", "lib.so", _writer(b"prebuilt"))
    files = [path, path.parent / MARKER, tmp_path / "cache" / "k.lock"]
    dirs = [path.parent, tmp_path / "cache"]
    for p in [*files, *dirs]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        assert cache.get_or_build("k", "lib.so", _writer(b"never")) == (path, False)
    finally:
        for p in dirs:
            p.chmod(0o700)


def test_a_cache_under_a_parent_others_can_write_is_refused(tmp_path: Path) -> None:
    """Whoever can rename the cache root's parent entries can swap the whole cache."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone can rename our cache away
    cache = BuildCache(shared / "cache")
    with pytest.raises(UnsafeCacheError, match="without the sticky bit") as info:
        cache.get_or_build("k", "lib.so", _writer(b"x"), lambda p: pytest.fail("loaded"))
    assert str(shared) in str(info.value)
    assert "\n" not in str(info.value)
    shared.chmod(0o1777)  # sticky, like /tmp: only the owner may rename our cache
    assert cache.get_or_build("k", "lib.so", _writer(b"x"))[1]
    # through a symbolic link too: the resolved path's parents count
    link = tmp_path / "link"
    link.symlink_to(shared / "cache")
    shared.chmod(0o777)
    with pytest.raises(UnsafeCacheError, match="without the sticky bit"):
        BuildCache(link).get_or_build("k", "lib.so", _writer(b"x"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a link to another user")
def test_a_cache_root_through_another_users_link_is_refused(tmp_path: Path) -> None:
    """In a sticky /tmp-like directory, a link's owner can still re-point it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    ours = tmp_path / "ours"
    link = shared / "cache"
    link.symlink_to(ours)
    os.lchown(link, 12345, 12345)
    with pytest.raises(UnsafeCacheError, match="symbolic link owned by uid 12345"):
        BuildCache(link).get_or_build("k", "lib.so", _writer(b"x"))
    assert not ours.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_cache_under_another_users_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 12345, 12345)
    monkeypatch.setenv(extension.CACHE_ENV, str(theirs / "cache"))
    with pytest.raises(extension.ExtensionBuildError, match="owned by uid 12345"):
        extension.build_extension("never_built", "0.1", [Path(__file__)])


def test_lock_wait_is_bounded_and_names_the_lock(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path, lock_timeout_s=0.3)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(BuildCacheError, match=f"lock {tmp_path / 'k.lock'}"):
            cache.get_or_build("k", "lib.so", _writer(b"x"))
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead: its lock went with it
    assert cache.get_or_build("k", "lib.so", _writer(b"x"))[1]


_HOLD_LOCK = """
import sys, time
from pathlib import Path
from vllm_ir._discovery.build_cache import BuildCache
with BuildCache(Path(sys.argv[1])).locked("k"):
    print("locked", flush=True)
    time.sleep(60)
"""

# A build that writes half its output and stalls, as a compiler does when the
# process is killed (OOM killer, preemption) mid-way.
_STALLED_BUILD = """
import sys, time
from pathlib import Path
from vllm_ir._discovery.build_cache import BuildCache
def build(directory):
    (directory / "lib.so").write_bytes(b"half")
    print("building", flush=True)
    time.sleep(60)
BuildCache(Path(sys.argv[1])).get_or_build("k", "lib.so", build)
"""

_NEXT_PROCESS = """
import sys
from pathlib import Path
from vllm_ir._discovery.build_cache import BuildCache
def build(directory):
    (directory / "lib.so").write_bytes(b"complete")
    return directory / "lib.so"
path, built = BuildCache(Path(sys.argv[1]), lock_timeout_s=20).get_or_build("k", "lib.so", build)
print(built, path.read_bytes().decode())
"""


def test_build_killed_mid_way_does_not_block_or_poison_the_next_process(tmp_path: Path) -> None:
    build = subprocess.Popen(
        [sys.executable, "-c", _STALLED_BUILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert build.stdout is not None
    assert build.stdout.readline().strip() == "building"
    os.killpg(build.pid, signal.SIGKILL)
    build.wait()
    assert list(tmp_path.glob(".building-k-*")), "the killed build left its directory"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _NEXT_PROCESS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "complete"]
    assert time.monotonic() - start < 30
    assert not list(tmp_path.glob(".building-k-*"))  # cleaned up under the lock


def test_reader_waits_for_a_build_in_progress(tmp_path: Path) -> None:
    slow = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from vllm_ir._discovery.build_cache import BuildCache
        def build(directory):
            print("building", flush=True)
            time.sleep(1.5)
            (directory / "lib.so").write_bytes(b"complete")
            return directory / "lib.so"
        BuildCache(Path(sys.argv[1])).get_or_build("k", "lib.so", build)
        """
    )
    builder = subprocess.Popen(
        [sys.executable, "-c", slow, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert builder.stdout is not None
    assert builder.stdout.readline().strip() == "building"
    loaded: list[bytes] = []
    _path, built = BuildCache(tmp_path).get_or_build(
        "k", "lib.so", _writer(b"second"), lambda p: loaded.append(p.read_bytes())
    )
    builder.wait(timeout=30)
    assert not built
    assert loaded == [b"complete"]
