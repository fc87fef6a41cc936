"""Kernel choice by measurement: time every candidate impl of an IR node, keep the fastest.

Used by the lowering pass when the backend is created with ``autotune=True``
(:class:`Autotuner`), and by ``vllm-ir tune`` for eager deployments
(:func:`measure`, :func:`decide`).

What is timed, for one distinct ``(op, argument metadata)``:

* **Candidates** are the impls compiled selection would accept on the node's
  FakeTensors, in priority order: each entry of the effective compiled list
  (then, if the user set no list for the op, the platform's eager entries the
  compiled list left out), checked by ``op.select`` (``supported``,
  ``VLLM_BATCH_INVARIANT``, ``supports_args``). Anything selection rejects is
  never run.
* **Inputs** are real tensors with the node's dtypes, shapes and strides.
  A dynamic dimension is taken at its hint (the size Dynamo saw when it traced
  the graph, from ``symbolic_shapes.optimization_hint`` (``hint_int`` on torch 2.11),
  which adds no guard); the choice is then used for every size of that
  dimension, as a compiled graph serves them all. Values follow the op's input
  generator (:mod:`vllm_ir._schema.samples`): the mean and spread of its first sample's
  tensor in the same position, so scales stay positive and weights near one.
  Ops without one get ``randn`` (``rand + 0.5`` for parameters named ``*scale*``).
  Integer tensors (indices, positions) get values in ``[0, n)``, ``n`` the
  smallest leading dimension of the other tensor arguments, so they index
  valid rows; boolean tensors get random masks.
* **In-place impls** run on fresh copies of their activations each call (made
  outside the timed region), so every call sees the same inputs.
* **native** is timed as Inductor compiles it on its own (``make_fx`` of the
  native function, then ``compile_fx``), not eagerly: that is what lowering
  to native produces. A compiled graph called alone pays its Python wrapper
  (argument handling, output allocation: ~10 us per call on a CPU), which
  inside a model is paid once per graph, not per op; with the default timer
  that cost, measured on a trivial compiled graph, is subtracted from native's
  time (``TuningRecord.native_overhead_s``).

The decision (:func:`decide`): a candidate other than native must beat native
by ``margin`` (default 10 %). Inside a model, the lowered native function fuses
with its neighbours (the residual add into the preceding GEMM, the norm into
the next quantization), which an opaque kernel cannot; timing the op alone
credits native none of that, so a kernel has to win clearly. Among the
candidates left, the fastest wins; times within ``tie_tolerance`` of the
fastest count as ties, broken by priority order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import _disable_current_modes
from vllm_ir_cli.flags import DEFAULT_AUTOTUNE_BUCKETS, DEFAULT_AUTOTUNE_MARGIN

from vllm_ir._base.fingerprint import code_fingerprint
from vllm_ir._base.logger import get_logger
from vllm_ir._base.timing import Timing, decide_or_refuse
from vllm_ir._base.torch_private import size_hint
from vllm_ir._discovery.build_cache import BuildCacheError, UnsafeCacheError
from vllm_ir._op.op import IrOp
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir.compilation._bucket_branches import bucket_branches
from vllm_ir.compilation._context import _current_context
from vllm_ir.compilation._rank_agreement import agreed_winner
from vllm_ir.compilation._tuning_cache import TuningCache, record_problem
from vllm_ir.priority import Mode, selection_mode_scope, user_priority

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_MARGIN",
    "Autotuner",
    "Timer",
    "TuningRecord",
    "WallClockTimer",
    "candidates",
    "decide",
    "measure",
    "real_inputs",
]

logger = get_logger(__name__)

DEFAULT_MARGIN = DEFAULT_AUTOTUNE_MARGIN
"""How much faster than Inductor-compiled native a kernel must be to replace it."""

DEFAULT_BUCKETS: tuple[int, ...] = DEFAULT_AUTOTUNE_BUCKETS
"""Autotuning's token buckets: decode (<= 16 tokens), <= 256, and larger."""

LAST_BUCKET_FACTOR = 4
"""The last bucket is measured at this multiple of the largest bound (1024 tokens by default)."""

DEFAULT_ROUNDS = 5
"""Interleaved rounds per bucket: each times every candidate once, round-robin."""

_UNBACKED_HINT = 4096  # a dynamic dim without a hint (data-dependent): a typical token count

Prepare = Callable[[], Callable[[], object]]
"""Returns a ready call (fresh inputs already made); only the call is timed."""


class Timer(Protocol):
    """Seconds per call of ``provider``'s impl; ``prepare()`` gives one ready call."""

    def __call__(self, provider: str, prepare: Prepare, device: torch.device) -> float: ...


@dataclass
class WallClockTimer:
    """Median over ``runs`` calls after ``warmup``; CUDA events on a GPU."""

    warmup: int = 3
    runs: int = 25

    def __call__(self, provider: str, prepare: Prepare, device: torch.device) -> float:
        for _ in range(self.warmup):
            prepare()()
        cuda = device.type == "cuda"
        samples = []
        for _ in range(self.runs):
            call = prepare()
            if cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                call()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                call()
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)


@dataclass(frozen=True)
class TuningRecord:
    """One tuning decision: candidates in priority order, their times, the winner."""

    op: str
    candidates: tuple[str, ...]
    times_s: dict[str, float]
    winner: str
    margin: float
    from_cache: bool = False
    tuning_s: float = 0.0
    """Seconds this decision took to measure (0 when read from the cache)."""
    native_overhead_s: float = 0.0
    """Call overhead of a compiled graph, subtracted from native's measured time."""
    nodes: list[str] = field(default_factory=list)
    bucket: str = ""
    """The token bucket measured (``<=16``, ``>256``; empty: the node's own size)."""
    tokens: int = 0
    """The token count measured at (0: the node's own size)."""
    threads: int = 0
    """``torch.get_num_threads()`` while measuring."""
    spread_s: dict[str, list[float]] = field(default_factory=dict)
    """``[p10, p90]`` of each candidate over interleaved rounds (bucket measurements)."""
    decided: bool = True
    """False when the timings were too noisy to rank: the priority order was kept."""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("nodes")
        d.pop("from_cache")
        d.pop("tuning_s")
        d["candidates"] = list(self.candidates)
        return d


def candidates(
    op: IrOp, args: Sequence[Any], mode: Mode = "compiled", *, tokens: int | None = None
) -> list[IrOpImpl]:
    """The impls selection would accept for ``args``, in effective priority order.

    In compiled mode, when the user set no list for the op, the platform's eager
    kernels follow the compiled list: compiled defaults often name only native
    (fused, it beat the kernels where it was measured), and measuring that again
    here is the point of autotuning. A user's list is the candidate set as given.
    ``tokens``: the token count whose bucket's lists apply (default: the call's,
    when it is static).
    """
    if tokens is None:
        count = op.tokens(*args)
        tokens = count if type(count) is int else None
    providers = op.get_priority(mode, tokens=tokens)
    if mode == "compiled" and not user_priority(op.name)[0]:
        providers += [p for p in op.get_priority("eager", tokens=tokens) if p not in providers]
    # the one rule of selection, on every impl
    if tokens is None:
        found = op.candidates(*args, mode=mode)
    else:
        with selection_mode_scope(mode):
            found = op.selector.candidates(tuple(args), tokens=tokens)
    accepted = []
    for provider in providers:
        if provider not in op.impls:
            continue
        decision = found[provider]
        if decision.accepted:
            accepted.append(op.impls[provider])
        else:
            logger.debug("autotune %s: %s not a candidate: %s", op.name, provider, decision.reason)
    return accepted


def decide(
    times: dict[str, float], order: Sequence[str], margin: float, tie_tolerance: float = 0.0
) -> str:
    """The winner among ``times`` (keys in priority ``order``); see the module doc."""
    native = times.get("native")
    eligible = [
        p
        for p in order
        if p in times and (p == "native" or native is None or times[p] < native * (1 - margin))
    ]
    best = min(times[p] for p in eligible)
    return next(p for p in eligible if times[p] <= best * (1 + tie_tolerance))


def _hint(value: Any) -> Any:
    if isinstance(value, torch.SymInt):
        return size_hint(value, _UNBACKED_HINT)
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        return value.node.hint
    return value


def _sample_stats(
    op: IrOp, dtype: torch.dtype, device: torch.device
) -> dict[int, tuple[float, float]]:
    """Mean and std of each tensor argument of the op's first sample input."""
    try:
        sample = next(op.sample_inputs(dtype, device))
    except (LookupError, StopIteration):
        return {}
    stats = {}
    for i, a in enumerate(sample.args):
        if isinstance(a, torch.Tensor) and a.numel():
            f = a.detach().float().cpu()
            stats[i] = (f.mean().item(), f.std().item() if f.numel() > 1 else 0.0)
    return stats


Sizes = Callable[[Any], Any]
"""A concrete value for each (possibly symbolic) size: ``_hint``, or a bucket's sizes."""


def sizes_for_tokens(op: IrOp, args: Sequence[Any], tokens: int) -> Sizes:
    """Concrete sizes with the call's token count near ``tokens``: the first symbolic
    token dim of the first activation is set so the product reaches ``tokens``
    (other symbols at their hints; tensors sharing the symbol follow it)."""
    idx = op.selector.tokens_at
    act = args[idx] if idx is not None and idx < len(args) else None
    if not isinstance(act, torch.Tensor):
        return _hint
    dims: list[Any] = list(act.shape[: -op.feature_dims])
    free = [i for i, d in enumerate(dims) if isinstance(d, torch.SymInt) and d.node.expr.is_symbol]
    if not free:
        return _hint
    target = dims[free[0]].node.expr
    others = 1
    for i, d in enumerate(dims):
        if i != free[0]:
            others *= int(_hint(d))
    value = max(1, tokens // max(1, others))

    def size(s: Any) -> Any:
        if not isinstance(s, torch.SymInt):
            return _hint(s)
        expr, env = s.node.expr, s.node.shape_env
        # torch 2.13 renamed var_to_val (hints of backed symbols); 2.11 has the old name
        hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
        subs = {
            sym: value if sym == target else int(hints.get(sym, _UNBACKED_HINT))
            for sym in expr.free_symbols
        }
        return int(expr.xreplace(subs))

    return size


def real_inputs(op: IrOp, args: Sequence[Any], size: Sizes | None = None) -> tuple[Any, ...]:
    """Real arguments with the metadata of ``args`` (FakeTensors or tensors); see module doc.

    ``size`` gives each symbolic size its value (default: its hint)."""
    size = size or _hint
    names = list(op.signature.parameters)
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    stats = _sample_stats(op, first.dtype, first.device) if first is not None else {}
    gen = torch.Generator().manual_seed(0)
    out: list[Any] = []
    with _disable_current_modes():
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                out.append(size(a))
                continue
            shape = [int(size(s)) for s in a.shape]
            stride = [int(size(s)) for s in a.stride()]
            # the elements a tensor of this shape and these strides spans
            span = sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) + 1
            span = span if all(shape) else 0
            if a.dtype == torch.bool:
                values = torch.rand(span, generator=gen) < 0.5
            elif not (a.dtype.is_floating_point or a.dtype.is_complex):
                # integers are indices more often than not: keep them valid for
                # every other tensor argument's leading dimension
                values = torch.randint(0, _index_bound(args, i, size), (span,), generator=gen)
            else:
                if i in stats:
                    mean, std = stats[i]
                else:
                    mean, std = (1.0, 0.25) if "scale" in names[i] else (0.0, 1.0)
                values = torch.randn(span, generator=gen) * std + mean
                if std == 0.0 or "scale" in names[i]:
                    values = values.abs()
            buffer = values.to(dtype=a.dtype, device=a.device)
            out.append(buffer.as_strided(shape, stride))
    return tuple(out)


def _index_bound(args: Sequence[Any], position: int, size: Sizes = _hint) -> int:
    """Exclusive bound for the values of integer argument ``position``: the smallest
    leading dimension of the other tensor arguments (1 when there is none), so an
    index tensor addresses valid rows of whichever tensor it indexes."""
    rows = [
        int(size(a.shape[0]))
        for j, a in enumerate(args)
        if j != position and isinstance(a, torch.Tensor) and a.dim() > 0
    ]
    return max(1, min(rows, default=1))


def _fresh_call(op: IrOp, impl: IrOpImpl, inputs: tuple[Any, ...]) -> Prepare:
    if not impl.inplace:
        return lambda: lambda: impl.impl_fn(*inputs)
    idx = op.activation_indices  # the positions an in-place impl writes

    def prepare() -> Callable[[], object]:
        fresh = tuple(a.clone() if i in idx else a for i, a in enumerate(inputs))
        return lambda: impl.impl_fn(*fresh)

    return prepare


def _inductor_native(op: IrOp, inputs: tuple[Any, ...]) -> Prepare:
    """native as Inductor compiles it on its own; compiled on the first call only,
    so a timer that never runs it (a cache hit, a fake timer) costs nothing."""
    compiled: list[Callable[..., object]] = []
    positions = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
    tensors = [inputs[i] for i in positions]
    native = op.impls["native"].impl_fn

    def call(*ts: torch.Tensor) -> object:
        full = list(inputs)
        for i, t in zip(positions, ts, strict=True):
            full[i] = t
        return native(*full)

    def prepare() -> Callable[[], object]:
        if not compiled:
            compiled.append(_compile_alone(call, tensors))
        fn = compiled[0]
        return lambda: fn(*tensors)

    return prepare


def _compile_alone(fn: Callable[..., object], tensors: list[torch.Tensor]) -> Callable[..., object]:
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    # Called from inside a compilation: none of its hooks (our passes) may run here.
    hooks = dict.fromkeys(
        (
            "pre_grad_custom_pass",
            "joint_custom_pre_pass",
            "post_grad_custom_pre_pass",
            "post_grad_custom_post_pass",
        )
    )
    with inductor_config.patch(hooks), _outside_current_compile():
        gm = make_fx(fn)(*tensors)
        return compile_fx(gm, tensors)  # type: ignore[return-value]


@contextlib.contextmanager
def _outside_current_compile() -> Iterator[None]:
    """Run a nested ``compile_fx`` as if no compile were open.

    With Inductor's caches on, a compile collects the Triton kernels it makes
    into its cache entry through the class-level ``TritonBundler`` (torch 2.13):
    a nested compile finds the outer one's bundle open (``begin_compile``
    asserts) and closes it when done. The outer bundle is set aside and
    restored, so both compiles bundle their own kernels. The nested compile
    also runs outside the outer one's ``TracingContext``: on an FX-cache hit it
    would record its output strides there (and assert it is the first).
    """
    from torch._guards import tracing
    from torch._inductor.triton_bundler import TritonBundler

    fields = ("_entries", "_static_autotuners", "_winners")
    saved = {name: getattr(TritonBundler, name, None) for name in fields}
    for name in fields:
        setattr(TritonBundler, name, None)
    try:
        # and outside its TracingContext, whose output strides a cache hit of
        # the nested graph would otherwise fill in
        with tracing(None):
            yield
    finally:
        for name, value in saved.items():
            setattr(TritonBundler, name, value)


_overheads: dict[str, float] = {}


def compiled_call_overhead(timer: Timer, device: torch.device) -> float:
    """Seconds per call of a trivial Inductor-compiled graph on ``device`` (once per
    process and device): the wrapper cost an op pays alone but not inside a model."""
    name = str(device)
    if name not in _overheads:
        with _disable_current_modes(), torch.no_grad():
            t = torch.zeros(1, device=device)
            fn = _compile_alone(lambda a: a + 1, [t])
            _overheads[name] = float(timer("overhead", lambda: lambda: fn(t), device))
    return _overheads[name]


def measure(
    op: IrOp,
    impls: Sequence[IrOpImpl],
    args: Sequence[Any],
    timer: Timer,
    *,
    compiled_native: bool = True,
    size: Sizes | None = None,
) -> dict[str, float]:
    """Seconds per call of each impl on real inputs shaped like ``args``."""
    with _disable_current_modes(), torch.no_grad():
        inputs = real_inputs(op, args, size)
        device = next(a.device for a in inputs if isinstance(a, torch.Tensor))
        times = {}
        for impl in impls:
            if impl.provider == "native" and compiled_native:
                prepare = _inductor_native(op, inputs)
            else:
                prepare = _fresh_call(op, impl, inputs)
            times[impl.provider] = float(timer(impl.provider, prepare, device))
    return times


def measure_rounds(
    op: IrOp,
    impls: Sequence[IrOpImpl],
    args: Sequence[Any],
    timer: Timer,
    rounds: int,
    *,
    size: Sizes | None = None,
    compiled_native: bool = True,
) -> dict[str, Timing]:
    """Each impl timed ``rounds`` times, interleaved (round ``r`` times every impl
    once before round ``r + 1``), summarized as median, p10, p90 (seconds)."""
    with _disable_current_modes(), torch.no_grad():
        inputs = real_inputs(op, args, size)
        device = next(a.device for a in inputs if isinstance(a, torch.Tensor))
        prepares = {
            impl.provider: (
                _inductor_native(op, inputs)
                if impl.provider == "native" and compiled_native
                else _fresh_call(op, impl, inputs)
            )
            for impl in impls
        }
        samples: dict[str, list[float]] = {p: [] for p in prepares}
        for _ in range(rounds):
            for provider, prepare in prepares.items():
                samples[provider].append(float(timer(provider, prepare, device)))
    return {p: Timing.of(s) for p, s in samples.items()}


def metadata_key(
    op: IrOp,
    impls: Sequence[IrOpImpl],
    args: Sequence[Any],
    settings: Any,
    size: Sizes = _hint,
) -> str:
    """The tuning cache key: op, candidates with their packages (distribution and
    version) and code fingerprints, argument metadata (sizes by ``size``: a
    bucket's representative sizes), and the decision settings (margin, overhead
    subtraction, the bucket). The file it is kept in is named by the machine and
    software environment (:mod:`vllm_ir.compilation._tuning_cache`)."""
    parts: list[Any] = [op.name, settings]
    parts += [(i.provider, i.package, code_fingerprint(i.impl_fn, i.supports_args)) for i in impls]
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(
                (
                    str(a.dtype),
                    a.device.type,
                    [int(size(s)) for s in a.shape],
                    [int(size(s)) for s in a.stride()],
                )
            )
        else:
            parts.append(repr(size(a)))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


class Autotuner:
    """Chooses each IR node's impl by measurement (the lowering pass asks :meth:`choose`).

    ``timer`` times one candidate (default :class:`WallClockTimer`);
    ``margin`` is how much faster than native a kernel must be;
    ``cache`` persists results (default: a :class:`TuningCache` in the vllm-ir cache
    dir, per device; ``persist=False`` keeps them in memory only).

    With a dynamic token count, every token bucket the count can reach
    (``buckets``, default :data:`DEFAULT_BUCKETS`, joined with the bounds of
    the op's priority table) is measured at a representative size (its upper
    bound; the last at :data:`LAST_BUCKET_FACTOR` times the largest bound),
    ``rounds`` interleaved rounds each; the lowering branches on the winners
    (:meth:`choose_buckets`). A bucket whose timings are too noisy to rank
    keeps the priority order, and its record says so.
    """

    def __init__(
        self,
        *,
        margin: float = DEFAULT_MARGIN,
        timer: Timer | None = None,
        tie_tolerance: float = 0.02,
        persist: bool = True,
        subtract_overhead: bool | None = None,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        rounds: int = DEFAULT_ROUNDS,
    ) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"autotune margin must be in [0, 1), got {margin!r}")
        self.buckets = check_buckets(buckets)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"autotune rounds must be a positive int, got {rounds!r}")
        self.rounds = rounds
        self.margin = margin
        self.timer: Timer = timer if timer is not None else WallClockTimer()
        self.tie_tolerance = tie_tolerance
        self.persist = persist
        # by default with the default timer only: a fake timer knows no "overhead"
        self.subtract_overhead = timer is None if subtract_overhead is None else subtract_overhead
        self.records: dict[str, TuningRecord] = {}
        """Every decision of this tuner, by cache key."""
        self._caches: dict[str, TuningCache] = {}

    def _cache(self, device: torch.device) -> TuningCache | None:
        if not self.persist:
            return None
        name = str(device)
        if name not in self._caches:
            self._caches[name] = TuningCache(device)
        return self._caches[name]

    def cache_state(self) -> tuple[Any, ...]:
        """What the FX graph cache key must cover: the settings and the tuning results
        a compile would read (a digest of the persistent records for this device)."""
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        cache = self._cache(device)
        digest = cache.digest() if cache is not None else "memory"
        memo = sorted((k, r.winner) for k, r in self.records.items())
        settings = (self.margin, self.tie_tolerance, self.subtract_overhead)
        return ("autotune", *settings, self.buckets, self.rounds, digest, tuple(memo))

    def choose_buckets(
        self, op: IrOp, node: str, args: Sequence[Any]
    ) -> list[tuple[int | None, IrOpImpl]] | None:
        """``(max_tokens, impl)`` per reachable bucket of a symbolic token count,
        neighbours with one winner merged (``None`` for a static count: :meth:`choose`)."""
        tokens = op.tokens(*args)
        if type(tokens) is int:
            return None
        plan = op.size_plan().merged(self.buckets)

        def choose(i: int, low: int, high: int) -> IrOpImpl:
            top = plan.upper(i)
            if top is None:
                top = plan.bounds[-1] * LAST_BUCKET_FACTOR
            rep = min(max(top, low), high)  # the bucket's upper end, within the symbol's range
            return self._choose_bucket(op, node, args, plan.label(i), rep)

        return bucket_branches(plan, tokens, choose)

    def _choose_bucket(
        self, op: IrOp, node: str, args: Sequence[Any], label: str, tokens: int
    ) -> IrOpImpl:
        impls = candidates(op, args, tokens=tokens)
        if len(impls) == 1:
            return impls[0]
        size = sizes_for_tokens(op, args, tokens)
        settings = (self.margin, self.subtract_overhead, "bucket", label, self.rounds)
        key = metadata_key(op, impls, args, settings, size)
        record = self.records.get(key) or self._lookup(
            op, key, impls, args, size=size, bucket=(label, tokens)
        )
        name = f"{node}[{label}]"
        if name not in record.nodes:
            record.nodes.append(name)
            ctx = _current_context()
            if ctx is not None:
                ctx.autotuned[name] = record
        return op.impls[record.winner]

    def choose(self, op: IrOp, node: str, args: Sequence[Any]) -> IrOpImpl:
        """The impl lowered for ``node``: measured, or read from the caches."""
        impls = candidates(op, args)
        if len(impls) == 1:
            return impls[0]
        key = metadata_key(op, impls, args, (self.margin, self.subtract_overhead))
        record = self.records.get(key) or self._lookup(op, key, impls, args)
        if node not in record.nodes:
            record.nodes.append(node)
            logger.debug("autotune: node %s (%s) lowered to %s", node, op.name, record.winner)
            ctx = _current_context()
            if ctx is not None:
                ctx.autotuned[node] = record
        return op.impls[record.winner]

    def _lookup(
        self,
        op: IrOp,
        key: str,
        impls: list[IrOpImpl],
        args: Sequence[Any],
        *,
        size: Sizes | None = None,
        bucket: tuple[str, int] | None = None,
    ) -> TuningRecord:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        cache = self._cache(device)
        stored = cache.get(key) if cache is not None else None
        order = tuple(i.provider for i in impls)
        # a record of other candidates (or one that lost its times) is measured again
        if (
            stored is not None
            and record_problem(stored) is None
            and stored["winner"] in order
            and set(order) <= set(stored["times_s"])
        ):
            record = TuningRecord(
                op.name,
                order,
                dict(stored["times_s"]),
                stored["winner"],
                self.margin,
                from_cache=True,
                native_overhead_s=float(stored.get("native_overhead_s", 0.0)),
                bucket=str(stored.get("bucket", "")),
                tokens=int(stored.get("tokens", 0)),
                threads=int(stored.get("threads", 0)),
                decided=bool(stored.get("decided", True)),
                note=str(stored.get("note", "")),
            )
        else:
            start = time.perf_counter()
            spread: dict[str, list[float]] = {}
            decided, note = True, ""
            if bucket is None:
                times = measure(op, impls, args, self.timer)
            else:
                timings = measure_rounds(op, impls, args, self.timer, self.rounds, size=size)
                times = {p: t.median for p, t in timings.items()}
            overhead = 0.0
            if self.subtract_overhead and "native" in times:
                overhead = min(compiled_call_overhead(self.timer, device), times["native"] / 2)
                times["native"] -= overhead  # never below half of what was measured
            winner = decide(times, order, self.margin, self.tie_tolerance)
            if bucket is not None:
                if overhead:
                    n = timings["native"]
                    timings["native"] = Timing(
                        n.median - overhead, n.p10 - overhead, n.p90 - overhead
                    )
                spread = {p: [t.p10, t.p90] for p, t in timings.items()}
                verdict = decide_or_refuse(timings, order, winner)
                winner, decided, note = verdict.winner, verdict.decided, verdict.note
                if not decided:
                    logger.warning("autotune %s %s: %s", op.name, bucket[0], note)
            elapsed = time.perf_counter() - start
            record = TuningRecord(
                op.name,
                order,
                times,
                winner,
                self.margin,
                tuning_s=elapsed,
                native_overhead_s=overhead,
                bucket=bucket[0] if bucket else "",
                tokens=bucket[1] if bucket else 0,
                threads=torch.get_num_threads(),
                spread_s=spread,
                decided=decided,
                note=note,
            )
            logger.debug("autotune %s: tuned in %.2f s", op.name, elapsed)
            if cache is not None:
                try:
                    cache.put(key, record.to_json())
                except UnsafeCacheError:
                    raise
                except BuildCacheError as e:  # persisting is only a cache: keep the result
                    logger.warning("autotune %s: result not saved: %s", op.name, e)
        chosen = agreed_winner(op.name, record.winner, order)
        if chosen != record.winner:  # the group's choice, not this rank's measurement
            record = dataclasses.replace(
                record, winner=chosen, note=f"rank 0's choice; {record.note}"
            )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "autotune %s%s: %s -> %s",
                op.name,
                " (cached)" if record.from_cache else "",
                ", ".join(f"{p} {record.times_s[p] * 1e6:.1f} us" for p in order),
                record.winner,
            )
        self.records[key] = record
        return record


def check_buckets(buckets: Sequence[int]) -> tuple[int, ...]:
    """Autotuning bucket bounds: positive ints, strictly ascending, at least one."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence):
        raise TypeError(f"autotune buckets must be a list of token bounds, got {buckets!r:.80}")
    bounds = tuple(buckets)
    if not bounds or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in bounds):
        raise ValueError(
            f"autotune buckets must be positive ints, e.g. (16, 256), got {list(bounds)!r:.80}"
        )
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"autotune buckets must ascend strictly, got {list(bounds)!r:.80}")
    return bounds
