"""The persistent autotuning cache: measured times per (op, argument metadata).

One JSON file per machine and software environment, under the vllm-ir cache
directory (``VLLM_IR_CACHE_DIR``, default ``~/.cache/vllm_ir``)::

    autotune/<env digest>.json   {"env": {...}, "entries": {<key>: <record>}}
    autotune/<env digest>.lock   flock held while the file is read-modified-written

The environment (device name, torch and triton versions, vllm-ir's version)
names the file, so a tuning measured elsewhere is never read here. An entry's
key covers the op, the candidates' source hashes, every argument's dtype,
shape and strides, the other arguments and the decision margin.

Crash safety, as for kernel builds (:mod:`vllm_ir.build_cache`): the file is
written to a private temporary file and published with ``os.replace``, so a
killed process leaves the old file or the new one. A file that cannot be read
(truncated, not JSON, another layout) is reported with a warning and treated
as empty: its ops are tuned again and the file rewritten. Directories and the
file must belong to the current user and be writable by nobody else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from vllm_ir._version import __version__
from vllm_ir.build_cache import BuildCache, check_private, ensure_private_dir
from vllm_ir.extension import cache_root
from vllm_ir.logger import get_logger

__all__ = ["TuningCache", "environment"]

logger = get_logger(__name__)

_FORMAT = 1


def _device_name(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    import platform

    return f"{device.type}:{platform.machine()}:{platform.processor() or 'unknown'}"


def environment(device: torch.device) -> dict[str, str]:
    """What a measurement depends on beyond its arguments: machine and software."""
    try:
        import triton  # type: ignore[import-not-found, unused-ignore]

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    return {
        "device": _device_name(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "vllm_ir": __version__,
        "threads": str(torch.get_num_threads()),
    }


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
            doc = json.loads(self.path.read_text())
            if doc.get("format") != _FORMAT or doc.get("env") != self.env:
                raise ValueError("another format or environment")
            entries = doc["entries"]
            if not isinstance(entries, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("winner"), str) for v in entries.values()
            ):
                raise ValueError("malformed entries")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            logger.warning(
                "autotune cache %s is unreadable (%s); its ops are tuned again and the "
                "file rewritten",
                self.path,
                e,
            )
            return {}
        return entries

    def entries(self) -> Mapping[str, dict[str, Any]]:
        """Every record (read once per instance; :meth:`put` keeps it current)."""
        if self._entries is None:
            if self.root.exists():
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
        ensure_private_dir(self.root.parent, follow_symlinks=True)
        ensure_private_dir(self.root)
        with BuildCache(self.root, lock_timeout_s=60).locked(self.path.stem):
            yield

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Add a record: re-read under the lock (others may have added theirs), then
        publish the whole file atomically."""
        with self._locked():
            entries = self._read()
            entries[key] = record
            doc = {"format": _FORMAT, "env": self.env, "entries": entries}
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
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
