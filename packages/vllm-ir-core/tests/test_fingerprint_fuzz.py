"""The FX-cache key against random helper state changed in one process and between two.

See ``fingerprint_fuzz``: ``VLLM_IR_FUZZ_FINGERPRINTS`` cases (``nox -s fuzz``
runs many; the unit suite a fixed set), each changed ``STEPS`` times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from fingerprint_fuzz import Case, run_case
from test_clone_elimination_fuzz import report_family

CASES = int(os.environ.get("VLLM_IR_FUZZ_FINGERPRINTS", "60"))
FIRST_SEED = int(os.environ.get("VLLM_IR_FUZZ_FINGERPRINTS_SEED", "0"))
STEPS = 8
SECOND_RUN = 20
"""Cases also built in a second interpreter (one subprocess for all of them)."""


def test_a_changed_result_changes_the_fingerprint(capsys: pytest.CaptureFixture[str]) -> None:
    start, counts, failures = time.perf_counter(), Counter[str](), list[str]()
    for seed in range(FIRST_SEED, FIRST_SEED + CASES):
        run_case(seed, STEPS, counts, failures)
    stats = {**counts, "failures": len(failures)}
    report_family("fingerprints", capsys, stats, first_seed=FIRST_SEED, start=start)
    assert not failures, "\n".join(failures[:5])
    # the rule was put to the test: many changes changed what the impl returns
    assert counts["result_changes"] > counts["changes"] // 5


def test_a_second_process_keys_the_same_state_alike_and_a_changed_one_apart() -> None:
    """The same program in a fresh interpreter (another hash seed) gets the same
    keys, so the cache hits; with one change made, the key moves with the result."""
    seeds = list(range(FIRST_SEED, FIRST_SEED + SECOND_RUN))
    tests = Path(__file__).parent
    printed = subprocess.run(
        [sys.executable, str(tests / "fingerprint_fuzz.py"), *map(str, seeds)],
        env={**os.environ, "PYTHONHASHSEED": "7", "PYTHONPATH": str(tests)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    second = {int(k): v for k, v in json.loads(printed).items()}
    for seed in seeds:
        here = Case.build(seed)
        assert second[seed]["built"] == here.fingerprint(), seed
        if second[seed]["result"] != here.baseline:
            assert second[seed]["changed"] != here.fingerprint(), (seed, here.kinds)
