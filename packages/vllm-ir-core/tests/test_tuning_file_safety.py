"""Tuning files that cannot hurt: bad input is one line and never applied, forks and
interruptions leave nothing half-done.

Each defect of the reliability-v4 review (07-10, 12, 14-16) has a regression
test here; the randomized families at the end state their case counts:

* hostile ``RANK`` values: 400 generated strings, each checked against the rule
  (ASCII digits only) and never expanded into a path outside the per-rank set;
* file kinds: 60 random (kind, owner, mode, format) tuning caches, each applied
  exactly when it is a regular file of the current user that nobody else can
  write, holding a supported format;
* forks: 6 seeds of a fork at a random point of the first selection's load, the
  child loading its own file every time.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import vllm_ir as ir
from test_fork_safety import _WAIT_FOR_CHILD
from torch import Tensor
from vllm_ir import config
from vllm_ir._cli.args import UsageError
from vllm_ir._cli.tuning_file import output_path, stamped, write_tuning
from vllm_ir._discovery import stamps
from vllm_ir.config import rank_path

# -- {rank} -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["../../elsewhere/x", "1/../../x", " 3", "-1", "+1", "3 ", "³"])
def test_a_rank_that_is_not_a_non_negative_integer_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RANK", value)
    with pytest.raises(ValueError, match=r"RANK=.* is not a rank \(a non-negative integer"):
        rank_path("tuned/{rank}.json")
    assert rank_path("tuned/0.json") == "tuned/0.json"  # only used where {rank} is
    with pytest.raises(UsageError, match=r"^--out tuned/\{rank\}\.json: RANK="):
        output_path("tuned/{rank}.json", False, kind="tune", replace=False)


def test_local_rank_is_checked_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "../x")
    with pytest.raises(ValueError, match=r"LOCAL_RANK='\.\./x' is not a rank"):
        rank_path("{rank}.json")
    monkeypatch.setenv("LOCAL_RANK", "07")
    assert rank_path("t-{rank}.json") == "t-07.json"


def test_no_rank_known_is_refused_never_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU workers set neither RANK nor LOCAL_RANK: before torch.distributed is
    up, {rank} is an error naming what to set; once it is up, its rank."""
    import torch.distributed as dist

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match=r"^t-\{rank\}\.json: \{rank\} needs this process's rank"):
        rank_path("t-{rank}.json")
    with pytest.raises(UsageError, match=r"none is known"):
        output_path("t-{rank}.json", False, kind="tune", replace=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    assert rank_path("t-{rank}.json") == "t-1.json"


def _hostile_rank(rng: random.Random) -> str:
    """A RANK value: digits, or digits with what a path or a shell could make of them."""
    pieces = ["0", "3", "17", "-", "+", " ", "\t", "/", "..", "x", "\n", "٣", "³", "{rank}", ""]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))


def test_random_rank_values_expand_only_when_they_are_digits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(20240614)
    cases = [_hostile_rank(rng) for _ in range(400)]
    expanded = 0
    for value in cases:
        monkeypatch.setenv("RANK", value)
        if not value:
            monkeypatch.delenv("RANK")  # unset, as LOCAL_RANK: no rank known
        got = _expanded_or_error("dir/tuned-{rank}.json")
        if isinstance(got, ValueError):
            if not value:
                assert "none is known" in str(got)
            assert not re.fullmatch("[0-9]+", value), value
            assert "\n" not in str(got)  # one line
            continue
        expanded += 1
        assert re.fullmatch(r"dir/tuned-[0-9]+\.json", got), (value, got)
    assert 10 < expanded < 400  # both sides of the rule were drawn


def _expanded_or_error(path: str) -> str | ValueError:
    try:
        return rank_path(path)
    except ValueError as e:
        return e


# -- what a tuning file must say ---------------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _first_source() -> str:
    return ir.ops.rms_norm.get_priority_entries("eager")[0].source


@pytest.mark.parametrize("fmt", [3, "2", 99, 2.0, True, None, [2]])
def test_an_unknown_format_is_refused_naming_it_and_the_supported_ones(
    tmp_path: Path, fmt: object
) -> None:
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"format": fmt, "ir_op_priority": {"rms_norm": ["native"]}}))
    with pytest.raises(ValueError, match=r'"format": .* is not a tuning-file format .* \(1, 2\)'):
        ir.load_tuning_file(path)
    assert not _first_source().startswith("tuning file")
    with pytest.raises(ValueError, match="is not a tuning-file format"):  # the flag's path too
        ir.parse_ir_op_priority_args([f"--ir-op-priority=@{path}"])


def _native(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)


def _stamped_file(path: Path, entry: list[str], stamp: dict[str, Any]) -> Path:
    doc = {"format": 2, "ir_op_priority": {"rms_norm": entry}, "stamps": {"rms_norm": stamp}}
    path.write_text(json.dumps(doc))
    return path


def _full_stamp(providers: list[str]) -> dict[str, Any]:
    return stamps.op_stamp("rms_norm", providers, "cpu")


@pytest.mark.parametrize(
    ("label", "entry", "stamp", "field"),
    [
        ("environment {}", ["native"], {"environment": {}}, "environment has no device"),
        ("unknown keys only", ["native"], {"environment": {"gpu": "H100"}}, "has no device"),
        ("no impls", ["native"], "no-impls", "the stamp has no impls"),
        ("impls miss one", ["t_other", "native"], "native-only", "impls have no t_other"),
        *(
            (f"no {key}", ["native"], f"drop-{key}", f"environment has no {key}")
            for key in ("device", "torch", "triton", "vllm_ir")  # every stamp has them
        ),
    ],
)
def test_a_stamp_that_proves_nothing_is_refused_naming_the_field(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
    label: str,
    entry: list[str],
    stamp: Any,
    field: str,
) -> None:
    # a second provider of this test's own: the entry must apply with a whole stamp
    other = ir.ops.rms_norm.register_impl("t_other", _native)
    request.addfinalizer(other.remove)
    if stamp == "no-impls":
        stamp = {"environment": _full_stamp(entry)["environment"]}
    elif stamp == "native-only":
        stamp = _full_stamp(["native"])
    elif isinstance(stamp, str):
        stamp = _full_stamp(entry)
        del stamp["environment"][label.removeprefix("no ")]
    path = _stamped_file(tmp_path / "tuned.json", entry, stamp)
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        handle = ir.load_tuning_file(path)
    try:
        assert not _first_source().startswith("tuning file"), label
    finally:
        handle.remove()
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    assert "rms_norm not applied: its stamp proves nothing" in lines[0]
    assert field in lines[0]
    # the whole stamp of this machine applies: only the missing field was wrong
    _stamped_file(path, entry, _full_stamp(entry))
    handle = ir.load_tuning_file(path)
    try:
        assert _first_source().startswith("tuning file"), label
    finally:
        handle.remove()


# -- merging into a format-1 file -----------------------------------------------


def test_a_merge_into_a_format_1_file_keeps_its_entries_applying_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"ir_op_priority": {"rms_norm": ["native"], "gelu_and_mul": []}}))
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        write_tuning(
            "--out", path, stamped({"ir_op_priority": {"silu_and_mul": ["native"]}}, "cpu")
        )
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    assert "kept rms_norm, gelu_and_mul of its format-1 file (no stamps) unchecked" in lines[0]
    assert "tune them again here to stamp them" in lines[0]
    doc = json.loads(path.read_text())
    assert doc["format"] == 2
    assert doc["stamps"]["rms_norm"] == stamps.UNCHECKED
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        handle = ir.load_tuning_file(path)
    try:
        assert _first_source().startswith("tuning file")  # applies as it did before the write
        silu = ir.ops.silu_and_mul.get_priority_entries("eager")[0]
        assert silu.source.startswith("tuning file")
    finally:
        handle.remove()
    assert not _warnings(caplog)
    # tuning the kept op again replaces its unchecked stamp with a real one
    write_tuning("--out", path, stamped({"ir_op_priority": {"rms_norm": ["native"]}}, "cpu"))
    assert json.loads(path.read_text())["stamps"]["rms_norm"]["environment"]


def test_a_merge_into_a_file_of_an_unknown_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    text = json.dumps({"format": 3, "ir_op_priority": {"rms_norm": ["native"]}})
    path.write_text(text)
    doc = stamped({"ir_op_priority": {"silu_and_mul": ["native"]}}, "cpu")
    with pytest.raises(UsageError, match=r'"format": 3 is not a tuning-file format .* --replace'):
        write_tuning("--out", path, doc)
    assert path.read_text() == text


def test_an_unchecked_stamp_is_only_the_exact_marker(tmp_path: Path) -> None:
    # {"format": 1, ...anything else} is not the marker: a stamp that proves nothing
    path = _stamped_file(tmp_path / "t.json", ["native"], {"format": 1, "environment": {}})
    handle = ir.load_tuning_file(path)
    try:
        assert not _first_source().startswith("tuning file")
    finally:
        handle.remove()


# -- what a tuning file must be ---------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    return {**env, "VLLM_IR_PROVIDERS": "none", **extra}


_FIRST_CALL = """
import torch, vllm_ir as ir
ir.ops.rms_norm(torch.randn(2, 8), None, 1e-6)
print("SOURCE", ir.ops.rms_norm.get_priority_entries("eager")[0].source)
"""


def test_a_fifo_without_a_writer_gives_up_after_its_wait_with_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "tuned.json"
    os.mkfifo(fifo)
    began = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL],
        env=_env(VLLM_IR_TUNING_FILE=str(fifo)),
        capture_output=True,
        text=True,
        timeout=60,  # was: blocked for ever opening the FIFO, the tuned-files lock held
    )
    assert run.returncode == 0, run.stderr
    assert time.monotonic() - began < config.FIFO_WAIT_S + 30
    assert "SOURCE native" in run.stdout
    lines = [line for line in run.stderr.splitlines() if "tuning file" in line]
    assert len(lines) == 1, run.stderr
    assert f"{fifo}: a FIFO whose writer gave no whole file within" in lines[0]


def test_a_fifo_whose_writer_writes_the_file_is_applied(tmp_path: Path) -> None:
    """A shell's ``VLLM_IR_TUNING_FILE=<(...)``: a writer, then the end of the file."""
    fifo = tmp_path / "tuned.json"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as f:  # blocks until the loader opens it
            f.write(json.dumps({"ir_op_priority": {"rms_norm": ["native"]}}))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    handle = ir.load_tuning_file(fifo)
    try:
        assert _first_source().startswith("tuning file")
    finally:
        handle.remove()
    writer.join(10)


def test_a_directory_or_device_as_a_tuning_file_is_refused(tmp_path: Path) -> None:
    for path, kind in ((tmp_path, "not a regular file"), (Path("/dev/null"), "not a regular")):
        with pytest.raises(ValueError, match=f"{re.escape(str(path))}: {kind}"):
            ir.load_tuning_file(path)


def _cache_applied(path: Path) -> bool:
    """Whether the first-selection loader applies ``path`` as the tuning cache."""
    handle = config._load_quietly("tuning cache", lambda: str(path))
    applied = _first_source().startswith("tuning cache")
    if handle is not None:
        handle.remove()
    return applied


def test_a_tuning_cache_others_can_write_is_refused_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"ir_op_priority": {"rms_norm": ["native"]}}))
    path.chmod(0o644)
    assert _cache_applied(path)
    path.chmod(0o664)
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        assert not _cache_applied(path)
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    assert f"refusing tuning cache {path}: it is writable by group or others (mode 664)" in lines[0]
    assert "chmod go-w" in lines[0]
    # a tuning file the user names is theirs to choose: not checked for its owner
    handle = ir.load_tuning_file(path)
    handle.remove()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_tuning_cache_owned_by_another_user_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tmp_path.chmod(0o777)  # a shared cache directory
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"ir_op_priority": {"rms_norm": ["native"]}}))
    os.chown(path, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        assert not _cache_applied(path)
    lines = _warnings(caplog)
    assert len(lines) == 1, lines
    assert "tuning cache not applied: refusing tuning cache" in lines[0]
    assert "owned by uid 65534, not by you (uid 0)" in lines[0]


def test_tune_cache_writes_a_file_only_its_user_can_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_IR_CACHE_DIR", str(tmp_path))
    old = os.umask(0o002)  # user-private groups: files group-writable by default
    try:
        option, path = output_path(None, True, kind="tune", replace=False)
        write_tuning(option, path, stamped({"ir_op_priority": {"rms_norm": ["native"]}}, "cpu"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert _cache_applied(path)


def _random_tuning_cache(rng: random.Random, path: Path) -> tuple[bool, str]:
    """A tuning cache at ``path`` of a random kind, owner, mode and format; whether
    it must apply, and how it was made."""
    kind = rng.choice(["regular", "regular", "fifo", "directory", "link", "dev-link"])
    mode = rng.choice([0o600, 0o644, 0o664, 0o666, 0o622])
    owner = rng.choice([os.getuid(), 65534]) if os.getuid() == 0 else os.getuid()
    fmt = rng.choice([None, 1, 2, 3, "2"])
    doc: dict[str, Any] = {"ir_op_priority": {"rms_norm": ["native"]}}
    if fmt == 2:
        doc = stamped(doc, "cpu")
    elif fmt is not None:
        doc["format"] = fmt
    target = path.with_name("target.json")
    if kind in ("regular", "link"):
        (target if kind == "link" else path).write_text(json.dumps(doc))
        os.chmod(target if kind == "link" else path, mode)
        os.chown(target if kind == "link" else path, owner, -1)
        if kind == "link":
            path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")
    applies = (
        kind in ("regular", "link")
        and owner == os.getuid()
        and not mode & 0o022
        and fmt in (None, 1, 2)
    )
    return applies, f"{kind} mode {mode:o} uid {owner} format {fmt!r}"


def test_random_tuning_caches_apply_exactly_when_regular_private_and_known(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(7)
    for case in range(60):
        folder = tmp_path / str(case)
        folder.mkdir()
        applies, made = _random_tuning_cache(rng, folder / "tuned.json")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vllm_ir"):
            assert _cache_applied(folder / "tuned.json") == applies, made
        lines = _warnings(caplog)
        assert len(lines) == (0 if applies else 1), (made, lines)  # refused: one line


# -- forks ------------------------------------------------------------------------

_FORK_PRELUDE = (
    """
import json, os, random, sys, threading, time
import torch, vllm_ir as ir
from vllm_ir import config
from vllm_ir._base.runtime import RUNTIME
"""
    + _WAIT_FOR_CHILD
    + """
def tuning_file(name, provider="native"):
    path = os.path.join(sys.argv[1], name)
    with open(path, "w") as f:
        json.dump({"ir_op_priority": {"rms_norm": [provider]}}, f)
    return path
"""
)


def _run_forking(script: str, tmp_path: Path, **env: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", _FORK_PRELUDE + textwrap.dedent(script), str(tmp_path)],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


# the parent's first-selection load is slowed (seeded) before each file it reads,
# so a fork lands before or after the tuning file applied; the fork comes at a random time
_FORK_DURING_LOAD = """
seed = int(sys.argv[2])
rng = random.Random(seed)
parent, slow = os.getpid(), rng.uniform(0.2, 0.6)

def slowed(real):
    def call(*args, **kwargs):
        if os.getpid() == parent:
            time.sleep(slow)
        return real(*args, **kwargs)
    return call

# slow reads (a network file system): before the tuning file is read, before the cache
config._read_json_source = slowed(config._read_json_source)
config._cache = slowed(config._cache)
os.environ["VLLM_IR_TUNING_FILE"] = tuning_file("parent.json")
child_file = tuning_file("child.json")
threading.Thread(
    target=lambda: ir.ops.rms_norm(torch.randn(2, 8), None, 1e-6), daemon=True
).start()
if seed < 0:  # the regression case: fork while the parent is surely loading
    while not RUNTIME.priorities.tuned_files_loading:
        time.sleep(0.001)
else:
    time.sleep(rng.uniform(0, 3 * slow))
pid = os.fork()
if pid == 0:
    inherited = RUNTIME.priorities.tuned_files_loaded  # loaded before the fork: kept
    os.environ["VLLM_IR_TUNING_FILE"] = child_file
    ir.ops.rms_norm(torch.randn(2, 8), None, 1e-6)
    files = sorted(RUNTIME.priorities.tuned.get("tuning file", {}))
    want = [os.path.join(sys.argv[1], "parent.json" if inherited else "child.json")]
    os._exit(0 if files == want else 3)
print("CHILD", wait_for(pid, 30))
"""


@pytest.mark.parametrize("seed", [-1, *range(6)])
def test_a_child_forked_during_the_tuning_file_load_loads_its_own(
    tmp_path: Path, seed: int
) -> None:
    # seed -1: the fork surely lands in the load (was: the child never loaded its
    # file, the parent's "loading" flag inherited); 0-5: anywhere around it
    out = _run_forking(_FORK_DURING_LOAD.replace("sys.argv[2]", repr(str(seed))), tmp_path)
    assert "CHILD 0" in out, out


_FORK_DURING_WRITE = """
from pathlib import Path
from vllm_ir._cli import tuning_file as tf
target = Path(sys.argv[1]) / "tuned.json"
held, release = threading.Event(), threading.Event()
real = tf._remove_killed_writers_temporaries

def holding(t):
    if threading.current_thread() is not threading.main_thread():
        held.set()
        release.wait(30)
    real(t)

tf._remove_killed_writers_temporaries = holding
writer = threading.Thread(
    target=tf.write_tuning, args=("--out", target, {"ir_op_priority": {"a": ["native"]}})
)
writer.start()
held.wait(30)
pid = os.fork()
if pid == 0:
    # the parent's writer still holds the lock: the child waits for it, not for itself
    tf.write_tuning("--out", target, {"ir_op_priority": {"b": ["native"]}})
    os._exit(0)
time.sleep(0.5)
release.set()
writer.join(30)
print("CHILD", wait_for(pid, 30))
print("OPS", sorted(json.loads(target.read_text())["ir_op_priority"]))
"""


def test_a_child_forked_while_a_thread_holds_the_tuning_file_lock_can_write(
    tmp_path: Path,
) -> None:
    out = _run_forking(_FORK_DURING_WRITE, tmp_path)
    assert "CHILD 0" in out, out  # was: "hung", the child's copy of the lock held
    assert "OPS ['a', 'b']" in out, out  # both writes merged, none lost


# -- interrupting tune --model ------------------------------------------------------

_SLOW_MODEL = """
import os, time, torch
from vllm_ir.testing import TinyDecoder

class SlowDecoder(TinyDecoder):
    def forward(self, x):
        time.sleep(0.01)  # 200 rounds take seconds: the signal lands while measuring
        return super().forward(x)

def build():
    def inputs(tokens):
        open(os.environ["MEASURING"], "w").close()  # measuring has begun
        return (torch.randn(tokens, 16),)
    return SlowDecoder(16, 2), inputs
"""


def _sigint_as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupting_tune_model_keeps_the_old_file_and_leaves_nothing(
    tmp_path: Path, sig: signal.Signals
) -> None:
    models, work = tmp_path / "models", tmp_path / "work"
    models.mkdir()
    work.mkdir()
    (models / "slow_model.py").write_text(_SLOW_MODEL)
    out = work / "tuned.json"
    old = json.dumps({"ir_op_priority": {"silu_and_mul": ["native"]}, "_measurements": {}})
    out.write_text(old)
    marker = tmp_path / "measuring"
    argv = ["tune", "--model", "slow_model:build", "--tokens", "2,300", "--rounds", "200"]
    code = (
        f"import sys; from vllm_ir_cli import main; sys.exit(main({[*argv, '--out', str(out)]!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=_env(PYTHONPATH=str(models), MEASURING=str(marker)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a background job (`cmd &` in a script) starts with
        # SIGINT ignored, and Python then never raises KeyboardInterrupt
        preexec_fn=_sigint_as_from_a_terminal,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1][-2000:]
    time.sleep(0.5)  # into the measurement
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    assert out.read_text() == old  # the old content, whole
    # nothing else: measurement writes nothing; only the documented lock may be there
    assert {p.name for p in work.iterdir()} <= {"tuned.json", ".tuned.json.lock"}
