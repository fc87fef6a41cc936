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
    faster = {
        "faster": dict.fromkeys(names, True),
        "faster_in_9_of_10_rounds": dict.fromkeys(names, True),
        "share_of_rounds_faster": dict.fromkeys(names, 1.0),
    }
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
        assert not verdict[key]["faster_over_mix_in_9_of_10_rounds"]
    assert "established only where" in verdict["note"]


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


def test_the_inductor_impl_is_native_compiled_on_every_decoder_op() -> None:
    """The crossing pair's second impl: registered on each op of the decoder, equal to
    native, declined on FakeTensors (no compiled function inside a traced graph), undone."""
    import torch
    import vllm_ir as ir
    from compiled_priorities import OPS
    from torch._subclasses.fake_tensor import FakeTensorMode

    undo = selection._register_inductor(OPS)
    try:
        x, w = torch.randn(3, 8), torch.rand(8)
        calls = {
            "rms_norm": (x, w, 1e-6),
            "fused_add_rms_norm": (x, x.clone(), w, 1e-6),
            "silu_and_mul": (torch.randn(3, 16),),
        }
        for name in OPS:
            op = ir.get_op(name)
            assert "inductor" in op.candidates(*calls[name], mode="eager").accepted()
            got = op.impls["inductor"].impl_fn(*calls[name])
            torch.testing.assert_close(got, op.native(*calls[name]))
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(x)
            assert not ir.ops.rms_norm.impls["inductor"].supports_args(fake, None, 1e-6)
    finally:
        undo()
    assert not any("inductor" in ir.get_op(name).impls for name in OPS)


def test_verdict_names_the_eager_crossing_pair() -> None:
    bucket = {"within_3pct": {"bucketed_table": True}, "noisy": False}
    table = {
        "buckets": {"<=16": bucket, ">256": bucket},
        "mix": {
            "faster": {"bucketed_table": True},
            "faster_in_9_of_10_rounds": {"bucketed_table": True},
            "share_of_rounds_faster": {"bucketed_table": 0.95},
        },
        "choice_is_a_single_fixed_priority": False,
    }
    decoder = {
        "buckets": {
            "<=16": {
                "within_3pct": dict.fromkeys(
                    ("bucketed_graph", "bucketed_graphs", "bucketed_switch"), True
                ),
                "noisy": False,
            }
        },
        "mix": {
            key: dict.fromkeys(("bucketed_graph", "bucketed_graphs", "bucketed_switch"), False)
            for key in ("faster", "faster_in_9_of_10_rounds")
        }
        | {
            "share_of_rounds_faster": dict.fromkeys(
                ("bucketed_graph", "bucketed_graphs", "bucketed_switch"), 0.4
            )
        },
        "choice_is_a_single_fixed_priority": False,
        "same_model_difference": {"1": 0.01},
    }
    report = {
        "kernels": {
            "crossovers": [],
            "crossovers_by_median": [],
            "bucketed": table,
            "bucketed_crossing_pair": None,
        },
        "compiled_decoder": decoder,
        "eager_decoder_crossing_pair": table,
    }
    verdict = selection._verdict(report)["eager_decoder_crossing_pair_bucketed_table"]
    assert verdict == {
        "within_3pct_in_every_bucket": True,
        "faster_than_best_single_fixed_over_mix": True,
        "faster_over_mix_in_9_of_10_rounds": True,
        "share_of_rounds_faster_over_mix": 0.95,
        "choice_is_a_single_fixed_priority": False,
    }


def _drifting(base: float, factors: list[float], rounds: int = 20) -> list[float]:
    """``base`` microseconds scaled by a machine drift that doubles over the rounds."""
    return [base * factors[r % len(factors)] * (1 + r / rounds) for r in range(rounds)]


def test_paired_ratios_cancel_drift_that_independent_medians_blur() -> None:
    """Each round slower than the last (the machine drifts), and b 10 % faster than a
    in every round: the paired ratio is 0.9 exactly, with no spread."""
    samples = {
        t: {"a": _drifting(100.0 * t, [1.0]), "b": _drifting(90.0 * t, [1.0])} for t in (1, 64)
    }
    summary = selection._summary([1, 64], samples, ["a"], ["b"], {"<=16": "b", "<=256": "b"}, 4)
    assert summary["buckets"]["<=16"]["over_best_fixed"] == {"b": 0.9}
    assert summary["buckets"]["<=16"]["over_best_fixed_p10_p90"] == {"b": [0.9, 0.9]}
    assert summary["mix"]["over_best_single"] == {"b": 0.9}
    assert summary["mix"]["faster_in_9_of_10_rounds"] == {"b": True}
    assert summary["mix"]["share_of_rounds_faster"] == {"b": 1.0}


def test_the_choice_keeps_the_default_unless_faster_in_9_of_10_rounds() -> None:
    """b wins at 4096 tokens in every round; c's median is lower at 1 token but it
    loses every third round (noise): only b's bucket leaves the default a."""
    tokens = [1, 4096]
    picked = {
        1: {
            "a": _drifting(10.0, [1.0]),
            "b": _drifting(20.0, [1.0]),
            "c": _drifting(9.0, [1.0, 1.0, 1.5]),
        },
        4096: {
            "a": _drifting(900.0, [1.0]),
            "b": _drifting(600.0, [1.0]),
            "c": _drifting(950.0, [1.0]),
        },
    }
    choice = selection._choose(tokens, picked, ["a", "b", "c"])
    assert choice == {"<=16": "a", "<=256": "a", ">256": "b"}
