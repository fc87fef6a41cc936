"""Differential tests: the eager fast path, ``selected_impl()`` and ``select()`` always agree.

Thousands of random calls — devices (``cpu``, and ``meta`` standing in for an
accelerator), dtypes, ranks, sizes, strides, storage offsets, optional
``None``s, scalar values including NaN — against impls with random
predicates that read only key facts, under random priorities and modes.
Then threads: scoped calls racing process-wide ``apply()``.
"""

from __future__ import annotations

import math
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir._schema.layout import contiguous, rows_flatten_free
from vllm_ir._selection import eager


def probe(x: Tensor, w: Tensor | None, eps: float, n: int | None = None) -> Tensor:
    """The op under test: its result does not matter, which impl ran does."""
    return x.clone()


# Predicates over key facts only (see vllm_ir._selection.key), as shipped ones are.
PREDICATES: dict[str, Callable[..., bool]] = {
    "fp32": lambda x, w, eps, n=None: x.dtype == torch.float32,
    "cpu": lambda x, w, eps, n=None: x.device.type == "cpu",
    "w_same_device": lambda x, w, eps, n=None: w is None or w.device == x.device,
    "w_dense": lambda x, w, eps, n=None: w is None or w.is_contiguous(),
    "w_none": lambda x, w, eps, n=None: w is None,
    "dense": lambda x, w, eps, n=None: x.is_contiguous(),
    "rows": lambda x, w, eps, n=None: rows_flatten_free(x),
    "layout_contiguous": lambda x, w, eps, n=None: contiguous(x),
    "unit_stride": lambda x, w, eps, n=None: x.dim() > 0 and x.stride(-1) == 1,
    "hidden8": lambda x, w, eps, n=None: x.dim() > 0 and x.shape[-1] % 8 == 0,
    "single_row": lambda x, w, eps, n=None: x.dim() > 1 and x.shape[0] == 1,
    "aligned": lambda x, w, eps, n=None: x.data_ptr() % 16 == 0,
    "w_aligned": lambda x, w, eps, n=None: w is None or w.data_ptr() % 8 == 0,
    "big_eps": lambda x, w, eps, n=None: eps > 1e-3,
    "nan_eps": lambda x, w, eps, n=None: math.isnan(eps),
    "no_n": lambda x, w, eps, n=None: n is None,
    "rank2": lambda x, w, eps, n=None: x.dim() == 2,
}

PROVIDERS = [f"k{i}" for i in range(6)]


def _all_of(preds: list[Callable[..., bool]]) -> Callable[..., bool]:
    def supports(x, w, eps, n=None):  # type: ignore[no-untyped-def]
        return all(p(x, w, eps, n) for p in preds)

    return supports


def _make_impls(op: ir.IrOp, rng: random.Random, ran: list[str]) -> None:
    for provider in PROVIDERS:
        chosen = rng.sample(sorted(PREDICATES), rng.randint(1, 3))
        supports = _all_of([PREDICATES[c] for c in chosen])

        def impl(
            x: Tensor, w: Tensor | None, eps: float, n: int | None = None, provider=provider
        ) -> Tensor:
            ran.append(provider)
            return x.clone()

        impl.__signature__ = op.signature  # type: ignore[attr-defined]
        op.register_impl(provider, supports_args=supports)(impl)


def _tensor(
    rng: random.Random, device: str, dtype: torch.dtype, batch: int, rest: list[int]
) -> Tensor:
    shape = [batch, *rest] if rest or rng.random() < 0.5 else [batch]
    order = list(range(len(shape)))
    if rng.random() < 0.3:
        rng.shuffle(order)  # a permuted layout
    pad = rng.choice([0, 0, 3, 8])  # wider rows: a slice
    strides = [0] * len(shape)
    step = 1
    for i in reversed(order):
        strides[i] = step
        step *= max(shape[i], 1) + (pad if i == order[-1] else 0)
    offset = rng.choice([0, 0, 1, 2, 4, 8, 16])
    buffer = torch.empty(offset + step + 64, dtype=dtype, device=device)
    return buffer.as_strided(shape, strides, offset)


def _arguments(rng: random.Random) -> tuple[Any, ...]:
    device = rng.choice(["cpu", "cpu", "meta"])
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    hidden = rng.choice([8, 12, 16, 64])
    rest = rng.choice([[hidden], [hidden], [3, hidden], [1, hidden], []])
    batch = rng.choice([0, 1, 1, 2, 3, 5, 17])
    x = _tensor(rng, device, dtype, batch, rest)
    w: Tensor | None = None
    if rng.random() < 0.6:
        w_device = device if rng.random() < 0.8 else rng.choice(["cpu", "meta"])
        w = _tensor(rng, w_device, dtype, hidden, [] if rng.random() < 0.8 else [2])
    eps = rng.choice([1e-6, 1e-6, 1e-2, float("nan"), 0.5])
    n = rng.choice([None, None, 4])
    return (x, w, eps, n)


def _priorities(rng: random.Random) -> list[str]:
    return rng.sample([*PROVIDERS, "native"], rng.randint(1, 4))


@pytest.mark.parametrize("seed", range(3))
def test_fast_path_dispatch_and_select_agree(make_op, seed: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    op = make_op(probe)
    ran: list[str] = []
    _make_impls(op, rng, ran)
    # a pool of arguments reused across trials, so calls hit cached keys
    pool = [_arguments(rng) for _ in range(60)]
    ir.IrOpPriorityConfig(**{op.name: _priorities(rng)}).apply()
    checked = 0
    for trial in range(1200):
        if trial % 100 == 0:
            ir.IrOpPriorityConfig(**{op.name: _priorities(rng)}).apply()
        args = rng.choice(pool) if rng.random() < 0.7 else _arguments(rng)
        scope = op.set_priority(_priorities(rng)) if rng.random() < 0.3 else None
        compiled = rng.random() < 0.15
        with scope or _nothing(), ir.priority.compiled_selection() if compiled else _nothing():
            want = op.select(*args).impl.provider
            assert op.selected_impl(*args).provider == want, args
            ran.clear()
            op(*args)
            assert (ran[-1] if ran else "native") == want, (args, want, ran)
        checked += 1
    assert checked == 1200


def test_fast_path_agrees_with_the_check_off(make_op) -> None:  # type: ignore[no-untyped-def]
    # without the re-validation the cache alone must be right
    eager.set_selection_check(False)
    try:
        test_fast_path_dispatch_and_select_agree(make_op, 7)
    finally:
        eager.set_selection_check(True)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _nothing() -> _Nothing:
    return _Nothing()


def test_scoped_calls_race_process_wide_apply(make_op) -> None:  # type: ignore[no-untyped-def]
    op = make_op(probe)
    local = threading.local()
    names = ["p0", "p1", "p2", "p3", "p5", "p6"]
    for name in names:

        def impl(
            x: Tensor, w: Tensor | None, eps: float, n: int | None = None, name=name
        ) -> Tensor:
            local.ran = name
            return x

        impl.__signature__ = op.signature  # type: ignore[attr-defined]
        op.register_impl(name)(impl)

    def which(x: Tensor) -> str:
        local.ran = "native"
        op(x, None, 1e-6)
        return str(local.ran)

    stop = threading.Event()
    errors: list[object] = []

    def scoped(mine: str) -> None:
        try:
            with op.set_priority([mine]):
                while not stop.is_set():
                    got = which(torch.ones(2))
                    if got != mine:
                        errors.append((mine, got))
        except Exception as e:  # surfaced below
            errors.append(e)

    def unscoped() -> None:
        try:
            while not stop.is_set():
                which(torch.ones(2))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=scoped, args=(p,)) for p in names[:4]]
    threads += [threading.Thread(target=unscoped) for _ in range(2)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: races show within seconds
    for t in threads:
        t.start()
    x = torch.ones(2)
    stale, rounds = 0, 0
    deadline = time.monotonic() + 3.0
    try:
        while time.monotonic() < deadline:
            rounds += 1
            for k in range(10):
                ir.IrOpPriorityConfig(**{op.name: ["p5" if k % 2 else "p6"]}).apply()
            final = op.select(x, None, 1e-6).impl.provider
            time.sleep(0.002)  # let in-flight selections finish
            if which(x) != final or op.selected_impl(x, None, 1e-6).provider != final:
                stale += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(switch)
    assert errors == []
    assert rounds > 5
    assert stale == 0
