"""Tuning files you can ship: stamped and checked per entry on load, merged under a
lock by concurrent writers, cleaned after killed writers, one per rank."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir._cli.args import UsageError
from vllm_ir._cli.tuning_file import FORMAT, merge, stamped, write_tuning
from vllm_ir._discovery.stamps import environment, stamp_difference


def _doc(priorities: dict[str, list[Any]], *, any_threads: bool = False) -> dict[str, Any]:
    """A stamped tuning file of ``priorities``; ``any_threads``: a stamp without the
    thread count (read by a process whose torch uses another, e.g. beside xdist)."""
    doc = stamped({"ir_op_priority": priorities, "measured": {}, "device": "cpu"}, "cpu")
    if any_threads:
        for stamp in doc["stamps"].values():
            del stamp["environment"]["threads"]
    return doc


def _native_times(scale: float) -> Callable[..., Tensor]:
    """An impl of ``rms_norm``: native's result times ``scale``."""

    def impl(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        return ir.ops.rms_norm.native(x, weight, epsilon, variance_size) * scale

    return impl


def _load(path: Path, **kwargs: Any) -> dict[str, list[Any]]:
    return ir.IrOpPriorityConfig.from_json(path, **kwargs).to_dict()


def test_a_stamp_records_the_machine_software_and_each_impls_package_and_code() -> None:
    doc = _doc(
        {
            "rms_norm": ["native"],
            "silu_and_mul": [{"max_tokens": 16, "priority": ["native"]}, {"priority": ["native"]}],
        }
    )
    assert doc["format"] == FORMAT
    stamp = doc["stamps"]["rms_norm"]
    assert stamp["environment"] == environment(torch.device("cpu"))
    assert {"device", "isa", "threads", "torch", "triton", "vllm_ir"} <= set(stamp["environment"])
    assert stamp["environment"]["threads"] == str(torch.get_num_threads())
    native = stamp["impls"]["native"]
    assert native["package"] == ir.ops.rms_norm.impls["native"].package
    assert isinstance(native["code"], str)
    assert list(doc["stamps"]["silu_and_mul"]["impls"]) == ["native"]  # from its buckets
    assert stamp_difference({**stamp, "op": "rms_norm"}) is None


STAMPED_ELSEWHERE = {
    "torch": "2.11.0+cu130",
    "threads": "999",
    "device": "NVIDIA H200",
    "vllm_ir": "0.0.1",
}
"""A stamp field and a value no process here has."""


@pytest.mark.parametrize(("field", "value"), STAMPED_ELSEWHERE.items())
def test_an_entry_from_another_environment_is_refused_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str, value: str
) -> None:
    doc = _doc({"rms_norm": ["native"], "silu_and_mul": ["native"]})
    doc["stamps"]["rms_norm"]["environment"][field] = value
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        assert _load(path) == {"silu_and_mul": ["native"]}  # the other entry still applies
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert "rms_norm not applied: measured elsewhere" in lines[0]
    assert f"{field} {value}, here " in lines[0]
    assert "VLLM_IR_ACCEPT_STALE=1" in lines[0]
    assert _load(path, accept_stale=True) == {"rms_norm": ["native"], "silu_and_mul": ["native"]}


def test_accept_stale_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc({"rms_norm": ["native"]})
    doc["stamps"]["rms_norm"]["environment"]["torch"] = "0.0"
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(doc))
    assert _load(path) == {}
    monkeypatch.setenv("VLLM_IR_ACCEPT_STALE", "1")
    assert _load(path) == {"rms_norm": ["native"]}
    # the flag path reads the same file the same way
    monkeypatch.delenv("VLLM_IR_ACCEPT_STALE")
    config, _ = ir.parse_ir_op_priority_args([f"--ir-op-priority=@{path}"])
    assert config.to_dict() == {}


def test_an_entry_whose_impl_changed_is_refused(tmp_path: Path) -> None:
    op = ir.ops.rms_norm
    first, second = _native_times(1.0), _native_times(2.0)  # closures: other code

    path = tmp_path / "tuned.json"
    handle = op.register_impl("stamped_impl", first)
    try:
        path.write_text(json.dumps(_doc({"rms_norm": ["stamped_impl", "native"]})))
        assert _load(path) == {"rms_norm": ["stamped_impl", "native"]}
    finally:
        handle.remove()
    handle = op.register_impl("stamped_impl", second)
    try:
        difference = stamp_difference(
            {**json.loads(path.read_text())["stamps"]["rms_norm"], "op": "rms_norm"}
        )
        assert difference == "impl stamped_impl: its code changed"
        assert _load(path) == {}
    finally:
        handle.remove()


def test_a_file_without_stamps_loads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"ir_op_priority": {"rms_norm": ["native"]}, "measured": {}}))
    assert _load(path) == {"rms_norm": ["native"]}


# -- merging ------------------------------------------------------------------


def test_a_write_merges_replaces_what_it_measured_and_replace_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    write_tuning("--out", path, _doc({"rms_norm": ["native"]}))
    write_tuning("--out", path, _doc({"silu_and_mul": ["native"]}))
    doc = json.loads(path.read_text())
    assert doc["ir_op_priority"] == {"rms_norm": ["native"], "silu_and_mul": ["native"]}
    assert set(doc["stamps"]) == {"rms_norm", "silu_and_mul"}
    new = _doc({"rms_norm": [{"max_tokens": 16, "priority": ["native"]}, {"priority": ["native"]}]})
    write_tuning("--out", path, new)
    doc = json.loads(path.read_text())
    assert doc["ir_op_priority"]["rms_norm"] == new["ir_op_priority"]["rms_norm"]
    assert doc["ir_op_priority"]["silu_and_mul"] == ["native"]
    write_tuning("--out", path, _doc({"rms_norm": ["native"]}), replace=True)
    assert json.loads(path.read_text())["ir_op_priority"] == {"rms_norm": ["native"]}


def test_merge_keeps_the_measurements_of_kept_ops() -> None:
    old = {"ir_op_priority": {"a": ["x"], "b": ["y"]}, "measured": {"a": {"s": 1}, "b": {"s": 2}}}
    new = {"ir_op_priority": {"b": ["z"]}, "measured": {"b": {"s": 3}}}
    assert merge(old, new)["measured"] == {"a": {"s": 1}, "b": {"s": 3}}  # the file's order
    assert new["measured"] == {"b": {"s": 3}}  # not modified


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not a tuning file"),
        ('{"rms_norm": ["native"]}', "not a tuning file"),
        ('{"ir_op_priority": {}, "_measurements": {}}', "written by `vllm-ir tune --model`"),
    ],
)
def test_a_file_that_cannot_be_merged_into_is_refused_not_overwritten(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "tuned.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        write_tuning("--out", path, _doc({"rms_norm": ["native"]}))
    assert path.read_text() == text
    write_tuning("--out", path, _doc({"rms_norm": ["native"]}), replace=True)
    assert json.loads(path.read_text())["ir_op_priority"] == {"rms_norm": ["native"]}


def _write_many(path: str, prefix: str, count: int) -> None:
    for i in range(count):
        doc = {"ir_op_priority": {f"{prefix}{i}": ["native"]}, "measured": {}}
        write_tuning("--out", Path(path), doc)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_many, args=(str(path), p, 25)) for p in "ab"]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
        assert w.exitcode == 0
    written = json.loads(path.read_text())["ir_op_priority"]
    assert sorted(written) == sorted(f"{p}{i}" for p in "ab" for i in range(25))
    assert not list(tmp_path.glob(".tuned.json.*.tmp"))


_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from vllm_ir._cli.tuning_file import write_tuning
def killed(*args):  # between the temporary file and the rename
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = killed
write_tuning("--out", Path(sys.argv[1]), {"ir_op_priority": {"b": ["native"]}, "measured": {}})
"""


def test_a_killed_writers_temporary_file_is_removed_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    write_tuning("--out", path, {"ir_op_priority": {"a": ["native"]}, "measured": {}})
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
    assert killed.returncode == -9
    left = list(tmp_path.glob(".tuned.json.*.tmp"))
    assert len(left) == 1  # the dead writer's full copy
    assert json.loads(path.read_text())["ir_op_priority"] == {"a": ["native"]}  # the old file
    write_tuning("--out", path, {"ir_op_priority": {"c": ["native"]}, "measured": {}})
    assert not list(tmp_path.glob(".tuned.json.*.tmp"))
    assert sorted(json.loads(path.read_text())["ir_op_priority"]) == ["a", "c"]


# -- per rank, through the command ------------------------------------------

RANKED_OPS = {"rms_norm": "test_opaque", "fused_add_rms_norm": "test_inplace"}
"""Each op with its stand-in kernel (tests/stand_in_kernels.py), listed before native."""

_WITH_STAND_INS = """
import sys
sys.path.insert(0, {tests!r})
import stand_in_kernels
stand_in_kernels.register()
"""


def _run_with_stand_ins(code: str, rank: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    prelude = _WITH_STAND_INS.format(tests=str(Path(__file__).parent))
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code],
        env={**env, "RANK": str(rank)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


@pytest.mark.slow
def test_two_ranks_tune_at_once_into_their_files_and_one_shared_file(tmp_path: Path) -> None:
    """Two processes (ranks 0 and 1) tune different ops at once: each into its
    ``{rank}`` file, then both into one shared file; each rank loads its own."""
    ranked = str(tmp_path / "tuned-{rank}.json")
    for out in (ranked, str(tmp_path / "shared.json")):
        procs = []
        for rank, (op, kernel) in enumerate(RANKED_OPS.items()):
            argv = [
                f"--ir-op-priority.{op}={kernel},native",
                "tune",
                "--ops",
                op,
                "--shapes",
                "a=4x64",
                "--runs",
                "1",
                "--warmup",
                "0",
            ]
            argv += ["--dtype", "fp32", "--threads", "0", "--out", out]  # torch's, as the loader
            code = f"from vllm_ir_cli import main; sys.exit(main({argv!r}))"
            procs.append(_run_with_stand_ins(code, rank))
        for proc in procs:
            _finish(proc)
    for rank, op in enumerate(RANKED_OPS):
        doc = json.loads((tmp_path / f"tuned-{rank}.json").read_text())
        assert list(doc["ir_op_priority"]) == [op]
        assert list(doc["stamps"]) == [op]
    shared = json.loads((tmp_path / "shared.json").read_text())
    assert sorted(shared["ir_op_priority"]) == sorted(RANKED_OPS)
    load = (
        f"import vllm_ir as ir; print(list(ir.IrOpPriorityConfig.from_json({ranked!r}).to_dict()))"
    )
    for rank, op in enumerate(RANKED_OPS):
        assert _finish(_run_with_stand_ins(load, rank)).strip() == repr([op])


# -- the layers -------------------------------------------------------------

LAYERED = ("t_explicit", "t_file", "t_cache", "t_table", "t_default")


@pytest.fixture
def layered_impls() -> Any:
    from vllm_ir.testing import isolated

    op = ir.ops.rms_norm
    handles = [op.register_impl(p, _native_times(1.0)) for p in LAYERED]
    try:
        with isolated():
            yield op
    finally:
        for handle in handles:
            handle.remove()


def test_layers_apply_highest_first_each_named(layered_impls: Any, tmp_path: Path) -> None:
    """explicit > tuning file > tuning cache > provider table > platform defaults."""
    from vllm_ir._base.runtime import RUNTIME
    from vllm_ir._discovery.providers import load_provider
    from vllm_ir._discovery.stamps import device_keys
    from vllm_ir.provider import PlatformDefaults, ProviderSpec
    from vllm_ir.testing import add_platform_defaults, remove_platform_defaults

    op = layered_impls
    tables = {}
    for layer, provider in (("file", "t_file"), ("cache", "t_cache")):
        tables[layer] = tmp_path / f"{layer}.json"
        tables[layer].write_text(json.dumps(_doc({"rms_norm": [provider]})))
    spec = ProviderSpec(
        name="tabled",
        api_version=1,
        register=lambda: None,
        tuned={device_keys()[-1]: {"rms_norm": ["t_table"]}, "NVIDIA X": {"rms_norm": ["t_file"]}},
    )
    handles = [
        ir.load_tuning_file(tables["file"]),
        ir.load_tuning_file(tables["cache"], layer="tuning cache"),
    ]
    load_provider("tabled", "tabled 0.1", spec)
    add_platform_defaults("defaults", [PlatformDefaults("cpu", eager={"rms_norm": ["t_default"]})])
    try:
        with op.set_priority(["t_explicit"]):
            entries = op.get_priority_entries("eager")
            assert [(e.provider, e.source.split(" ")[0:2]) for e in entries] == [
                ("t_explicit", ["user", "(scoped)"]),
                ("t_file", ["tuning", "file"]),
                ("t_cache", ["tuning", "cache"]),
                ("t_table", ["provider", "table"]),
                ("t_default", ["cpu", "eager"]),
                ("native", ["native", "fallback"]),
            ]
            assert entries[1].source == f"tuning file {tables['file']}"
            assert entries[3].source == "provider table tabled"
            # under Inductor the tuned layers stay out: the compiled defaults choose
            compiled = [e.provider for e in op.get_priority_entries("compiled")]
            assert compiled == ["t_explicit", "native"]
        assert op.selected_impl(torch.randn(2, 8), torch.ones(8), 1e-6).provider == "t_file"
        handles[0].remove()
        assert op.selected_impl(torch.randn(2, 8), torch.ones(8), 1e-6).provider == "t_cache"
    finally:
        for handle in handles:
            handle.remove()
        remove_platform_defaults("defaults")
        RUNTIME.discovery.registrations.pop("tabled").remove()
        RUNTIME.discovery.loaded.pop("tabled")
    assert op.selected_impl(torch.randn(2, 8), torch.ones(8), 1e-6).provider == "native"
    assert [e.provider for e in op.get_priority_entries("eager")] == ["native"]


def test_a_malformed_provider_table_fails_in_the_spec() -> None:
    from vllm_ir.provider import ProviderSpec

    with pytest.raises(TypeError, match="tuned must map device names to op tables"):
        ProviderSpec(name="bad", api_version=1, register=lambda: None, tuned={"cpu:AVX2": ["x"]})


_FIRST_SELECTION = """
import torch, vllm_ir as ir
ir.ops.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)
print([(e.provider, e.source) for e in ir.ops.rms_norm.get_priority_entries("eager")])
"""


def test_the_tuning_file_variable_and_the_local_cache_apply_at_the_first_selection(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tuned.json").write_text(json.dumps(_doc({"rms_norm": ["native"]}, any_threads=True)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["VLLM_IR_CACHE_DIR"] = str(cache)
    run = [sys.executable, "-c", _FIRST_SELECTION]
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr([("native", f"tuning cache {cache / 'tuned.json'}")])
    tuning_file = tmp_path / "tuned-{rank}.json"
    (tmp_path / "tuned-1.json").write_text(
        json.dumps(_doc({"rms_norm": ["native"]}, any_threads=True))
    )
    env |= {"VLLM_IR_TUNING_FILE": str(tuning_file), "RANK": "1"}
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr([("native", f"tuning file {tmp_path / 'tuned-1.json'}")])
    env["VLLM_IR_TUNING_FILE"] = str(tmp_path / "missing.json")
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert "tuning file " in out.stderr
    assert "cannot read the file" in out.stderr  # named once; selection goes on
    assert "tuning cache" in out.stdout


# -- random sequences of what operators do ------------------------------------

FUZZ_OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul")


def _random_entry(rng: random.Random) -> list[Any]:
    if rng.random() < 0.5:
        return ["native"]
    bound = rng.choice([1, 16, 256])
    return [{"max_tokens": bound, "priority": ["native"]}, {"priority": ["native"]}]


@pytest.mark.parametrize("seed", range(30))
def test_random_sequences_of_writes_kills_and_stale_entries_match_a_model(
    tmp_path: Path, seed: int
) -> None:
    """Merges, replaces, killed writers and entries gone stale, in random order:
    after each step the file holds what a dict model says, loading applies
    exactly its fresh entries, and no temporary file survives a write."""
    rng = random.Random(seed)
    path = tmp_path / "tuned.json"
    model: dict[str, tuple[list[Any], bool]] = {}  # op -> (entry, stale)
    for _ in range(12):
        action = rng.choice(["merge", "merge", "replace", "kill", "stale"])
        if action in ("merge", "replace"):
            measured = {op: _random_entry(rng) for op in rng.sample(FUZZ_OPS, rng.randint(1, 3))}
            write_tuning("--out", path, _doc(measured), replace=action == "replace")
            if action == "replace":
                model.clear()
            model.update({op: (entry, False) for op, entry in measured.items()})
            assert not list(tmp_path.glob(".tuned.json.*.tmp"))
        elif action == "kill":  # a writer died between its temporary file and the rename
            (tmp_path / f".tuned.json.dead{rng.randrange(10**6)}.tmp").write_text("{")
        elif model:
            op = rng.choice(sorted(model))
            doc = json.loads(path.read_text())
            doc["stamps"][op]["environment"]["torch"] = "0.0.0"
            path.write_text(json.dumps(doc))
            model[op] = (model[op][0], True)
        if not model:
            continue
        doc = json.loads(path.read_text())
        assert {op: entry for op, (entry, _) in model.items()} == doc["ir_op_priority"]
        assert set(doc["stamps"]) == set(model)
        fresh = {op: entry for op, (entry, stale) in model.items() if not stale}
        expected = ir.IrOpPriorityConfig.from_dict(fresh).to_dict()
        assert _load(path) == expected, (seed, action)


# -- what an outside review found ---------------------------------------------


def test_within_a_layer_the_table_loaded_last_comes_first(
    layered_impls: Any, tmp_path: Path
) -> None:
    op = layered_impls
    old, new = tmp_path / "z_old.json", tmp_path / "a_new.json"
    old.write_text(json.dumps(_doc({"rms_norm": ["t_file"]})))
    new.write_text(json.dumps(_doc({"rms_norm": ["t_cache"]})))
    first, second = ir.load_tuning_file(old), ir.load_tuning_file(new)
    again = ir.load_tuning_file(old)  # loaded again: first again
    try:
        assert [e.provider for e in op.get_priority_entries("eager")][:2] == ["t_file", "t_cache"]
        first.remove()  # replaced by `again`: removing it changes nothing
        assert op.get_priority_entries("eager")[0].provider == "t_file"
        again.remove()
        assert op.get_priority_entries("eager")[0].provider == "t_cache"
    finally:
        for handle in (first, second, again):
            handle.remove()
    assert op.get_priority_entries("eager")[0].provider == "native"


def test_a_tuning_file_drops_only_the_entries_it_cannot_apply(
    layered_impls: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "0")
    doc = _doc({"rms_norm": ["t_file"], "silu_and_mul": ["native"]})
    doc["ir_op_priority"]["no_such_op"] = ["native"]  # a package not installed here
    doc["stamps"]["no_such_op"] = doc["stamps"]["silu_and_mul"]
    del doc["stamps"]["silu_and_mul"]  # format 2 without a stamp: refused
    path = tmp_path / "tuned-{rank}.json"
    Path(str(path).replace("{rank}", "0")).write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        handle = ir.load_tuning_file(str(path))
    try:
        entries = layered_impls.get_priority_entries("eager")
        assert entries[0].provider == "t_file"
        assert ir.ops.silu_and_mul.get_priority_entries("eager")[0].source == "native fallback"
    finally:
        handle.remove()
    lines = [r.getMessage() for r in caplog.records]
    assert any("no_such_op not applied" in line for line in lines)
    assert any("silu_and_mul not applied" in line and "no stamp" in line for line in lines)


def test_tune_measures_against_the_defaults_not_the_tables(
    layered_impls: Any, tmp_path: Path
) -> None:
    from vllm_ir.priority import without_tuned_tables

    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(_doc({"rms_norm": ["t_file"]})))
    handle = ir.load_tuning_file(path)
    try:
        with without_tuned_tables():
            assert layered_impls.get_priority_entries("eager")[0].provider == "native"
        assert layered_impls.get_priority_entries("eager")[0].provider == "t_file"
    finally:
        handle.remove()


def test_a_file_that_cannot_be_merged_into_is_refused_before_measuring(tmp_path: Path) -> None:
    from vllm_ir._cli.tuning_file import output_path

    path = tmp_path / "notes.json"
    path.write_text('{"a": 1}')
    with pytest.raises(UsageError, match="not a tuning file"):
        output_path(str(path), False, kind="tune", replace=False)
    assert output_path(str(path), False, kind="tune", replace=True) == ("--out", path)
    with pytest.raises(UsageError, match="one of them"):
        output_path(str(path), True, kind="tune", replace=False)


def test_threads_are_set_before_a_tuning_file_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from vllm_ir_cli import main

    doc = _doc({"rms_norm": ["native"]})
    doc["stamps"]["rms_norm"]["environment"]["threads"] = "1"
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(doc))
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING, logger="vllm_ir"):
            argv = ["bench", "rms_norm", "--shapes", "2x8", "--dtypes", "fp32", "--rounds", "1"]
            argv += ["--warmup", "0", "--no-compiled", "--threads", "1"]
            argv += [f"--ir-op-priority=@{path}"]
            assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    assert not [r for r in caplog.records if "not applied" in r.getMessage()]
    assert "threads: 1 (--threads; torch's default here is " in capsys.readouterr().out
