"""An op's priority lists as its users set and read them (methods of :class:`~vllm_ir.IrOp`).

The lists themselves, their scopes and the effective list live in
:mod:`vllm_ir.priority`; this is the per-op face of them, with the op's own
validation (its known providers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vllm_ir._base.cache import before_selection
from vllm_ir._base.provider_packages import where_provider_comes_from
from vllm_ir._base.text import listing, short_repr
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir._selection import compiled_eager
from vllm_ir._selection.buckets import BucketedPriority, as_priority
from vllm_ir.priority import Mode, PriorityEntry, effective_priority, scoped_priority

__all__ = ["PriorityMethods"]


class PriorityMethods:
    """``check_providers``, ``check_priority``, ``set_priority``, ``get_priority``
    and ``get_priority_entries`` of an op."""

    name: str

    if TYPE_CHECKING:

        @property
        def impls(self) -> Mapping[str, IrOpImpl]: ...

    def check_providers(self, providers: Sequence[str]) -> list[str]:
        """Validate a priority list for this op; returns it as a list."""
        if isinstance(providers, str) or not all(isinstance(p, str) for p in providers):
            raise TypeError(
                f"priority of op {self.name!r} must be a list of provider names, got "
                f"{short_repr(providers)}"
            )
        known = self.impls
        unknown = [p for p in providers if p not in known]
        if unknown:
            raise ValueError(
                f"unknown provider(s) {listing(unknown)} for op {self.name!r}"
                f"{where_provider_comes_from(unknown)}; known providers: {', '.join(sorted(known))}"
            )
        return list(providers)

    def check_priority(self, value: object) -> list[str] | BucketedPriority:
        """Validate a priority entry for this op: a list of providers, or of size
        buckets (:mod:`vllm_ir._selection.buckets`); unknown providers are refused."""
        spec = as_priority(value, f"priority of op {self.name!r}")
        if isinstance(spec, BucketedPriority):
            self.check_providers(spec.providers())
            return spec
        return self.check_providers(spec)

    @contextlib.contextmanager
    def set_priority(
        self,
        providers: Sequence[str] | Sequence[Mapping[str, Any]],
        *,
        compile: bool = False,
    ) -> Iterator[None]:
        """Within the ``with`` block, try ``providers`` first for this op.

        ``providers`` is a list of names (every size) or of size buckets,
        ``[{"max_tokens": 64, "priority": [...]}, {"priority": [...]}]``.
        Scoped to the current thread / task, nestable, restored on exceptions.
        ``compile=True``: plain eager calls run the selected impl through
        ``torch.compile`` where it may be compiled (``native``, and impls
        registered with ``compiled=True``); see :mod:`vllm_ir._selection.compiled_eager`.

        >>> import vllm_ir as ir
        >>> with ir.ops.rms_norm.set_priority(["native"]):
        ...     ir.ops.rms_norm.get_priority()[0]
        'native'
        """
        if not isinstance(compile, bool):
            raise TypeError(
                f"set_priority of op {self.name!r}: compile must be a bool, "
                f"got {type(compile).__name__} {compile!r:.60}"
            )
        with scoped_priority({self.name: self.check_priority(providers)}):
            if not compile:
                yield
                return
            with compiled_eager.requested(self.name):
                yield

    def get_priority(self, mode: Mode | None = None, *, tokens: int | None = None) -> list[str]:
        """The effective priority list in this context (``native`` last or earlier),
        for a call of ``tokens`` tokens (``None``: the last, catch-all bucket)."""
        return [e.provider for e in self.get_priority_entries(mode, tokens=tokens)]

    def get_priority_entries(
        self, mode: Mode | None = None, *, tokens: int | None = None
    ) -> tuple[PriorityEntry, ...]:
        """The effective priority list with the origin of each entry."""
        before_selection()
        return effective_priority(self.name, mode, tokens=tokens)
