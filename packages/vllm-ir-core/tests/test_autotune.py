"""Autotuning: candidates, the decision rule, the tuning cache, the FX cache key.

Deterministic: a fake timer returns set times and records what was timed. One
real compile (the last test) checks eager == compiled with autotune on.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.compilation import LoweringPass, VllmIRBackend, pass_context
from vllm_ir.compilation._autotune import Autotuner, candidates, decide
from vllm_ir.compilation._tuning_cache import TuningCache
from vllm_ir.priority import compiled_selection
from vllm_ir.selection import invalidate_caches

X = torch.randn(4, 8)


class FakeTimer:
    """Times from a table; remembers which providers it was asked to time."""

    def __init__(self, times: dict[str, float]) -> None:
        self.times = times
        self.timed: list[str] = []

    def __call__(self, provider: str, prepare: object, device: torch.device) -> float:
        self.timed.append(provider)
        return self.times[provider]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VLLM_IR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def op(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    def tuned(x: Tensor, factor: float) -> Tensor:
        return x * factor

    op = make_op(tuned)

    def impl(x: Tensor, factor: float) -> Tensor:
        return x * factor

    for name in ("fast", "slow"):
        op.register_impl(name)(impl)
    op.register_impl("unsupported", supported=False)(impl)
    op.register_impl("declines", supports_args=lambda x, factor: False)(impl)
    op.register_impl("invariant", batch_invariant=True)(impl)
    return op


ALL = ["slow", "fast", "unsupported", "declines", "invariant"]


def choose(op: ir.IrOp, tuner: Autotuner, priority: list[str]) -> str:
    with op.set_priority(priority), compiled_selection(), pass_context() as ctx:
        impl = tuner.choose(op, "node0", (X, 2.0))
    assert ctx.autotuned["node0"].winner == impl.provider
    return impl.provider


def test_a_candidate_made_slower_loses(op: ir.IrOp) -> None:
    times = {"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0}
    assert choose(op, Autotuner(timer=FakeTimer(times), persist=False), ALL) == "slow"
    times["slow"] = 3.0
    assert choose(op, Autotuner(timer=FakeTimer(times), persist=False), ALL) == "fast"


def test_ties_go_to_the_earlier_priority(op: ir.IrOp) -> None:
    times = {"native": 10.0, "slow": 1.0, "fast": 1.0, "invariant": 1.0}
    tuner = Autotuner(timer=FakeTimer(times), persist=False, tie_tolerance=0.0)
    assert choose(op, tuner, ["fast", "slow", "invariant"]) == "fast"
    tuner = Autotuner(timer=FakeTimer(times), persist=False, tie_tolerance=0.0)
    assert choose(op, tuner, ["invariant", "slow", "fast"]) == "invariant"


def test_unsupported_candidates_are_never_timed(op: ir.IrOp) -> None:
    timer = FakeTimer({"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0})
    choose(op, Autotuner(timer=timer, persist=False), ALL)
    assert sorted(timer.timed) == ["fast", "invariant", "native", "slow"]
    with op.set_priority(ALL), compiled_selection():
        names = [i.provider for i in candidates(op, (X, 2.0))]
    assert names == ["slow", "fast", "invariant", "native"]


def test_batch_invariant_mode_restricts_candidates(
    op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = op.impls["native"]
    if not native.batch_invariant:
        pytest.skip("native is not batch invariant here")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    invalidate_caches()
    timer = FakeTimer({"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0})
    assert choose(op, Autotuner(timer=timer, persist=False), ALL) == "invariant"
    assert sorted(timer.timed) == ["invariant", "native"]


def test_a_kernel_must_beat_native_by_the_margin(op: ir.IrOp) -> None:
    times = {"native": 10.0, "slow": 9.5, "fast": 9.5, "invariant": 9.5}  # 5 % faster
    assert choose(op, Autotuner(timer=FakeTimer(times), persist=False), ALL) == "native"
    tuner = Autotuner(timer=FakeTimer(times), persist=False, margin=0.01)
    assert choose(op, tuner, ALL) == "slow"
    assert decide({"native": 10.0, "k": 8.9}, ["k", "native"], 0.1) == "k"
    assert decide({"native": 10.0, "k": 9.1}, ["k", "native"], 0.1) == "native"


def test_a_cache_hit_times_nothing(op: ir.IrOp, cache_dir: Path) -> None:
    times = {"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0}
    assert choose(op, Autotuner(timer=FakeTimer(times)), ALL) == "slow"
    assert list(cache_dir.glob("autotune/*.json"))
    second = FakeTimer({})  # any timing would raise KeyError
    with op.set_priority(ALL), compiled_selection(), pass_context() as ctx:
        assert Autotuner(timer=second).choose(op, "n", (X, 2.0)).provider == "slow"
    assert second.timed == []
    assert ctx.autotuned["n"].from_cache
    assert ctx.autotuned["n"].times_s["fast"] == 2.0
    # another shape is another entry: timed
    third = FakeTimer(times)
    with op.set_priority(ALL), compiled_selection():
        Autotuner(timer=third).choose(op, "n", (torch.randn(16, 8), 2.0))
    assert third.timed


def _retuned_after(
    damage: Callable[[Path], None],
    op: ir.IrOp,
    cache_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> Path:
    """Tune, ``damage`` the cache file, tune again with ``fast`` now the fastest: the
    damaged record must be measured anew, not trusted. The cache file's path."""
    times = {"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0}
    choose(op, Autotuner(timer=FakeTimer(times)), ALL)
    (path,) = cache_dir.glob("autotune/*.json")
    damage(path)
    timer = FakeTimer({**times, "fast": 0.5})
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        assert choose(op, Autotuner(timer=timer), ALL) == "fast"
    assert timer.timed
    return path


def test_a_corrupted_cache_is_retuned_with_a_warning(
    op: ir.IrOp, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def truncate(path: Path) -> None:
        path.write_text(path.read_text()[:40])

    path = _retuned_after(truncate, op, cache_dir, caplog)
    assert "unreadable" in caplog.text
    assert json.loads(path.read_text())["entries"]  # rewritten whole


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r.pop("times_s"),
        lambda r: r.__setitem__("times_s", [1, 2]),
        lambda r: r.__setitem__("native_overhead_s", "fast"),
        lambda r: r.__setitem__("times_s", {"native": 1.0}),  # no time for the winner
        lambda r: r.__setitem__("times_s", {k: None for k in r["times_s"]}),
        lambda r: r.__setitem__("times_s", {k: True for k in r["times_s"]}),
        lambda r: r.__setitem__("times_s", {k: float("nan") for k in r["times_s"]}),
        lambda r: r.__setitem__("native_overhead_s", 10**400),  # no float holds it
        # read as int(...) once: a crash of the lowering, not a retune
        lambda r: r.__setitem__("tokens", "many"),
        lambda r: r.__setitem__("tokens", None),
        lambda r: r.__setitem__("tokens", [1]),
        lambda r: r.__setitem__("threads", "x"),
    ],
    ids=[
        "no-times", "list", "overhead-str", "no-winner-time", "null", "bool", "nan", "huge",
        "tokens-str", "tokens-null", "tokens-list", "threads-str",
    ],
)  # fmt: skip
def test_a_malformed_record_is_retuned_with_a_warning(
    op: ir.IrOp, cache_dir: Path, caplog: pytest.LogCaptureFixture, edit: Callable[..., Any]
) -> None:
    def edit_the_record(path: Path) -> None:
        doc = json.loads(path.read_text())
        (record,) = doc["entries"].values()
        edit(record)
        path.write_text(json.dumps(doc))

    path = _retuned_after(edit_the_record, op, cache_dir, caplog)
    assert "malformed" in caplog.text
    (rewritten,) = json.loads(path.read_text())["entries"].values()
    assert rewritten["winner"] == "fast"


def _into_a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir(mode=0o700)


def _nested_deeply(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("spoil", [_into_a_directory, _nested_deeply])
def test_an_unreadable_cache_file_is_treated_as_empty(
    spoil: Callable[[Path], None],
    op: ir.IrOp,
    cache_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cache path that became a directory, or JSON nested past the parser's depth."""
    times = {"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0}
    choose(op, Autotuner(timer=FakeTimer(times)), ALL)
    (path,) = cache_dir.glob("autotune/*.json")
    spoil(path)
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        assert TuningCache(torch.device("cpu")).entries() == {}
        assert choose(op, Autotuner(timer=FakeTimer(times)), ALL) == "slow"
    assert "unreadable" in caplog.text


def test_an_unwritable_cache_keeps_the_measurement(
    op: ir.IrOp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk (or a read-only dir) loses only the persistence, with a warning."""
    import errno

    from vllm_ir.compilation import _tuning_cache as tuning_cache

    def full(*args: object, **kwargs: object) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tuning_cache.tempfile, "mkstemp", full)
    times = {"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0}
    tuner = Autotuner(timer=FakeTimer(times))
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        assert choose(op, tuner, ALL) == "slow"
    assert "not saved" in caplog.text
    assert "No space left" in caplog.text
    again = FakeTimer({})  # the in-memory record serves the next node: nothing timed
    tuner.timer = again
    with op.set_priority(ALL), compiled_selection():
        assert tuner.choose(op, "node1", (X, 2.0)).provider == "slow"
    assert again.timed == []


def test_a_killed_writers_temporary_file_is_removed_by_the_next_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer killed before its rename leaves its temporary file; the next
    writer of the environment removes it (the lock proves its writer dead).
    Another environment's is removed only once an hour old: its writer may be live."""
    import os

    root = tmp_path / "autotune"
    record = {"op": "o", "winner": "native", "times_s": {"native": 1.0}}

    class Killed(BaseException):
        pass

    def killed(*args: object) -> None:
        raise Killed

    with monkeypatch.context() as m:  # SIGKILL before the rename: no clean-up runs
        m.setattr(os, "replace", killed)
        m.setattr(os, "unlink", lambda *args, **kwargs: None)
        with pytest.raises(Killed):
            TuningCache(torch.device("cpu"), root=root).put("k1", record)
    (left,) = root.glob(".tmp-*")
    live_elsewhere = root / ".tmp-0123456789abcdef01234567-live.json"
    dead_elsewhere = root / ".tmp-0123456789abcdef01234567-dead.json"
    for other in (live_elsewhere, dead_elsewhere):
        other.write_text("{}")
    two_hours_ago = time.time() - 7200
    os.utime(dead_elsewhere, (two_hours_ago, two_hours_ago))

    cache = TuningCache(torch.device("cpu"), root=root)
    cache.put("k2", record)
    assert not left.exists()
    assert sorted(p.name for p in root.glob(".tmp-*")) == [live_elsewhere.name]
    assert set(TuningCache(torch.device("cpu"), root=root).entries()) == {"k2"}


def test_a_tuning_cache_under_a_parent_others_can_write_is_refused(tmp_path: Path) -> None:
    from vllm_ir._discovery.build_cache import UnsafeCacheError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cache = TuningCache(torch.device("cpu"), root=shared / "cache" / "autotune")
    with pytest.raises(UnsafeCacheError, match="sticky"):
        cache.put("k", {"op": "o", "winner": "native", "times_s": {"native": 1.0}})


def test_uuid_changes_when_tuning_results_change(op: ir.IrOp) -> None:
    lowering = LoweringPass({op.name: ALL})
    lowering.autotuner = Autotuner(timer=FakeTimer({}))
    before = lowering.pre.uuid()
    assert lowering.pre.uuid() == before
    plain = LoweringPass({op.name: ALL}).pre.uuid()
    assert plain != before  # the autotune setting is in the key
    times = {"native": 10.0, "slow": 1.0, "fast": 2.0, "invariant": 5.0}
    choose(op, Autotuner(timer=FakeTimer(times)), ALL)  # another process tuned
    lowering.autotuner = Autotuner(timer=FakeTimer({}))
    after = lowering.pre.uuid()
    assert after != before
    margin = LoweringPass({op.name: ALL})
    margin.autotuner = Autotuner(timer=FakeTimer({}), margin=0.2)
    assert margin.pre.uuid() != after


def test_tuning_cache_refuses_a_file_others_can_write(tmp_path: Path) -> None:
    cache = TuningCache(torch.device("cpu"), root=tmp_path / "t")
    cache.put("k", {"op": "o", "winner": "native", "times_s": {}})
    cache.path.chmod(0o666)
    from vllm_ir._discovery.build_cache import UnsafeCacheError

    with pytest.raises(UnsafeCacheError, match="writable by group or others"):
        TuningCache(torch.device("cpu"), root=tmp_path / "t").entries()


def test_inplace_candidates_run_on_fresh_copies(inplace_op: ir.IrOp) -> None:
    """The in-place impl writes its activations; each timed call gets new copies."""
    seen: list[Tensor] = []

    class Runs:
        def __call__(self, provider: str, prepare: Callable[..., object], device: object) -> float:
            if provider == "writes_inputs":
                for _ in range(3):
                    call = prepare()
                    outputs = call()  # type: ignore[operator]
                    seen.append(outputs[1].clone())
            return 1.0

    args = (torch.ones(2, 4), torch.ones(2, 4))
    with inplace_op.set_priority(["writes_inputs"]), compiled_selection():
        Autotuner(timer=Runs(), persist=False, margin=0.0).choose(inplace_op, "n", args)
    assert len(seen) == 3
    torch.testing.assert_close(seen[0], seen[2])  # not accumulated across calls
    assert torch.equal(args[0], torch.ones(2, 4))


def test_compile_with_autotune_matches_eager() -> None:
    """One real compile: candidates measured on this CPU, lowered, run."""
    from vllm_ir.compilation._autotune import WallClockTimer
    from vllm_ir.testing import inductor_caches_off

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.linear = torch.nn.Linear(32, 32)
            self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(32))

        def forward(self, x: Tensor) -> Tensor:
            h = ir.ops.rms_norm(x, self.weight, 1e-6)
            h, _ = ir.ops.fused_add_rms_norm.maybe_inplace(self.linear(h), x, self.weight, 1e-6)
            return h

    model, x = Block().eval(), torch.randn(8, 32)
    tuner = Autotuner(timer=WallClockTimer(warmup=1, runs=3))
    backend = VllmIRBackend(autotune=tuner)
    with torch.no_grad(), inductor_caches_off():
        expected = model(x.clone())
        compiled: Any = torch.compile(model, backend=backend)
        got = compiled(x.clone())
    torch.testing.assert_close(got, expected)
    ctx = backend.pass_contexts[-1]
    records = {r.op: r for r in ctx.autotuned.values()}
    eager_kernels = set(ir.ops.rms_norm.get_priority("eager")) - {"native"}
    if not eager_kernels:
        assert records == {}  # native alone: nothing to measure
        return
    assert set(records) == {"rms_norm", "fused_add_rms_norm"}
    for op_name, record in records.items():
        assert "native" in record.candidates
        assert len(record.candidates) >= 2
        assert all(t > 0 for t in record.times_s.values())
        assert ctx.selected_impls[op_name] == {n: record.winner for n in record.nodes}


def test_tune_writes_a_loadable_priority_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_ir_cli import main

    out = tmp_path / "tuned.json"
    argv = ["tune", "--ops", "rms_norm", "--shapes", "decode=2x64,prefill=16x64"]
    assert main([*argv, "--dtype", "fp32", "--runs", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    if "rms_norm" not in doc["ir_op_priority"]:  # native alone here: nothing to choose
        assert doc["measured"] == {}
        return
    measured = doc["measured"]["rms_norm"]
    assert set(measured) == {"decode", "prefill"}
    assert set(measured["decode"]["times_us"]) == set(doc["ir_op_priority"]["rms_norm"])
    config = ir.IrOpPriorityConfig.from_json(out)
    assert config.to_dict() == doc["ir_op_priority"]
    assert ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority=@{out}"]) == config
    capsys.readouterr()
    assert main(["explain", "rms_norm", "--eager", "--tuned", str(out)]) == 0
    text = capsys.readouterr().out
    assert "decode (2x64): " in text
    assert " us" in text


def test_cli_flags_and_kernel_config(tmp_path: Path) -> None:
    config = ir.KernelConfig.from_cli_args(["--ir-autotune", "--ir-autotune.margin=0.05"])
    assert config.autotune
    assert config.autotune_margin == 0.05
    backend = ir.VllmIRBackend.from_config(config)
    assert backend.autotuner is not None
    assert backend.autotuner.margin == 0.05
    assert (
        ir.VllmIRBackend.from_config(ir.KernelConfig.from_cli_args(["--ir-autotune=off"])).autotuner
        is None
    )
    with pytest.raises(ValueError, match="margin must be in"):
        ir.KernelConfig.from_cli_args(["--ir-autotune.margin=1.5"])
    with pytest.raises(ValueError, match="cannot read the file"):
        ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority=@{tmp_path / 'missing.json'}"])
    with pytest.raises(ValueError, match="autotune_margin"):
        ir.KernelConfig(autotune=True, autotune_margin=-0.1)


def test_compiled_call_overhead_is_taken_off_native(
    op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_ir.compilation import _autotune as autotune

    monkeypatch.setattr(autotune, "_overheads", {"cpu": 2.0})  # as if measured
    times = {"native": 10.0, "slow": 8.5, "fast": 9.9, "invariant": 9.9}  # slow: 15 % faster
    assert choose(op, Autotuner(timer=FakeTimer(times), persist=False), ALL) == "slow"
    tuner = Autotuner(timer=FakeTimer(times), persist=False, subtract_overhead=True)
    with op.set_priority(ALL), compiled_selection(), pass_context() as ctx:
        assert tuner.choose(op, "n", (X, 2.0)).provider == "native"  # native: 8.0
    assert ctx.autotuned["n"].native_overhead_s == 2.0
    assert ctx.autotuned["n"].times_s["native"] == 8.0


def test_autotune_measures_with_inductor_caches_on(tmp_path: Path) -> None:
    """Inductor's caches as users have them: native is compiled alone (a nested
    compile_fx) while the model's compile is open; a second CPU impl is really
    timed. A random factor in the program makes every run a cache miss."""
    from vllm_ir.compilation._autotune import WallClockTimer

    # not torch's generator: an earlier test on this worker may have seeded it, and
    # the same factor again would hit the FX cache a previous run left on disk
    rng = random.SystemRandom()
    name = f"autotune_caches_on_{rng.randrange(2**31)}"

    @ir.register_op(name=name)
    def shift(x: Tensor, y: Tensor) -> Tensor:
        return x * 2 + y

    @shift.register_impl("second")
    def _second(x: Tensor, y: Tensor) -> Tensor:
        return torch.addcmul(y, x, torch.full_like(x, 2.0))

    try:
        factor = rng.random() + 1.0
        x, y = torch.randn(16, 64), torch.randn(16, 64)
        tuner = Autotuner(timer=WallClockTimer(warmup=1, runs=3), persist=False)
        backend = VllmIRBackend(autotune=tuner, priority={name: ["second", "native"]})
        with torch.no_grad():
            got = torch.compile(lambda a, b: shift(a * factor, b), backend=backend)(x, y)
        torch.testing.assert_close(got, x * factor * 2 + y)
        (record,) = backend.pass_contexts[-1].autotuned.values()
        assert set(record.times_s) == {"second", "native"}
        assert all(t > 0 for t in record.times_s.values())
    finally:
        shift._unregister()


def test_integer_inputs_index_valid_rows(make_op: Callable[..., ir.IrOp]) -> None:
    """Embedding-style ops: index tensors get values in range, so candidates run."""
    from vllm_ir.compilation._autotune import WallClockTimer, measure, real_inputs

    def embed(ids: Tensor, weight: Tensor) -> Tensor:
        return torch.nn.functional.embedding(ids, weight)

    op = make_op(embed)

    @op.register_impl("index_select")
    def _index_select(ids: Tensor, weight: Tensor) -> Tensor:
        return weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, weight.shape[-1])

    args = (torch.zeros(4, 3, dtype=torch.int64), torch.zeros(8, 4))
    ids, _ = real_inputs(op, args)
    assert ids.dtype == torch.int64
    assert ids.min() >= 0
    assert ids.max() < 8
    assert len(set(ids.flatten().tolist())) > 1  # not all one row
    times = measure(op, list(op.impls.values()), args, WallClockTimer(warmup=0, runs=1))
    assert set(times) == {"native", "index_select"}


_RANK = """
import json, sys
import torch, torch.distributed as dist
import vllm_ir as ir
from vllm_ir.compilation import pass_context, set_tuning_group
from vllm_ir.compilation._autotune import Autotuner
from vllm_ir.priority import compiled_selection

rank, init, agree = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
if not agree:
    set_tuning_group(None)

def ranked(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor

op = ir.register_op(name="ranked_op")(ranked)
for name in ("a", "b"):
    op.register_impl(name)(ranked)
# each rank's noise favours another kernel
times = {"native": 10.0, "a": 1.0, "b": 2.0} if rank == 0 else {"native": 10.0, "a": 2.0, "b": 1.0}
timer = lambda provider, prepare, device: times[provider]
tuner = Autotuner(timer=timer, persist=False)
chosen = []
with op.set_priority(["a", "b"]), compiled_selection(), pass_context():
    for shape in ((4, 8), (16, 8), (4, 8)):  # the third: this run's record, no broadcast
        chosen.append(tuner.choose(op, "n", (torch.randn(*shape), 2.0)).provider)
print(json.dumps(chosen))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("agree", [True, False], ids=["agreed", "alone"])
def test_ranks_with_different_noise_choose_alike(tmp_path: Path, agree: bool) -> None:
    """Two gloo ranks whose timings favour different kernels: with the group agreeing
    (the default under torch.distributed) both run rank 0's choice; alone, each its own."""
    import os
    import subprocess
    import sys

    init = f"file://{tmp_path / 'rendezvous'}"
    env = {**os.environ, "VLLM_IR_CACHE_DIR": str(tmp_path / "cache")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(rank), init, "1" if agree else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    chosen = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    if agree:
        assert chosen == [["a", "a", "a"], ["a", "a", "a"]]
    else:
        assert chosen == [["a", "a", "a"], ["b", "b", "b"]]
