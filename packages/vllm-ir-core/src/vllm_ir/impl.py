"""Kernel implementations of IR ops, and the checks a registration must pass.

A registration is validated in full before anything is stored, so a rejected
``register_impl`` leaves the op exactly as it was.
"""

from __future__ import annotations

import inspect
import keyword
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NATIVE",
    "IrOpImpl",
    "calling_package",
    "check_impl_signature",
    "check_provider_name",
    "check_supports_args_signature",
    "resolved_signature",
]

NATIVE = "native"
"""The reserved provider name of an op's own (``register_op``) function."""


@dataclass(frozen=True, eq=False, slots=True)
class IrOpImpl:
    """One implementation of an IR op, registered by ``provider``.

    Attributes:
        provider: unique name of the implementation within its op, e.g. ``vllm_c``.
        impl_fn: the kernel entry point; its signature equals the op's native one.
        supported: static availability on this machine (checked once, at registration).
        supports_args: optional predicate over the op's arguments; a plain ``bool``
            that reads only the facts of the dispatch key (:mod:`vllm_ir.dispatch_key`:
            per tensor dtype, device, strides, sizes but the batch size, the batch
            size's class and 16-byte alignment; non-tensor arguments), never values
            (it is called with FakeTensors under compile, and its answer is cached).
        inplace: the impl writes its outputs into the op's activations.
        batch_invariant: a row's result does not depend on the batch it is in.
        unsupported_reason: why ``supported`` is False (shown by selection logs,
            ``vllm-ir explain`` and ``vllm-ir ops``).
        package: ``"name version"`` of the distribution the impl came from, or the
            module that registered it when it did not come from an installed package
            (resolved lazily: the lookup scans installed metadata).
    """

    op_name: str
    provider: str
    impl_fn: Callable[..., Any]
    supported: bool = True
    supports_args: Callable[..., bool] | None = None
    inplace: bool = False
    batch_invariant: bool = False
    source_module: str = ""
    unsupported_reason: str = ""
    distribution: str | None = field(default=None, repr=False)

    @property
    def package(self) -> str:
        """``"name version"`` of the distribution this impl came from."""
        if self.distribution is None:
            object.__setattr__(self, "distribution", calling_package(self.source_module))
        return self.distribution or ""

    def __repr__(self) -> str:
        flags = [f"supported={self.supported}"]
        if self.inplace:
            flags.append("inplace")
        if self.batch_invariant:
            flags.append("batch_invariant")
        return f"IrOpImpl({self.op_name}:{self.provider}, {', '.join(flags)})"


def check_provider_name(op_name: str, provider: object) -> str:
    if not isinstance(provider, str) or not provider.isidentifier() or keyword.iskeyword(provider):
        raise ValueError(
            f"provider name for op {op_name!r} must be a Python identifier such as "
            f"'vllm_c' or 'triton', got {provider!r}"
        )
    if provider == NATIVE:
        raise ValueError(
            f"provider name {NATIVE!r} is reserved for the native implementation of "
            f"op {op_name!r} (the function passed to register_op); choose another name"
        )
    return provider


def resolved_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature with string annotations evaluated where possible."""
    try:
        return inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, SyntaxError):
        return inspect.signature(fn)


def _without_return(sig: inspect.Signature) -> inspect.Signature:
    return sig.replace(return_annotation=inspect.Signature.empty)


def check_impl_signature(
    op_name: str, provider: str, native: inspect.Signature, impl_fn: Callable[..., Any]
) -> None:
    """Raise ``TypeError`` unless ``impl_fn`` has exactly the native signature."""
    if not callable(impl_fn):
        raise TypeError(f"impl {provider!r} of op {op_name!r} must be callable, got {impl_fn!r}")
    impl = resolved_signature(impl_fn)
    if impl != native:
        raise TypeError(
            f"impl {provider!r} of op {op_name!r} has signature {impl_fn.__name__}{impl}, "
            f"but the op's native signature is {op_name}{native}; parameter names, "
            "kinds, defaults and annotations must match exactly"
        )


def check_supports_args_signature(
    op_name: str, provider: str, native: inspect.Signature, supports_args: object
) -> None:
    """``supports_args`` takes the op's parameters: same names, kinds and defaults."""
    if not callable(supports_args):
        raise TypeError(
            f"supports_args of impl {provider!r} of op {op_name!r} must be callable, "
            f"got {supports_args!r}"
        )
    try:
        given = inspect.signature(supports_args)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"supports_args of impl {provider!r} of op {op_name!r} has no inspectable "
            f"signature ({e}); use a Python function"
        ) from None

    def shape(sig: inspect.Signature) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    if shape(given) != shape(native):
        expected = _without_return(native).replace(
            parameters=[p.replace(annotation=p.empty) for p in native.parameters.values()]
        )
        raise TypeError(
            f"supports_args of impl {provider!r} of op {op_name!r} has signature {given}, "
            f"but it must take the op's own parameters {expected} (same names, kinds "
            "and defaults) and return a bool"
        )


def calling_package(module_name: str | None) -> str:
    """Best-effort ``"dist version"`` of the distribution providing ``module_name``."""
    if not module_name:
        return ""
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top == "__main__":
        return module_name
    from importlib import metadata

    try:
        dists = metadata.packages_distributions().get(top, [])
    except Exception:  # broken metadata must never break a registration
        dists = []
    if not dists:
        return module_name
    name = dists[0]
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name
