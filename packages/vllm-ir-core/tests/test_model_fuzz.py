"""Differential fuzzing of model patterns against plain Inductor (the generator:
``model_fuzz.py``): fused-qkv views with RoPE, impls reading outside tensors.

``VLLM_IR_FUZZ_MODELS`` cases per family (``nox -s fuzz`` runs many; the unit
suite a seeded few), from seed ``VLLM_IR_FUZZ_MODELS_SEED``; counts are merged
into ``VLLM_IR_FUZZ_REPORT`` under ``model_<family>``.
"""

from __future__ import annotations

import os
import time

import model_fuzz
import pytest
from test_clone_elimination_fuzz import write_report

CASES = int(os.environ.get("VLLM_IR_FUZZ_MODELS", "3"))
SEED = int(os.environ.get("VLLM_IR_FUZZ_MODELS_SEED", "0"))

pytestmark = pytest.mark.usefixtures("dynamo_reset_after")


@pytest.mark.parametrize("family", model_fuzz.FAMILIES)
def test_never_wrong_where_inductor_is_right(
    family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stats = model_fuzz.Stats()
    start = time.perf_counter()
    for seed in range(SEED, SEED + CASES):
        model_fuzz.check_case(model_fuzz.make_case(seed, family), stats)
    report = stats.to_json()[family]
    report.update(first_seed=SEED, seconds=round(time.perf_counter() - start, 1))
    write_report(f"model_{family}", report)
    with capsys.disabled():
        print(f"\nmodel patterns, {family}: {report}")
    assert not stats.regressions, "\n".join(stats.regressions[:5])
    assert stats.calls[family] > 0
