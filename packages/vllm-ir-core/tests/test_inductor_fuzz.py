"""Differential fuzzing against plain Inductor (the generators: ``inductor_fuzz.py``,
and ``model_fuzz.py`` for model patterns: fused-qkv views with RoPE, impls
reading outside tensors).

``VLLM_IR_FUZZ_INDUCTOR`` cases per family of the first, ``VLLM_IR_FUZZ_MODELS`` of
the second (``nox -s fuzz`` runs many; the unit suite a seeded few), from seeds
``VLLM_IR_FUZZ_INDUCTOR_SEED`` / ``VLLM_IR_FUZZ_MODELS_SEED``; counts are merged into
``VLLM_IR_FUZZ_REPORT`` under ``against_inductor_<family>``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import inductor_fuzz
import model_fuzz
import pytest
from test_clone_elimination_fuzz import report_family

CASES = int(os.environ.get("VLLM_IR_FUZZ_INDUCTOR", "1"))
SEED = int(os.environ.get("VLLM_IR_FUZZ_INDUCTOR_SEED", "0"))
MODEL_CASES = int(os.environ.get("VLLM_IR_FUZZ_MODELS", "3"))
MODEL_SEED = int(os.environ.get("VLLM_IR_FUZZ_MODELS_SEED", "0"))

GENERATORS: dict[str, tuple[Any, int, int]] = {
    **{family: (inductor_fuzz, CASES, SEED) for family in inductor_fuzz.FAMILIES},
    **{family: (model_fuzz, MODEL_CASES, MODEL_SEED) for family in model_fuzz.FAMILIES},
}
"""Family -> (its generator module, cases, first seed)."""


pytestmark = pytest.mark.usefixtures("dynamo_reset_after")


@pytest.mark.parametrize("family", list(GENERATORS))
def test_never_wrong_where_inductor_is_right(
    family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    generator, cases, first = GENERATORS[family]
    stats = inductor_fuzz.Stats()
    start = time.perf_counter()
    for seed in range(first, first + cases):
        generator.check_case(generator.make_case(seed, family), stats)
    section = f"against_inductor_{family}"
    report_family(section, capsys, stats.to_json()[family], first_seed=first, start=start)
    assert not stats.regressions, "\n".join(stats.regressions[:5])
    assert stats.calls[family] > 0


@pytest.mark.parametrize(
    ("seed", "family"), [(s, f) for s in range(1, 3) for f in ("views", "pieces")]
)
def test_more_seeds_of_the_addressing_families(seed: int, family: str) -> None:
    stats = inductor_fuzz.Stats()
    inductor_fuzz.check_case(inductor_fuzz.make_case(seed, family), stats)
    assert not stats.regressions, "\n".join(stats.regressions)


@pytest.mark.parametrize("seed", [1, 5, 6, 8])
def test_more_seeds_of_the_bucket_family(seed: int) -> None:
    """Seeds that crashed or misread before the bucket branches took their size
    symbols, plain strides and storage-starting copies (compile-v4 r02, r07, r08)."""
    stats = inductor_fuzz.Stats()
    inductor_fuzz.check_case(inductor_fuzz.make_case(seed, "buckets"), stats)
    assert not stats.regressions, "\n".join(stats.regressions)
