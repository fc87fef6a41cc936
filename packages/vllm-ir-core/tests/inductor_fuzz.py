"""Differential fuzzing against plain Inductor: VllmIRBackend is never wrong
where ``backend="inductor"`` is right.

Families (``FAMILIES``), each a generator of random programs over one
``(rows, 6)`` input, compared with eager under both backends:

* ``views``: no IR op. Arithmetic, then a random chain of views (slices,
  ``narrow``, transposes, ``split``/``chunk``/``unbind`` pieces, reshapes, an
  ``int32`` reinterpretation), copies Inductor's no-op removal drops
  (``clone``, ``cat([x])``, ``repeat``, a zero pad, ``to(copy=True)``,
  ``x ** 1``, ``empty_like(x).copy_(x)``), in-place writes, and an
  ``as_strided`` at an absolute (or omitted) offset kept inside the storage.
* ``pieces``: the same chains ending in an IR op whose impl reads its
  argument through ``x.as_strided(x.size(), x.stride(), x.storage_offset())``.
* ``recompiles``: one backend, called with new row counts, strides
  (a transposed input) and dtypes; impls that branch on the row count.
* ``autotune``: the ``pieces`` programs with autotune on, under a fake timer
  (random times) or a real one.
* ``cache_reuse``: the ``pieces`` programs compiled again and again with
  Inductor's caches **on**, under random priorities and
  ``VLLM_BATCH_INVARIANT`` settings: a graph served from the cache must be
  the one the settings in force select (across processes too: the cache
  directory outlives the run).
* ``buckets``: a bucketed priority table on a token count that is a symbol
  or an expression of one (``x[1:]``, ``x[::2]``, a flattened ``(2, n, 6)``
  input), lowered per size range (``"graphs"``), to ``torch.cond`` branches, by
  the autotuner, or traced through (``enable_torch_wrap(False)``), called at
  counts on both sides of the bound.

Half the cases compile with dynamic shapes. A case where Inductor is right and
vllm-ir wrong is a failure; where both are wrong it is counted as upstream.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
import vllm_ir as ir
from torch import Tensor
from vllm_ir.compilation._autotune import Autotuner, WallClockTimer
from vllm_ir.selection import invalidate_caches
from vllm_ir.testing import inductor_caches_off

COLS = 6
FAMILIES = ("views", "pieces", "recompiles", "autotune", "cache_reuse", "buckets")


@ir.register_op(name="inductor_fuzz_offset_reader")
def offset_reader(x: Tensor) -> Tensor:
    return x * 3 + 1


@offset_reader.register_impl("strided")
def _offset_reader_strided(x: Tensor) -> Tensor:
    return x.as_strided(x.size(), x.stride(), x.storage_offset()) * 3 + 1


@offset_reader.register_impl("by_rows")
def _offset_reader_by_rows(x: Tensor) -> Tensor:
    if x.dim() > 0 and x.shape[0] <= 4:  # a "decode" path: guards the trace on rows
        return x + x + x + 1
    return x * 3 + 1


@offset_reader.register_impl("plus_half")
def _offset_reader_plus_half(x: Tensor) -> Tensor:
    # visibly another kernel (not batch invariant): a graph lowered to it and
    # served where selection picks another impl shows in the values
    return x * 3 + 1.5


PRIORITY = {"inductor_fuzz_offset_reader": ["strided", "native"]}

COPIES: dict[str, Callable[[Tensor], Tensor]] = {
    "clone": lambda t: t.clone(),
    "cat": lambda t: torch.cat([t]),
    "repeat": lambda t: t.repeat(*([1] * t.dim())),
    "pad": lambda t: F.pad(t, (0, 0)),
    "to_copy": lambda t: t.to(copy=True),
    "pow1": lambda t: t**1,
    "empty_like_copy": lambda t: torch.empty_like(t).copy_(t),
}


@dataclass
class Step:
    """One operation of a program; ``describe`` is its source-like text."""

    describe: str
    apply: Callable[[Tensor], Tensor]


def _view_steps(rng: random.Random, t: Tensor) -> list[Step]:
    """Views that are valid for ``t``'s shape (rank 1 or 2, floating)."""
    steps: list[Step] = []
    if t.dim() == 2 and t.shape[0] >= 2:
        a = rng.randrange(0, t.shape[0] - 1)
        steps.append(Step(f"[{a}:]", lambda x, a=a: x[a:]))
        n = rng.randint(1, t.shape[0] - a)
        steps.append(Step(f".narrow(0, {a}, {n})", lambda x, a=a, n=n: x.narrow(0, a, n)))
        steps.append(Step(".chunk(2)[-1]", lambda x: x.chunk(2)[-1]))
        steps.append(Step(".split(2)[-1]", lambda x: x.split(2)[-1]))
        steps.append(Step(".unbind(0)[1]", lambda x: x.unbind(0)[1]))
        steps.append(Step(".t()", lambda x: x.t()))
    if t.dim() == 2 and t.is_contiguous():
        steps.append(Step(".view(-1)", lambda x: x.view(-1)))
        if t.dtype == torch.float32:
            steps.append(Step(".view(torch.int32)", lambda x: x.view(torch.int32)))
    if t.dim() == 1 and t.shape[0] % COLS == 0 and t.shape[0] >= COLS:
        steps.append(Step(f".view(-1, {COLS})", lambda x: x.view(-1, COLS)))
    if t.dim() == 1 and t.shape[0] >= 2:
        steps.append(Step("[1:]", lambda x: x[1:]))
        steps.append(Step(".unsqueeze(0)", lambda x: x.unsqueeze(0)))
    return steps


def _random_steps(rng: random.Random, x: Tensor, *, ending: str) -> list[Step]:
    """A random program on ``x``, ending in an ``as_strided`` or an IR op."""
    steps = [Step(f" * {k} + 1", lambda t, k=k: t * k + 1) for k in (rng.choice([2, 3]),)]
    t = steps[0].apply(x)
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.55:
            choices = _view_steps(rng, t)
            if not choices:
                continue
            step = rng.choice(choices)
        elif kind < 0.85 and t.dtype.is_floating_point:
            name = rng.choice(list(COPIES))
            step = Step(f".{name}()", COPIES[name])
        elif t.dtype.is_floating_point:
            step = Step(".add_(1)", lambda v: v.add_(1))
        else:
            continue
        t = step.apply(t)
        steps.append(step)
    if t.dtype != torch.float32:  # come back to floats for the ending
        steps.append(Step(".view(torch.float32)", lambda v: v.view(torch.float32)))
        t = steps[-1].apply(t)
    if ending == "ir_op":
        steps.append(Step(" -> offset_reader", offset_reader))
        return steps
    # an as_strided inside the storage of t, at an absolute or the implicit offset
    room = t.untyped_storage().nbytes() // t.element_size()
    rows, cols = rng.randint(1, 2), rng.randint(1, 3)
    s0, s1 = rng.choice([(cols, 1), (1, rows), (COLS, 1)])
    span = (rows - 1) * s0 + (cols - 1) * s1 + 1
    if span > room:
        rows, cols, s0, s1, span = 1, 1, 1, 1, 1
    if rng.random() < 0.3 and t.storage_offset() + span <= room:
        steps.append(
            Step(
                f".as_strided(({rows}, {cols}), ({s0}, {s1}))",
                lambda v, r=rows, c=cols, a=s0, b=s1: v.as_strided((r, c), (a, b)),
            )
        )
    else:
        off = rng.randrange(0, room - span + 1)
        steps.append(
            Step(
                f".as_strided(({rows}, {cols}), ({s0}, {s1}), {off})",
                lambda v, r=rows, c=cols, a=s0, b=s1, o=off: v.as_strided((r, c), (a, b), o),
            )
        )
    steps.append(Step(" + 0", lambda v: v + 0))
    return steps


@dataclass
class Case:
    seed: int
    family: str
    steps: list[Step]
    dynamic: bool
    inputs: list[Tensor]
    priority: dict[str, list[str]] = field(default_factory=lambda: dict(PRIORITY))
    autotune: str | None = None
    settings: list[tuple[str, bool]] = field(default_factory=list)
    """cache_reuse: (first provider, batch invariance) of each compile."""
    dispatch: str = "graphs"
    """buckets: ``VllmIRBackend(bucket_dispatch=...)``."""
    wrap: bool = True
    """buckets: False compiles in trace-through mode."""
    ours: str = "vllm_ir"
    """The backend under test: ``vllm_ir``, or ``inductor`` in trace-through mode."""

    def describe(self) -> str:
        program = "x" + "".join(s.describe for s in self.steps)
        shapes = [tuple(t.shape) for t in self.inputs]
        return (
            f"seed {self.seed} ({self.family}, dynamic={self.dynamic}, "
            f"autotune={self.autotune}, priority={self.priority}, settings={self.settings}, "
            f"dispatch={self.dispatch}, wrap={self.wrap}, ours={self.ours}): "
            f"{program} on {shapes}"
        )

    def run(self, x: Tensor) -> Tensor:
        t = x
        for step in self.steps:
            t = step.apply(t)
        return t


def _arange(rows: int, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.arange(rows * COLS, dtype=dtype).view(rows, COLS)


def make_case(seed: int, family: str) -> Case:
    rng = random.Random(seed)
    if family == "buckets":
        return _bucket_case(rng, seed)
    dynamic = rng.random() < 0.5
    x = _arange(rng.choice([4, 6]))
    if family == "views":
        return Case(seed, family, _random_steps(rng, x, ending="as_strided"), dynamic, [x])
    steps = _random_steps(rng, x, ending="ir_op")
    if family == "pieces":
        return Case(seed, family, steps, dynamic, [x])
    if family == "recompiles":
        inputs = [x, _arange(8), _arange(6).t().contiguous().t(), _arange(4, torch.float64)]
        rng.shuffle(inputs)
        prio = {"inductor_fuzz_offset_reader": [rng.choice(["strided", "by_rows"]), "native"]}
        return Case(seed, family, steps, dynamic, inputs, prio)
    if family == "cache_reuse":
        providers = ["strided", "by_rows", "plus_half", "native"]
        # the same list under both batch-invariance settings, then another list
        # (plus_half is the impl whose values show which impl ran: mostly first)
        first = "plus_half" if rng.random() < 0.75 else rng.choice(providers)
        then, invariant = rng.choice(providers), rng.random() < 0.5
        settings = [(first, invariant), (first, not invariant), (then, invariant)]
        return Case(seed, family, steps, dynamic, [x], settings=settings)
    assert family == "autotune"
    prio = {"inductor_fuzz_offset_reader": ["strided", "by_rows", "native"]}
    return Case(seed, family, steps, dynamic, [x], prio, rng.choice(["fake", "real"]))


TOKEN_COUNTS: dict[str, tuple[Step, Callable[[int], Tensor]]] = {
    # (the step making the op's activation, an input giving it n tokens)
    "x": (Step("", lambda t: t), lambda n: _arange(n)),
    "x[1:]": (Step("[1:]", lambda t: t[1:]), lambda n: _arange(n + 1)),
    "x[::2]": (Step("[::2]", lambda t: t[::2]), lambda n: _arange(2 * n)),
    "flatten": (
        Step(".flatten(0, 1)", lambda t: t.flatten(0, 1)),
        lambda n: _arange(2 * n).view(2, n, COLS),
    ),
}


def _bucket_case(rng: random.Random, seed: int) -> Case:
    """A bucketed table on a symbolic (or compound) token count, called on both
    sides of its bound; the impls' values differ (``plus_half``) except under
    the autotuner, whose choice eager cannot know."""
    mode = rng.choice(["graphs", "branches", "autotune", "trace_through"])
    providers = ["strided", "by_rows", "native"]
    if mode != "autotune":
        providers.append("plus_half")
    bound = rng.randint(3, 9)

    def ranked() -> list[str]:
        return list(dict.fromkeys([*rng.sample(providers, rng.randint(1, 2)), "native"]))

    table = [{"max_tokens": bound, "priority": ranked()}, {"priority": ranked()}]
    count, make = TOKEN_COUNTS[rng.choice(list(TOKEN_COUNTS))]
    steps = [Step(" * 2 + 1", lambda t: t * 2 + 1), count, Step(" -> offset_reader", offset_reader)]
    sizes = sorted({rng.randint(2, bound), bound, bound + 1, rng.randint(bound + 1, 3 * bound)})
    return Case(
        seed,
        "buckets",
        steps,
        True,
        [make(n) for n in sizes],
        {offset_reader.name: table},  # type: ignore[dict-item]
        "fake" if mode == "autotune" else None,
        dispatch="branches" if mode == "branches" else "graphs",
        wrap=mode != "trace_through",
        ours=rng.choice(["vllm_ir", "inductor"]) if mode == "trace_through" else "vllm_ir",
    )


class _RandomTimer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, provider: str, prepare: Any, device: torch.device) -> float:
        return self.rng.uniform(1e-6, 2e-6)


@dataclass
class Stats:
    cases: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    regressions: list[str] = field(default_factory=list)
    """Inductor right, vllm-ir wrong: failures."""
    upstream: Counter[str] = field(default_factory=Counter)
    """Both backends wrong (torch's bug)."""
    fixed_upstream: Counter[str] = field(default_factory=Counter)
    """Inductor wrong, vllm-ir right."""
    invalid: Counter[str] = field(default_factory=Counter)
    """Calls eager refuses (a program generated for another input), skipped."""

    def record(self, family: str, ok: bool, plain_ok: bool, failure: str) -> None:
        """Count one call: vllm-ir ``ok`` or not, plain Inductor ``plain_ok`` or not;
        ``failure`` describes it, kept for a regression (Inductor right, vllm-ir wrong)."""
        self.calls[family] += 1
        if ok and not plain_ok:
            self.fixed_upstream[family] += 1
        elif not ok and not plain_ok:
            self.upstream[family] += 1
        elif not ok:
            self.regressions.append(f"[{family}] {failure} (inductor right)")

    def to_json(self) -> dict[str, Any]:
        return {
            family: {
                "cases": self.cases[family],
                "calls": self.calls[family],
                "regressions": sum(r.startswith(f"[{family}]") for r in self.regressions),
                "both_wrong_upstream": self.upstream[family],
                "inductor_wrong_vllm_ir_right": self.fixed_upstream[family],
                "skipped_invalid_calls": self.invalid[family],
            }
            for family in self.cases
        }


def _backend(case: Case) -> Any:
    if case.ours == "inductor":
        return "inductor"
    if case.autotune is None:
        return ir.VllmIRBackend(priority=case.priority, bucket_dispatch=case.dispatch)
    timer = _RandomTimer(case.seed) if case.autotune == "fake" else WallClockTimer(0, 1)
    return ir.VllmIRBackend(
        priority=case.priority,
        autotune=Autotuner(timer=timer, persist=False, margin=0.0),
        bucket_dispatch=case.dispatch,
    )


def check_case(case: Case, stats: Stats) -> None:
    """Compile ``case`` with both backends and call each on every input."""
    if case.settings:
        _check_cache_reuse(case, stats)
        return
    torch._dynamo.reset()
    ours = torch.compile(case.run, backend=_backend(case), dynamic=case.dynamic or None)
    theirs = torch.compile(case.run, backend="inductor", dynamic=case.dynamic or None)
    stats.cases[case.family] += 1
    op = offset_reader
    for x in case.inputs:
        with op.set_priority(case.priority[op.name]), torch.no_grad(), inductor_caches_off():
            try:
                want = case.run(x.clone())
            except RuntimeError:  # the steps do not fit this input (recompiles)
                stats.invalid[case.family] += 1
                continue
            plain = theirs(x.clone())
            try:
                with ir.enable_torch_wrap(case.wrap):
                    got = ours(x.clone())
            except Exception as e:  # a crash where Inductor runs is a finding too
                first = str(getattr(e, "inner_exception", e)).splitlines()[0][:200]
                stats.record(
                    case.family,
                    False,
                    _same(plain, want),
                    f"{case.describe()}: input {tuple(x.shape)}: vllm_ir raised "
                    f"{type(e).__name__}: {first}",
                )
                return
        stats.record(
            case.family,
            _same(got, want),
            _same(plain, want),
            f"{case.describe()}: input {tuple(x.shape)}/{x.stride()} {x.dtype}: "
            f"eager {want.tolist()} vllm_ir {got.tolist()}",
        )


def _check_cache_reuse(case: Case, stats: Stats) -> None:
    """One compile per setting, Inductor's caches on, each against eager."""
    stats.cases[case.family] += 1
    x = case.inputs[0]
    saved = os.environ.get("VLLM_BATCH_INVARIANT")
    try:
        for provider, batch_invariant in case.settings:
            os.environ["VLLM_BATCH_INVARIANT"] = "1" if batch_invariant else "0"
            invalidate_caches()
            torch._dynamo.reset()
            case.priority = {offset_reader.name: [provider, "native"]}
            ours = torch.compile(case.run, backend=_backend(case), dynamic=case.dynamic or None)
            with offset_reader.set_priority(case.priority[offset_reader.name]), torch.no_grad():
                want, got = case.run(x.clone()), ours(x.clone())
            stats.calls[case.family] += 1
            if not _same(got, want):  # plain Inductor runs the op eagerly: always right
                stats.regressions.append(
                    f"[{case.family}] {case.describe()}: {provider}, batch invariant "
                    f"{batch_invariant}: eager {want.tolist()} vllm_ir {got.tolist()}"
                )
    finally:
        if saved is None:
            os.environ.pop("VLLM_BATCH_INVARIANT", None)
        else:
            os.environ["VLLM_BATCH_INVARIANT"] = saved
        invalidate_caches()


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
