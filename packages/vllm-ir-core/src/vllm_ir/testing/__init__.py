"""The conformance kit: check a provider's impls against the ops' contracts.

One call checks everything an impl promises::

    from vllm_ir.testing import assert_conforms
    assert_conforms("my_provider")

For each op the provider implements, and each dtype:

* ``correctness``: results equal the native semantics within the op's
  tolerance, over the op's sample inputs (those ``supports_args`` accepts),
  then the provider's own extra samples (``op.register_extra_samples``);
* ``supports_args``: returns a plain ``bool``, and the same answer for every
  batch size — it is called with FakeTensors of a symbolic batch dimension,
  where reading a size yields a ``SymBool`` (a guard on the batch size) —
  and for every arguments that share the selection key
  (:mod:`vllm_ir._selection.key`): it is re-asked with another batch size of
  the same class, another storage offset of the same alignment and other
  values, and must not change its answer (the eager cache would otherwise
  run an impl ``select()`` rejects);
* ``mutation``: an impl that writes into its inputs is declared
  ``inplace=True``, and an inplace impl returns the activations it wrote;
* ``compiled``: eager and ``torch.compile(backend=VllmIRBackend(...))`` agree;
* ``opcheck``: ``torch.library.opcheck`` of the op's torch overloads with the
  provider selected: schema, fake impl and autograd registration on every
  sample, and on the first sample also ``test_aot_dispatch_dynamic`` (it
  traces the op's own fake impl, the same for every provider).

In pytest, :func:`conformance_cases` parametrizes one test per case::

    @pytest.mark.parametrize("case", conformance_cases("my_provider"), ids=str)
    def test_conformance(case):
        case.check()

Also here for the packages' tests: :func:`isolated` (selection state reset
around a block; the pytest plugin's ``vllm_ir_isolated`` fixture),
:class:`TinyDecoder` and :func:`compile_agrees` (lazily: they import
``vllm_ir.compilation``); test classes to subclass in
:mod:`vllm_ir.testing.compiled` (a provider's norm impls through the compile
pipeline) and :mod:`vllm_ir.testing.vendor` (the tests vendor-wrapper
packages share). And what those tests read or set of core's state, so that
they import nothing outside the provider contract: :func:`load_provider`
(load a provider from a source tree as discovery does),
:func:`add_platform_defaults` / :func:`remove_platform_defaults`,
:func:`platform_default_contributions`, :func:`effective_priority` and
:class:`Mode`, :data:`ENTRY_POINT_GROUP`, :data:`FALLBACK_NAMESPACE`, and
:class:`VllmIRDeprecationWarning` (for ``filterwarnings``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_ir._base.deprecation import VllmIRDeprecationWarning
from vllm_ir._base.namespace import FALLBACK_NAMESPACE
from vllm_ir._discovery.providers import ENTRY_POINT_GROUP, load_provider
from vllm_ir._op.op import IrOp
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir._schema.samples import SampleInput
from vllm_ir._selection.eager import SelectionMismatch, set_selection_check
from vllm_ir._selection.key import ALIGNMENT
from vllm_ir.priority import (
    Mode,
    add_platform_defaults,
    effective_priority,
    platform_default_contributions,
    remove_platform_defaults,
)
from vllm_ir.testing._opcheck_compat import strides_compared_on_every_device
from vllm_ir.testing.isolation import SELECTION_ENV, inductor_caches_off, isolated
from vllm_ir.testing.models import TinyDecoder, compile_agrees

__all__ = [
    "CHECKS",
    "SelectionMismatch",
    "ENTRY_POINT_GROUP",
    "FALLBACK_NAMESPACE",
    "SELECTION_ENV",
    "Mode",
    "TinyDecoder",
    "VllmIRDeprecationWarning",
    "add_platform_defaults",
    "compile_agrees",
    "effective_priority",
    "isolated",
    "load_provider",
    "platform_default_contributions",
    "remove_platform_defaults",
    "ConformanceCase",
    "ConformanceError",
    "ConformanceReport",
    "NotApplicable",
    "assert_conforms",
    "assert_discovered",
    "check_provider",
    "conformance_cases",
    "inductor_caches_off",
    "key_sharing_variants",
    "set_selection_check",
]

CHECKS = ("correctness", "supports_args", "mutation", "compiled", "opcheck")
DEFAULT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class ConformanceError(AssertionError):
    """An impl broke a contract; the message lists every failure."""


class NotApplicable(Exception):
    """The impl declines every sample input of this case (e.g. an unsupported dtype)."""


@dataclass(frozen=True)
class ConformanceCase:
    """One check of one provider's impl of one op, for one dtype."""

    op: IrOp
    provider: str
    check_name: str
    dtype: torch.dtype
    device: str = "cpu"

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.op.name}-{self.provider}-{self.check_name}-{dtype}"

    @property
    def impl(self) -> IrOpImpl:
        return self.op.impls[self.provider]

    def check(self) -> None:
        """Run the check; raises :class:`ConformanceError` on failure.

        A case the impl does not apply to (``supports_args`` declines every
        sample) raises :class:`NotApplicable`, or skips under pytest.
        """
        try:
            _run(self)
        except NotApplicable as e:
            if "pytest" not in sys.modules:
                raise
            import pytest

            pytest.skip(str(e))


def _samples(case: ConformanceCase) -> Iterator[SampleInput]:
    """The samples selection would send to the case's impl (``op.candidates``' rule)."""
    for sample in case.op.sample_inputs(case.dtype, case.device, provider=case.provider):
        if case.op.candidates(*sample.args)[case.provider].accepted:
            yield sample


@contextlib.contextmanager
def _selected(case: ConformanceCase) -> Iterator[None]:
    with case.op.set_priority([case.provider]):
        yield


def _comparable(value: Any) -> Any:
    """FP8 tensors upcast: assert_close does not compare float8 dtypes."""
    if isinstance(value, torch.Tensor) and value.dtype in _FLOAT8:
        return value.to(torch.float32)
    if isinstance(value, tuple):
        return tuple(_comparable(v) for v in value)
    return value


_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2}


def _close(got: Any, want: Any, case: ConformanceCase, what: str) -> str | None:
    tol = case.op.tolerance(case.dtype)
    got, want = _comparable(got), _comparable(want)
    try:
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)
    except AssertionError as e:
        return f"{what}: {_mismatch(got, want, tol.atol, tol.rtol) or str(e).splitlines()[0]}"
    return None


def _where(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(index))


def _mismatch(got: Any, want: Any, atol: float, rtol: float) -> str | None:
    """Which output differs, by how much at most (absolute and relative), where, and the
    tolerance; None where the difference is not in values (types, shapes, dtypes)."""
    outs_got = got if isinstance(got, tuple) else (got,)
    outs_want = want if isinstance(want, tuple) else (want,)
    if len(outs_got) != len(outs_want):
        return None
    parts = []
    for i, (g, w) in enumerate(zip(outs_got, outs_want, strict=True)):
        if not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)):
            continue
        if g.shape != w.shape or g.dtype != w.dtype:
            return None
        g64, w64 = g.detach().cpu().double(), w.detach().cpu().double()
        diff = (g64 - w64).abs()
        both_nan = g64.isnan() & w64.isnan()
        diff = torch.where(both_nan, torch.zeros_like(diff), diff.nan_to_num(nan=float("inf")))
        bad = diff > atol + rtol * w64.abs()
        if not bool(bad.any()):
            continue
        rel = diff / w64.abs().clamp_min(torch.finfo(torch.float64).tiny)
        a, r = int(diff.argmax()), int(rel.argmax())
        output = f"output {i}: " if len(outs_got) > 1 else ""
        at_a, at_r = _where(a, g.shape), _where(r, g.shape)
        parts.append(
            f"{output}{int(bad.sum())} of {bad.numel()} elements outside the tolerance; "
            f"largest abs diff {float(diff.flatten()[a]):.3g} at {at_a} "
            f"(got {float(g64.flatten()[a]):.6g}, want {float(w64.flatten()[a]):.6g}), "
            f"largest rel diff {float(rel.flatten()[r]):.3g} at {at_r}"
        )
    if not parts:
        return None
    return "; ".join(parts) + f" (tolerance atol={atol:g}, rtol={rtol:g})"


def _check_correctness(case: ConformanceCase) -> Iterator[str]:
    for sample in _samples(case):
        want = case.op.native(*sample.clone().args)
        try:
            got = case.impl.impl_fn(*sample.clone().args)
        except Exception as e:  # arguments supports_args accepted: raising is a failure
            first = str(e).splitlines()[0] if str(e) else ""
            yield (
                f"sample {sample.name}: raised {type(e).__name__}: {first[:200]}; an impl "
                "must compute every call its supports_args accepts (decline the others)"
            )
            continue
        failure = _close(got, want, case, f"sample {sample.name}")
        if failure:
            yield failure


def _symbolic(value: Any, fake_mode: Any) -> Any:
    """A FakeTensor of ``value`` whose first dimension is a symbolic batch size."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    if not isinstance(value, torch.Tensor):
        return value
    dims = [DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (value.dim() - 1)
    context: StatelessSymbolicContext | None = (
        StatelessSymbolicContext(dynamic_sizes=dims) if value.dim() > 1 else None
    )
    return fake_mode.from_tensor(value, symbolic_context=context)


def _check_supports_args(case: ConformanceCase) -> Iterator[str]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    supports = case.impl.supports_args
    if supports is None:
        return
    for sample in case.op.sample_inputs(case.dtype, case.device, provider=case.provider):
        answer = supports(*sample.args)
        if type(answer) is not bool:
            yield f"sample {sample.name}: returned {type(answer).__name__}, not a plain bool"
            continue
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        with fake_mode:
            symbolic = [_symbolic(a, fake_mode) for a in sample.args]
            try:
                symbolic_answer = supports(*symbolic)
            except Exception as e:  # e.g. it reads values: no FakeTensor has them
                yield (
                    f"sample {sample.name}: raised {type(e).__name__} on FakeTensors of a "
                    f"symbolic batch size ({str(e).splitlines()[0]}); under torch.compile "
                    "it is called with such tensors"
                )
                symbolic_answer = answer
        if type(symbolic_answer) is not bool:
            yield (
                f"sample {sample.name}: returned {type(symbolic_answer).__name__} for a "
                "symbolic batch size: it reads sizes and would guard compiled graphs on them"
            )
        elif symbolic_answer != answer:
            yield f"sample {sample.name}: answers differ between real and fake tensors"
        for what, variant in key_sharing_variants(case.op, sample.args):
            again = supports(*variant)
            if again is not answer:
                yield (
                    f"sample {sample.name}: answered {answer} but {again!r} for the same "
                    f"arguments with {what}, which share the selection key: it reads a fact "
                    "the key does not hold (see vllm_ir._selection.key)"
                )


def _with_layout(t: torch.Tensor, batch: int | None, offset: int, fill: float) -> torch.Tensor:
    """A tensor with ``t``'s dtype, device and strides; batch size ``batch`` (dim 0
    of rank >= 2), storage offset ``offset`` in a fresh buffer, filled with ``fill``."""
    shape = list(t.shape)
    if batch is not None:
        shape[0] = batch
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, t.stride(), strict=True) if n > 0)
    buffer = torch.empty(offset + span, dtype=t.dtype, device=t.device)
    if t.device.type != "meta":
        buffer.fill_(fill)
    return buffer.as_strided(shape, t.stride(), offset)


def _aligned_offset(t: torch.Tensor, shift_bytes: int) -> int | None:
    """A storage offset in a fresh buffer that gives ``t``'s alignment, ``shift_bytes`` on."""
    itemsize = t.element_size()
    align = t.data_ptr() % ALIGNMENT if t.device.type != "meta" else 0
    if align % itemsize or shift_bytes % itemsize:
        return None
    return (align + shift_bytes) // itemsize


def key_sharing_variants(op: IrOp, args: Sequence[Any]) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Copies of ``args`` that share their selection key but differ elsewhere.

    Each varies one thing the key leaves out: the batch size within its class
    (0, 1, 2 or more), the storage offset within its alignment, the values.
    A variant whose key differs after all (e.g. a batch of 0 or 1, which is
    its own class) is not produced.
    """
    args = tuple(args)
    try:
        base = op.selection_key(*args)
    except Exception:
        return
    tensors = [
        i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.layout == torch.strided
    ]
    if not tensors:
        return
    batches = {args[i].shape[0] for i in tensors if args[i].dim() > 1}
    plans: list[tuple[str, dict[str, Any]]] = []
    if len(batches) == 1 and min(batches) >= 2:
        b = batches.pop()
        plans += [(f"batch size {n}", {"batch": n}) for n in (b + 1, 2 * b + 3)]
    plans += [(f"storage offset shifted by {shift} bytes", {"shift": shift}) for shift in (16, 64)]
    plans.append(("other values", {"fill": 3.0}))
    for what, plan in plans:
        variant = list(args)
        for i in tensors:
            t = args[i]
            offset = _aligned_offset(t, plan.get("shift", 0))
            if offset is None:
                break
            batch = plan.get("batch") if t.dim() > 1 else None
            variant[i] = _with_layout(t, batch, offset, plan.get("fill", 1.0))
        else:
            try:
                same = op.selection_key(*variant) == base
            except Exception:
                same = False
            if same:
                yield what, tuple(variant)


def _check_mutation(case: ConformanceCase) -> Iterator[str]:
    op, impl = case.op, case.impl
    reused_any = False
    for sample in _samples(case):
        args = sample.clone().args
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        out = impl.impl_fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        mutated = [
            name
            for name, a, b in zip(
                list(op.signature.parameters)[: len(args)], args, before, strict=True
            )
            if isinstance(a, torch.Tensor) and not torch.equal(a, b)
        ]
        if mutated and not impl.inplace:
            yield f"sample {sample.name}: writes {mutated} but is not registered inplace=True"
        bad = [m for m in mutated if m not in op.activations]
        if bad:
            yield f"sample {sample.name}: writes non-activation arguments {bad}"
        if impl.inplace:
            names = list(op.signature.parameters)
            reused_any = reused_any or any(
                isinstance(o, torch.Tensor)
                and any(
                    isinstance(args[names.index(a)], torch.Tensor)
                    and o.data_ptr() == args[names.index(a)].data_ptr()
                    for a in op.activations
                    if names.index(a) < len(args)
                )
                for o in outs
            )
            lost = [
                m
                for m in mutated
                if not any(
                    o.data_ptr() == args[names.index(m)].data_ptr()
                    for o in outs
                    if isinstance(o, torch.Tensor)
                )
            ]
            if lost:
                yield (
                    f"sample {sample.name}: inplace impl writes {lost} but does not return "
                    "them: an output written into an activation must be returned"
                )
    if impl.inplace and not reused_any:
        yield (
            f"registered inplace=True but returned none of the activations "
            f"{list(op.activations)} on any sample: the compiler removes the clones of "
            "donated activations on this promise; write the outputs into them, or register "
            "without inplace=True"
        )


def _check_compiled(case: ConformanceCase) -> Iterator[str]:
    from vllm_ir.compilation import VllmIRBackend

    sample = next(iter(_samples(case)), None)
    if sample is None:
        return
    torch._dynamo.reset()
    backend = VllmIRBackend(priority={case.op.name: [case.provider]})
    op = case.op
    compiled = torch.compile(lambda *args: op(*args), backend=backend, fullgraph=True)
    with _selected(case):
        want = case.op(*sample.clone().args)
    with inductor_caches_off():  # on a hit the lowering could not be checked
        got = compiled(*sample.clone().args)
    failure = _close(got, want, case, f"eager vs compiled, sample {sample.name}")
    if failure:
        yield failure
    chosen = set(backend.lowering_pass.selected_impls.get(case.op.name, {}).values())
    if chosen != {case.provider}:
        yield f"compiled graph selected {sorted(chosen)}, not {case.provider!r}"


_OPCHECK_OF_THE_IMPL = ("test_schema", "test_autograd_registration", "test_faketensor")
"""The opcheck tests the kit runs on every sample: the schema check (the impl's
mutation and aliasing), the autograd registration, and the fake impl's metadata
against the impl's outputs (strides too, on every device and torch:
:mod:`~vllm_ir.testing._opcheck_compat`). ``test_aot_dispatch_dynamic`` traces the op's fake
impl, core's native for every provider (about 0.4 s a sample for rotary), so
the kit runs it on the first sample only; core's suite runs all four on every
sample of every op."""


def _check_opcheck(case: ConformanceCase) -> Iterator[str]:
    overloads = [case.op.torch_op]
    if case.op.allow_inplace:
        overloads.append(case.op.maybe_inplace.torch_op)
    with _selected(case):
        for index, sample in enumerate(_samples(case)):
            # no test_utils: opcheck's default, all of its tests
            tests: dict[str, Any] = {} if index == 0 else {"test_utils": _OPCHECK_OF_THE_IMPL}
            for overload in overloads:
                try:
                    with strides_compared_on_every_device():  # torch 2.11: CUDA only
                        torch.library.opcheck(overload, sample.clone().args, **tests)
                except Exception as e:
                    yield f"{overload} on sample {sample.name}: {str(e).splitlines()[0]}"


_CHECKS = {
    "correctness": _check_correctness,
    "supports_args": _check_supports_args,
    "mutation": _check_mutation,
    "compiled": _check_compiled,
    "opcheck": _check_opcheck,
}


def conformance_cases(
    provider: str,
    *,
    ops: Iterable[IrOp] | None = None,
    dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES,
    checks: Sequence[str] = CHECKS,
    device: str = "cpu",
) -> list[ConformanceCase]:
    """Every (op, check, dtype) case for ``provider``'s impls; for parametrize.

    ``compiled`` runs for the first dtype only (a compile costs seconds).
    """
    from vllm_ir._discovery.providers import ensure_loaded

    unknown = [c for c in checks if c not in _CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    # the installed providers first: ops they declare exist only once they load, and
    # this is often the first call of a test process
    ensure_loaded()
    selected = list(ops) if ops is not None else list(IrOp.registry.values())
    cases = []
    for op in selected:
        if provider not in op.impls:
            continue
        for check in checks:
            for dtype in dtypes[:1] if check == "compiled" else dtypes:
                cases.append(ConformanceCase(op, provider, check, dtype, device))
    if not cases:
        raise LookupError(_no_cases_message(provider, selected))
    return cases


def _no_cases_message(provider: str, checked: Sequence[IrOp]) -> str:
    """Why ``provider`` has nothing to check: a typo, a filtered or failed provider, other ops."""
    import difflib

    from vllm_ir import envs
    from vllm_ir._discovery.providers import load_errors
    from vllm_ir._op.op import IrOp as _IrOp

    everywhere = sorted({p for op in _IrOp.registry.values() for p in op.impls})
    mine = sorted(op.name for op in _IrOp.registry.values() if provider in op.impls)
    if mine:
        return (
            f"provider {provider!r} implements none of the ops checked "
            f"({', '.join(op.name for op in checked) or 'none'}); it implements {', '.join(mine)}"
        )
    lines = [f"provider {provider!r} has no impls; providers with impls: {', '.join(everywhere)}"]
    close = difflib.get_close_matches(provider, everywhere, n=1)
    if close:
        lines.append(f"did you mean {close[0]!r}?")
    allow = envs.provider_allow_list()
    if allow is not None and provider not in allow:
        lines.append(
            f"{envs.VLLM_IR_PROVIDERS}={','.join(sorted(allow)) or 'none'} does not name it: "
            "providers it does not name are not loaded"
        )
    for name, error in sorted(load_errors().items()):
        lines.append(f"provider {name} ({error.package}) failed to load: {error.cause}")
    return "; ".join(lines)


@dataclass
class ConformanceReport:
    """The outcome of :func:`check_provider`."""

    passed: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)


def _run(case: ConformanceCase) -> None:
    if next(iter(_samples(case)), None) is None:
        raise NotApplicable(f"{case}: supports_args declines every sample input")
    failures = list(_CHECKS[case.check_name](case))
    if failures:
        raise ConformanceError(f"{case}: " + "; ".join(failures))


def check_provider(provider: str, **kwargs: Any) -> ConformanceReport:
    """Run every case; collect failures instead of stopping at the first."""
    report = ConformanceReport()
    for case in conformance_cases(provider, **kwargs):
        try:
            _run(case)
        except ConformanceError as e:
            report.failures.append(str(e))
        except NotApplicable as e:
            report.not_applicable.append(str(e))
        else:
            report.passed.append(str(case))
    return report


def assert_conforms(provider: str, **kwargs: Any) -> None:
    """Raise :class:`ConformanceError` listing every failed case."""
    report = check_provider(provider, **kwargs)
    if report.failures:
        raise ConformanceError(
            f"{len(report.failures)} conformance failure(s) for {provider!r}:\n"
            + "\n".join(f"  {f}" for f in report.failures)
        )


def assert_discovered(provider: str, entry_point: str, spec: object, package: str) -> None:
    """``provider`` was loaded, without error, from its installed entry point.

    The ``vllm_ir.providers`` entry point named ``provider`` is ``entry_point``
    (``"my_kernels:provider"``); discovery loaded ``spec`` from it, credited to
    ``package`` (``"my-kernels 1.0"``). Needs the package installed.
    """
    from importlib import metadata

    from vllm_ir._discovery.providers import ENTRY_POINT_GROUP, load_errors, loaded_providers

    (ep,) = [e for e in metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == provider]
    assert ep.value == entry_point
    loaded = loaded_providers()[provider]
    assert loaded.package == package
    assert loaded.spec is spec
    assert provider not in load_errors()
