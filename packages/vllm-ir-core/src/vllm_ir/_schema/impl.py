"""Kernel implementations of IR ops, and the checks a registration must pass.

A registration is validated in full before anything is stored, so a rejected
``register_impl`` leaves the op exactly as it was.
"""

from __future__ import annotations

import inspect
import keyword
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

__all__ = [
    "check_registration",
    "check_unregistered",
    "NATIVE",
    "IrOpImpl",
    "calling_package",
    "check_impl_signature",
    "check_provider_name",
    "check_supports_args_signature",
    "resolved_signature",
    "signature_difference",
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
            that reads only the facts of the selection key (:mod:`vllm_ir._selection.key`:
            per tensor dtype, device, strides, sizes but the batch size, the batch
            size's class and 16-byte alignment; non-tensor arguments), never values
            (it is called with FakeTensors under compile, and its answer is cached).
        inplace: the impl writes its outputs into the op's activations.
        batch_invariant: a row's result does not depend on the batch it is in.
        compiled: ``torch.compile`` may compile the impl for eager calls in a
            ``set_priority(..., compile=True)`` scope (:mod:`vllm_ir._selection.compiled_eager`);
            always true of ``native``.
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
    compiled: bool = False

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


def resolved_signature(fn: Callable[..., Any], *, strict: bool = False) -> inspect.Signature:
    """``fn``'s signature with string annotations evaluated in ``fn``'s own namespace.

    String annotations (``from __future__ import annotations``) are evaluated
    with ``fn``'s globals, the variables its closure captured, and the locals
    of the code that applied the decorator: a function defined inside
    another one, after a local ``from torch import Tensor``, resolves like
    one at module level. An annotation that still cannot be evaluated stays a
    string, or with ``strict=True`` raises ``TypeError`` saying which one.
    """
    sig = inspect.signature(fn)
    if not any(
        isinstance(a, str)
        for a in (sig.return_annotation, *(p.annotation for p in sig.parameters.values()))
    ):
        return sig
    fn = inspect.unwrap(fn)
    globals_ = dict(getattr(fn, "__globals__", {}))
    try:
        captured = dict(inspect.getclosurevars(fn).nonlocals)
    except (TypeError, ValueError):
        captured = {}
    localns = {**_caller_locals(), **captured}

    def evaluate(annotation: Any, what: str) -> Any:
        if not isinstance(annotation, str):
            return annotation
        try:
            return eval(annotation, globals_, localns)  # what typing.get_type_hints does
        except Exception as e:
            if not strict:
                return annotation
            name = getattr(fn, "__qualname__", repr(fn))
            raise TypeError(
                f"the annotation {annotation!r} of {what} of {name} could not be evaluated "
                f"({type(e).__name__}: {e}); import the names it uses at module level of "
                f"{getattr(fn, '__module__', 'its module')}"
            ) from None

    params = [
        p.replace(annotation=evaluate(p.annotation, f"parameter {p.name!r}"))
        for p in sig.parameters.values()
    ]
    return sig.replace(
        parameters=params, return_annotation=evaluate(sig.return_annotation, "the return")
    )


def _caller_locals() -> dict[str, Any]:
    """Locals of the nearest frame outside vllm-ir: where the decorator was applied."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("vllm_ir."):
        frame = frame.f_back
    return dict(frame.f_locals) if frame is not None else {}


def _without_return(sig: inspect.Signature) -> inspect.Signature:
    return sig.replace(return_annotation=inspect.Signature.empty)


def _fmt(annotation: Any) -> str:
    return (
        "no annotation"
        if annotation is inspect.Parameter.empty
        else (inspect.formatannotation(annotation))
    )


def signature_difference(given: inspect.Signature, native: inspect.Signature) -> str:
    """The first way ``given`` differs from ``native``, in words (``""``: equal)."""
    gp, np_ = list(given.parameters.values()), list(native.parameters.values())
    for i, (g, n) in enumerate(zip(gp, np_, strict=False)):
        if g.name != n.name:
            return f"parameter {i + 1} is named {g.name!r}, the op's is {n.name!r}"
        if g.kind != n.kind:
            return f"parameter {g.name!r} is {g.kind.description}, the op's is {n.kind.description}"
        if g.annotation != n.annotation:
            return (
                f"parameter {g.name!r} is annotated {_fmt(g.annotation)}, "
                f"the op's {_fmt(n.annotation)}"
            )
        if g.default is not n.default and g.default != n.default:

            def show(d: Any) -> str:
                return "no default" if d is inspect.Parameter.empty else f"default {d!r}"

            return f"parameter {g.name!r} has {show(g.default)}, the op's has {show(n.default)}"
    if len(gp) < len(np_):
        missing = ", ".join(repr(p.name) for p in np_[len(gp) :])
        return f"it lacks the op's parameter(s) {missing}"
    if len(gp) > len(np_):
        extra = ", ".join(repr(p.name) for p in gp[len(np_) :])
        return f"it has extra parameter(s) {extra}"
    if given.return_annotation != native.return_annotation:
        return (
            f"it returns {_fmt(given.return_annotation)}, "
            f"the op returns {_fmt(native.return_annotation)}"
        )
    return ""


def check_impl_signature(
    op_name: str, provider: str, native: inspect.Signature, impl_fn: Callable[..., Any]
) -> None:
    """Raise ``TypeError`` unless ``impl_fn`` has exactly the native signature."""
    if not callable(impl_fn):
        raise TypeError(f"impl {provider!r} of op {op_name!r} must be callable, got {impl_fn!r}")
    try:
        impl = resolved_signature(impl_fn, strict=True)
    except TypeError as e:
        raise TypeError(f"impl {provider!r} of op {op_name!r}: {e}") from None
    difference = signature_difference(impl, native)
    if difference:
        name = getattr(impl_fn, "__name__", "impl")
        raise TypeError(
            f"impl {provider!r} of op {op_name!r}: {difference}; the impl is {name}{impl}, "
            f"the op is {op_name}{native} (names, kinds, defaults and annotations must match)"
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


def check_registration(
    op_name: str,
    provider: object,
    *,
    registered: Mapping[str, IrOpImpl],
    signature: inspect.Signature,
    allow_inplace: bool,
    supports_args: Callable[..., bool] | None,
    supported: object,
    inplace: object,
    batch_invariant: object,
    compiled: object,
    unsupported_reason: object,
) -> None:
    """Raise ``TypeError`` / ``ValueError`` for a ``register_impl`` call that
    cannot register: a bad or taken provider name, a flag that is not a bool, a
    non-str reason, ``compiled`` with ``inplace``, a ``supports_args`` without
    the op's parameters, or ``inplace`` on an op that never donates its inputs."""
    check_provider_name(op_name, provider)
    check_unregistered(op_name, provider, registered)
    flags = (
        ("supported", supported),
        ("inplace", inplace),
        ("batch_invariant", batch_invariant),
        ("compiled", compiled),
    )
    for flag, value in flags:
        if not isinstance(value, bool):
            raise TypeError(
                f"register_impl({provider!r}) of op {op_name!r}: {flag} must be a "
                f"bool, got {type(value).__name__} {value!r}"
                + (" (call it: pass its result)" if callable(value) else "")
            )
    if unsupported_reason is not None and not isinstance(unsupported_reason, str):
        raise TypeError(
            f"register_impl({provider!r}) of op {op_name!r}: unsupported_reason must "
            f"be a str, got {unsupported_reason!r}"
        )
    if compiled and inplace:
        raise ValueError(
            f"register_impl({provider!r}) of op {op_name!r}: compiled=True needs a "
            "functional impl (inplace=False); eager compile runs functional impls only"
        )
    if supports_args is not None:
        check_supports_args_signature(op_name, str(provider), signature, supports_args)
    if inplace and not allow_inplace:
        raise ValueError(
            f"impl {provider!r} of op {op_name!r} is inplace=True, but the op was "
            "registered without allow_inplace=True, so callers never donate its "
            "inputs; register the op with allow_inplace=True or make the impl functional"
        )


def check_unregistered(op_name: str, provider: object, registered: Mapping[str, IrOpImpl]) -> None:
    """Provider names are unique per op: ``ValueError`` naming who took ``provider``."""
    existing = registered.get(provider)  # type: ignore[call-overload]
    if existing is not None:
        raise ValueError(
            f"op {op_name!r} already has an impl from provider {provider!r} "
            f"(registered by {existing.package or existing.source_module}); "
            "provider names must be unique per op"
        )
