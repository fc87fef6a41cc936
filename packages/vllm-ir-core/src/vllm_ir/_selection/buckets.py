"""Per-size priorities: a priority entry split into token-count buckets.

A bucketed entry is a list of buckets in ascending ``max_tokens``; the last
has no ``max_tokens`` and covers every larger size::

    [{"max_tokens": 64, "priority": ["cpu_c", "native"]}, {"priority": ["native"]}]

A call falls into the first bucket whose ``max_tokens`` is at least its token
count (:func:`tokens_of`: the product of all but the last dim of the op's
first activation). A plain list of providers still means every size.

The CLI spelling is ``<=64:cpu_c,native;native`` (``;`` between buckets,
``<=N:`` before each bounded one): see :func:`parse_bucket_text`.

>>> table = as_priority([{"max_tokens": 16, "priority": ["a"]}, {"priority": ["b"]}], "x")
>>> table.for_tokens(16), table.for_tokens(17)
(('a',), ('b',))
>>> format_bucket_text(table)
'<=16:a;b'
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from vllm_ir._base.text import short_repr, typed_repr

__all__ = [
    "ALL_SIZES",
    "AmbiguousBucket",
    "Bucket",
    "BucketedPriority",
    "PrioritySpec",
    "PriorityTypeError",
    "SizePlan",
    "as_priority",
    "assume_range",
    "assumed_range",
    "format_bucket_text",
    "guarded_bucket_tokens",
    "merged_bounds",
    "parse_bucket_text",
    "priority_for_tokens",
    "spec_bounds",
    "static_bucket_tokens",
    "symbolic_range",
    "spec_to_json",
    "tokens_of",
]

_KEYS = frozenset({"max_tokens", "priority"})


class PriorityTypeError(TypeError, ValueError):
    """A priority entry of the wrong type: a ``TypeError``, and a ``ValueError`` too,
    so the CLI reports it as bad input in one line like every other."""


@dataclass(frozen=True)
class Bucket:
    """The providers for calls of at most ``max_tokens`` tokens (``None``: any larger size)."""

    max_tokens: int | None
    providers: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.max_tokens is None else {"max_tokens": self.max_tokens}
        out["priority"] = list(self.providers)
        return out


@dataclass(frozen=True)
class BucketedPriority:
    """Buckets in ascending ``max_tokens``, the last a catch-all (see :func:`as_priority`)."""

    buckets: tuple[Bucket, ...]

    @property
    def bounds(self) -> tuple[int, ...]:
        """The ``max_tokens`` of every bucket but the catch-all, ascending."""
        return tuple(b.max_tokens for b in self.buckets if b.max_tokens is not None)

    def for_tokens(self, tokens: int) -> tuple[str, ...]:
        """The providers of the bucket that ``tokens`` falls into."""
        return self.buckets[SizePlan(self.bounds).index(tokens)].providers

    def providers(self) -> tuple[str, ...]:
        """Every provider any bucket names, in first-named order."""
        return tuple(dict.fromkeys(p for b in self.buckets for p in b.providers))

    def to_json(self) -> list[dict[str, Any]]:
        return [b.to_json() for b in self.buckets]

    def __repr__(self) -> str:
        return f"BucketedPriority({format_bucket_text(self)!r})"


PrioritySpec = Union[tuple[str, ...], BucketedPriority]  # noqa: UP007 (a runtime alias)
"""One op's priority entry: providers for every size, or per-size buckets."""


def tokens_of(activation: Any, feature_dims: int = 1) -> Any:
    """The token count of a call: the product of all but the last ``feature_dims``
    dims of its first activation (1 for smaller ranks). A SymInt for symbolic sizes."""
    shape = getattr(activation, "shape", None)
    if shape is None:
        return 1
    tokens: Any = 1
    for size in tuple(shape)[:-feature_dims]:
        tokens = tokens * size
    return tokens


ALL_SIZES = "all sizes"
"""The bucket of a call whose op's effective table has no buckets."""


@dataclass(frozen=True)
class SizePlan:
    """An op's size buckets in one context, and everything read from them.

    Calls of at most ``bounds[i]`` tokens (and more than ``bounds[i - 1]``)
    share bucket ``i``; bucket ``len(bounds)`` holds every larger count. With
    no bounds there is one bucket, every size, and the plan is false. The
    selector returns it (:meth:`vllm_ir.IrOp.size_plan`); the eager key, the
    lowering's branches, the graph pieces, the autotuner, ``explain`` and the
    kernel plan read only this.

    >>> plan = SizePlan((16, 256))
    >>> plan.index(16), plan.index(17), plan.index(1000)
    (0, 1, 2)
    >>> plan.labels, plan.label_of(100)
    (('<=16', '<=256', '>256'), '<=256')
    >>> list(plan.indices(10, 100)), plan.label_of_range(17, 200), plan.label_of_range(1, 300)
    ([0, 1], '<=256', 'all sizes')
    >>> plan.lowest(1, 10), plan.upper(1), plan.upper(2)
    (17, 256, None)
    >>> plan.merged([64]).bounds, bool(SizePlan()), SizePlan().label_of(5)
    ((16, 64, 256), False, 'all sizes')
    """

    bounds: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.bounds)

    def __len__(self) -> int:
        """The number of buckets."""
        return len(self.bounds) + 1

    def index(self, tokens: int) -> int:
        """The bucket of ``tokens``: the first bound ``>= tokens``, else the last bucket."""
        return bisect.bisect_left(self.bounds, tokens)

    def label(self, index: int) -> str:
        """``<=16`` for a bounded bucket, ``>256`` for the last, ``all sizes`` without bounds."""
        if not self.bounds:
            return ALL_SIZES
        if index < len(self.bounds):
            return f"<={self.bounds[index]}"
        return f">{self.bounds[-1]}"

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.label(i) for i in range(len(self)))

    def label_of(self, tokens: int) -> str:
        return self.label(self.index(tokens))

    def indices(self, low: int, high: int) -> range:
        """The buckets a count in ``[low, high]`` can fall into."""
        return range(self.index(low), self.index(high) + 1)

    def label_of_range(self, low: int, high: int) -> str:
        """The bucket of every count in ``[low, high]``, or ``all sizes`` if several."""
        first, last = self.index(low), self.index(high)
        return self.label(first) if first == last else ALL_SIZES

    def lowest(self, index: int, low: int) -> int:
        """The smallest count of bucket ``index`` that is at least ``low``: the
        representative a selection of that bucket is made with."""
        return max(low, self.bounds[index - 1] + 1) if index else low

    def upper(self, index: int) -> int | None:
        """The largest count of bucket ``index``; ``None`` for the unbounded last one."""
        return self.bounds[index] if index < len(self.bounds) else None

    def merged(self, extra: Iterable[int]) -> SizePlan:
        """This plan cut further at ``extra`` (the autotuner's own buckets)."""
        return SizePlan(tuple(sorted({*self.bounds, *extra})))


def _where_bucket(where: str, i: int) -> str:
    return f"{where} bucket {i}"


def _providers(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise PriorityTypeError(
            f"{where} must be a list of provider names, got {typed_repr(value)}"
        )
    listed = list(value)
    if not all(isinstance(p, str) for p in listed):
        raise PriorityTypeError(
            f"{where} must be a list of provider names, got {typed_repr(listed)}"
        )
    return tuple(listed)


def _bucket(value: object, where: str) -> Bucket:
    if isinstance(value, Bucket):
        value = value.to_json()
    if not isinstance(value, Mapping):
        raise PriorityTypeError(
            f'{where} must be {{"max_tokens": N, "priority": [...]}}, got {typed_repr(value)}'
        )
    unknown = [k for k in value if k not in _KEYS]
    if unknown:
        raise ValueError(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
            "a bucket has max_tokens (all but the last) and priority"
        )
    if "priority" not in value:
        raise ValueError(f"{where} has no priority list")
    bound = value.get("max_tokens")
    if "max_tokens" in value and (
        isinstance(bound, bool) or not isinstance(bound, int) or bound <= 0
    ):
        raise ValueError(f"{where}: max_tokens must be a positive int, got {typed_repr(bound)}")
    return Bucket(bound, _providers(value["priority"], f"{where} priority"))


def as_priority(value: object, where: str) -> PrioritySpec:
    """Validate one op's priority entry: a list of provider names, or of buckets.

    ``where`` names the entry in errors (e.g. ``"priority of op 'rms_norm'"``).
    A bucket list whose only bucket is the catch-all is its plain list.
    """
    if isinstance(value, BucketedPriority):
        value = value.to_json()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise PriorityTypeError(
            f"{where} must be a list of provider names or of size buckets, got {typed_repr(value)}"
        )
    listed = list(value)  # an iterator is read once, here
    if not listed or all(isinstance(p, str) for p in listed):
        return tuple(listed)
    if any(isinstance(p, str) for p in listed):
        raise PriorityTypeError(
            f"{where} mixes provider names and buckets; give a list of names, or a list "
            'of buckets like [{"max_tokens": 64, "priority": [...]}, {"priority": [...]}]'
        )
    buckets = [_bucket(b, _where_bucket(where, i)) for i, b in enumerate(listed)]
    *bounded, last = buckets
    if last.max_tokens is not None:
        raise ValueError(
            f"{where}: the last bucket (max_tokens {last.max_tokens}) must have no max_tokens, "
            'so that it covers every larger size; add a final {"priority": [...]}'
        )
    for i, b in enumerate(bounded):
        if b.max_tokens is None:
            raise ValueError(
                f"{where}: bucket {i} has no max_tokens; only the last bucket may omit it"
            )
        if i and b.max_tokens <= bounded[i - 1].max_tokens:  # type: ignore[operator]
            what = "repeats" if b.max_tokens == bounded[i - 1].max_tokens else "is below"
            raise ValueError(
                f"{where}: bucket {i} max_tokens {b.max_tokens} {what} bucket {i - 1}'s "
                f"({bounded[i - 1].max_tokens}); order buckets by ascending max_tokens"
            )
    if not bounded:
        return last.providers
    return BucketedPriority(tuple(buckets))


def spec_bounds(spec: PrioritySpec | None) -> tuple[int, ...]:
    """The bucket bounds of one entry (none for a plain list)."""
    return spec.bounds if isinstance(spec, BucketedPriority) else ()


def merged_bounds(specs: Iterable[PrioritySpec | None]) -> tuple[int, ...]:
    """The union of the bounds of several entries, ascending: within each of
    the resulting buckets every entry resolves to one list."""
    return tuple(sorted({b for s in specs for b in spec_bounds(s)}))


def priority_for_tokens(spec: PrioritySpec, tokens: int | None) -> tuple[str, ...]:
    """The providers ``spec`` gives a call of ``tokens`` tokens.

    ``tokens=None`` (no call in view, e.g. ``get_priority()``): the catch-all bucket.
    """
    if isinstance(spec, BucketedPriority):
        if tokens is None:
            return spec.buckets[-1].providers
        return spec.for_tokens(tokens)
    return spec


def spec_to_json(spec: PrioritySpec) -> list[Any]:
    """The JSON form: a list of names, or of bucket objects."""
    return spec.to_json() if isinstance(spec, BucketedPriority) else list(spec)


def parse_bucket_text(text: str, where: str) -> list[Any]:
    """The CLI spelling of an entry -> its JSON form.

    ``a,b`` is a plain list; ``<=64:a,b;<=256:c;native`` is three buckets (the
    last, without ``<=N:``, covers the rest). Validated by :func:`as_priority`.
    """
    example = "e.g. vllm_c,native or '<=64:cpu_c,native;native'"
    parts = text.split(";")
    if len(parts) == 1 and not text.strip().startswith("<="):
        return _names(text, where, example)
    buckets: list[Any] = []
    for part in parts:
        part = part.strip()
        if part.startswith("<="):
            bound_text, colon, names = part[2:].partition(":")
            if not colon:
                raise ValueError(
                    f"{where}: bucket {short_repr(part)} needs ':' after its bound; {example}"
                )
            try:
                bound = int(bound_text.strip())
            except ValueError:
                raise ValueError(
                    f"{where}: bucket bound {short_repr(bound_text.strip(), 40)} is not an int; "
                    f"{example}"
                ) from None
            buckets.append({"max_tokens": bound, "priority": _names(names, where, example)})
        else:
            buckets.append({"priority": _names(part, where, example)})
    return buckets


def _names(text: str, where: str, example: str) -> list[str]:
    names = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in names):
        raise ValueError(
            f"{where}={short_repr(text)}: expected a comma-separated list of providers; {example}"
        )
    return names


def format_bucket_text(spec: PrioritySpec) -> str:
    """The CLI spelling of an entry (inverse of :func:`parse_bucket_text`)."""
    if not isinstance(spec, BucketedPriority):
        return ",".join(spec)
    return ";".join(
        ("" if b.max_tokens is None else f"<={b.max_tokens}:") + ",".join(b.providers)
        for b in spec.buckets
    )


class AmbiguousBucket(ValueError):
    """A symbolic token count whose known range spans several buckets: no one
    selection serves it (the lowering branches per bucket instead)."""


def static_bucket_tokens(op_name: str, plan: SizePlan, tokens: Any) -> int:
    """A token count in the one bucket symbolic ``tokens`` can fall into, from its
    value range (no guard); :class:`AmbiguousBucket` if the range spans several."""
    low, high = symbolic_range(tokens)
    if len(plan.indices(low, high)) == 1:
        return low
    raise AmbiguousBucket(
        f"op {op_name!r}: the token count {tokens} ranges over [{low}, {high}], across "
        f"buckets with bounds {list(plan.bounds)}; select per bucket (the compile lowering does)"
    )


def guarded_bucket_tokens(plan: SizePlan, tokens: Any) -> int:
    """A token count in the bucket of symbolic ``tokens``, found by comparisons that
    guard: for a call traced from user code (trace-through), where branching on a
    size is what Python code does. The graph then serves that bucket only, and a
    count in another bucket recompiles."""
    for bound in plan.bounds:
        if tokens <= bound:  # a SymBool's truth: a guard on the count
            return bound
    return plan.bounds[-1] + 1


# (sympy expression, low, high): the size range a graph being compiled serves
_assumed: contextvars.ContextVar[tuple[Any, int, int] | None] = contextvars.ContextVar(
    "vllm_ir_assumed_range", default=None
)


@contextlib.contextmanager
def assume_range(expr: Any, low: int, high: int) -> Iterator[None]:
    """Within the block, :func:`symbolic_range` of a size whose expression is ``expr``
    is at most ``[low, high]``: the compile of a graph that only ever runs at
    those sizes (:mod:`vllm_ir.compilation._bucket_switch` selects its caller)."""
    token = _assumed.set((expr, low, high))
    try:
        yield
    finally:
        _assumed.reset(token)


def assumed_range() -> tuple[str, int, int] | None:
    """The range :func:`assume_range` set, printable (a compile's cache key holds it)."""
    found = _assumed.get()
    return None if found is None else (str(found[0]), found[1], found[2])


def symbolic_range(value: Any) -> tuple[int, int]:
    """``(low, high)`` of a SymInt from its ShapeEnv's value ranges, without a guard
    (an unbounded high is a large int), narrowed to an :func:`assume_range`."""
    node = value.node
    vr = node.shape_env.bound_sympy(node.expr)
    low, high = _finite(vr.lower, 0), _finite(vr.upper, sys.maxsize)
    assumed = _assumed.get()
    if assumed is not None and node.expr == assumed[0]:
        low, high = max(low, assumed[1]), min(high, assumed[2])
    return low, high


def _finite(bound: Any, otherwise: int) -> int:
    """A sympy bound as an int (``otherwise`` for torch's or sympy's infinities)."""
    if bound.is_integer and bound.is_number and bound.is_finite is not False:
        try:
            return int(bound)
        except (TypeError, ValueError, AttributeError, OverflowError):
            pass
    return otherwise
