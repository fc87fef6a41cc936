"""IR ops: declaration, torch-library wiring, impls, priorities, samples.

An IR op is a torch custom op in the :data:`~vllm_ir.NAMESPACE` namespace whose semantics are
its native Python function. Calling the :class:`IrOp` object selects an impl
by priority and calls it. Plain eager calls take a cached fast path
(:mod:`vllm_ir._eager`); calls under Dynamo, ``make_fx``, a dispatch mode, a
``__torch_function__`` subclass or autograd go through
``torch.ops.<NAMESPACE>.<name>`` so tracers see one node. Gradients are the
native function's (:mod:`vllm_ir._autograd`); signature and activation checks
live in :mod:`vllm_ir._signature`.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, overload

import torch
from torch.library import Library, infer_schema

from vllm_ir import _compiled_eager as compiled_eager
from vllm_ir._autograd import NativeGradient
from vllm_ir._buckets import (
    BucketedPriority,
    as_priority,
)
from vllm_ir._cache import (
    before_selection,
    invalidating,
    release_cache,
)
from vllm_ir._deprecation import warn_deprecated
from vllm_ir._eager import EagerCall
from vllm_ir._hotpath import make_needs_grad_fn, make_route_fn
from vllm_ir._impl import (
    NATIVE,
    IrOpImpl,
    check_impl_signature,
    check_provider_name,
    check_supports_args_signature,
    resolved_signature,
)
from vllm_ir._namespace import NAMESPACE
from vllm_ir._registration import (
    RegistrationHandle,
    current_registration_log,
    record,
)
from vllm_ir._runtime import RUNTIME
from vllm_ir._samples import SampleInput, SampleInputGenerator
from vllm_ir._selector import Selector
from vllm_ir._signature import (
    check_native_signature,
    check_op_name,
    resolve_activations,
)
from vllm_ir._text import listing, short_repr
from vllm_ir._tolerances import Tolerance, ToleranceTable, tolerance_for
from vllm_ir._torch_private import destroy_library
from vllm_ir.priority import (
    Mode,
    PriorityEntry,
    effective_priority,
    scoped_priority,
    scoped_state_var,
    selection_mode,
    selection_mode_scope,
)
from vllm_ir.selection import Candidates, Selection

__all__ = ["IrOp", "IrOpInplaceOverload", "NAMESPACE", "get_op", "register_op"]

# The torch.ops namespace of every IR op: vllm_ir, or vllm_ir_core beside
# vLLM 0.32 to 0.34 (see vllm_ir._namespace)
_torch_ns = getattr(torch.ops, NAMESPACE)

_grad_enabled = torch.is_grad_enabled
_scoped_get = scoped_state_var().get


def _module_of(op: IrOp) -> str:
    return str(getattr(op.native, "__module__", "?"))


def _ops_module_names() -> set[str]:
    ops_module = sys.modules.get("vllm_ir.ops")
    return set(vars(ops_module)) if ops_module is not None else set()


class IrOp:
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
        self._input_generator: SampleInputGenerator | None = None
        # provider -> its extra conformance samples, on top of the op's own
        self._extra_samples: dict[str, list[SampleInputGenerator]] = {}
        self.tolerances = ToleranceTable(name)
        """Tolerance per dtype for comparing an impl with native (:meth:`register_tolerances`)."""
        self.__doc__ = native_fn.__doc__
        self._gradient = NativeGradient(native_fn)
        self._lib = Library(NAMESPACE, "FRAGMENT")
        self._maybe_inplace: IrOpInplaceOverload | None = None
        try:
            self._define_torch_ops()
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
        except BaseException:
            # nothing half-declared: the torch library and the caches go with the op
            self._destroy_library()
            self._release_caches()
            raise

    # -- torch library ----------------------------------------------------

    def _define_torch_ops(self) -> None:
        try:
            schema = infer_schema(self.native, mutates_args=())
        except Exception as e:  # infer_schema explains what it cannot express
            raise TypeError(
                f"cannot declare IR op {self.name!r}: its native signature "
                f"{self.signature} has no torch schema: {e}"
            ) from e
        qualname = f"{NAMESPACE}::{self.name}"
        self._lib.define(f"{self.name}{schema}")
        self._lib.impl(self.name, self._kernel_default, "CompositeExplicitAutograd")
        torch.library.register_fake(qualname, self.native, lib=self._lib)
        torch.library.register_autograd(
            qualname,
            self._gradient.backward,
            setup_context=self._gradient.setup_context,
            lib=self._lib,
        )
        if self.allow_inplace:
            inplace_schema = infer_schema(self.native, mutates_args=self.activations)
            overload = f"{self.name}.maybe_inplace"
            self._lib.define(f"{overload}{inplace_schema}")
            # A torch schema cannot say "outputs may alias inputs", so behind the
            # dispatcher an inplace impl runs on copies, like the default overload.
            # Memory is reused on the eager fast path and by the compiler's lowering.
            self._lib.impl(overload, self._kernel_default, "CompositeExplicitAutograd")
            self._lib.impl(overload, self._autograd_maybe_inplace, "Autograd")
            torch.library.register_fake(f"{qualname}.maybe_inplace", self.native, lib=self._lib)

    def _kernel_default(self, *args: Any) -> Any:
        impl = self.selected_impl(*args)
        if impl.inplace:
            args = self._clone_activations(args)
        return impl.impl_fn(*args)

    def _autograd_maybe_inplace(self, *args: Any) -> Any:
        # Donating a tensor autograd still needs would corrupt its gradient, so
        # maybe_inplace degrades to the functional overload, which is allowed.
        if _grad_enabled() and self._needs_grad(*args):
            return self.torch_op(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return self.maybe_inplace.torch_op(*args)

    # -- calling ----------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The default overload: never mutates its inputs.

        Each op's class replaces this with code generated from its signature
        (see ``vllm_ir._hotpath``); this is only reached before that.
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

    def bucket_bounds(self, mode: Mode | None = None) -> tuple[int, ...]:
        """The bucket bounds of the effective table in this context: calls of at most
        ``bounds[i]`` tokens (and more than ``bounds[i - 1]``) share bucket ``i``;
        empty when no source is bucketed. Cached per cache generation and scope."""
        if mode is None:
            return self._selector.bucket_bounds()
        with selection_mode_scope(mode):
            return self._selector.bucket_bounds()

    def select(self, *args: Any, mode: Mode | None = None, **kwargs: Any) -> Selection:
        """The impl a call with these arguments runs, uncached, with the decision
        on each priority entry tried (:meth:`selected_impl` is its cached ``.impl``)."""
        args = self._bind(args, kwargs)
        self._selector.check_args(args)
        with selection_mode_scope(mode or selection_mode()):
            return self._selector.select(args)

    def candidates(self, *args: Any, mode: Mode | None = None, **kwargs: Any) -> Candidates:
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
            return self._selector.candidates(args)

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
    def impls(self) -> Mapping[str, IrOpImpl]:
        """Provider name -> impl, always including ``native`` (loads providers)."""
        before_selection()
        return self._selector.impls

    @property
    def selector(self) -> Selector:
        """The op's selection state and rule: impls, keys, caches (:mod:`vllm_ir._selector`).

        For compiler passes and tools that select as a given token count
        (``op.selector.select(args, tokens=n)``); registration goes through the op.
        """
        return self._selector

    @property
    def activation_indices(self) -> frozenset[int]:
        """Positions of the activation parameters (what an in-place impl may write)."""
        return self._activation_idx

    @property
    def has_input_generator(self) -> bool:
        """Whether :meth:`input_generator` registered a generator of benchmark inputs."""
        return self._input_generator is not None

    def selection_key(self, *args: Any) -> Any:
        """The selection cache's key for positional ``args`` (what ``supports_args`` may read).

        Two calls with equal keys get the same selection; the conformance kit
        checks that ``supports_args`` agrees with that.
        """
        return self._selector.key(*args)

    @property
    def registered_impls(self) -> Mapping[str, IrOpImpl]:
        """Like :attr:`impls`, without loading providers: what is registered so far."""
        return self._selector.impls

    def register_impl(
        self,
        provider: str,
        *,
        supported: bool = True,
        supports_args: Callable[..., bool] | None = None,
        inplace: bool = False,
        batch_invariant: bool = False,
        unsupported_reason: str | None = None,
        compiled: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function as ``provider``'s impl of this op.

        Arguments are validated here and the signature at decoration; a
        rejected registration registers nothing. Returns the function unchanged.

        ``compiled=True``: the impl is plain torch that ``torch.compile`` can
        take, so eager calls in a ``set_priority(..., compile=True)`` scope run
        it compiled (:mod:`vllm_ir._compiled_eager`); it must be functional.

        ``supports_args`` takes the op's parameters and returns a plain bool.
        Its answer is cached on the dispatch key (:mod:`vllm_ir._dispatch_key`),
        so it may read only the key's facts: of every tensor argument the
        dtype, device, strides (contiguity, :mod:`vllm_ir._layout`), the sizes
        but the batch size (``shape[1:]`` from rank 2), whether the batch size
        is 0, 1 or more, and ``data_ptr() % 16``; non-tensor arguments by
        value. Never the batch size itself, the storage offset or values: the
        eager cache would run the impl for calls ``select()`` rejects.

        >>> import torch, vllm_ir as ir
        >>> @ir.register_op
        ... def doc_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        ...     return x * factor
        >>> @doc_scale.register_impl("doc_provider", supports_args=lambda x, factor: factor > 0)
        ... def doc_scale_impl(x: torch.Tensor, factor: float) -> torch.Tensor:
        ...     return torch.mul(x, factor)
        >>> sorted(doc_scale.impls)
        ['doc_provider', 'native']
        """
        check_provider_name(self.name, provider)
        if provider in self._selector.impls:
            existing = self._selector.impls[provider]
            raise ValueError(
                f"op {self.name!r} already has an impl from provider {provider!r} "
                f"(registered by {existing.package or existing.source_module}); "
                "provider names must be unique per op"
            )
        for flag, value in (
            ("supported", supported),
            ("inplace", inplace),
            ("batch_invariant", batch_invariant),
            ("compiled", compiled),
        ):
            if not isinstance(value, bool):
                raise TypeError(
                    f"register_impl({provider!r}) of op {self.name!r}: {flag} must be a "
                    f"bool, got {type(value).__name__} {value!r}"
                    + (" (call it: pass its result)" if callable(value) else "")
                )
        if unsupported_reason is not None and not isinstance(unsupported_reason, str):
            raise TypeError(
                f"register_impl({provider!r}) of op {self.name!r}: unsupported_reason must "
                f"be a str, got {unsupported_reason!r}"
            )
        if compiled and inplace:
            raise ValueError(
                f"register_impl({provider!r}) of op {self.name!r}: compiled=True needs a "
                "functional impl (inplace=False); eager compile runs functional impls only"
            )
        if supports_args is not None:
            check_supports_args_signature(self.name, provider, self.signature, supports_args)
        if inplace and not self.allow_inplace:
            raise ValueError(
                f"impl {provider!r} of op {self.name!r} is inplace=True, but the op was "
                "registered without allow_inplace=True, so callers never donate its "
                "inputs; register the op with allow_inplace=True or make the impl functional"
            )

        def decorator(impl_fn: Callable[..., Any]) -> Callable[..., Any]:
            check_impl_signature(self.name, provider, self.signature, impl_fn)
            if provider in self._selector.impls:  # registered between call and decoration
                raise ValueError(f"op {self.name!r} already has an impl from {provider!r}")
            load = current_registration_log()
            impl = IrOpImpl(
                self.name,
                provider,
                impl_fn,
                supported=supported,
                supports_args=supports_args,
                inplace=inplace,
                batch_invariant=batch_invariant,
                source_module=getattr(impl_fn, "__module__", "") or "",
                distribution=load.package if load else None,
                unsupported_reason="" if supported else (unsupported_reason or ""),
                compiled=compiled,
            )
            with invalidating():
                self._selector.add(impl)
            record(
                RegistrationHandle(
                    f"impl {provider!r} of op {self.name!r}",
                    lambda: self._unregister_impl(provider, impl),
                )
            )
            return impl_fn

        return decorator

    def unregister_impl(self, provider: str) -> None:
        """Remove ``provider``'s impl of this op (``native`` cannot be removed).

        Selections cached under it are dropped. A provider's registrations are
        also undone together by :meth:`vllm_ir.RegistrationLog.remove`.

        >>> import torch, vllm_ir as ir
        >>> @ir.ops.rms_norm.register_impl("doc_tmp")
        ... def doc_tmp(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
        ...             variance_size: int | None = None) -> torch.Tensor:
        ...     return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)
        >>> ir.ops.rms_norm.unregister_impl("doc_tmp")
        >>> "doc_tmp" in ir.ops.rms_norm.impls
        False
        """
        if provider == NATIVE:
            raise ValueError(f"the {NATIVE!r} impl of op {self.name!r} cannot be unregistered")
        if provider not in self._selector.impls:
            raise KeyError(
                f"op {self.name!r} has no impl from provider {provider!r}; registered: "
                f"{', '.join(sorted(self._selector.impls))}"
            )
        self._unregister_impl(provider)

    def _unregister_impl(self, provider: str, impl: IrOpImpl | None = None) -> None:
        # ``impl``: remove only that registration, not a later one under the same name
        current = self._selector.impls.get(provider)
        if provider == NATIVE or current is None or (impl is not None and current is not impl):
            return
        with invalidating():
            self._selector.remove(provider)
            # the wrappers hold the impl's function (and all it closes over)
            for eager in self._eager_calls():
                eager.forget(current)
            compiled_eager.forget(self.name, current)

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

    # -- priority ---------------------------------------------------------

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
                f"unknown provider(s) {listing(unknown)} for op {self.name!r}; "
                f"known providers: {', '.join(sorted(known))}"
            )
        return list(providers)

    def check_priority(self, value: object) -> list[str] | BucketedPriority:
        """Validate a priority entry for this op: a list of providers, or of size
        buckets (:mod:`vllm_ir._buckets`); unknown providers are refused."""
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
        registered with ``compiled=True``); see :mod:`vllm_ir._compiled_eager`.

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

    # -- samples ----------------------------------------------------------

    def register_input_generator(self, generator: SampleInputGenerator) -> SampleInputGenerator:
        """Decorator: the op's sample inputs, used by tests and benchmarks."""
        previous, self._input_generator = self._input_generator, generator

        def undo() -> None:
            if self._input_generator is generator:
                self._input_generator = previous

        record(RegistrationHandle(f"input generator of op {self.name!r}", undo))
        return generator

    def register_extra_samples(
        self, provider: str
    ) -> Callable[[SampleInputGenerator], SampleInputGenerator]:
        """Decorator: more sample inputs for ``provider``'s impl of this op only.

        The conformance kit checks ``provider``'s impl on the op's own samples
        and then on these (the shapes its kernel special-cases, say); other
        providers' checks, and what :meth:`sample_inputs` yields without
        ``provider``, are unchanged. Undone with the provider's registrations.
        """
        if not isinstance(provider, str) or not provider:
            raise TypeError(
                f"register_extra_samples of op {self.name!r} takes a provider name, e.g. "
                f"@ir.ops.{self.name}.register_extra_samples('my_kernels'), got {provider!r}"
            )

        def decorator(generator: SampleInputGenerator) -> SampleInputGenerator:
            if not callable(generator):
                raise TypeError(
                    f"extra samples of op {self.name!r} for {provider!r} must be a generator "
                    f"function (dtype, device) -> SampleInputs, got {type(generator).__name__}"
                )
            extras = self._extra_samples.setdefault(provider, [])
            extras.append(generator)

            def undo() -> None:
                if generator in extras:
                    extras.remove(generator)
                if not extras and self._extra_samples.get(provider) is extras:
                    del self._extra_samples[provider]

            record(RegistrationHandle(f"extra samples of op {self.name!r} for {provider!r}", undo))
            return generator

        return decorator

    def sample_inputs(
        self,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        *,
        provider: str | None = None,
    ) -> Iterator[SampleInput]:
        """The op's sample calls; with ``provider``, followed by that provider's
        extra samples (:meth:`register_extra_samples`)."""
        if self._input_generator is None:
            raise LookupError(
                f"op {self.name!r} has no input generator; register one with "
                f"@ir.ops.{self.name}.register_input_generator"
            )
        own = self._input_generator(dtype, torch.device(device))
        extras = list(self._extra_samples.get(provider, ())) if provider is not None else []
        if not extras:
            return own
        return itertools.chain(own, *(g(dtype, torch.device(device)) for g in extras))

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        """How close an impl's result for ``dtype`` must be to native's (tests, the kit)."""
        return tolerance_for(dtype, self.tolerances)

    def register_tolerances(
        self, tolerances: Mapping[torch.dtype, Tolerance]
    ) -> RegistrationHandle:
        """Compare impls of this op with native within ``tolerances`` (dtype -> tolerance).

        Returns a handle; a failed provider load removes what it registered.

        >>> import torch, vllm_ir as ir
        >>> handle = ir.ops.silu_and_mul.register_tolerances(
        ...     {torch.float64: ir.Tolerance(atol=1e-12, rtol=1e-12)})
        >>> ir.ops.silu_and_mul.tolerance(torch.float64).atol
        1e-12
        >>> handle.remove()
        """
        return self.tolerances.register(tolerances)

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
