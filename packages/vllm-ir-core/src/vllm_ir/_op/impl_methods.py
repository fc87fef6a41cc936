"""An op's impls as its users register them: the registration API of :class:`~vllm_ir.IrOp`.

Validation lives with the impl (:func:`vllm_ir._schema.impl.check_registration`),
the impls and their lifetime with the op's selector
(:class:`~vllm_ir._selection.selector.Selector`: ``add`` returns the handle,
``remove`` tells the eager and compiled wrappers to forget the impl).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

from vllm_ir._base.cache import before_selection
from vllm_ir._base.registration import RegistrationHandle, current_registration_log, record
from vllm_ir._schema.impl import NATIVE, IrOpImpl, check_impl_signature, check_registration
from vllm_ir._selection.selector import Selector

__all__ = ["ImplMethods"]

_Impl = TypeVar("_Impl", bound=Callable[..., Any])


class ImplMethods:
    """``impls``, ``registered_impls``, ``register_impl`` and ``unregister_impl`` of an op."""

    name: str
    signature: Any
    allow_inplace: bool
    _selector: Selector

    @property
    def impls(self) -> Mapping[str, IrOpImpl]:
        """Provider name -> impl, always including ``native`` (loads providers)."""
        before_selection()
        return self._selector.impls

    @property
    def registered_impls(self) -> Mapping[str, IrOpImpl]:
        """Like :attr:`impls`, without loading providers: what is registered so far."""
        return self._selector.impls

    @overload
    def register_impl(
        self,
        provider: str,
        impl_fn: None = None,
        *,
        supported: bool = ...,
        supports_args: Callable[..., bool] | None = ...,
        inplace: bool = ...,
        batch_invariant: bool = ...,
        unsupported_reason: str | None = ...,
        compiled: bool = ...,
    ) -> Callable[[_Impl], _Impl]: ...

    @overload
    def register_impl(
        self,
        provider: str,
        impl_fn: Callable[..., Any],
        *,
        supported: bool = ...,
        supports_args: Callable[..., bool] | None = ...,
        inplace: bool = ...,
        batch_invariant: bool = ...,
        unsupported_reason: str | None = ...,
        compiled: bool = ...,
    ) -> RegistrationHandle: ...

    def register_impl(
        self,
        provider: str,
        impl_fn: Callable[..., Any] | None = None,
        *,
        supported: bool = True,
        supports_args: Callable[..., bool] | None = None,
        inplace: bool = False,
        batch_invariant: bool = False,
        unsupported_reason: str | None = None,
        compiled: bool = False,
    ) -> RegistrationHandle | Callable[[_Impl], _Impl]:
        """Register the decorated function (or ``impl_fn``) as ``provider``'s impl.

        Arguments are validated here and the signature at decoration; a
        rejected registration registers nothing. As a decorator it returns the
        function unchanged; given ``impl_fn`` it returns the registration's
        :class:`~vllm_ir.provider.RegistrationHandle` (both record it in an
        active :func:`~vllm_ir.provider.recording_registrations` log).

        ``compiled=True``: the impl is plain torch that ``torch.compile`` can
        take, so eager calls in a ``set_priority(..., compile=True)`` scope run
        it compiled (:mod:`vllm_ir._selection.compiled_eager`); it must be functional.

        ``supports_args`` takes the op's parameters and returns a plain bool.
        Its answer is cached on the selection key (:mod:`vllm_ir._selection.key`),
        so it may read only the key's facts: of every tensor argument the
        dtype, device, strides (contiguity, :mod:`vllm_ir._schema.layout`), the sizes
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
        >>> handle = doc_scale.register_impl("doc_other", doc_scale_impl)
        >>> sorted(doc_scale.impls)
        ['doc_other', 'doc_provider', 'native']
        >>> handle.remove()
        >>> sorted(doc_scale.impls)
        ['doc_provider', 'native']
        """
        check_registration(
            self.name,
            provider,
            registered=self._selector.impls,
            signature=self.signature,
            allow_inplace=self.allow_inplace,
            supports_args=supports_args,
            supported=supported,
            inplace=inplace,
            batch_invariant=batch_invariant,
            compiled=compiled,
            unsupported_reason=unsupported_reason,
        )

        def register(fn: Callable[..., Any]) -> RegistrationHandle:
            check_impl_signature(self.name, provider, self.signature, fn)
            load = current_registration_log()
            impl = IrOpImpl(
                self.name,
                provider,
                fn,
                supported=supported,
                supports_args=supports_args,
                inplace=inplace,
                batch_invariant=batch_invariant,
                source_module=getattr(fn, "__module__", "") or "",
                distribution=load.package if load else None,
                unsupported_reason="" if supported else (unsupported_reason or ""),
                compiled=compiled,
            )
            handle = self._selector.add(impl)  # a name taken since the call: refused here
            record(handle)
            return handle

        if impl_fn is not None:
            return register(impl_fn)

        def decorator(fn: _Impl) -> _Impl:
            register(fn)
            return fn

        return decorator

    def unregister_impl(self, provider: str) -> None:
        """Remove ``provider``'s impl of this op (``native`` cannot be removed).

        Selections cached under it are dropped. A provider's registrations are
        also undone together by :meth:`vllm_ir.provider.RegistrationLog.remove`.

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
        self._selector.remove(provider)
