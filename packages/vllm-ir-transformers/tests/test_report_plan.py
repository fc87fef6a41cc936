"""The kernelize report links to the kernel plan: report.plan(*inputs), and its text says how."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import LLAMA
from vllm_ir_transformers import kernelize
from vllm_ir_transformers.report import PLAN_HINT


@pytest.mark.usefixtures("one_thread")
def test_report_plan_lists_every_norm_and_mlp_with_the_impl_that_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = LLAMA.build()
    report = kernelize(model)
    assert PLAN_HINT in str(report)
    with torch.no_grad():
        plan = report.plan(torch.randint(3, 128, (2, 5)))
    assert plan.mode == "eager"
    assert not plan.mismatches
    ran = {s.site: (s.op, s.ran, s.tokens) for s in plan}
    for status in report.current():
        if status.runs.startswith("not called"):  # computed inside its layer's fused op
            continue
        # 10 tokens everywhere: rotary_embedding counts the query's (feature_dims=2)
        assert ran[status.name] == (status.op, status.impl, 10), status
    # the replaced norms that are called, both MLPs, both attention RoPEs, both
    # fused decoder layers
    assert sorted(op for op, _, _ in ran.values()) == sorted(
        ["rms_norm"] * 3
        + ["silu_and_mul"] * 2
        + ["rotary_embedding"] * 2
        + ["fused_add_rms_norm"] * 2
    )
    # the hint's commands work: save, then print with the CLI
    from vllm_ir_cli import main

    path = tmp_path / "plan.json"
    plan.to_json(path)
    assert main(["explain", "--plan", str(path)]) == 0
    assert "model.layers.1.mlp" in capsys.readouterr().out


def test_a_dry_run_report_gives_no_plan_hint() -> None:
    report = kernelize(LLAMA.build(), dry_run=True)
    assert PLAN_HINT not in str(report)
