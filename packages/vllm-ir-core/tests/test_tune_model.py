"""vllm-ir tune --model: the decision per size bucket, the module:callable contract, bad input."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm_ir as ir
from vllm_ir._cli.tune_model import (
    DEFAULT,
    TOO_NOISY,
    Timing,
    _print,
    bucket_table,
    decide_bucket,
    measure_interleaved,
    sample_interleaved,
)
from vllm_ir_cli import main


def _t(median: float, spread: float = 0.02) -> Timing:
    return Timing(median, median * (1 - spread), median * (1 + spread), spread * 2 > 0.25, 10)


def test_a_clearly_faster_candidate_wins_its_bucket() -> None:
    per = {1: {DEFAULT: _t(100), "native": _t(100), "fast": _t(80)}}
    first, why = decide_bucket(per, {1: "native"})
    assert first == "fast"
    assert "faster at every size" in why


def test_a_difference_within_the_spread_keeps_the_defaults() -> None:
    per = {1: {DEFAULT: _t(100, 0.05), "native": _t(100, 0.05), "fast": _t(97, 0.05)}}
    first, why = decide_bucket(per, {1: "native"})
    assert first is None
    assert "within the spread" in why


def test_noise_refuses_to_decide_and_says_so() -> None:
    per = {1: {DEFAULT: _t(100, 0.3), "native": _t(100, 0.3), "fast": _t(50)}}
    first, why = decide_bucket(per, {1: "native"})
    assert first is None
    assert why.startswith("too noisy to decide")


def test_a_candidate_must_win_at_every_size_of_the_bucket() -> None:
    per = {
        1: {DEFAULT: _t(100), "native": _t(100), "fast": _t(50)},
        16: {DEFAULT: _t(100), "native": _t(100), "fast": _t(120)},
    }
    assert decide_bucket(per, {1: "native", 16: "native"})[0] is None


def test_the_default_winning_keeps_the_defaults() -> None:
    per = {1: {DEFAULT: _t(100), "native": _t(100), "slow": _t(150)}}
    assert decide_bucket(per, {1: "native"}) == (None, "the default (native) is fastest")


def _sweep_doc(reasons: dict[str, str]) -> dict[str, Any]:
    ops = {op: {"<=16": {"tokens": [1], "first": None, "reason": r}} for op, r in reasons.items()}
    combined = {"1": {"same_as_default": True}}
    return {"_measurements": {"ops": ops, "bucket_bounds": [16], "combined": combined}}


@pytest.mark.parametrize(
    ("reasons", "says"),
    [
        ({"a": "the default (native) is fastest"}, "the defaults won in its bucket"),
        ({"a": f"{TOO_NOISY} (spread 40%)"}, f"the defaults stay, every decision {TOO_NOISY}"),
        (
            {"a": f"{TOO_NOISY} (spread 40%)", "b": "the default (native) is fastest"},
            f"the defaults stay (1 of 2 decisions {TOO_NOISY})",
        ),
    ],
)
def test_the_summary_says_why_nothing_was_re_measured(
    reasons: dict[str, str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defaults kept because every timing was too noisy is not the defaults winning."""
    _print(_sweep_doc(reasons))
    printed = capsys.readouterr().out
    assert f"tokens 1: {says}: nothing to re-measure" in printed
    assert "put first: the provider moved to the front" in printed
    if TOO_NOISY in next(iter(reasons.values())):
        assert "the defaults won" not in printed


def test_interleaved_samples_pair_rounds_and_rotate_the_order() -> None:
    """One sample per setting per round, the order rotating between rounds, so that
    sample r of every setting comes from round r."""
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    samples = sample_interleaved(steps, rounds=3, warmup=1)
    assert [len(v) for v in samples.values()] == [3, 3, 3]
    # a sample is a run of calls to one setting (sizing call included)
    runs = [name for name, _ in itertools.groupby(calls[3:])]
    assert runs == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    timings = measure_interleaved(steps, rounds=2, warmup=0)
    assert {name: t.rounds for name, t in timings.items()} == {"a": 2, "b": 2, "c": 2}


def test_bucket_table_has_the_bucketed_priority_format() -> None:
    table = bucket_table([["a", "native"], ["native"], ["b", "native"]], [16, 256])
    assert table == [
        {"max_tokens": 16, "priority": ["a", "native"]},
        {"max_tokens": 256, "priority": ["native"]},
        {"priority": ["b", "native"]},
    ]


MODEL_MODULE = """
import torch
from vllm_ir.testing import TinyDecoder

def build():
    return TinyDecoder(16, 2), lambda tokens: (torch.randn(tokens, 16),)

def wrong():
    return TinyDecoder(16, 2)

def not_a_model():
    return "abc", lambda tokens: (torch.randn(tokens, 16),)
"""


@pytest.fixture
def model_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"sweep_model_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(MODEL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("unmeasured", ["above", "below"])
def test_tune_a_module_callable(
    model_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], unmeasured: str
) -> None:
    out = tmp_path / "tuned.json"
    argv = ["tune", "--model", f"{model_module}:build", "--tokens", "2,300", "--rounds", "3"]
    argv += ["--unmeasured", unmeasured]
    assert main([*argv, "--warmup", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["ir_op_priority"]) == {"rms_norm", "fused_add_rms_norm"}
    for table in doc["ir_op_priority"].values():
        bounds = [e.get("max_tokens") for e in table]
        if unmeasured == "above":  # the buckets as given, each decided at counts above 2
            assert bounds == [16, 256, None]
        else:  # 3 to 299 run what 2 chose: a cut below 300 only, where the lists differ
            assert bounds in ([None], [299, None])
        assert all("native" in e["priority"] for e in table)
    assert doc["_measurements"]["unmeasured"] == unmeasured
    # the table judged against the best candidate per size, where it guessed too
    assert doc["_measurements"]["held_out"] == [24]  # sqrt(2 * 300), rounded
    judged = doc["_measurements"]["table_vs_best"]["rms_norm"]
    assert set(judged["sizes"]) == {"2", "300", "24"}
    assert judged["sizes"]["24"]["held_out"]
    assert all(0 < s["ratio"] <= 1 for s in judged["sizes"].values())
    size, ratio = judged["worst"]["held_out"]
    assert (size, ratio) == ("24", judged["sizes"]["24"]["ratio"])
    figures = doc["_measurements"]
    assert figures["threads"] == 1
    assert figures["ops"]["rms_norm"]["<=16"]["tokens"] == [2]
    assert figures["ops"]["rms_norm"]["<=256"]["reason"].startswith("no token count measured")
    timed = figures["ops"]["rms_norm"][">256"]["times_us"]["300"]
    assert {"default", "native"} <= set(timed)
    printed = capsys.readouterr().out
    assert "rms_norm: the table runs at >= " in printed
    assert f">= {ratio:.2f} of the best at held-out sizes (worst at 24 tokens)" in printed
    assert "wrote" in printed
    _loads_as_priorities(out, doc, capsys)


def _loads_as_priorities(
    out: Path, doc: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep's file is a priority file: from_json, @FILE and explain --tuned read
    its bucketed ``ir_op_priority`` and accept the ``_measurements`` beside it."""
    from vllm_ir._selection.buckets import as_priority, format_bucket_text

    config = ir.IrOpPriorityConfig.from_json(out)
    # a one-entry table (every size alike) reads back as its plain list
    assert config == ir.IrOpPriorityConfig.from_dict(doc["ir_op_priority"])
    assert ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority=@{out}"]) == config
    assert main(["explain", "rms_norm", "--tuned", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"tuned in {out} (tune --model" in printed
    assert (
        f"priority: {format_bucket_text(as_priority(config.to_dict()['rms_norm'], 'x'))}" in printed
    )
    assert doc["_measurements"]["ops"]["rms_norm"][">256"]["reason"] in printed


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
        ("{module}:missing", "has no callable 'missing'"),
        ("{module}:wrong", "must return (model, example_inputs)"),
        # an empty --model (an unset variable) is not "no --model": no per-op tune
        ("", "argument --model: expected a model directory"),
        # a callable that is not a factory, a factory whose model is not callable
        ("json:loads", "loads cannot be called with no arguments"),
        ("{module}:not_a_model", "got str 'abc' as model, which is not callable"),
    ],
)
def test_bad_models_are_one_line(
    model: str, says: str, model_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    argv = ["tune", "--model", model.format(module=model_module), "--out", str(out)]
    assert main([*argv, "--ops", "rms_norm", "--runs", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert err.count("\n") == 1
    assert err.startswith("vllm-ir: error:")
    assert not out.exists()


def test_bad_token_lists_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--model", "x:y", "--tokens", "16,1", "--out", str(tmp_path / "t.json")]
    assert main(argv) == 2
    assert "ascending order" in capsys.readouterr().err


def test_the_model_is_kernelized_by_an_entry_point_of_vllm_ir_kernelizers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Core names no integration package: it asks the ``vllm_ir.kernelizers`` group."""
    import types
    from importlib import metadata

    import torch
    from vllm_ir._cli import model_source

    model = torch.nn.Linear(2, 2)
    report = types.SimpleNamespace(replaced=["a", "b"], by_op=lambda: "{'rms_norm': 2}")
    kernelizer = types.SimpleNamespace(
        is_kernelized=lambda m: False, kernelize=lambda m: report, __name__="fake"
    )
    found: list[metadata.EntryPoint] = []
    monkeypatch.setattr(metadata, "entry_points", lambda group: found)
    assert model_source._kernelize("m", model).startswith(
        "no package of the entry-point group vllm_ir.kernelizers is installed"
    )
    monkeypatch.setitem(sys.modules, "fake_kernelizer", kernelizer)
    found.append(metadata.EntryPoint("fake", "fake_kernelizer", model_source.KERNELIZERS))
    assert model_source._kernelize("m", model) == "kernelized: 2 modules ({'rms_norm': 2})"
    kernelizer.is_kernelized = lambda m: True
    assert model_source._kernelize("m", model) == "already kernelized"


@pytest.mark.parametrize("seed", range(30))
def test_a_size_between_measured_counts_gets_the_list_chosen_below_it(seed: int) -> None:
    """Random buckets, decisions and measured counts: every size runs the list of the
    largest measured count at or below it (the smallest one's below them all)."""
    import random

    from vllm_ir._cli.tune_model import below_table
    from vllm_ir._selection.buckets import SizePlan, as_priority, priority_for_tokens

    rng = random.Random(seed)
    bounds = tuple(sorted(rng.sample(range(1, 300), rng.randint(0, 4))))
    plan = SizePlan(bounds)
    lists = [[rng.choice("abc"), "native"] for _ in range(len(plan))]
    tokens = sorted(rng.sample(range(1, 400), rng.randint(1, 5)))
    written = as_priority(below_table(lists, bounds, tokens), "x")
    for size in range(0, 450):
        below = [t for t in tokens if t <= size] or tokens[:1]
        assert list(priority_for_tokens(written, size)) == lists[plan.index(below[-1])], size


def test_held_out_sizes_are_the_geometric_midpoints_between_measured_counts() -> None:
    from vllm_ir._cli.tune_model import midpoints

    assert midpoints([1, 16, 256, 1024]) == [4, 64, 512]
    assert midpoints([300, 2]) == [24]
    assert midpoints([1, 2, 3]) == []  # nothing strictly between neighbours
    assert midpoints([7]) == []


def test_plan_command_shows_what_runs_never_runs_and_loses(
    model_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    times = {"native": {"median_us": 9.0}, "fast": {"median_us": 3.0}}
    tuned = tmp_path / "tuned.json"
    tuned.write_text(
        json.dumps({"_measurements": {"ops": {"rms_norm": {"<=16": {"times_us": {"2": times}}}}}})
    )
    report = tmp_path / "plan.json"
    argv = ["plan", "--model", f"{model_module}:build", "--tokens", "2,300"]
    assert main([*argv, "--tuned", str(tuned), "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "2 tokens:\nkernel plan (eager" in printed
    assert "300 tokens:" in printed
    assert "  rms_norm: " in printed  # its summary line
    assert "losing pick: " in printed
    assert "ran native at 2 tokens; fast was 3.0x faster there" in printed
    assert "no pick loses by more than 5% at a measured size" in printed  # at 300: not measured
    saved = json.loads(report.read_text())
    assert [p["op"] for p in saved["2 tokens"]["losing_picks"]] == ["rms_norm"] * len(
        saved["2 tokens"]["losing_picks"]
    )
    assert saved["2 tokens"]["losing_picks"]
    assert saved["300 tokens"]["losing_picks"] == []
    assert "summary" in saved["2 tokens"]["plan"]


def test_the_closing_line_names_what_serves_the_file(
    model_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model that says which variable its runtime reads files from (the vLLM plugin's
    layers: ``VLLM_IR_PRIORITY_FILE``) gets that variable in tune's last line."""
    (tmp_path / f"{model_module}_var.py").write_text(
        MODEL_MODULE + "\nclass Named(TinyDecoder):\n    ir_priority_variable = 'MY_FILE'\n"
        "\ndef named():\n    return Named(16, 2), lambda t: (torch.randn(t, 16),)\n"
    )
    out = tmp_path / "tuned.json"
    argv = ["tune", "--model", f"{model_module}_var:named", "--tokens", "2", "--rounds", "1"]
    assert main([*argv, "--warmup", "0", "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"wrote {out}; serve the model with MY_FILE={out}"
    sys.modules.pop(f"{model_module}_var", None)


def test_plan_command_plans_under_the_tuned_file(
    model_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plan --tuned FILE`` shows what a process given the file runs: the file's
    priorities apply while planning (and only then), each op's block printed once."""
    op = ir.ops.rms_norm
    op.register_impl("plan_t")(op.native)
    try:
        tuned = tmp_path / "tuned.json"
        doc = {"ir_op_priority": {"rms_norm": ["plan_t", "native"]}, "_measurements": {"ops": {}}}
        tuned.write_text(json.dumps(doc))
        argv = ["plan", "--model", f"{model_module}:build", "--tokens", "2"]
        assert main([*argv, "--tuned", str(tuned), "--threads", "1"]) == 0
        printed = capsys.readouterr().out
        assert printed.startswith("threads: 1 (--threads")
        assert "  rms_norm: 1 calls at 1 site; ran plan_t (1)" in printed
        assert printed.count("  rms_norm: ") == 1
        assert op.get_priority()[0] != "plan_t"  # taken back
        assert main(argv) == 0
        assert "ran plan_t" not in capsys.readouterr().out
    finally:
        op.unregister_impl("plan_t")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan"], "give a saved plan (FILE.json) or --model SPEC, one of them"),
        (["plan", "x.json", "--model", "m:build"], "one of them"),
        (["plan", "--model", "m:build", "--tuned", "{missing}"], "cannot read a tuning file"),
        (["plan", "--model", "m:build", "--tuned", "{tune}"], "not a `vllm-ir tune --model` file"),
        (
            ["plan", "--model", "m:build", "--tuned", "{listed}"],
            "must map op names to size buckets",
        ),
        (["plan", "x.json", "--margin", "-5"], "--margin must be at least 0 and below 1"),
        (["plan", "x.json", "--margin", "nan"], "--margin must be at least 0 and below 1"),
    ],
)
def test_plan_command_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "tune.json").write_text(json.dumps({"ir_op_priority": {}, "measured": {}}))
    (tmp_path / "listed.json").write_text(json.dumps({"_measurements": {"ops": [1]}}))
    paths = {name: str(tmp_path / f"{name}.json") for name in ("missing", "tune", "listed")}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
