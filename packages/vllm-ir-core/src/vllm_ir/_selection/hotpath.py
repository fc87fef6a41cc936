"""The eager hot path, generated per op from its signature.

From an op's signature we generate, once, straight-line Python: the dispatch
key (:mod:`vllm_ir._selection.key`), the "does any tensor need grad" test, and
the whole eager ``__call__`` with the op's own parameters. Each saved
attribute read, ``*args`` pack or extra call is 30-100 ns; generic code over
``args`` cost about twice the generated code's overhead on the hot path.

The generated source is registered with :mod:`linecache` (as ``torch.fx``
does for generated ``forward`` methods), so tracebacks and debuggers show
its lines.

Generated code shares its function scope with the op's parameter names, so
every name it defines or reads itself — globals, locals, its ``self`` —
starts with :data:`~vllm_ir._schema.signature.GENERATED_PREFIX`, which parameter
names may not (``check_native_signature``): a parameter called ``fn`` or
``_miss`` reaches the impl unchanged.
"""

from __future__ import annotations

import inspect
import itertools
import linecache
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.forward_ad as _forward_ad

from vllm_ir._schema.signature import GENERATED_PREFIX as P
from vllm_ir._schema.signature import TensorKind, params_source, tensor_kind
from vllm_ir._selection.key import key_expression, key_namespace

__all__ = [
    "compile_source",
    "make_donating_call",
    "make_eager_call",
    "make_needs_grad_fn",
    "make_route_fn",
]

_counter = itertools.count()

# forward_ad._current_level (-1 outside dual_level()) is torch's own record of
# an open forward-AD level; should a torch release drop it, routing by it is
# off (tests/test_transforms.py then fails) rather than every call failing
_FORWARD_AD: Any = (
    _forward_ad
    if isinstance(getattr(_forward_ad, "_current_level", None), int)
    else types.SimpleNamespace(_current_level=-1)
)


def compile_source(source: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """Compile generated ``source`` defining ``name``; its lines show in tracebacks."""
    filename = f"<vllm_ir generated {name} #{next(_counter)}>"
    # mtime None: linecache.checkcache never drops a "file" it cannot stat
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]  # type: ignore[no-any-return]


def _needs_grad_expr(sig: inspect.Signature) -> str:
    terms = []
    for p in sig.parameters.values():
        kind = tensor_kind(p.annotation)
        if kind == "tensor":
            terms.append(f"{p.name}.requires_grad")
        elif kind == "optional":
            terms.append(f"({p.name} is not None and {p.name}.requires_grad)")
        elif kind == "list":
            terms.append(f"{P}any({P}t.requires_grad for {P}t in {p.name})")
    return " or ".join(terms) or "False"


def _route_expr(sig: inspect.Signature) -> str:
    """True when the call must leave the fast path: tracing, modes, autograd,
    forward-mode AD (a dual level is open: ``forward_ad``, ``torch.func.jvp``)."""
    # tensors inside list arguments may carry __torch_function__ too
    checked = ", ".join(
        f"*{p.name}" if tensor_kind(p.annotation) == "list" else p.name
        for p in sig.parameters.values()
    )
    # dual tensors do not set requires_grad: the open dual level is the fact
    # (one module attribute read; -1 outside forward_ad.dual_level())
    return (
        f"({P}is_compiling() or {P}dispatch_stack_len()"
        f" or {P}has_torch_function(({checked},))"
        f" or {P}forward_ad._current_level >= 0"
        f" or ({P}grad_enabled() and ({_needs_grad_expr(sig)})))"
    )


def _route_namespace() -> dict[str, Any]:
    # builtins too: a parameter may be named ``any`` (it shares the scope)
    return {
        f"{P}any": any,
        f"{P}Exception": Exception,
        f"{P}is_compiling": torch.compiler.is_compiling,
        f"{P}dispatch_stack_len": torch._C._len_torch_dispatch_stack,
        f"{P}has_torch_function": torch.overrides.has_torch_function,
        f"{P}forward_ad": _FORWARD_AD,
        f"{P}grad_enabled": torch.is_grad_enabled,
    }


def make_needs_grad_fn(sig: inspect.Signature) -> Callable[..., bool]:
    """``needs_grad(*args)`` -> whether any tensor argument requires grad."""
    namespace: dict[str, Any] = {f"{P}any": any}
    source = (
        f"def needs_grad({params_source(sig, namespace)}):\n    return {_needs_grad_expr(sig)}\n"
    )
    return compile_source(source, "needs_grad", namespace)


def make_route_fn(sig: inspect.Signature) -> Callable[..., bool]:
    """``route(*args)`` -> whether the call must go through the torch op."""
    namespace = _route_namespace()
    source = f"def route({params_source(sig, namespace)}):\n    return {_route_expr(sig)}\n"
    return compile_source(source, "route", namespace)


def make_eager_call(
    sig: inspect.Signature,
    op_name: str,
    *,
    routed: Callable[..., Any],
    calls: dict[Any, Callable[..., Any]],
    miss: Callable[..., Callable[..., Any]],
    scoped_get: Callable[[], Any],
    verify: Callable[..., Callable[..., Any]] | None = None,
) -> Callable[..., Any]:
    """The eager ``__call__(self, <op params>)`` of one overload of one op.

    Plain eager calls look up, in ``calls``, the function to run for the
    arguments' selection key (the selected impl, or for the default overload
    and an inplace impl, one that clones the activations first); on a miss —
    or when building the key fails, e.g. for an argument of the wrong type —
    ``miss(*args)`` checks the arguments, selects, stores and returns it.
    Calls under Dynamo, a dispatch mode (``make_fx``, FakeTensorMode),
    ``__torch_function__`` arguments, an open forward-AD level, or with
    tensors that need grad call ``routed`` (the torch op, so a tracer records
    one node and autograd sees the op; the native function under torch.func
    transforms and for nested tensors — see :meth:`vllm_ir._selection.eager.EagerCall.routed`).

    The function is called after the ``try``: an exception from it (the
    impl's) propagates unchanged and the impl runs exactly once.

    ``verify(fn, *args)``, when given, re-checks every cache hit against an
    uncached selection (``VLLM_IR_CHECK_SELECTION=1``).
    """
    namespace = key_namespace(scoped_get)
    namespace.update(_route_namespace())
    namespace.update(
        {f"{P}routed": routed, f"{P}calls": calls, f"{P}miss": miss, f"{P}verify": verify}
    )
    args = ", ".join(sig.parameters)
    lines = [
        f"def {op_name}({P}self, {params_source(sig, namespace)}):",
        "    try:",
        f"        if {_route_expr(sig)}:",
        f"            {P}fn = {P}routed",
        "        else:",
        f"            {P}fn = {P}calls[{key_expression(sig)}]",
        f"    except {P}Exception:  # a miss, or arguments the key cannot describe",
        f"        {P}fn = {P}miss({args})",
    ]
    if verify is not None:
        lines += [
            "    else:",
            f"        if {P}fn is not {P}routed:",
            f"            {P}fn = {P}verify({P}fn, {args})",
        ]
    lines.append(f"    return {P}fn({args})")
    # named after the op, so a wrong call says "rms_norm() missing 1 required ..."
    return compile_source("\n".join(lines) + "\n", op_name, namespace)


def _spanned(kinds: dict[str, TensorKind], a: str, b: str) -> bool:
    """Whether the pair is tested by the address spans of single tensors."""
    return kinds[a] == "tensor" and kinds[b] in ("tensor", "optional")


def _may_share_expr(kinds: dict[str, TensorKind], a: str, b: str) -> str:
    """Whether parameters ``a`` (an activation) and ``b`` may share memory
    (``kinds``: each parameter's :func:`tensor_kind`): do their storages' address
    spans meet (false for most pairs), then ``apart`` only for views of one
    buffer; ``None`` has an empty span, a list is tested through ``shares``."""
    if _spanned(kinds, a, b):
        return f"({P}lo_{a} < {P}hi_{b} and {P}lo_{b} < {P}hi_{a} and not {P}apart({a}, {b}))"
    guards = [f"{n} is not None" for n in (a, b) if kinds[n] != "tensor"]
    return "(" + " and ".join((*guards, f"{P}shares({a}, {b})")) + ")"


def _span_lines(kinds: dict[str, TensorKind], pairs: list[tuple[str, str]]) -> list[str]:
    """Each spanned tensor's storage address span, read once for all its pairs."""
    names = dict.fromkeys(n for a, b in pairs if _spanned(kinds, a, b) for n in (a, b))
    return [
        f"    {P}lo_{n}, {P}hi_{n} = {P}span({n})"
        if kinds[n] == "tensor"
        else f"    {P}lo_{n}, {P}hi_{n} = (0, 0) if {n} is None else {P}span({n})"
        for n in names
    ]


def make_donating_call(
    sig: inspect.Signature,
    activations: tuple[int, ...],
    others: tuple[int, ...],
    *,
    on_copies: Callable[..., Any],
    span: Callable[[torch.Tensor], tuple[int, int]],
    apart: Callable[[torch.Tensor, torch.Tensor], bool],
    shares: Callable[[torch.Tensor, Any], bool],
    bump: Callable[[tuple[Any, ...]], None],
) -> Callable[..., Any]:
    """``donating(fn, <op params>)``: run the inplace impl ``fn`` on the donated
    activations and bump their versions; or, when an activation may share memory
    with another activation or tensor argument, ``on_copies(fn, <op params>)``.

    Straight-line tests of each (activation, other tensor) pair: a loop over
    argument tuples cost twice this call's overhead over the impl, as much as a
    decode-sized kernel (``benchmarks/dispatch_overhead.py``'s ``donation`` table).
    """
    names = list(sig.parameters)
    kinds = {p.name: tensor_kind(p.annotation) for p in sig.parameters.values()}
    pairs = [
        (names[i], names[j])
        for n, i in enumerate(activations)
        for j in (*activations[n + 1 :], *others)
    ]
    namespace: dict[str, Any] = {
        f"{P}on_copies": on_copies,
        f"{P}span": span,
        f"{P}apart": apart,
        f"{P}shares": shares,
        f"{P}bump": bump,
    }
    args = ", ".join(names)
    acts = "".join(f"{names[i]}, " for i in activations)
    lines = [f"def donating({P}fn, {params_source(sig, namespace)}):"]
    if pairs:
        shared = " or ".join(_may_share_expr(kinds, a, b) for a, b in pairs)
        lines += _span_lines(kinds, pairs)
        lines += [f"    if {shared}:", f"        return {P}on_copies({P}fn, {args})"]
    lines += [
        f"    {P}out = {P}fn({args})",
        "    # the impl wrote them outside torch's view: autograd must know",
        f"    {P}bump(({acts}))",
        f"    return {P}out",
    ]
    return compile_source("\n".join(lines) + "\n", "donating", namespace)
