"""A crash-safe, owner-checked cache of built files, one entry per key.

Layout under the cache directory (created ``0700``)::

    <key>/                     a published entry: the file and its marker
    <key>/COMPLETE.json        written before publishing: file name, size, sha256
    <key>.lock                 held (``flock``) while an entry is checked, built or loaded
    .building-<key>-*/         private directories of builds in progress
    .quarantine/<key>-<time>/  entries that failed their check, kept for inspection

Why each piece:

- A build writes into a private temporary directory and is published with one
  ``os.replace`` of that directory, its marker already inside: a process killed
  at any point leaves either no entry or a complete one, never a half-written
  file that a later process would ``dlopen`` (and die of ``SIGBUS``).
- The lock is ``fcntl.flock``, which the kernel releases when its holder dies,
  so a killed build never blocks later processes; the lock file is opened
  close-on-exec, so a compiler left running does not hold it either. The
  existence check runs under the lock, so a reader waits for a build in
  progress instead of racing it.
- An entry whose file does not match its marker (truncated, replaced, or left
  by an older vllm-ir without markers) is moved to ``.quarantine`` and rebuilt,
  with a warning.
- Loading a library runs its code: every directory and file used must belong
  to the current user and be writable by nobody else, or the cache is refused
  with an error that names the path and the fix. The directories above the
  cache root count too (:func:`check_trusted_parents`): whoever can rename
  entries of a parent can swap the whole cache for their own tree between the
  checks and the ``dlopen``, so each parent must be owned by the current user
  or root and, if group or others can write it, be sticky (like ``/tmp``).
- A cache that cannot be written (a read-only image layer or mount) still
  serves the entries it holds, once they are verified: the lock is then taken
  shared on an existing lock file, or skipped when there is none (nothing can
  be written, so nothing can race). A missing or damaged entry in such a cache
  is a :class:`BuildCacheError` naming the directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from vllm_ir._base.logger import get_logger

__all__ = [
    "MARKER",
    "BuildCache",
    "BuildCacheError",
    "UnsafeCacheError",
    "check_private",
    "check_trusted_parents",
    "ensure_private_dir",
    "refuse_unless_private",
]

MARKER = "COMPLETE.json"
"""The completion marker inside a published entry."""

logger = get_logger(__name__)


_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
"""Why a lock file of an otherwise readable cache cannot be opened for writing."""


class BuildCacheError(RuntimeError):
    """The cache cannot be used as asked; the message says why and what to do."""


class UnsafeCacheError(BuildCacheError):
    """A cache path that someone else could have written; nothing was loaded from it."""


def check_private(path: Path, *, follow_symlinks: bool = False) -> os.stat_result:
    """Raise :class:`UnsafeCacheError` unless ``path`` is ours and writable only by us."""
    st = os.stat(path) if follow_symlinks else os.lstat(path)
    fix = "or set VLLM_IR_CACHE_DIR to a directory only you can write"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(
            f"refusing build cache path {path}: it is a symbolic link; remove it, {fix}"
        )
    refuse_unless_private(st, path)
    return st


def refuse_unless_private(
    st: os.stat_result,
    path: Path,
    *,
    what: str = "build cache path",
    harm: str = "loading from it would run their code",
    planted: str = "anyone could plant code in it",
) -> None:
    """The rule of every path under the cache root (the build cache's and the tuning
    cache's): ``st``, of ``path``, is the current user's and writable by nobody else.
    ``harm`` and ``planted`` say what another writer could do with it."""
    fix = "or set VLLM_IR_CACHE_DIR to a directory only you can write"
    if st.st_uid != os.getuid():
        raise UnsafeCacheError(
            f"refusing {what} {path}: it is owned by uid {st.st_uid}, not by you "
            f"(uid {os.getuid()}), and {harm}; remove it, {fix}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(
            f"refusing {what} {path}: it is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}), so {planted}; "
            f"`chmod go-w {path}` if its contents are trusted, else remove it, {fix}"
        )


def check_trusted_parents(path: Path) -> None:
    """Raise :class:`UnsafeCacheError` if another user could replace ``path`` from above.

    Every existing directory above ``path``, both as written and with symbolic
    links resolved, must be owned by the current user or root, and must be
    sticky if group or others can write it: otherwise its owner or writers can
    rename ``path`` away and put their own tree in its place after it was
    checked. A symbolic link on the way (``path`` itself included) must be
    the current user's or root's: its owner can re-point it. ``/tmp`` (root,
    sticky) passes; a ``0777`` directory without the sticky bit, or one owned
    by another user, does not.
    """
    absolute = Path(os.path.abspath(path))
    parents = {*absolute.parents, *Path(os.path.realpath(path)).parents}
    fix = "set VLLM_IR_CACHE_DIR to a directory whose parents only you (or root) can write"
    for component in (*reversed(absolute.parents), absolute):
        # a link's owner may point it elsewhere at any time (in /tmp too: sticky
        # protects the name from others, not from its owner)
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(component)
            if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.getuid()):
                raise UnsafeCacheError(
                    f"refusing cache directory {path}: {component} is a symbolic link owned "
                    f"by uid {st.st_uid}, who could point it at their own code; {fix}"
                )
    for parent in sorted(parents, key=lambda p: len(p.parts)):
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            continue  # created by us below
        if st.st_uid not in (0, os.getuid()):
            raise UnsafeCacheError(
                f"refusing cache directory {path}: its parent {parent} is owned by uid "
                f"{st.st_uid}, who could swap the cache for their own code; {fix}"
            )
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not st.st_mode & stat.S_ISVTX:
            raise UnsafeCacheError(
                f"refusing cache directory {path}: its parent {parent} is writable by group "
                f"or others without the sticky bit (mode {stat.S_IMODE(st.st_mode):o}), so "
                f"anyone could swap the cache for their own code; `chmod +t {parent}` or "
                f"`chmod go-w {parent}`, or {fix}"
            )


def ensure_private_dir(
    path: Path, *, follow_symlinks: bool = False, check_parents: bool = False
) -> Path:
    """Create ``path`` (mode ``0700``) if missing, then :func:`check_private` it.

    ``check_parents`` also applies :func:`check_trusted_parents` (for a cache
    root; below a checked root every directory is private already).
    """
    if check_parents:
        check_trusted_parents(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise BuildCacheError(
            f"cannot create build cache directory {path}: {e.strerror}; "
            "set VLLM_IR_CACHE_DIR to a writable directory"
        ) from None
    st = check_private(path, follow_symlinks=follow_symlinks)
    if not stat.S_ISDIR(st.st_mode):
        raise BuildCacheError(f"build cache path {path} is not a directory; remove it")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BuildCache:
    """Entries built at most once per key, published atomically, checked before use.

    ``root`` is created ``0700``; an existing one must be the current
    user's and writable by nobody else. ``lock_timeout_s`` bounds the wait for
    another process building the same key (a dead one never holds the lock).
    """

    def __init__(self, root: Path, *, lock_timeout_s: float = 30 * 60) -> None:
        self.root = Path(root)
        self.lock_timeout_s = lock_timeout_s

    @contextlib.contextmanager
    def locked(self, key: str, *, read_only_ok: bool = False) -> Iterator[bool]:
        """Hold ``<key>.lock``: a kernel ``flock``, released if this process dies.

        Yields whether the cache can be written. When the lock file cannot be
        created or opened for writing (a read-only cache), ``read_only_ok``
        takes a shared lock on an existing lock file instead, or none when
        there is no lock file, and yields ``False``; without it, that is a
        :class:`BuildCacheError`.
        """
        path = self.root / f"{key}.lock"
        fd, mode = self._open_lock(path, read_only_ok)
        if fd is None:
            yield False  # nobody can write here: there is nothing to serialize
            return
        try:
            deadline = time.monotonic() + self.lock_timeout_s
            waited = False
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise BuildCacheError(
                            f"waited {self.lock_timeout_s:.0f} s for the lock {path}, held by "
                            f"another live process building {key}; if that build hangs, "
                            "stop it (a lock of a dead process is released automatically)"
                        ) from None
                    if not waited:
                        logger.info("waiting for another process building %s (%s)", key, path)
                        waited = True
                    time.sleep(0.1)
            yield mode == fcntl.LOCK_EX
        finally:
            os.close(fd)  # releases the flock

    def _open_lock(self, path: Path, read_only_ok: bool) -> tuple[int | None, int]:
        """The lock file's fd and flock mode; ``(None, _)``: read-only, no lock file."""
        fix = f"make {self.root} writable or set VLLM_IR_CACHE_DIR to a writable directory"
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(path, flags, 0o600), fcntl.LOCK_EX
        except OSError as e:
            if not read_only_ok or e.errno not in _READ_ONLY_ERRNOS:
                raise BuildCacheError(
                    f"cannot open the lock file {path}: {e.strerror}; {fix}"
                ) from None
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), fcntl.LOCK_SH
        except FileNotFoundError:
            return None, fcntl.LOCK_SH
        except OSError as e:
            raise BuildCacheError(
                f"cannot open the lock file {path}: {e.strerror}; {fix}"
            ) from None

    def get_or_build(
        self,
        key: str,
        filename: str,
        build: Callable[[Path], Path],
        load: Callable[[Path], None] | None = None,
    ) -> tuple[Path, bool]:
        """The checked entry's file for ``key``, building and publishing it if needed.

        ``build(directory)`` writes the file into a fresh private directory and
        returns its path (it may also load it). ``load(path)`` is called, under
        the lock, for an entry found in the cache. Returns ``(path, built)``.
        """
        if "/" in key or key.startswith("."):
            raise ValueError(f"build cache key must be a plain name, got {key!r}")
        ensure_private_dir(self.root, follow_symlinks=True, check_parents=True)
        entry = self.root / key
        with self.locked(key, read_only_ok=True) as writable:
            problem = self._problem(entry, filename)
            if problem is None:
                path = entry / filename
                if load is not None:
                    load(path)
                return path, False
            if not writable:
                raise BuildCacheError(
                    f"the build cache {self.root} is read-only and its entry {key} is "
                    f"{'missing' if problem == 'missing' else f'unusable ({problem})'}; make "
                    "it writable or set VLLM_IR_CACHE_DIR to a writable directory"
                )
            if entry.exists() or entry.is_symlink():
                self._quarantine(entry, problem)
            self._remove_stale_builds(key)
            return self._build_and_publish(key, entry, filename, build), True

    def _problem(self, entry: Path, filename: str) -> str | None:
        """Why ``entry`` cannot be used (``None``: it can); unsafe paths raise."""
        if not entry.exists() and not entry.is_symlink():
            return "missing"
        check_private(entry)
        marker = entry / MARKER
        if not marker.exists():
            return "it has no completion marker (an interrupted or older build)"
        check_private(marker)
        try:
            record = json.loads(marker.read_text())
            size, digest = int(record["size"]), str(record["sha256"])
            recorded_name = str(record["file"])
        except (ValueError, KeyError, TypeError, RecursionError, MemoryError):
            # RecursionError: deeply nested JSON (json recurses once per level)
            return "its completion marker is unreadable"
        if recorded_name != filename:
            return f"its marker names {recorded_name!r}, not {filename!r}"
        path = entry / filename
        if not path.exists():
            return f"{filename} is missing"
        st = check_private(path)
        if not stat.S_ISREG(st.st_mode):
            return f"{filename} is not a regular file"
        if st.st_size != size:
            return f"{filename} has {st.st_size} bytes, its marker says {size} (truncated?)"
        if _sha256(path) != digest:
            return f"{filename} does not match the sha256 in its marker"
        return None

    def _quarantine(self, entry: Path, problem: str) -> None:
        quarantine = ensure_private_dir(self.root / ".quarantine")
        target = quarantine / f"{entry.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        os.replace(entry, target)
        logger.warning(
            "build cache entry %s is unusable (%s): moved to %s and rebuilding",
            entry,
            problem,
            target,
        )

    def _remove_stale_builds(self, key: str) -> None:
        # we hold the key's lock: a build directory of this key is a dead process's
        for stale in self.root.glob(f".building-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)

    def _build_and_publish(
        self, key: str, entry: Path, filename: str, build: Callable[[Path], Path]
    ) -> Path:
        workdir = Path(tempfile.mkdtemp(prefix=f".building-{key}-", dir=self.root))  # 0700
        try:
            built = Path(build(workdir))
            if built.parent != workdir:
                raise BuildCacheError(f"build of {key} wrote {built}, outside {workdir}")
            if built.name != filename:
                os.replace(built, workdir / filename)
            path = workdir / filename
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            record = {"file": filename, "size": path.stat().st_size, "sha256": _sha256(path)}
            marker = workdir / MARKER
            with open(marker, "w") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(workdir)
            os.replace(workdir, entry)  # the publication: atomic, marker included
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return entry / filename
