"""The eager call path of one op overload: the cache of ``select()``, and its miss path.

``op(...)`` and ``op.maybe_inplace(...)`` run code generated per op
(:mod:`vllm_ir._selection.hotpath`) that looks the arguments' selection key up in a
bounded cache (:mod:`vllm_ir._base.cache`). On a miss, :meth:`EagerCall.miss`
checks the argument types against the schema, selects through the op's
:class:`~vllm_ir._selection.selector.Selector` (its cache, or its one miss path), and
stores the result unless the priorities changed meanwhile. The rule: **for
any arguments, the fast path runs exactly the impl ``select()`` returns,
once.**

Donation (``maybe_inplace`` with an inplace impl) happens only when it cannot
change the result: an activation whose elements overlap in memory (rows from
``expand``, overlapping strides) or that may share memory with another tensor
argument (views of one buffer, through one storage object or several, whose
layouts do not prove them apart) runs on
copies instead, as the default overload does; after an
impl wrote a donated activation its version counter is bumped, so autograd
refuses a backward that saved it, as after any in-place op.

``VLLM_IR_CHECK_SELECTION=1`` (or :func:`set_selection_check`) regenerates
every op's call to re-validate each cache hit against an uncached
selection — hits of the exact-facts cache and, on its misses, hits of the
selection-key cache (a new batch size of a known class) — raising
:class:`SelectionMismatch` on a difference: a ``supports_args`` that reads a
fact the key does not hold. It costs a full
selection per call: a debugging and testing aid.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol

import torch

from vllm_ir import envs
from vllm_ir._base import torch_wrap
from vllm_ir._base.cache import generation, holds, register_cache, settled_generation
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir._schema.layout import apart, may_overlap_itself, storage_span, storages_meet
from vllm_ir._selection.compiled_eager import compiled_fn_for
from vllm_ir._selection.hotpath import _FORWARD_AD, make_donating_call, make_eager_call
from vllm_ir._selection.selector import Selector, store_if_cacheable
from vllm_ir.selection import describe

__all__ = ["SelectionMismatch", "EagerCall", "selection_check_enabled", "set_selection_check"]


class SelectionMismatch(AssertionError):
    """A cached eager selection differs from ``select()`` for the same arguments."""


class SelectingOp(Protocol):
    """What an eager call needs from its op (implemented by :class:`vllm_ir.IrOp`)."""

    name: str
    signature: inspect.Signature
    native: Callable[..., Any]

    @property
    def activation_indices(self) -> frozenset[int]: ...

    @property
    def selector(self) -> Selector: ...

    def _needs_grad(self, *args: Any) -> bool: ...
    def _route(self, *args: Any) -> bool: ...
    def _clone_activations(self, args: tuple[Any, ...]) -> tuple[Any, ...]: ...


_check: list[bool | None] = [None]  # None: follow VLLM_IR_CHECK_SELECTION
_is_compiling = torch.compiler.is_compiling
_functorch_active: Callable[[], bool] = getattr(
    torch._C,
    "_are_functorch_transforms_active",
    lambda: torch._C._functorch.peek_interpreter_stack() is not None,
)
_increment_version = torch._C._increment_version
_installed = RUNTIME.eager_calls  # the data lives on the runtime (vllm_ir._base.runtime)
_grad_enabled = torch.is_grad_enabled


def selection_check_enabled() -> bool:
    """Whether cached eager calls are re-validated against ``select()``."""
    forced = _check[0]
    return envs.check_selection() if forced is None else forced


def set_selection_check(enabled: bool | None) -> None:
    """Turn re-validation of cached eager calls on or off for every op
    (``None``: follow ``VLLM_IR_CHECK_SELECTION``)."""
    _check[0] = enabled
    for call in list(_installed):
        call.install()


class EagerCall:
    """One overload's eager ``__call__``: its cache, miss path and check.

    ``copy_activations``: the default overload, which never writes its
    inputs, runs an inplace impl on copies of the activations; otherwise
    (``maybe_inplace``) an inplace impl gets the activations donated when
    that cannot change its result (see the module doc).
    """

    def __init__(
        self,
        op: SelectingOp,
        owner: type,
        torch_op: Callable[..., Any],
        scoped_get: Callable[[], Any],
        *,
        copy_activations: bool,
    ) -> None:
        self.op = op
        self.selector = op.selector
        self.owner = owner
        self.torch_op = torch_op
        self.scoped_get = scoped_get
        self.copy_activations = copy_activations
        self.calls: dict[Any, Callable[..., Any]] = register_cache()
        # wrappers per inplace impl (on copies; donating): a stable identity, so
        # check mode can compare; dropped with the impl (forget)
        self._on_copies: dict[IrOpImpl, Callable[..., Any]] = {}
        self._donating: dict[IrOpImpl, Callable[..., Any]] = {}
        params = list(op.signature.parameters.values())
        self._act_idx = tuple(sorted(op.activation_indices))
        # the other tensor arguments a donated activation must not share memory with
        self._other_idx = tuple(
            i
            for i, p in enumerate(params)
            if i not in op.activation_indices and _holds_tensors(p.annotation)
        )
        # trace-through mode's call (see vllm_ir._base.torch_wrap): built when it is on
        self.through: Callable[..., Any] | None = None
        if not torch_wrap.enabled:
            self.build_through()
        self.install()
        _installed.add(self)

    def install(self) -> None:
        """(Re)generate the overload's ``__call__``, with the check if enabled."""
        self.checking = selection_check_enabled()
        call = make_eager_call(
            self.op.signature,
            self.op.name,
            routed=self.routed,
            calls=self.calls,
            miss=self.miss,
            scoped_get=self.scoped_get,
            verify=self.verify if self.checking else None,
        )
        self.owner.__call__ = call  # type: ignore[method-assign]

    def fn_for(self, impl: IrOpImpl, args: tuple[Any, ...]) -> Callable[..., Any]:
        """What this overload runs when ``impl`` is selected for ``args``.

        Depends on ``args`` only through exact key facts (shapes, strides), so
        the answer can be cached on the fast path's key.
        """
        if not impl.inplace:
            if impl.compiled:  # in a set_priority(..., compile=True) scope: compiled
                compiled = compiled_fn_for(self.op.name, impl, args)
                if compiled is not None:
                    return compiled
            return impl.impl_fn
        if self.copy_activations or self._overlapping_activation(args):
            fn = self._on_copies.get(impl)
            if fn is None:
                fn = self._on_copies.setdefault(
                    impl, functools.partial(self._call_on_copies, impl.impl_fn)
                )
            return fn
        fn = self._donating.get(impl)
        if fn is None:
            fn = self._donating.setdefault(
                impl, functools.partial(self._call_donating, impl.impl_fn)
            )
        return fn

    def forget(self, impl: IrOpImpl) -> None:
        """Drop the wrappers of an unregistered impl (and with them its function)."""
        self._on_copies.pop(impl, None)
        self._donating.pop(impl, None)

    def _overlapping_activation(self, args: tuple[Any, ...]) -> bool:
        # rows from expand() or overlapping strides: writing one element writes others
        return any(
            isinstance(args[i], torch.Tensor) and may_overlap_itself(args[i]) for i in self._act_idx
        )

    @functools.cached_property
    def _call_donating(self) -> Callable[..., Any]:
        """``(fn, *args)``: the inplace ``fn`` on the donated activations, or on copies
        when one may share memory with another tensor argument (generated per op)."""
        return make_donating_call(
            self.op.signature,
            self._act_idx,
            self._other_idx,
            on_copies=self._call_on_copies,
            span=storage_span,
            apart=apart,
            shares=_shares_memory,
            bump=_increment_version,
        )

    def _call_on_copies(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*self.op._clone_activations(args))

    def routed(self, *args: Any) -> Any:
        """A call the fast path does not serve (see :func:`make_eager_call`).

        The torch op, so tracers record one node and autograd sees the op;
        but under a torch.func transform (``grad``, ``jacrev``, ``vmap``,
        ``jvp``), with an open forward-AD level, or for nested (jagged)
        tensors, the native function, which composes with all of them: the
        torch op's autograd formula has no forward-mode rule and is not
        functorch-compatible, and nested tensors have no rule for the op.
        In trace-through mode (:mod:`vllm_ir._base.torch_wrap`), a call that needs
        no gradient runs the selected impl instead of the torch op.
        """
        if not _is_compiling() and (
            _functorch_active() or _FORWARD_AD._current_level >= 0 or _has_nested(args)
        ):
            return self.op.native(*args)
        # Dynamo reads (and guards on) the module attribute while it traces this
        if (
            not torch_wrap.enabled
            and self.through is not None
            and not (_grad_enabled() and self.op._needs_grad(*args))
        ):
            return self.through(*torch_wrap.absent_for_none(args))
        return self.torch_op(*args)

    def build_through(self) -> None:
        """Make :attr:`through`, trace-through mode's call (imports Dynamo)."""
        if self.through is None:
            self.through = torch_wrap.nonstrict(self.run_selected)

    def run_selected(self, *args: Any) -> Any:
        """Trace-through: run what ``select()`` returns for ``args``, without the torch op.

        Under Dynamo this runs outside its tracer, on FakeTensors, where
        AOTAutograd traces the impl; there an inplace impl runs on copies
        (the graph stays functional). Arguments torch would convert (a 0-d
        tensor for a float) keep the torch op, which converts them.
        """
        op = self.op
        if self.selector.check_args(args) != "plain":
            return self.torch_op(*args)
        impl = self.selector.traced_impl(args)
        if not impl.inplace:  # never the compiled callable: this call is being traced
            return impl.impl_fn(*args)
        if _is_compiling():
            return impl.impl_fn(*op._clone_activations(args))
        return self.fn_for(impl, args)(*args)

    def miss(self, *args: Any) -> Callable[..., Any]:
        """The function to run for ``args`` (all parameters, positionally); caches it."""
        op = self.op
        if self.selector.check_args(args) == "convert" or op._route(*args) or _functorch_active():
            # a value torch converts (e.g. a 0-d tensor for a float): torch's
            # semantics, uncached, so no key keeps it alive; functorch's wrapper
            # tensors (vmap) have no data pointer, so they always miss
            return self.routed
        since = generation()
        # through the selection cache: a new batch size selects nothing anew
        impl = self.selector.impl_for(args)
        if self.checking:  # a selection-cache hit is a cached call too: re-check it
            impl = self._verify_selection(impl, args, since)
        fn = self.fn_for(impl, args)
        store_if_cacheable(self.calls, self.selector.fast_key, args, fn, since)
        return fn

    def _fns_of(self, impl: IrOpImpl) -> tuple[Callable[..., Any] | None, ...]:
        return (impl.impl_fn, self._on_copies.get(impl), self._donating.get(impl))

    def is_fn_of(self, impl: IrOpImpl, fn: Callable[..., Any]) -> bool:
        """Whether ``fn`` is one of the callables this overload runs for ``impl``."""
        return fn in self._fns_of(impl) or getattr(fn, "impl", None) is impl

    def verify(self, fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        """Check mode: ``fn`` (a cache hit) must be what an uncached selection runs."""
        since = generation()
        expected_impl = self.selector.select(args).impl
        expected = self.fn_for(expected_impl, args)
        if fn is expected:
            return fn
        try:
            key = self.selector.fast_key(*args)
        except Exception:
            return expected  # such a call is never cached: fn came from a concurrent change
        if not holds(self.calls, key, fn, since):
            return expected  # the priorities changed concurrently: not a mismatch
        impls = self.selector.impls.items()
        cached = next((p for p, i in impls if self.is_fn_of(i, fn)), repr(fn))
        raise self._mismatch(cached, args, expected_impl)

    def _verify_selection(self, impl: IrOpImpl, args: tuple[Any, ...], since: int) -> IrOpImpl:
        """Check mode, on a miss: the selection cache's ``impl`` (found through the
        coarser selection key, e.g. for a new batch size) must be ``select()``'s."""
        expected = self.selector.select(args).impl
        # inputs changed meanwhile (their change and the generation's advance are
        # atomic, so wait for one in progress): not a mismatch
        if impl is expected or settled_generation() != since:
            return expected
        raise self._mismatch(impl.provider, args, expected)

    def _mismatch(
        self, cached: str, args: tuple[Any, ...], expected: IrOpImpl
    ) -> SelectionMismatch:
        return SelectionMismatch(
            f"{envs.VLLM_IR_CHECK_SELECTION}: the eager cache of op {self.op.name!r} runs "
            f"{cached!r} for {describe(args)}, but select() chooses "
            f"{expected.provider!r}. A supports_args reads a fact the selection key "
            "does not hold (see vllm_ir._selection.key); make it a function of the key's facts."
        )


def _build_through_calls(wrap_enabled: bool) -> None:
    """Trace-through turned on: every overload gets its call (built once, kept)."""
    if not wrap_enabled:
        for call in list(_installed):
            call.build_through()


torch_wrap.on_change(_build_through_calls)


def _holds_tensors(annotation: object) -> bool:
    from vllm_ir._schema.signature import tensor_kind

    return tensor_kind(annotation) != "other"


def _tensors(value: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(v for v in value if isinstance(v, torch.Tensor))
    return ()


def _shares_memory(a: torch.Tensor, b: Any) -> bool:
    """Whether ``b`` (a tensor, or a list of them) may share memory with ``a``:
    views of one buffer, unless their layouts prove them apart
    (:func:`~vllm_ir._schema.layout.apart`: the query and key columns of one
    ``qkv`` tensor are donated together)."""
    return any(storages_meet(a, t) and not apart(a, t) for t in _tensors(b))


def _has_nested(args: tuple[Any, ...]) -> bool:
    return any(t.is_nested for a in args for t in _tensors(a))
