"""Writing a tuning file: stamped, merged into what the file holds, atomic, per rank.

``vllm-ir tune --out FILE`` (and ``tune --model``) write through :func:`write_tuning`:

* **Stamped**: the document gets ``"format": 2`` and a ``"stamps"`` entry per op
  (:mod:`vllm_ir._discovery.stamps`), checked when the file is loaded.
* **Merged**: the ops measured now replace their entries; the file's other ops
  are kept (``--replace`` starts over). Those of a format-1 file (no stamps) are
  kept with the stamp :data:`~vllm_ir._discovery.stamps.UNCHECKED`: they apply
  unchecked, as before, and the write says so in one line. A file of the other kind (``tune`` vs
  ``tune --model``), or one that is not a tuning file, is refused rather than
  overwritten.
* **Concurrent and crash-safe**: a writer holds an exclusive lock on
  ``.FILE.lock`` beside the file while it reads, merges and publishes (a
  temporary file renamed over the old one), so writers tuning into one file at
  once lose nothing and a reader sees the old file or the new one. A writer
  creates its temporary file under that lock, so every ``.FILE.*.tmp`` the next
  writer finds under it is a killed writer's: it is removed.
* **Per rank**: ``{rank}`` in the path becomes this process's rank (``RANK``,
  else ``LOCAL_RANK``, else torch.distributed's; none known: an error), for one
  file per rank in multi-process serving; readers expand it the same way
  (:func:`vllm_ir.config.rank_path`).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm_ir._base.logger import get_logger
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._base.text import short_repr
from vllm_ir._cli.args import UsageError, writable_file, write_atomically
from vllm_ir._discovery.stamps import UNCHECKED, stamps_of
from vllm_ir.config import rank_path, tuning_cache_path

__all__ = ["FORMAT", "OP_KEYED", "applying", "merge", "output_path", "stamped", "write_tuning"]

FORMAT = 2
"""The tuning-file format: 2 adds ``"format"`` and ``"stamps"`` (1: neither)."""

logger = get_logger(__name__)

OP_KEYED = (
    ("ir_op_priority",),
    ("stamps",),
    ("measured",),
    ("_measurements", "ops"),
    ("_measurements", "table_vs_best"),
)
"""The parts of a tuning document keyed by op name: merged op by op."""


def output_path(out: str | None, cache: bool, *, kind: str, replace: bool) -> tuple[str, Path]:
    """The option and file ``tune`` (``kind``: ``"tune"`` or ``"tune --model"``)
    writes: ``--out`` (``{rank}`` expanded), or ``--cache``: the local tuning cache
    (its directory made if missing). Checked before any measurement: a file that
    cannot be merged into is refused now, not after the sweep."""
    if cache == (out is not None):
        raise UsageError("give --out FILE or --cache (the local tuning cache), one of them")
    if out is not None:
        try:
            expanded = rank_path(out)
        except ValueError as e:  # a RANK that is not a rank: never a path outside the set
            raise UsageError(f"--out {e}") from None
        option, path = "--out", writable_file("--out", expanded)
    else:
        option, path = "--cache", tuning_cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--cache: cannot create {path.parent}: {e.strerror}") from None
        writable_file("--cache", str(path))
    if not replace:
        _read_existing(option, path, kind)
    return option, path


def applying(option: str, path: Path, variable: str | None = None) -> str:
    """The line saying what was written and how it applies; ``variable``: the one the
    tuned model's runtime reads files from (a model's ``ir_priority_variable``, such as
    the vLLM plugin's ``VLLM_IR_PRIORITY_FILE``)."""
    if option == "--cache":
        return f"wrote {path}: the local tuning cache, applied by every process here"
    if variable is not None:
        return f"wrote {path}; serve the model with {variable}={path}"
    return (
        f"wrote {path}; apply it with VLLM_IR_TUNING_FILE={path} (below explicit settings) "
        f"or --ir-op-priority=@{path}"
    )


def stamped(doc: dict[str, Any], device_type: str) -> dict[str, Any]:
    """``doc`` with its format and a stamp for each op it tunes."""
    return {"format": FORMAT, **doc, "stamps": stamps_of(doc["ir_op_priority"], device_type)}


def kind_of(doc: dict[str, Any]) -> str:
    return "tune --model" if "_measurements" in doc else "tune"


def _part(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    value: Any = doc
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else None


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the ops of ``old`` it did not measure kept (see :data:`OP_KEYED`).

    >>> merge({"ir_op_priority": {"a": ["x"], "b": ["y"]}},
    ...       {"ir_op_priority": {"b": ["z"]}})["ir_op_priority"]
    {'a': ['x'], 'b': ['z']}
    """
    merged = json.loads(json.dumps(new))  # a deep copy: the parts are updated in place
    measured_now = set(new.get("ir_op_priority", {}))
    for path in OP_KEYED:
        before, after = _part(old, path), _part(merged, path)
        if before is None or after is None:
            continue
        ordered = {}  # the file's order, then the ops new to it
        for op, value in before.items():
            if op not in measured_now:
                ordered[op] = value
            elif op in after:
                ordered[op] = after[op]
        ordered |= {op: value for op, value in after.items() if op not in ordered}
        after.clear()
        after.update(ordered)
    return merged


def _read_existing(option: str, target: Path, kind: str) -> dict[str, Any] | None:
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{option} {target}: cannot read the file to merge into: {e}") from None
    try:
        old = json.loads(text)
    except json.JSONDecodeError:
        old = None
    if not isinstance(old, dict) or not isinstance(old.get("ir_op_priority"), dict):
        raise UsageError(
            f"{option} {target}: not a tuning file, so there is nothing to merge into; "
            "give another path, or --replace to overwrite it"
        )
    fmt = old.get("format", 1)
    if type(fmt) is not int or fmt not in (1, FORMAT):  # what it means is unknown here
        raise UsageError(
            f'{option} {target}: "format": {short_repr(fmt)} is not a tuning-file format this '
            "vllm-ir writes into; give another path, or --replace to overwrite it"
        )
    if kind_of(old) != kind:
        raise UsageError(
            f"{option} {target}: written by `vllm-ir {kind_of(old)}`, not `vllm-ir {kind}`; "
            "give another path, or --replace to overwrite it"
        )
    return old


@contextlib.contextmanager
def _locked(option: str, target: Path) -> Iterator[None]:
    lock_path = target.parent / f".{target.name}.lock"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise UsageError(f"{option} {target}: cannot create its lock file: {e.strerror}") from None
    # known to the runtime: a child forked meanwhile closes its copy (else its
    # own writes, and everyone's, would wait for the child to exit)
    locks = RUNTIME.priorities.tuning_file_locks
    locks[fd] = threading.get_ident()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if locks.pop(fd, None) is not None:  # else closed at a fork: not ours to close
            os.close(fd)  # releases the lock


def _remove_killed_writers_temporaries(target: Path) -> None:
    """Call under the lock: every temporary file of ``target`` is a dead writer's."""
    for tmp in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        with contextlib.suppress(OSError):  # gone meanwhile
            tmp.unlink()


def _keep_unchecked(
    option: str, target: Path, old: dict[str, Any], doc: dict[str, Any]
) -> dict[str, Any]:
    """A format-1 file's entries, marked to apply unchecked as before: in the format-2
    file the merge writes, an entry without a stamp would be refused at every load."""
    kept = [op for op in old["ir_op_priority"] if op not in doc.get("ir_op_priority", {})]
    if kept:  # said once, at write time: loading them says nothing, as before
        logger.warning(
            "%s %s: kept %s of its format-1 file (no stamps) unchecked, as before; tune %s "
            "again here to stamp %s",
            option,
            target,
            ", ".join(kept),
            "it" if len(kept) == 1 else "them",
            "it" if len(kept) == 1 else "them",
        )
    return {**old, "stamps": {op: dict(UNCHECKED) for op in old["ir_op_priority"]}}


def write_tuning(
    option: str, target: Path, doc: dict[str, Any], *, replace: bool = False
) -> dict[str, Any]:
    """Merge ``doc`` into ``target`` (or replace it) under its lock; returns what was written."""
    with _locked(option, target):
        _remove_killed_writers_temporaries(target)
        old = None if replace else _read_existing(option, target, kind_of(doc))
        if old is not None and "stamps" not in old and old.get("format", 1) == 1:
            old = _keep_unchecked(option, target, old, doc)
        written = doc if old is None else merge(old, doc)
        # the tuning cache is applied only if nobody else can write it (umask 002 or not)
        mode = 0o644 if option == "--cache" else 0o666
        write_atomically(option, target, json.dumps(written, indent=2) + "\n", mode=mode)
    return written
