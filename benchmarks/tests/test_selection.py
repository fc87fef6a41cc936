"""benchmarks/selection.py's decisions on made-up timings (the measurement itself is
the script's run: ``python benchmarks/selection.py --quick``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import selection


def _t(median: float, spread: float = 0.02) -> dict[str, Any]:
    return {"median_us": median, "p10_us": median * (1 - spread), "p90_us": median * (1 + spread)}


def _rows(*per_tokens: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"tokens": 4**i, "times_us": t} for i, t in enumerate(per_tokens)]


def test_a_crossover_is_faster_small_and_slower_large_beyond_the_spread() -> None:
    rows = _rows(
        {"a": _t(10), "b": _t(20)}, {"a": _t(30), "b": _t(25)}, {"a": _t(100), "b": _t(60)}
    )
    assert selection._crossovers(rows) == [
        {"faster_small": "a", "faster_large": "b", "first_tokens_b_wins": 4}
    ]


def test_no_crossover_when_one_impl_wins_everywhere_or_within_the_spread() -> None:
    assert (
        selection._crossovers(_rows({"a": _t(10), "b": _t(20)}, {"a": _t(50), "b": _t(90)})) == []
    )
    close = _rows({"a": _t(10, 0.2), "b": _t(11, 0.2)}, {"a": _t(12, 0.2), "b": _t(11, 0.2)})
    assert selection._crossovers(close) == []


def test_verdict_reports_noise_instead_of_a_result() -> None:
    names = ("bucketed_graph", "bucketed_graphs", "bucketed_switch", "bucketed_table")
    bucket = {"within_3pct": dict.fromkeys(names, True), "noisy": True}
    faster = {"faster": dict.fromkeys(names, True)}
    table = {
        "buckets": {"<=16": bucket},
        "mix": faster,
        "choice_is_a_single_fixed_priority": True,
    }
    report = {
        "kernels": {
            "crossovers": [],
            "crossovers_by_median": [{"faster_small": "a"}],
            "bucketed": table,
            "bucketed_crossing_pair": table,
        },
        "compiled_decoder": {**table, "same_model_difference": {"1": 0.02, "300": 0.11}},
    }
    verdict = selection._verdict(report)
    assert verdict["timings_noisy"]
    assert verdict["max_same_model_difference"] == 0.11
    assert verdict["kernel_crossover_by_median"]
    assert not verdict["kernel_crossover_found"]
    # one fixed priority in every bucket: "faster over the mix" would be noise
    for key in (
        "decoder_bucketed_graph",
        "decoder_bucketed_graphs",
        "decoder_bucketed_switch",
        "kernels_bucketed_table",
        "kernels_crossing_pair_bucketed_table",
    ):
        assert not verdict[key]["faster_than_best_single_fixed_over_mix"]
    assert "not established" in verdict["note"]


def test_crossing_bounds_cut_where_the_faster_of_the_pair_changes() -> None:
    rows = _rows(
        {"a": _t(10), "b": _t(20)},
        {"a": _t(50), "b": _t(90)},
        {"a": _t(500), "b": _t(300)},
        {"a": _t(900), "b": _t(600)},
    )
    tokens = [r["tokens"] for r in rows]
    assert selection._crossing_bounds(rows, ["a", "b"]) == tuple(
        sorted({selection.BOUNDS[0], tokens[1]})
    )
