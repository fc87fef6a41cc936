"""Selection of an impl for a call: priority order, ``supported``,
batch invariance, ``supports_args``.

Selection is a pure function of the effective priority list, the process
environment it reads (``VLLM_BATCH_INVARIANT``, ``VLLM_IR_PLATFORM``) and
the argument facts that ``supports_args`` may look at, so its answer is
cached per op on those facts (see :mod:`vllm_ir._base.cache` and
:mod:`vllm_ir._selection.key`). The environment is read once per cache
generation: every cached selection and every new one agree on it, and a
change takes effect at the next :func:`invalidate_caches`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_ir import envs
from vllm_ir._base.cache import generation, invalidate_caches, register_cache, release_cache
from vllm_ir._base.logger import get_logger
from vllm_ir._base.platform import current_platform
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir.priority import Mode, PriorityEntry, effective_priority

__all__ = [
    "NOT_LISTED",
    "Candidates",
    "Decision",
    "Selection",
    "SelectionEnv",
    "invalidate_caches",
    "register_cache",
    "release_cache",
    "candidates",
    "select",
    "selection_env",
]

logger = get_logger(__name__)


@dataclass(frozen=True)
class SelectionEnv:
    """The environment selections of one cache generation read."""

    generation: int
    batch_invariant: bool
    platform: str


_env: list[SelectionEnv | None] = [None]


def selection_env() -> SelectionEnv:
    """The environment in force for this cache generation (read at its first selection)."""
    env = _env[0]
    gen = generation()
    if env is None or env.generation != gen:
        env = SelectionEnv(gen, envs.batch_invariant(), current_platform())
        _env[0] = env
    return env


@dataclass(frozen=True)
class Decision:
    """What selection made of one entry of the priority list."""

    entry: PriorityEntry
    accepted: bool
    reason: str

    @property
    def provider(self) -> str:
        return self.entry.provider

    @property
    def listed(self) -> bool:
        """On the effective priority list (else only :func:`candidates` asked it)."""
        return self.entry.source != NOT_LISTED


NOT_LISTED = "not on the priority list"
"""The ``source`` of a :class:`Decision` on an impl that the priority list does not name."""


@dataclass(frozen=True)
class Selection:
    """The chosen impl and the decision taken on every entry before it."""

    impl: IrOpImpl
    decisions: tuple[Decision, ...]


@dataclass(frozen=True)
class Candidates:
    """The decision on every registered impl of an op for one call (:meth:`IrOp.candidates`).

    First the entries of the effective priority list, in order (what
    :func:`select` walks; it stops at the first accepted), then every other
    registered impl by provider name (``listed`` false). Each decision applies
    the one rule of selection: registered, ``supported``, batch invariance
    under ``VLLM_BATCH_INVARIANT``, ``supports_args``.
    """

    op_name: str
    decisions: tuple[Decision, ...]

    def __iter__(self) -> Iterator[Decision]:
        return iter(self.decisions)

    def __len__(self) -> int:
        return len(self.decisions)

    def __getitem__(self, provider: str) -> Decision:
        """The decision on ``provider`` (its first, if the list names it twice)."""
        for d in self.decisions:
            if d.provider == provider:
                return d
        raise KeyError(f"{self.op_name} has no impl or priority entry {provider!r}")

    def __contains__(self, provider: object) -> bool:
        return any(d.provider == provider for d in self.decisions)

    @property
    def selected(self) -> Decision:
        """The decision :func:`select` would return last: the first accepted listed entry."""
        return next(d for d in self.decisions if d.listed and d.accepted)

    def accepted(self) -> list[str]:
        """The providers that accept the call, listed ones first in priority order."""
        seen: list[str] = []
        for d in self.decisions:
            if d.accepted and d.provider not in seen:
                seen.append(d.provider)
        return seen


def _check_plain_bool(op_name: str, impl: IrOpImpl, answer: object) -> bool:
    if type(answer) is bool:
        return answer
    hint = (
        " It depends on a symbolic size or value, which would guard the compiled "
        "graph on it; supports_args may only read the facts of the selection key "
        "(see vllm_ir._selection.key)."
        if type(answer).__name__.startswith("Sym")
        else ""
    )
    raise TypeError(
        f"supports_args of impl {impl.provider!r} of op {op_name!r} returned "
        f"{type(answer).__name__} {answer!r}; it must return a plain bool.{hint}"
    )


def _rejection(
    op_name: str,
    impl: IrOpImpl | None,
    args: tuple[Any, ...],
    batch_invariant: bool,
) -> str | None:
    """Why ``impl`` cannot serve ``args`` (None if it can)."""
    if impl is None:
        return "not registered (is its provider package installed and loaded?)"
    if not impl.supported:
        reason = "not supported on this platform"
        return f"{reason}: {impl.unsupported_reason}" if impl.unsupported_reason else reason
    if batch_invariant and not impl.batch_invariant:
        return f"not batch invariant ({envs.VLLM_BATCH_INVARIANT}=1)"
    if impl.supports_args is not None:
        try:
            answer = _ask(impl.supports_args, args)
        except _DataPointerRead:
            # FakeTensors (torch.compile) have no memory: the alignment is unknown
            return NO_DATA_POINTER
        if not _check_plain_bool(op_name, impl, answer):
            return "arguments not supported (supports_args returned False)"
    return None


NO_DATA_POINTER = (
    "arguments not supported when compiling: supports_args reads the data pointer, "
    "which torch.compile's FakeTensors do not have (compiled selection declines)"
)
"""The rejection of an impl whose ``supports_args`` reads ``data_ptr()`` of a FakeTensor."""


class _DataPointerRead(Exception):
    """A predicate asked a FakeTensor for its data pointer."""


def _ask(predicate: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``predicate(*args)``; on FakeTensors, reading ``data_ptr()`` raises
    :class:`_DataPointerRead` (FakeTensors answer 0 outside a compile, or raise
    inside one: either way the answer would not be the real tensor's)."""
    from torch._subclasses.fake_tensor import is_fake

    if not any(is_fake(a) for a in args):
        return predicate(*args)
    try:
        with _no_data_pointers():
            return predicate(*args)
    except RuntimeError as error:
        if "data pointer" in str(error):
            raise _DataPointerRead from error
        raise


@functools.cache
def _no_data_pointers_mode() -> type:
    """The TorchFunctionMode class refusing ``data_ptr()`` (built once, on first use:
    this module imports no torch at import time)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class NoDataPointers(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.Tensor.data_ptr or func is torch._C.TensorBase.data_ptr:
                raise _DataPointerRead
            return func(*args, **(kwargs or {}))

    return NoDataPointers


def _no_data_pointers() -> Any:
    return _no_data_pointers_mode()()


def select(
    op_name: str,
    impls: Mapping[str, IrOpImpl],
    args: tuple[Any, ...],
    mode: Mode,
    describe_args: Callable[[], str] | None = None,
    *,
    tokens: int | None = None,
) -> Selection:
    """Walk the effective priority list and return the first impl that can run.

    ``tokens``: the call's token count, which picks the bucket of bucketed
    priorities (``IrOp.tokens``; ``None`` when the table has no buckets).
    ``native`` is always on the list and always accepts, so this never fails
    (an impl whose ``supports_args`` raises propagates its error).
    """
    # one snapshot (a dict copy is atomic): another thread may unregister an impl
    # between a check and its lookup
    impls = dict(impls)
    decisions: list[Decision] = []
    for entry, reason in _walk(op_name, impls, args, mode, tokens):
        if reason is None:
            decisions.append(Decision(entry, True, "selected"))
            selection = Selection(impls[entry.provider], tuple(decisions))
            _log(op_name, mode, selection, describe_args)
            return selection
        decisions.append(Decision(entry, False, reason))
    raise AssertionError(f"no impl of {op_name!r} accepted the call; native must always accept")


def _walk(
    op_name: str,
    impls: Mapping[str, IrOpImpl],
    args: tuple[Any, ...],
    mode: Mode,
    tokens: int | None,
) -> Iterator[tuple[PriorityEntry, str | None]]:
    """``(entry, why it is rejected or None)`` down the effective priority list, lazily."""
    env = selection_env()
    for entry in effective_priority(op_name, mode, platform=env.platform, tokens=tokens):
        yield entry, _rejection(op_name, impls.get(entry.provider), args, env.batch_invariant)


def candidates(
    op_name: str,
    impls: Mapping[str, IrOpImpl],
    args: tuple[Any, ...],
    mode: Mode,
    *,
    tokens: int | None = None,
) -> Candidates:
    """:func:`select`'s rule applied to every entry and every registered impl (no early stop)."""
    impls = dict(impls)  # one snapshot, as in select
    decisions: list[Decision] = []
    chosen = False
    for entry, reason in _walk(op_name, impls, args, mode, tokens):
        if reason is None:
            decisions.append(Decision(entry, True, "accepts" if chosen else "selected"))
            chosen = True
        else:
            decisions.append(Decision(entry, False, reason))
    listed = {d.provider for d in decisions}
    batch_invariant = selection_env().batch_invariant
    for provider in sorted(set(impls) - listed):
        reason = _rejection(op_name, impls[provider], args, batch_invariant)
        entry = PriorityEntry(provider, NOT_LISTED)
        decisions.append(Decision(entry, reason is None, reason or "accepts"))
    return Candidates(op_name, tuple(decisions))


def _log(
    op_name: str, mode: Mode, selection: Selection, describe_args: Callable[[], str] | None
) -> None:
    if not logger.isEnabledFor(10):  # DEBUG
        return
    where = f" for {describe_args()}" if describe_args else ""
    for d in selection.decisions[:-1]:
        logger.debug(
            "%s (%s): rejected %s [%s]: %s",
            op_name,
            mode,
            d.entry.provider,
            d.entry.source,
            d.reason,
        )
    chosen = selection.decisions[-1].entry
    logger.debug(
        "%s (%s): selected %s [%s]%s", op_name, mode, chosen.provider, chosen.source, where
    )


def describe(args: Iterable[Any]) -> str:
    """A short, data-free description of call arguments for logs and errors."""
    import torch

    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dtype = str(a.dtype).removeprefix("torch.")
            parts.append(f"Tensor({dtype}, {tuple(a.shape)}, {a.device})")
        else:
            parts.append(repr(a))
    return "(" + ", ".join(parts) + ")"
