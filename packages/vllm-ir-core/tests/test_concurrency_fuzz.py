"""Random sequences of registry changes in one thread while others call the op.

What a concurrent call may run (docs/design.md, "Invalidation and threads"):
what ``select()`` returns in a state the registry was in at some moment of the
call — before, during or after a change that overlaps it — never an impl that
was unregistered before the call started, and never an exception caused by
the change. A call started after a change returned sees that change.

A mutator thread applies random changes (register or unregister a tagging
impl, set the process-wide list, a bucketed list, ``invalidate_caches()``);
before each, it logs the state it is about to enter. Callers read the log's
length before and after each call: the impl that ran (its tag in the output)
must be what selection picks in one of the states between. ``VLLM_IR_FUZZ_THREADS``
seeds run (``nox -s fuzz`` runs many; the unit suite a fixed few).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import vllm_ir as ir
from test_buckets import TAGS, _tag_impl, scaled
from test_clone_elimination_fuzz import report_family
from torch import Tensor
from vllm_ir.priority import set_process_priority
from vllm_ir.selection import invalidate_caches

SEEDS = int(os.environ.get("VLLM_IR_FUZZ_THREADS", "3"))
FIRST_SEED = int(os.environ.get("VLLM_IR_FUZZ_THREADS_SEED", "0"))
CALLERS = 3
CHANGES = 200


def _slow_yes(x: Tensor, factor: float) -> bool:
    """Accepts every call, slowly: selection then spans thread switches, where a
    change can land between reading the generation and storing the answer."""
    time.sleep(2e-5)
    return True


State = tuple[frozenset[str], Any]
"""(registered tags, the process-wide list: None, a list, or a bucket table)."""


def _selects(state: State, tokens: int) -> str:
    """What selection picks in ``state`` for a call of ``tokens`` rows."""
    registered, spec = state
    if spec is None:
        return "native"
    names = spec
    if isinstance(spec, dict):
        names = spec["small"] if tokens <= spec["bound"] else spec["large"]
    return next((p for p in names if p in registered or p == "native"), "native")


def _as_priority(spec: Any) -> Any:
    if isinstance(spec, dict):
        return [
            {"max_tokens": spec["bound"], "priority": spec["small"]},
            {"priority": spec["large"]},
        ]
    return spec


def _random_list(rng: random.Random) -> list[str]:
    return [*rng.sample(list(TAGS), rng.randint(1, 3)), "native"]


def _run_seed(op: ir.IrOp, seed: int) -> tuple[int, list[str]]:
    rng = random.Random(seed)
    log: list[State] = [(frozenset(), None)]
    done = threading.Event()
    problems: list[str] = []
    calls = [0]

    def mutate() -> None:
        registered: set[str] = set()
        spec: Any = None
        try:
            for _ in range(CHANGES):
                kind = rng.random()
                tag = rng.choice(list(TAGS))
                if kind < 0.5:
                    if tag in registered:
                        registered.discard(tag)
                        log.append((frozenset(registered), spec))
                        op.unregister_impl(tag)
                    else:
                        registered.add(tag)
                        log.append((frozenset(registered), spec))
                        op.register_impl(tag, supports_args=_slow_yes)(_tag_impl(TAGS[tag]))
                elif kind < 0.8:
                    spec = _random_list(rng)
                    if rng.random() < 0.4:
                        spec = {"bound": 4, "small": spec, "large": _random_list(rng)}
                    log.append((frozenset(registered), spec))
                    set_process_priority({op.name: _as_priority(spec)})
                else:
                    log.append((frozenset(registered), spec))
                    invalidate_caches()
                time.sleep(rng.random() * 2e-3)
        finally:
            done.set()

    def call(worker: int) -> None:
        local = random.Random(seed * 100 + worker)
        while not done.is_set():
            rows = local.choice([2, 4, 7])
            x = torch.randint(-4, 5, (rows, 8)).float()
            # the mutator logs a state, then makes it: the one logged before it may
            # still be in effect when the call starts
            before = max(len(log) - 2, 0)
            try:
                out = op(x, 2.0)
            except Exception as e:  # any exception is a finding
                problems.append(f"seed {seed}: a call raised {type(e).__name__}: {e}")
                return
            after = len(log)  # the state being entered when the call ended counts too
            offset = (out - x * 2.0).flatten()[0].item()
            ran = next((t for t, k in TAGS.items() if offset == k), "native")
            allowed = {_selects(state, rows) for state in log[before:after]}
            if ran not in allowed:
                problems.append(
                    f"seed {seed}: {rows} rows ran {ran!r}; the states during the call "
                    f"select {sorted(allowed)}"
                )
                return
            calls[0] += 1

    callers = [threading.Thread(target=call, args=(w,)) for w in range(CALLERS)]
    mutator = threading.Thread(target=mutate)
    for t in (*callers, mutator):
        t.start()
    for t in (mutator, *callers):
        t.join()
    # quiet again: every call is what select() returns in the last state
    x = torch.randint(-4, 5, (3, 8)).float()
    want = _selects(log[-1], 3)
    assert op.select(x, 2.0).impl.provider == want
    for tag in [t for t in TAGS if t in log[-1][0]]:
        op.unregister_impl(tag)
    set_process_priority({op.name: ["native"]})
    return calls[0], problems


def test_concurrent_calls_run_a_state_they_overlapped(
    make_op: Callable[..., ir.IrOp], capsys: pytest.CaptureFixture[str]
) -> None:
    op = make_op(scaled)
    saved = dict(ir.priority.process_priorities())
    start, calls, problems = time.perf_counter(), 0, []
    try:
        for seed in range(FIRST_SEED, FIRST_SEED + SEEDS):
            seed_calls, seed_problems = _run_seed(op, seed)
            calls += seed_calls
            problems += seed_problems
    finally:
        set_process_priority(saved, replace=True)
    stats = {"cases": SEEDS, "changes": SEEDS * CHANGES, "calls": calls, "failures": len(problems)}
    report_family("threads", capsys, stats, first_seed=FIRST_SEED, start=start)
    assert not problems, "\n".join(problems[:5])
    assert calls > SEEDS * 100, "the callers barely overlapped the changes"
