"""IR ops: declaration, torch-library wiring, impls, priorities, samples.

An IR op is a torch custom op in the :data:`~vllm_ir.NAMESPACE` namespace whose semantics are
its native Python function. Calling the :class:`IrOp` object selects an impl
by priority and calls it. Plain eager calls take a cached fast path
(:mod:`vllm_ir._selection.eager`); calls under Dynamo, ``make_fx``, a dispatch mode, a
``__torch_function__`` subclass or autograd go through
``torch.ops.<NAMESPACE>.<name>`` so tracers see one node. Gradients are the
native function's (:mod:`vllm_ir._schema.autograd`); signature and activation checks
live in :mod:`vllm_ir._schema.signature`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, overload

import torch
from torch.library import Library

from vllm_ir._base.cache import (
    before_selection,
    release_cache,
)
from vllm_ir._base.deprecation import warn_deprecated
from vllm_ir._base.namespace import NAMESPACE
from vllm_ir._base.registration import (
    RegistrationHandle,
    record,
)
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._base.torch_private import destroy_library
from vllm_ir._op.impl_methods import ImplMethods
from vllm_ir._op.library import define_torch_ops
from vllm_ir._op.priority_methods import PriorityMethods
from vllm_ir._op.sample_methods import OpSamples, SampleMethods
from vllm_ir._schema.autograd import NativeGradient
from vllm_ir._schema.impl import (
    NATIVE,
    IrOpImpl,
    resolved_signature,
)
from vllm_ir._schema.signature import (
    check_native_signature,
    check_op_name,
    resolve_activations,
)
from vllm_ir._schema.tolerances import ToleranceTable
from vllm_ir._selection import compiled_eager
from vllm_ir._selection.buckets import (
    SizePlan,
)
from vllm_ir._selection.eager import EagerCall
from vllm_ir._selection.hotpath import make_needs_grad_fn, make_route_fn
from vllm_ir._selection.selector import Selector
from vllm_ir.priority import (
    Mode,
    scoped_state_var,
    selection_mode,
    selection_mode_scope,
)
from vllm_ir.selection import Candidates, Selection

__all__ = ["IrOp", "IrOpInplaceOverload", "NAMESPACE", "get_op", "register_op"]

# The torch.ops namespace of every IR op: vllm_ir, or vllm_ir_core beside
# vLLM 0.32 to 0.34 (see vllm_ir._base.namespace)
_torch_ns = getattr(torch.ops, NAMESPACE)

_scoped_get = scoped_state_var().get


def _module_of(op: IrOp) -> str:
    return str(getattr(op.native, "__module__", "?"))


def _ops_module_names() -> set[str]:
    ops_module = sys.modules.get("vllm_ir.ops")
    return set(vars(ops_module)) if ops_module is not None else set()


class IrOp(ImplMethods, PriorityMethods, SampleMethods):
    """An IR op: its native semantics, its impls and its priority.

    Create with :func:`register_op`; reach with ``vllm_ir.ops.<name>``.

    >>> import torch, vllm_ir as ir
    >>> x = torch.ones(2, 8)
    >>> ir.ops.rms_norm(x, None, 1e-6).shape
    torch.Size([2, 8])
    >>> ir.ops.rms_norm.selected_impl(x, None, 1e-6).provider in ir.ops.rms_norm.impls
    True
    """

    registry: ClassVar[Mapping[str, IrOp]]
    _registry: ClassVar[dict[str, IrOp]] = RUNTIME.ops

    def __init__(
        self,
        name: str,
        native_fn: Callable[..., Any],
        activations: Sequence[str] | None = None,
        allow_inplace: bool = False,
        feature_dims: int = 1,
    ) -> None:
        check_op_name(
            name,
            {n: _module_of(op) for n, op in IrOp._registry.items()},
            _ops_module_names(),
        )
        self.name = name
        self.native = native_fn
        self.allow_inplace = allow_inplace
        self.signature = resolved_signature(native_fn)
        self._param_names = tuple(self.signature.parameters)
        check_native_signature(name, self.signature)
        self.activations: tuple[str, ...] = resolve_activations(
            name, self.signature, activations, allow_inplace
        )
        self._activation_idx = frozenset(self._param_names.index(a) for a in self.activations)
        self.feature_dims = feature_dims
        """Trailing dims of the first activation that are not tokens (see :meth:`tokens`)."""
        self._route = make_route_fn(self.signature)
        self._needs_grad = make_needs_grad_fn(self.signature)
        self._selector = Selector(
            name,
            self.signature,
            IrOpImpl(
                name,
                NATIVE,
                native_fn,
                supported=True,
                inplace=False,
                batch_invariant=True,
                source_module=getattr(native_fn, "__module__", "") or "",
                compiled=True,  # plain torch: torch.compile can always take it
            ),
            tokens_at=self._param_names.index(self.activations[0]) if self.activations else None,
            feature_dims=feature_dims,
        )
        self._samples = OpSamples(name)
        self.tolerances = ToleranceTable(name)
        """Tolerance per dtype for comparing an impl with native (:meth:`register_tolerances`)."""
        self.__doc__ = native_fn.__doc__
        self._gradient = NativeGradient(native_fn)
        self._lib = Library(NAMESPACE, "FRAGMENT")
        self._maybe_inplace: IrOpInplaceOverload | None = None
        try:
            define_torch_ops(self, self._lib)
            self.torch_op: torch._ops.OpOverload = getattr(_torch_ns, name).default
            """``torch.ops.<NAMESPACE>.<name>.default``: never mutates its inputs."""
            # A class per op, as torch.fx does per GraphModule: ``op(...)`` looks
            # ``__call__`` up on the type, and the generated one takes the op's own
            # parameters.
            self.__class__ = type(f"IrOp[{name}]", (IrOp,), {"__doc__": self.__doc__})
            self._eager = EagerCall(
                self, self.__class__, self.torch_op, _scoped_get, copy_activations=True
            )
            self._calls = self._eager.calls
            # built now, not on first use: Dynamo cannot trace the code generation
            self._maybe_inplace = IrOpInplaceOverload(self) if allow_inplace else None
            # what holds an impl's function forgets it when the impl leaves
            for eager in self._eager_calls():
                self._selector.subscribe(eager.forget)
            self._selector.subscribe(functools.partial(compiled_eager.forget, name))
        except BaseException:
            # nothing half-declared: the torch library and the caches go with the op
            self._destroy_library()
            self._release_caches()
            raise

    # -- calling ----------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The default overload: never mutates its inputs.

        Each op's class replaces this with code generated from its signature
        (see ``vllm_ir._selection.hotpath``); this is only reached before that.
        """
        raise TypeError(f"op {self.name!r} is not fully constructed")

    def selected_impl(self, *args: Any, **kwargs: Any) -> IrOpImpl:
        """The impl that a call with these arguments runs: ``select(...).impl``, cached.

        Uses the eager priorities, or the compiled ones inside
        :func:`vllm_ir.priority.compiled_selection` (as the lowering pass does).
        Works on real tensors and on FakeTensors alike (building the key adds
        no guard; a key with symbolic sizes is not cached).

        >>> import torch, vllm_ir as ir
        >>> x = torch.randn(2, 8)
        >>> op = ir.ops.rms_norm
        >>> op.selected_impl(x, None, 1e-6) is op.select(x, None, 1e-6).impl
        True
        """
        if kwargs or len(args) != len(self._param_names):
            args = self._bind(args, kwargs)
        return self._selector.impl_for(args)

    def dispatch(self, *args: Any, **kwargs: Any) -> IrOpImpl:
        """Deprecated name of :meth:`selected_impl` (kept for one release)."""
        warn_deprecated(
            f"{self.name}.dispatch() is now {self.name}.selected_impl(); dispatch() "
            "goes in the next release"
        )
        return self.selected_impl(*args, **kwargs)

    def tokens(self, *args: Any) -> Any:
        """The call's token count: the product of all but the last dim of the op's
        first activation (``activations[0]``) — all but the last ``feature_dims``
        dims for an op declared with them (``rotary_embedding``: heads and head
        size); 1 for smaller ranks, or an op without activations. A SymInt under
        ``torch.compile`` with dynamic sizes."""
        return self._selector.tokens(*args)

    def size_plan(self, mode: Mode | None = None) -> SizePlan:
        """The size buckets of the effective table in this context: calls of at most
        ``bounds[i]`` tokens (and more than ``bounds[i - 1]``) share bucket ``i``;
        false when no source is bucketed. Cached per cache generation and scope.

        >>> import vllm_ir as ir
        >>> with ir.ops.rms_norm.set_priority([{"max_tokens": 64, "priority": ["native"]},
        ...                                    {"priority": ["native"]}]):
        ...     plan = ir.ops.rms_norm.size_plan()
        >>> plan.bounds, plan.labels
        ((64,), ('<=64', '>64'))
        """
        if mode is None:
            return self._selector.size_plan()
        with selection_mode_scope(mode):
            return self._selector.size_plan()

    def bucket_bounds(self, mode: Mode | None = None) -> tuple[int, ...]:
        """The bounds of :meth:`size_plan` (empty when no source is bucketed)."""
        return self.size_plan(mode).bounds

    def select(
        self, *args: Any, mode: Mode | None = None, tokens: int | None = None, **kwargs: Any
    ) -> Selection:
        """The impl a call with these arguments runs, uncached, with the decision
        on each priority entry tried (:meth:`selected_impl` is its cached ``.impl``).
        ``tokens``: select as a call of that many tokens (a size bucket's
        representative, :meth:`size_plan`), not the arguments' own count."""
        args = self._bind(args, kwargs)
        self._selector.check_args(args)
        with selection_mode_scope(mode or selection_mode()):
            return self._selector.select(args, **self._tokens(tokens))

    def candidates(
        self, *args: Any, mode: Mode | None = None, tokens: int | None = None, **kwargs: Any
    ) -> Candidates:
        """The decision on every registered impl for this call: accepted, or rejected and why.

        The rule :meth:`select` applies, asked of every impl (``select`` stops
        at the first accepted entry): autotuning, ``vllm-ir bench`` and
        ``explain`` and the conformance kit choose their candidates here.

        >>> import torch, vllm_ir as ir
        >>> x = torch.randn(2, 8)
        >>> with ir.ops.rms_norm.set_priority(["native"]):
        ...     found = ir.ops.rms_norm.candidates(x, None, 1e-6)
        >>> found.selected.provider, found["native"].accepted
        ('native', True)
        """
        args = self._bind(args, kwargs)
        self._selector.check_args(args)
        with selection_mode_scope(mode or selection_mode()):
            return self._selector.candidates(args, **self._tokens(tokens))

    def _tokens(self, tokens: int | None) -> dict[str, int | None]:
        """The selector's ``tokens=`` for a caller's: none given, the arguments' count."""
        if tokens is None:
            return {}
        if type(tokens) is not int or tokens < 0:
            raise TypeError(f"{self.name}: tokens must be a non-negative int, got {tokens!r}")
        return {"tokens": tokens if self._selector.size_plan() else None}

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}{self.signature}: {e}") from None
        bound.apply_defaults()
        return bound.args

    def _clone_activations(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        idx = self._activation_idx
        return tuple(
            a.clone() if i in idx and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)
        )

    # -- impls ------------------------------------------------------------

    @property
    def selector(self) -> Selector:
        """The op's selection state and rule: impls, keys, caches
        (:mod:`vllm_ir._selection.selector`).

        For compiler passes and tools that select as a given token count
        (``op.selector.select(args, tokens=n)``); registration goes through the op.
        """
        return self._selector

    @property
    def activation_indices(self) -> frozenset[int]:
        """Positions of the activation parameters (what an in-place impl may write)."""
        return self._activation_idx

    def selection_key(self, *args: Any) -> Any:
        """The selection cache's key for positional ``args`` (what ``supports_args`` may read).

        Two calls with equal keys get the same selection; the conformance kit
        checks that ``supports_args`` agrees with that.
        """
        return self._selector.key(*args)

    def _unregister(self) -> None:
        """Remove this op entirely (rollback of a failed provider load; tests)."""
        if IrOp._registry.get(self.name) is self:
            del IrOp._registry[self.name]
            ops_module = sys.modules.get("vllm_ir.ops")
            if ops_module is not None and getattr(ops_module, self.name, None) is self:
                delattr(ops_module, self.name)
        self._destroy_library()
        self._release_caches()

    def _destroy_library(self) -> None:
        """Undefine the op's torch ops, so its name can be declared again."""
        destroy_library(self._lib)

    def _release_caches(self) -> None:
        """Stop tracking the op's caches: the selector's and its overloads' calls."""
        if "_selector" in self.__dict__:  # a failed declaration may have none
            self._selector.release()
        for eager in self._eager_calls():
            release_cache(eager.calls)

    def _eager_calls(self) -> list[EagerCall]:
        """The eager calls built so far (a failed declaration may have none)."""
        calls = [self.__dict__["_eager"]] if "_eager" in self.__dict__ else []
        if self._maybe_inplace is not None:
            calls.append(self._maybe_inplace._eager)
        return calls

    # -- overloads --------------------------------------------------------

    @property
    def maybe_inplace(self) -> IrOpInplaceOverload:
        """The overload that may reuse the activations' memory for its outputs."""
        if self._maybe_inplace is None:
            raise AttributeError(
                f"op {self.name!r} has no maybe_inplace overload; declare it with "
                "@register_op(allow_inplace=True)"
            )
        return self._maybe_inplace

    def __repr__(self) -> str:
        return f"IrOp({self.name}{self.signature})"


class IrOpInplaceOverload:
    """``op.maybe_inplace``: the caller donates the activations.

    The impl may write its outputs into them; reading a donated tensor after
    the call is undefined in eager mode and a compile error under
    ``torch.compile``.
    """

    def __init__(self, op: IrOp) -> None:
        self.op = op
        self.torch_op: torch._ops.OpOverload = getattr(_torch_ns, op.name).maybe_inplace
        self.__class__ = type(f"IrOpInplaceOverload[{op.name}]", (IrOpInplaceOverload,), {})
        self._eager = EagerCall(
            op, self.__class__, self.torch_op, _scoped_get, copy_activations=False
        )
        self._calls = self._eager.calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call with donated activations (replaced per op by generated code)."""
        raise TypeError(f"maybe_inplace of {self.op.name!r} is not fully constructed")

    def __repr__(self) -> str:
        return f"IrOpInplaceOverload({self.op.name})"


IrOp.registry = MappingProxyType(IrOp._registry)


@overload
def register_op(f: Callable[..., Any], /) -> IrOp: ...


@overload
def register_op(
    f: None = None,
    /,
    *,
    name: str | None = None,
    activations: Sequence[str] | None = None,
    allow_inplace: bool = False,
    feature_dims: int = 1,
) -> Callable[[Callable[..., Any]], IrOp]: ...


def register_op(
    f: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    activations: Sequence[str] | None = None,
    allow_inplace: bool = False,
    feature_dims: int = 1,
) -> IrOp | Callable[[Callable[..., Any]], IrOp]:
    """Declare an IR op whose semantics are the decorated native function.

    Defines ``torch.ops.<NAMESPACE>.<name>.default`` (and ``.maybe_inplace`` with
    ``allow_inplace=True``) with a fake impl and gradients of the native
    function, and exposes the op as ``vllm_ir.ops.<name>``.

    Args:
        name: op name; defaults to the function's name.
        activations: parameters that ``maybe_inplace`` callers donate;
            defaults to those whose names start with ``x``.
        allow_inplace: create the ``maybe_inplace`` overload, which lets impls
            registered with ``inplace=True`` write outputs into activations.
        feature_dims: how many trailing dims of the first activation are not
            tokens (default 1, the hidden size); size buckets count the tokens
            in the dims before them (:meth:`IrOp.tokens`).

    >>> import torch, vllm_ir as ir
    >>> @ir.register_op(name="doc_double")
    ... def double(x: torch.Tensor) -> torch.Tensor:
    ...     return x * 2
    >>> getattr(torch.ops, ir.NAMESPACE).doc_double(torch.ones(2)).tolist()
    [2.0, 2.0]
    """

    if not isinstance(allow_inplace, bool):
        raise TypeError(
            f"register_op: allow_inplace must be a bool, got {type(allow_inplace).__name__} "
            f"{allow_inplace!r:.60}"
        )
    if isinstance(feature_dims, bool) or not isinstance(feature_dims, int) or feature_dims < 1:
        raise TypeError(
            f"register_op: feature_dims must be an int of at least 1, got "
            f"{type(feature_dims).__name__} {feature_dims!r:.60}"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"register_op: name must be a str, got {type(name).__name__} {name!r:.60}")

    def decorator(fn: Callable[..., Any]) -> IrOp:
        if not callable(fn):
            raise TypeError(f"register_op expects a function, got {fn!r:.60}")
        op_name = name or getattr(fn, "__name__", None)
        if not isinstance(op_name, str):
            raise TypeError(
                f"register_op: {type(fn).__name__} object {fn!r:.60} has no __name__; "
                "pass name='my_op', or decorate a function"
            )
        op = IrOp(op_name, fn, activations, allow_inplace, feature_dims)
        IrOp._registry[op.name] = op
        ops_module = sys.modules.get("vllm_ir.ops")
        if ops_module is not None:
            setattr(ops_module, op.name, op)
        record(RegistrationHandle(f"IR op {op.name!r}", op._unregister))
        return op

    if f is not None:
        return decorator(f)
    return decorator


def get_op(name: str) -> IrOp:
    """The op called ``name``; a ``KeyError`` lists the known ones."""
    try:
        return IrOp._registry[name]
    except KeyError:
        before_selection()
    try:
        return IrOp._registry[name]
    except KeyError:
        raise KeyError(
            f"unknown IR op {name!r}; known ops: {', '.join(sorted(IrOp._registry))}"
        ) from None
