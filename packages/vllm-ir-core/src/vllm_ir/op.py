"""IR ops: declaration, the ``maybe_inplace`` overload, and eager calls.

An IR op is a torch custom op in the ``vllm_ir`` namespace whose semantics are
its native Python function. Calling the :class:`IrOp` object selects an impl
by priority and calls it. Plain eager calls take a cached fast path; calls
under Dynamo, ``make_fx``, a dispatch mode, a ``__torch_function__`` subclass
or autograd go through ``torch.ops.vllm_ir.<name>`` so tracers see one node.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import keyword
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, overload

import torch
from torch.library import Library, infer_schema

from vllm_ir import dispatch as _dispatch
from vllm_ir._hotpath import make_eager_call, make_key_fn, make_needs_grad_fn, tensor_kind
from vllm_ir.impl import (
    NATIVE,
    IrOpImpl,
    check_impl_signature,
    check_provider_name,
    check_supports_args_signature,
    resolved_signature,
)
from vllm_ir.priority import (
    Mode,
    PriorityEntry,
    effective_priority,
    scoped_priority,
    scoped_state_var,
    selection_mode,
)
from vllm_ir.registration import RegistrationHandle, current_registration_log, record
from vllm_ir.samples import SampleInput, SampleInputGenerator
from vllm_ir.tolerances import Tolerance, tolerance_for

__all__ = ["IrOp", "IrOpInplaceOverload", "NAMESPACE", "get_op", "register_op"]

NAMESPACE = "vllm_ir"
"""The ``torch.ops`` namespace of every IR op."""

_grad_enabled = torch.is_grad_enabled
_scoped_get = scoped_state_var().get


def _ensure_providers_loaded() -> None:
    from vllm_ir import providers

    providers.ensure_loaded()


class IrOp:
    """An IR op: its native semantics, its impls and its priority.

    Create with :func:`register_op`; reach with ``vllm_ir.ops.<name>``.

    >>> import torch, vllm_ir as ir
    >>> x = torch.ones(2, 8)
    >>> ir.ops.rms_norm(x, None, 1e-6).shape
    torch.Size([2, 8])
    >>> ir.ops.rms_norm.dispatch(x, None, 1e-6).provider in ir.ops.rms_norm.impls
    True
    """

    registry: ClassVar[Mapping[str, IrOp]]
    _registry: ClassVar[dict[str, IrOp]] = {}

    def __init__(
        self,
        name: str,
        native_fn: Callable[..., Any],
        activations: Sequence[str] | None = None,
        allow_inplace: bool = False,
    ) -> None:
        _check_op_name(name)
        self.name = name
        self.native = native_fn
        self.allow_inplace = allow_inplace
        self.signature = resolved_signature(native_fn)
        self._param_names = tuple(self.signature.parameters)
        _check_native_signature(name, self.signature)
        self.activations: tuple[str, ...] = _resolve_activations(
            name, self.signature, activations, allow_inplace
        )
        self._activation_idx = frozenset(self._param_names.index(a) for a in self.activations)
        self._key = make_key_fn(self.signature, _scoped_get)
        self._needs_grad = make_needs_grad_fn(self.signature)
        self._caches: dict[Mode, dict[Any, IrOpImpl]] = {
            "eager": _dispatch.register_cache(),
            "compiled": _dispatch.register_cache(),
        }
        self._eager_cache = self._caches["eager"]
        self._impls: dict[str, IrOpImpl] = {
            NATIVE: IrOpImpl(
                name,
                NATIVE,
                native_fn,
                supported=True,
                inplace=False,
                batch_invariant=True,
                source_module=getattr(native_fn, "__module__", "") or "",
            )
        }
        self._input_generator: SampleInputGenerator | None = None
        self.tolerances: dict[torch.dtype, Tolerance] = {}
        self.__doc__ = native_fn.__doc__
        self._lib = Library(NAMESPACE, "FRAGMENT")
        try:
            self._define_torch_ops()
        except BaseException:
            self._lib._destroy()
            raise
        self.torch_op: torch._ops.OpOverload = getattr(torch.ops.vllm_ir, name).default
        """``torch.ops.vllm_ir.<name>.default``: never mutates its inputs."""
        self._calls = _dispatch.register_cache()
        call = make_eager_call(
            self.signature,
            name,
            torch_op=self.torch_op,
            calls=self._calls,
            resolve=self._resolve_default_call,
            scoped_get=_scoped_get,
        )
        # A class per op, as torch.fx does per GraphModule: ``op(...)`` looks
        # ``__call__`` up on the type, and the generated one takes the op's own
        # parameters.
        self.__class__ = type(f"IrOp[{name}]", (IrOp,), {"__call__": call, "__doc__": self.__doc__})
        # built now, not on first use: Dynamo cannot trace the code generation
        self._maybe_inplace = IrOpInplaceOverload(self) if allow_inplace else None

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
            qualname, self._backward, setup_context=self._setup_context, lib=self._lib
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
        impl = self.dispatch(*args)
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

    def _setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        tensor_idx = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        ctx.tensor_idx = tensor_idx
        ctx.others = tuple(None if i in tensor_idx else a for i, a in enumerate(inputs))
        ctx.save_for_backward(*(inputs[i] for i in tensor_idx))

    def _backward(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
        # Gradients are those of the native semantics, whichever impl ran forward.
        inputs = list(ctx.others)
        wanted = []
        with torch.enable_grad():
            for i, saved in zip(ctx.tensor_idx, ctx.saved_tensors, strict=True):
                inputs[i] = saved.detach().requires_grad_(ctx.needs_input_grad[i])
                if ctx.needs_input_grad[i]:
                    wanted.append(i)
            out = self.native(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            pairs = [
                (o, g)
                for o, g in zip(outs, grads, strict=True)
                if g is not None and o.requires_grad
            ]
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                [inputs[i] for i in wanted],
                [g for _, g in pairs],
                allow_unused=True,
            )
        result: list[Any] = [None] * len(inputs)
        for i, g in zip(wanted, found, strict=True):
            result[i] = g
        return tuple(result)

    # -- calling ----------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The default overload: never mutates its inputs.

        Each op's class replaces this with code generated from its signature
        (see ``vllm_ir._hotpath``); this is only reached before that.
        """
        raise TypeError(f"op {self.name!r} is not fully constructed")

    def dispatch(self, *args: Any, **kwargs: Any) -> IrOpImpl:
        """The impl that a call with these arguments runs.

        Uses the eager priorities, or the compiled ones inside
        :func:`vllm_ir.priority.compiled_selection` (as the lowering pass does).
        Works on real tensors and on FakeTensors alike.
        """
        if kwargs:
            args = self._bind(args, kwargs)
        mode = selection_mode()
        try:
            return self._caches[mode][self._key(*args)]
        except (KeyError, TypeError):
            return self._select_uncached(args, mode)

    def select(self, *args: Any, mode: Mode | None = None, **kwargs: Any) -> _dispatch.Selection:
        """Like :meth:`dispatch`, uncached, with the decision on every candidate."""
        args = self._bind(args, kwargs)
        _ensure_providers_loaded()
        with _mode_scope(mode):
            return _dispatch.select(
                self.name, self._impls, args, selection_mode(), lambda: _dispatch.describe(args)
            )

    def _select_uncached(self, args: tuple[Any, ...], mode: Mode) -> IrOpImpl:
        try:
            self.signature.bind(*args)
        except TypeError as e:
            raise TypeError(f"{self.name}{self.signature}: {e}") from None
        _ensure_providers_loaded()
        selection = _dispatch.select(
            self.name, self._impls, args, mode, lambda: _dispatch.describe(args)
        )
        with contextlib.suppress(TypeError):  # unhashable argument: stay uncached
            self._caches[mode][self._key(*args)] = selection.impl
        return selection.impl

    def _resolve_default_call(self, key: Any, args: tuple[Any, ...]) -> Callable[..., Any]:
        """What the default overload runs for ``args``: never writes the inputs."""
        impl = self._select_uncached(args, "eager")
        fn = impl.impl_fn
        if impl.inplace:
            fn = functools.partial(self._call_on_copies, impl.impl_fn)
        if key is not None:
            self._calls[key] = fn
        return fn

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}{self.signature}: {e}") from None
        bound.apply_defaults()
        return bound.args

    def _call_on_copies(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an inplace impl for the default overload: on copies of the activations."""
        return fn(*self._clone_activations(args))

    def _clone_activations(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        idx = self._activation_idx
        return tuple(
            a.clone() if i in idx and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)
        )

    # -- impls ------------------------------------------------------------

    @property
    def impls(self) -> Mapping[str, IrOpImpl]:
        """Provider name -> impl, always including ``native`` (loads providers)."""
        _ensure_providers_loaded()
        return MappingProxyType(self._impls)

    def register_impl(
        self,
        provider: str,
        *,
        supported: bool = True,
        supports_args: Callable[..., bool] | None = None,
        inplace: bool = False,
        batch_invariant: bool = False,
        unsupported_reason: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function as ``provider``'s impl of this op.

        Arguments are validated here and the signature at decoration; a
        rejected registration registers nothing. Returns the function unchanged.

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
        if provider in self._impls:
            existing = self._impls[provider]
            raise ValueError(
                f"op {self.name!r} already has an impl from provider {provider!r} "
                f"(registered by {existing.package or existing.source_module}); "
                "provider names must be unique per op"
            )
        for flag, value in (
            ("supported", supported),
            ("inplace", inplace),
            ("batch_invariant", batch_invariant),
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
            if provider in self._impls:  # registered between call and decoration
                raise ValueError(f"op {self.name!r} already has an impl from {provider!r}")
            load = current_registration_log()
            self._impls[provider] = IrOpImpl(
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
            )
            impl = self._impls[provider]
            record(
                RegistrationHandle(
                    f"impl {provider!r} of op {self.name!r}",
                    lambda: self._unregister_impl(provider, impl),
                )
            )
            _dispatch.invalidate_caches()
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
        if provider not in self._impls:
            raise KeyError(
                f"op {self.name!r} has no impl from provider {provider!r}; registered: "
                f"{', '.join(sorted(self._impls))}"
            )
        self._unregister_impl(provider)

    def _unregister_impl(self, provider: str, impl: IrOpImpl | None = None) -> None:
        # ``impl``: remove only that registration, not a later one under the same name
        current = self._impls.get(provider)
        if provider == NATIVE or current is None or (impl is not None and current is not impl):
            return
        del self._impls[provider]
        _dispatch.invalidate_caches()

    def _unregister(self) -> None:
        """Remove this op entirely (rollback of a failed provider load; tests)."""
        if IrOp._registry.get(self.name) is self:
            del IrOp._registry[self.name]
            ops_module = sys.modules.get("vllm_ir.ops")
            if ops_module is not None and getattr(ops_module, self.name, None) is self:
                delattr(ops_module, self.name)
        self._lib._destroy()
        calls = [self._calls] + ([self._maybe_inplace._calls] if self._maybe_inplace else [])
        for cache in [*self._caches.values(), *calls]:
            _dispatch.release_cache(cache)

    # -- priority ---------------------------------------------------------

    def check_providers(self, providers: Sequence[str]) -> list[str]:
        """Validate a priority list for this op; returns it as a list."""
        if isinstance(providers, str) or not all(isinstance(p, str) for p in providers):
            raise TypeError(
                f"priority of op {self.name!r} must be a list of provider names, got {providers!r}"
            )
        known = self.impls
        unknown = [p for p in providers if p not in known]
        if unknown:
            raise ValueError(
                f"unknown provider(s) {', '.join(map(repr, unknown))} for op {self.name!r}; "
                f"known providers: {', '.join(sorted(known))}"
            )
        return list(providers)

    @contextlib.contextmanager
    def set_priority(self, providers: Sequence[str]) -> Iterator[None]:
        """Within the ``with`` block, try ``providers`` first for this op.

        Scoped to the current thread / task, nestable, restored on exceptions.

        >>> import vllm_ir as ir
        >>> with ir.ops.rms_norm.set_priority(["native"]):
        ...     ir.ops.rms_norm.get_priority()[0]
        'native'
        """
        with scoped_priority({self.name: self.check_providers(providers)}):
            yield

    def get_priority(self, mode: Mode | None = None) -> list[str]:
        """The effective priority list in this context (``native`` last or earlier)."""
        return [e.provider for e in self.get_priority_entries(mode)]

    def get_priority_entries(self, mode: Mode | None = None) -> tuple[PriorityEntry, ...]:
        """The effective priority list with the origin of each entry."""
        _ensure_providers_loaded()
        return effective_priority(self.name, mode)

    # -- samples ----------------------------------------------------------

    def register_input_generator(self, generator: SampleInputGenerator) -> SampleInputGenerator:
        """Decorator: the op's sample inputs, used by tests and benchmarks."""
        previous, self._input_generator = self._input_generator, generator

        def undo() -> None:
            if self._input_generator is generator:
                self._input_generator = previous

        record(RegistrationHandle(f"input generator of op {self.name!r}", undo))
        return generator

    def sample_inputs(
        self, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> Iterator[SampleInput]:
        if self._input_generator is None:
            raise LookupError(
                f"op {self.name!r} has no input generator; register one with "
                f"@ir.ops.{self.name}.register_input_generator"
            )
        return self._input_generator(dtype, torch.device(device))

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        return tolerance_for(dtype, self.tolerances)

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
        self.torch_op: torch._ops.OpOverload = getattr(torch.ops.vllm_ir, op.name).maybe_inplace
        self._calls = _dispatch.register_cache()
        call = make_eager_call(
            op.signature,
            op.name,
            torch_op=self.torch_op,
            calls=self._calls,
            resolve=self._resolve_call,
            scoped_get=_scoped_get,
        )
        self.__class__ = type(
            f"IrOpInplaceOverload[{op.name}]", (IrOpInplaceOverload,), {"__call__": call}
        )

    def _resolve_call(self, key: Any, args: tuple[Any, ...]) -> Callable[..., Any]:
        """What ``maybe_inplace`` runs for ``args``: the impl itself."""
        fn = self.op._select_uncached(args, "eager").impl_fn
        if key is not None:
            self._calls[key] = fn
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call with donated activations (replaced per op by generated code)."""
        raise TypeError(f"maybe_inplace of {self.op.name!r} is not fully constructed")

    def __repr__(self) -> str:
        return f"IrOpInplaceOverload({self.op.name})"


IrOp.registry = MappingProxyType(IrOp._registry)


@contextlib.contextmanager
def _mode_scope(mode: Mode | None) -> Iterator[None]:
    if mode is None or mode == selection_mode():
        yield
        return
    from vllm_ir.priority import _mode

    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


def _check_op_name(name: object) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"IR op name must be a Python identifier, got {name!r}")
    if name.startswith("_"):
        raise ValueError(f"IR op name {name!r} must not start with an underscore")
    if name in IrOp._registry:
        existing = IrOp._registry[name]
        raise ValueError(
            f"IR op {name!r} is already registered (by {existing.native.__module__}); "
            "choose another name"
        )
    ops_module = sys.modules.get("vllm_ir.ops")
    if ops_module is not None and name in vars(ops_module):
        raise ValueError(
            f"IR op name {name!r} would shadow vllm_ir.ops.{name}; choose another name"
        )


def _check_native_signature(name: str, sig: inspect.Signature) -> None:
    for p in sig.parameters.values():
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            raise TypeError(
                f"IR op {name!r}: parameter {p.name!r} is {p.kind.description}; IR ops "
                "take plain positional-or-keyword parameters only"
            )
        if p.annotation is inspect.Parameter.empty:
            raise TypeError(
                f"IR op {name!r}: parameter {p.name!r} has no type annotation; "
                "annotations define the op's torch schema"
            )


def _resolve_activations(
    name: str, sig: inspect.Signature, activations: Sequence[str] | None, allow_inplace: bool
) -> tuple[str, ...]:
    params = sig.parameters
    if activations is None:
        chosen = tuple(p for p in params if p.startswith("x"))
    elif isinstance(activations, str):
        raise TypeError(f"IR op {name!r}: activations must be a list of names, got a string")
    else:
        chosen = tuple(activations)
    for a in chosen:
        if a not in params:
            raise ValueError(
                f"IR op {name!r}: activation {a!r} is not a parameter; parameters: "
                f"{', '.join(params)}"
            )
        if tensor_kind(params[a].annotation) != "tensor":
            raise TypeError(
                f"IR op {name!r}: activation {a!r} is annotated {params[a].annotation}, "
                "but activations must be Tensors"
            )
    if allow_inplace:
        if not chosen:
            raise ValueError(
                f"IR op {name!r} has allow_inplace=True but no activations; name them "
                "with activations=[...] or start their parameter names with 'x'"
            )
        n_out = _count_tensor_outputs(sig.return_annotation)
        if n_out != len(chosen):
            raise ValueError(
                f"IR op {name!r} has allow_inplace=True, so each output must be able to "
                f"reuse one activation, but it returns {n_out} tensor(s) for "
                f"{len(chosen)} activation(s) {list(chosen)}"
            )
    return chosen


def _count_tensor_outputs(annotation: object) -> int:
    if annotation is torch.Tensor:
        return 1
    import typing

    if typing.get_origin(annotation) is tuple:
        return sum(1 for a in typing.get_args(annotation) if a is torch.Tensor)
    return 0


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
) -> Callable[[Callable[..., Any]], IrOp]: ...


def register_op(
    f: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    activations: Sequence[str] | None = None,
    allow_inplace: bool = False,
) -> IrOp | Callable[[Callable[..., Any]], IrOp]:
    """Declare an IR op whose semantics are the decorated native function.

    Defines ``torch.ops.vllm_ir.<name>.default`` (and ``.maybe_inplace`` with
    ``allow_inplace=True``) with a fake impl and gradients of the native
    function, and exposes the op as ``vllm_ir.ops.<name>``.

    Args:
        name: op name; defaults to the function's name.
        activations: parameters that ``maybe_inplace`` callers donate;
            defaults to those whose names start with ``x``.
        allow_inplace: create the ``maybe_inplace`` overload, which lets impls
            registered with ``inplace=True`` write outputs into activations.

    >>> import torch, vllm_ir as ir
    >>> @ir.register_op(name="doc_double")
    ... def double(x: torch.Tensor) -> torch.Tensor:
    ...     return x * 2
    >>> torch.ops.vllm_ir.doc_double(torch.ones(2)).tolist()
    [2.0, 2.0]
    """

    def decorator(fn: Callable[..., Any]) -> IrOp:
        if not callable(fn):
            raise TypeError(f"register_op expects a function, got {fn!r}")
        op = IrOp(name or fn.__name__, fn, activations, allow_inplace)
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
        _ensure_providers_loaded()
    try:
        return IrOp._registry[name]
    except KeyError:
        raise KeyError(
            f"unknown IR op {name!r}; known ops: {', '.join(sorted(IrOp._registry))}"
        ) from None
