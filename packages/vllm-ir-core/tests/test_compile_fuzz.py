"""End-to-end differential fuzzing: random IR programs, compiled vs eager.

The generator and the check are in ``compile_fuzz.py``. Each compile runs one
to three random programs (fragments) in one compiled function.
``VLLM_IR_FUZZ_COMPILES`` sets the number of compiles (``nox -s fuzz`` runs
300; the unit suite a seeded handful), ``VLLM_IR_FUZZ_COMPILE_SEED`` the first seed,
``VLLM_IR_FUZZ_REPORT`` a JSON file the counts are merged into.
"""

from __future__ import annotations

import os
import time

import compile_fuzz
import pytest
from test_clone_elimination_fuzz import write_report

COMPILES = int(os.environ.get("VLLM_IR_FUZZ_COMPILES", "6"))
SEED = int(os.environ.get("VLLM_IR_FUZZ_COMPILE_SEED", "0"))


pytestmark = pytest.mark.usefixtures("dynamo_reset_after")


def test_compiled_equals_eager_on_random_programs(capsys: pytest.CaptureFixture[str]) -> None:
    stats = compile_fuzz.Stats()
    start = time.perf_counter()
    for seed in range(SEED, SEED + COMPILES):
        compile_fuzz.check_case(compile_fuzz.make_case(seed), stats)
    seconds = round(time.perf_counter() - start, 1)
    report = {
        "compiles": stats.compiles,
        "programs": stats.programs,
        "clones_inserted": stats.clones_inserted,
        "clones_removed": stats.clones_removed,
        "kept_by_reason": dict(stats.kept.most_common()),
        "miscompiles": len(stats.miscompiles),
        "eager_errors": stats.eager_errors,
        "eager_fallbacks": stats.eager_fallbacks,
        "seconds": seconds,
        "first_seed": SEED,
    }
    write_report("end_to_end", report)
    with capsys.disabled():
        print(
            f"\ncompile fuzz: {stats.compiles} compiles, {stats.programs} programs, "
            f"{stats.clones_inserted} clones inserted, {stats.clones_removed} removed, "
            f"{len(stats.miscompiles)} miscompiles, {seconds} s"
        )
        print(f"clones kept, by reason: {report['kept_by_reason']}")
    assert not stats.miscompiles, "\n\n".join(stats.miscompiles[:3])
    assert not stats.eager_errors  # every generated program is valid
    assert stats.clones_inserted > 0  # in-place impls were selected and lowered


@pytest.mark.parametrize("seed", [1085, 1183, 1185, 1302, 1800])
def test_programs_that_once_miscompiled(seed: int) -> None:
    """1085: an impl reading its argument's storage offset, given a copy of a
    row-slice input; traced before Inductor's no-op removal it baked the
    copy's offset (0), and the removal then handed it the slice (a nonzero
    offset). 1183: ``as_strided`` at an absolute offset on a slice of an
    intermediate, which Inductor addresses from the slice. 1185: an impl's
    ``x.storage_offset()``, traced with dynamic shapes, read as 0 by Inductor.
    1302, 1800: an ``as_strided`` view of a graph input the program then writes
    in place, with dynamic shapes, which AOTAutograd miscompiles (the backend
    runs such graphs eagerly). (Minimal forms of each are in
    test_compile_soundness.py.)"""
    stats = compile_fuzz.Stats()
    compile_fuzz.check_case(compile_fuzz.make_case(seed), stats)
    assert not stats.miscompiles, "\n\n".join(stats.miscompiles[:3])


BUCKET_CASES = int(os.environ.get("VLLM_IR_FUZZ_BUCKET_CASES", "3"))
BUCKET_SEED = int(os.environ.get("VLLM_IR_FUZZ_BUCKET_SEED", "0"))


def test_bucketed_tables_under_symbolic_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    """Random programs over ops with bucketed tables, on activations whose sizes are
    unbacked, products, floor divisions or non-contiguous (``compile_fuzz.SIZE_FORMS``,
    one per seed in turn), compiled once with dynamic sizes: compiled == eager at
    each size, or plain Inductor fails too. ``VLLM_IR_FUZZ_BUCKET_CASES`` sets the
    number of programs (a handful here; ``nox -s fuzz`` may run hundreds),
    ``VLLM_IR_FUZZ_BUCKET_SEED`` the first seed."""
    stats = compile_fuzz.BucketStats()
    start = time.perf_counter()
    for seed in range(BUCKET_SEED, BUCKET_SEED + BUCKET_CASES):
        compile_fuzz.check_bucket_case(compile_fuzz.make_bucket_case(seed), stats)
    seconds = round(time.perf_counter() - start, 1)
    report = {
        "programs": BUCKET_CASES,
        "compiles": stats.compiles,
        "calls": stats.calls,
        "runtime_selected": stats.runtime_selected,
        "both_fail": stats.both_fail,
        "failures": len(stats.failures),
        "forms": dict(stats.forms),
        "seconds": seconds,
        "first_seed": BUCKET_SEED,
    }
    write_report("bucket_sizes", report)
    with capsys.disabled():
        print(
            f"\nbucket fuzz: {BUCKET_CASES} programs, {stats.compiles} compiles, "
            f"{stats.calls} calls, {stats.runtime_selected} nodes selected at run time, "
            f"{stats.both_fail} also failing plain Inductor, {len(stats.failures)} failures, "
            f"{seconds} s"
        )
    assert not stats.failures, "\n\n".join(stats.failures[:3])


@pytest.mark.parametrize("seed", [23, 27, 38])
def test_bucket_programs_that_once_crashed(seed: int) -> None:
    """compile-v5 families the bucket fuzz found on bfd78c6 (seed 0 of the run above
    is a fourth: an impl branching on an unbacked token count): 23, interleaved
    rows donated together (``PendingUnbackedSymbolNotFound``); 27, a column-major
    input to a branch reading its storage (a stride assertion); 38, a
    ``hidden // heads`` head size and an in-place bucket (a fresh unbacked size)."""
    stats = compile_fuzz.BucketStats()
    compile_fuzz.check_bucket_case(compile_fuzz.make_bucket_case(seed), stats)
    assert not stats.failures, "\n\n".join(stats.failures[:3])
