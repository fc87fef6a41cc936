"""vllm-ir tune --model on a tiny random Llama saved to a temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import vllm_ir as ir
from conftest import LLAMA
from vllm_ir_cli import main


@pytest.mark.usefixtures("one_thread")
def test_tune_a_saved_hugging_face_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = tmp_path / "tiny-llama"
    LLAMA.build().save_pretrained(model_dir)
    out = tmp_path / "tuned.json"
    argv = ["tune", "--model", str(model_dir), "--tokens", "1,300", "--rounds", "3"]
    assert main([*argv, "--warmup", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kernelized: 11 modules" in printed
    doc = json.loads(out.read_text())
    # every op the kernelized model calls, in the bucketed format
    assert set(doc["ir_op_priority"]) == {
        "rms_norm",
        "silu_and_mul",
        "fused_add_rms_norm",
        "rotary_embedding",
    }
    for table in doc["ir_op_priority"].values():
        # sizes 2 to 299 were not measured: they run what 1 chose (a cut below 300 at most)
        assert [e.get("max_tokens") for e in table] in ([None], [299, None])
    figures = doc["_measurements"]
    assert figures["kernelized"].startswith("kernelized: 11 modules")
    for op, buckets in figures["ops"].items():
        decode = buckets["<=16"]
        assert decode["tokens"] == [1], op
        assert decode["reason"]
        times = decode["times_us"]["1"]
        # the default and every other accepted candidate, each one op at a time
        assert "default" in times
        assert "native" in times
        assert all(t["rounds"] == 3 for t in times.values())
    assert set(figures["combined"]) == {"1", "300"}
    # the file is a priority file: the bucketed table loads, _measurements ignored
    config = ir.IrOpPriorityConfig.from_json(out)
    # a one-entry table (every size alike) reads back as its plain list
    assert config == ir.IrOpPriorityConfig.from_dict(doc["ir_op_priority"])
    assert ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority=@{out}"]) == config
    assert main(["explain", "silu_and_mul", "--tuned", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "priority: " in printed
    assert figures["ops"]["silu_and_mul"]["<=16"]["reason"] in printed


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("{tmp}/empty", "a directory without config.json, not a Hugging Face model directory"),
        ("{tmp}/missing", "no such directory"),
        ("./missing-model", "no such directory"),
        ("{tmp}/afile", "a file, not a model directory"),
        ("{tmp}/broken", "a model directory that does not load"),
        # a name: nothing is downloaded, so no word of the hub or of repo ids
        ("nobody-xyz/no-such-model", "neither a directory here nor a model name in the local"),
    ],
)
def test_models_that_do_not_load_are_one_line(
    model: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "no-such-type"}')
    spec = model.format(tmp=tmp_path)
    argv = ["tune", "--model", spec, "--out", str(tmp_path / "t.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err
    assert err.count("\n") == 1
    assert "huggingface.co" not in err
    assert "repo id" not in err.lower()
    assert "connect" not in err
