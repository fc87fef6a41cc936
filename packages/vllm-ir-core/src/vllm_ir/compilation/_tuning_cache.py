"""The persistent autotuning cache: measured times per (op, argument metadata).

One JSON file per machine and software environment, under the vllm-ir cache
directory (``VLLM_IR_CACHE_DIR``, default ``~/.cache/vllm_ir``)::

    autotune/<env digest>.json   {"env": {...}, "entries": {<key>: <record>}}
    autotune/<env digest>.lock   flock held while the file is read-modified-written
    autotune/.tmp-<env digest>-*.json   the next file, while a writer holds the lock

The environment (:func:`vllm_ir._discovery.stamps.environment`: the device
and its ISA or compute capability, threads, torch, triton and vllm-ir versions)
names the file, so a tuning measured elsewhere is never read here. An entry's
key covers the op, the candidates' source hashes, every argument's dtype,
shape and strides, the other arguments and the decision margin.

Crash safety, as for kernel builds (:mod:`vllm_ir._discovery.build_cache`): the file is
written to a private temporary file and published with ``os.replace``, so a
killed process leaves the old file or the new one. It may also leave its
temporary file (a full copy of the cache); the next writer removes it. A
writer creates its temporary file under the lock of its environment's file,
and renames or removes it before letting go, so under that lock every
temporary file of the environment is a dead writer's (as
:mod:`vllm_ir._discovery.build_cache` removes stale builds). Temporaries of other
environments (another torch version sharing the directory, or an older
vllm-ir's unprefixed ones) are under locks this writer does not hold: they
are removed only once an hour old (:data:`STALE_TEMPORARY_S`), which no live
write, a few seconds under its lock, comes near. A file that cannot be read
(truncated, not JSON, nested too deeply, another layout) is reported with a
warning and treated as empty: its ops are tuned again and the file rewritten;
a malformed record (times missing, not numbers, no time for its winner) is
reported and dropped the same way. Directories and the file must belong to the
current user and be writable by nobody else, and so must the directories above
(:func:`vllm_ir._discovery.build_cache.check_trusted_parents`). Persisting is only a
cache: when the file cannot be written (a full disk, a read-only directory),
:meth:`TuningCache.put` raises :class:`vllm_ir._discovery.build_cache.BuildCacheError`
and the autotuner keeps the measurement in memory, with a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from vllm_ir._base.logger import get_logger
from vllm_ir._discovery.build_cache import (
    BuildCache,
    BuildCacheError,
    check_private,
    check_trusted_parents,
    ensure_private_dir,
)
from vllm_ir._discovery.extension import cache_root
from vllm_ir._discovery.stamps import environment

__all__ = ["TuningCache", "record_problem"]

logger = get_logger(__name__)

_FORMAT = 1

STALE_TEMPORARY_S = 3600.0
"""Age past which another environment's temporary file is taken for a killed writer's."""


def _number(value: object) -> bool:
    """A finite JSON number (an integer too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def record_problem(record: object) -> str | None:
    """Why a stored record cannot be used (``None``: it can)."""
    if not isinstance(record, dict):
        return "not an object"
    winner, times = record.get("winner"), record.get("times_s")
    if not isinstance(winner, str):
        return "no winner"
    if not isinstance(times, dict) or not times:
        return "times_s is not an object of times"
    if not all(isinstance(k, str) and _number(v) and v >= 0 for k, v in times.items()):
        return "times_s holds something other than non-negative numbers"
    if winner not in times:
        return f"times_s has no time for its winner {winner!r}"
    if not _number(record.get("native_overhead_s", 0.0)):
        return "native_overhead_s is not a number"
    for field in ("tokens", "threads"):
        value = record.get(field, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{field} is not a non-negative integer"
    return None


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:24]


class TuningCache:
    """Records keyed by strings, persisted per environment; safe across processes."""

    def __init__(self, device: torch.device, root: Path | None = None) -> None:
        self.env = environment(device)
        self.root = Path(root) if root is not None else cache_root() / "autotune"
        self.path = self.root / f"{_digest(self.env)}.json"
        self._entries: dict[str, dict[str, Any]] | None = None

    def _read(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        check_private(self.path)
        try:
            try:
                text = self.path.read_text()
            except OSError as e:  # a directory, a FIFO gone, no permission: unreadable
                raise ValueError(f"{type(e).__name__}: {e.strerror or e}") from e
            doc = json.loads(text)
            if doc.get("format") != _FORMAT or doc.get("env") != self.env:
                raise ValueError("another format or environment")
            entries = doc["entries"]
            if not isinstance(entries, dict):
                raise ValueError("malformed entries")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, MemoryError) as e:
            # RecursionError: deeply nested JSON (json recurses once per level)
            logger.warning(
                "autotune cache %s is unreadable (%s); its ops are tuned again and the "
                "file rewritten",
                self.path,
                type(e).__name__ if isinstance(e, RecursionError) else e,
            )
            return {}
        usable = {}
        for key, record in entries.items():
            problem = record_problem(record)
            if problem is None:
                usable[key] = record
            else:
                logger.warning(
                    "autotune cache %s: record %s is malformed (%s); its op is tuned again "
                    "and the record rewritten",
                    self.path,
                    key,
                    problem,
                )
        return usable

    def entries(self) -> Mapping[str, dict[str, Any]]:
        """Every record (read once per instance; :meth:`put` keeps it current)."""
        if self._entries is None:
            if self.root.exists():
                check_trusted_parents(self.root)
                check_private(self.root)
            self._entries = self._read()
        return self._entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries().get(key)

    def digest(self, ops: frozenset[str] | None = None) -> str:
        """A hash of the records (of ``ops`` only, if given): part of the FX cache key."""
        chosen = {k: v for k, v in self.entries().items() if ops is None or v.get("op") in ops}
        return _digest(chosen)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_private_dir(self.root.parent, follow_symlinks=True, check_parents=True)
        ensure_private_dir(self.root)
        with BuildCache(self.root, lock_timeout_s=60).locked(self.path.stem):
            yield

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Add a record: re-read under the lock (others may have added theirs), then
        publish the whole file atomically.

        The record is kept in memory first, so :meth:`get` serves it even when
        writing fails: a :class:`BuildCacheError` saying why (an unsafe path
        raises its :class:`~vllm_ir._discovery.build_cache.UnsafeCacheError` subclass).
        """
        self._entries = {**self.entries(), key: record}
        try:
            self._write(key, record)
        except OSError as e:
            raise BuildCacheError(
                f"cannot write the autotune cache {self.path}: {e.strerror or e}; free space, "
                "make it writable, or set VLLM_IR_CACHE_DIR to a writable directory"
            ) from None

    def _write(self, key: str, record: dict[str, Any]) -> None:
        with self._locked():
            self._remove_stale_temporaries()
            entries = self._read()
            entries[key] = record
            doc = {"format": _FORMAT, "env": self.env, "entries": entries}
            fd, tmp = tempfile.mkstemp(
                dir=self.root, prefix=f".tmp-{self.path.stem}-", suffix=".json"
            )
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(doc, f, indent=1, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        self._entries = entries

    def _remove_stale_temporaries(self) -> None:
        """Remove the temporary files of killed writers; call under the lock.

        This environment's are all stale (their writers held this lock);
        others' only once :data:`STALE_TEMPORARY_S` old (see the module doc).
        """
        mine = f".tmp-{self.path.stem}-"
        now = time.time()
        for tmp in self.root.glob(".tmp-*.json"):
            with contextlib.suppress(OSError):  # gone meanwhile: removed by another writer
                if tmp.name.startswith(mine) or now - tmp.lstat().st_mtime > STALE_TEMPORARY_S:
                    tmp.unlink()
