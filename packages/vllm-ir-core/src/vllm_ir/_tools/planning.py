"""``vllm_ir.plan(model_or_fn, *args, **kwargs)``: the whole-model kernel plan.

Runs the callable once and records, for every IR op call site, where it was
called (module path or source line), the argument metadata, the token count
and size bucket, the impl that ran and what selection made of every other
impl (:class:`~vllm_ir._op.callsite.CallSite`).

* Eager: a ``TorchDispatchMode`` sees every ``torch.ops.<NAMESPACE>.*`` call
  (under a dispatch mode IR ops leave the fast path for the torch op, whose
  kernel runs ``op.selected_impl(...)``: the selection cache the fast path runs
  too). The impl that ran is ``op.selected_impl(...)``; it is cross-checked
  against ``op.candidates(...)`` (the one selection rule) and a difference is
  reported as a mismatch, never hidden. Both are read in one registry
  generation: another thread's priority change between them is read again,
  not reported (a call whose reads never settle is noted, not checked).
  Global module forward hooks keep the stack of modules the planning thread
  runs, for the module path (other threads' modules are ignored). Outside ``plan()``
  nothing is installed: the normal eager path is unchanged. An IR op that an
  impl calls itself is part of that impl's call (the mode is off while a
  call it intercepted runs), as it is one node of the caller's graph.
* Compiled (a callable from ``torch.compile(..., backend="vllm_ir")``): the
  call compiles it, with Inductor's caches off so the passes run, and the
  lowering pass records each node it lowers with its module path from
  ``node.meta["nn_module_stack"]``.

>>> import torch, vllm_ir as ir
>>> from vllm_ir.testing import TinyDecoder
>>> p = ir.plan(TinyDecoder(16, 2), torch.randn(4, 16))
>>> [(s.op, s.count) for s in p]
[('rms_norm', 1), ('fused_add_rms_norm', 2)]
>>> ir.Plan.from_json(p.to_json()) == p
True
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_ir._base.cache import generation, settled_generation
from vllm_ir._base.namespace import NAMESPACE
from vllm_ir._op.callsite import (
    CallSite,
    CandidateNote,
    bucket_of,
    collecting_lowered,
    describe_args,
    is_internal,
    notes_for,
    source_line,
    token_count,
)
from vllm_ir._op.op import IrOp, get_op
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir._selection.buckets import ALL_SIZES
from vllm_ir.selection import Candidates, selection_env

__all__ = ["FORMAT", "LosingPick", "OpSummary", "Plan", "PlanFormatError", "plan"]

FORMAT = "vllm-ir-plan"
VERSION = 1


class PlanFormatError(ValueError):
    """A JSON document that is not a plan written by :meth:`Plan.to_json`."""


@dataclass(frozen=True)
class Plan:
    """The kernel plan of one run: a :class:`~vllm_ir._op.callsite.CallSite` per call site.

    ``str(plan)`` / :meth:`table` print it; :meth:`to_json` / :meth:`from_json`
    save and load it (``vllm-ir explain --plan FILE.json`` prints a saved one).
    """

    mode: str
    """``eager`` or ``compiled``."""
    platform: str
    batch_invariant: bool
    """Whether ``VLLM_BATCH_INVARIANT`` was in force (impls not batch invariant rejected)."""
    sites: tuple[CallSite, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def __iter__(self) -> Iterator[CallSite]:
        return iter(self.sites)

    def __len__(self) -> int:
        return len(self.sites)

    @property
    def mismatches(self) -> list[CallSite]:
        """Call sites where the impl that ran is not the selection rule's (should be none)."""
        return [s for s in self.sites if s.mismatch]

    def summary(self) -> dict[str, OpSummary]:
        """Per op: its calls and sites, what ran, and what never did, with why —
        the misses a plain run is silent about.

        An impl that never ran at any of the op's call sites is listed as
        ``rejected`` when ``supports_args`` (or the platform, or batch
        invariance) turned it down at every one, with each distinct reason;
        ``unreached`` when it accepted somewhere but an earlier priority entry
        always came first (a priority entry that never matters); ``not listed``
        when it accepted but no list names it.

        >>> import torch, vllm_ir as ir
        >>> from vllm_ir.testing import TinyDecoder
        >>> s = ir.plan(TinyDecoder(16, 2), torch.randn(4, 16)).summary()["rms_norm"]
        >>> s.calls, s.ran
        (1, {'native': 1})
        """
        found: dict[str, OpSummary] = {}
        for s in self.sites:
            op = found.setdefault(s.op, OpSummary(s.op))
            op.add(s)
        return found

    def summary_lines(self) -> list[str]:
        """One line per op: ``rms_norm: 48 calls at 2 sites; ran cpu_c (48); never ran:
        aiter (rejected at every site: not supported on this platform)``."""
        return [op.line() for op in self.summary().values()]

    def losing_picks(self, tuned: Mapping[str, Any], *, margin: float = 0.05) -> list[LosingPick]:
        """Call sites whose impl is slower than another candidate by more than
        ``margin`` at a token count that ``tuned`` — a ``vllm-ir tune --model``
        document (``json.load`` of its file) — measured for this op; sizes it did
        not measure are not judged.

        >>> import torch, vllm_ir as ir
        >>> from vllm_ir.testing import TinyDecoder
        >>> p = ir.plan(TinyDecoder(16, 1), torch.randn(4, 16))
        >>> times = {"native": {"median_us": 9.0}, "fast": {"median_us": 3.0}}
        >>> doc = {"_measurements": {"ops": {"rms_norm": {"<=16": {"times_us": {"4": times}}}}}}
        >>> [(x.op, x.ran, x.best, x.tokens, x.speedup) for x in p.losing_picks(doc)]
        [('rms_norm', 'native', 'fast', 4, 3.0)]
        """
        if not (isinstance(margin, (int, float)) and 0 <= margin < 1):  # nan fails it too
            raise ValueError(f"margin must be at least 0 and below 1, got {margin!r}")
        measured = sweep_measurements(tuned) or {}
        found = []
        for s in self.sites:
            if not isinstance(s.tokens, int):  # a symbolic count: no one size measured
                continue
            times = _measured_times(measured.get(s.op), s.tokens)
            if s.ran not in times:
                continue
            best = min(times, key=times.__getitem__)
            if times[best] < times[s.ran] * (1 - margin):
                speedup = round(times[s.ran] / times[best], 3)
                found.append(LosingPick(s.site, s.op, s.tokens, s.ran, best, speedup))
        return found

    def by_op(self) -> dict[str, dict[str, int]]:
        """``{op: {provider: calls}}``: how often each impl ran."""
        counts: dict[str, dict[str, int]] = {}
        for s in self.sites:
            per = counts.setdefault(s.op, {})
            per[s.ran] = per.get(s.ran, 0) + s.count
        return counts

    def table(self, *, candidates: bool = True) -> str:
        """One row per call site; with ``candidates``, every other impl and why it did not run."""
        from vllm_ir._cli.table import render_table

        head = (
            f"kernel plan ({self.mode}, platform {self.platform}, batch invariance "
            f"{'on' if self.batch_invariant else 'off'}): {len(self.sites)} call sites, "
            f"{sum(s.count for s in self.sites)} calls"
        )
        rows = []
        for s in self.sites:
            shapes = ", ".join(a for a in s.args if ":" in a)
            rows.append(
                [
                    s.site,
                    s.op if s.overload == "default" else f"{s.op}.{s.overload}",
                    shapes,
                    str(s.tokens if s.tokens is not None else "-"),
                    s.bucket,
                    s.ran + ("" if s.batch_invariant else " (not batch inv.)"),
                    str(s.count),
                ]
            )
        headers = ["call site", "op", "tensors", "tokens", "bucket", "ran", "calls"]
        lines = [head, render_table(headers, rows)]
        if candidates:
            lines.append("")
            lines.append("candidates per call site:")
            for s in self.sites:
                # a branched node has a site per bucket: say which
                where = "" if s.bucket == ALL_SIZES else f" [{s.bucket}]"
                lines.append(f"  {s.site} {s.op}{where}: ran {s.ran}")
                for c in s.candidates:
                    if c.status != "ran":
                        lines.append(f"    {c.provider}: {c.status}: {c.reason}")
        lines.append("")
        lines.append("per op:")
        lines.extend(f"  {line}" for line in self.summary_lines())
        for s in self.mismatches:
            lines.append(f"MISMATCH at {s.site} {s.op}: {s.mismatch}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "mode": self.mode,
            "platform": self.platform,
            "batch_invariant": self.batch_invariant,
            "notes": list(self.notes),
            "sites": [asdict(s) for s in self.sites],
            # derived from the sites (not read back): the same data as summary()
            "summary": {name: op.to_dict() for name, op in self.summary().items()},
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """The plan as JSON; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """A plan from :meth:`to_json`'s text; :class:`PlanFormatError` says what is wrong."""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise PlanFormatError(f"not JSON ({e})") from None
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Any) -> Plan:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise PlanFormatError(f'not a vllm-ir plan (no "format": "{FORMAT}")')
        if doc.get("version") != VERSION:
            raise PlanFormatError(
                f"plan version {doc.get('version')!r}; this vllm-ir reads version {VERSION}"
            )
        try:
            sites = tuple(_site_from_dict(s) for s in doc["sites"])
            return cls(
                mode=_typed(doc["mode"], str, "mode"),
                platform=_typed(doc["platform"], str, "platform"),
                batch_invariant=_typed(doc["batch_invariant"], bool, "batch_invariant"),
                sites=sites,
                notes=tuple(
                    _typed(n, str, "notes") for n in _typed(doc.get("notes", []), list, "notes")
                ),
            )
        except KeyError as e:
            raise PlanFormatError(f"missing key {e}") from None
        except TypeError as e:
            raise PlanFormatError(str(e)) from None


@dataclass(frozen=True)
class LosingPick:
    """A call site whose impl lost to ``best`` at a measured token count
    (:meth:`Plan.losing_picks`): ``best`` ran ``speedup`` times faster there."""

    site: str
    op: str
    tokens: int
    ran: str
    best: str
    speedup: float


def sweep_measurements(doc: object) -> Mapping[str, Any] | None:
    """The per-op figures (``_measurements.ops``) of a ``vllm-ir tune --model``
    document; ``None`` for a document without figures (a ``tune --shapes``
    file); ``ValueError`` saying what is wrong for anything else."""
    if not isinstance(doc, Mapping):
        raise ValueError(
            f"a tuning document is a JSON object, got {type(doc).__name__} "
            "(give what `vllm-ir tune --model` writes)"
        )
    if "_measurements" not in doc:
        return None
    measurements = doc["_measurements"]
    ops = measurements.get("ops") if isinstance(measurements, Mapping) else None
    if not isinstance(ops, Mapping) or not all(isinstance(b, Mapping) for b in ops.values()):
        raise ValueError(
            "its _measurements.ops must map op names to size buckets "
            "(what `vllm-ir tune --model` writes)"
        )
    return ops


def _measured_times(buckets: Any, tokens: int) -> dict[str, float]:
    """Provider -> median step time at ``tokens`` in a sweep's figures of one op
    (empty where it did not measure that count)."""
    if not isinstance(buckets, dict):
        return {}
    for bucket in buckets.values():
        by_count = bucket.get("times_us") if isinstance(bucket, dict) else None
        times = by_count.get(str(tokens)) if isinstance(by_count, dict) else None
        if isinstance(times, dict):
            # a malformed time (not a positive finite number) judges nothing
            return {
                p: float(v["median_us"])
                for p, v in times.items()
                if p != "default" and isinstance(v, dict) and _time(v.get("median_us"))
            }
    return {}


def _time(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@dataclass
class OpSummary:
    """One op's calls in a :class:`Plan`, and the impls that never ran
    (:meth:`Plan.summary`)."""

    op: str
    calls: int = 0
    sites: int = 0
    ran: dict[str, int] = field(default_factory=dict)
    """Provider -> calls it ran."""
    _seen: dict[str, dict[str, set[str]]] = field(default_factory=dict, repr=False)
    # provider -> status -> reasons, over every site

    def add(self, site: CallSite) -> None:
        self.calls += site.count
        self.sites += 1
        self.ran[site.ran] = self.ran.get(site.ran, 0) + site.count
        for c in site.candidates:
            self._seen.setdefault(c.provider, {}).setdefault(c.status, set()).add(c.reason)

    @property
    def never_ran(self) -> dict[str, dict[str, Any]]:
        """Provider -> ``{"status": ..., "reasons": [...]}`` for every impl that ran nowhere."""
        found = {}
        for provider, statuses in self._seen.items():
            if provider in self.ran:
                continue
            if "lost" in statuses:
                status, reasons = "unreached", statuses["lost"]
            elif "not listed" in statuses:
                status, reasons = "not listed", statuses["not listed"]
            else:
                status, reasons = "rejected", statuses.get("rejected", set())
            found[provider] = {"status": status, "reasons": sorted(reasons)}
        return found

    def line(self) -> str:
        ran = ", ".join(f"{p} ({n})" for p, n in self.ran.items())
        head = f"{self.op}: {self.calls} calls at {self.sites} site{'s' * (self.sites != 1)}"
        missed = []
        for provider, miss in self.never_ran.items():
            where = "every site" if self.sites != 1 else "its site"
            if miss["status"] == "rejected":
                missed.append(f"{provider} (rejected at {where}: {'; '.join(miss['reasons'])})")
            elif miss["status"] == "unreached":
                missed.append(f"{provider} (accepts, never reached: an earlier entry ran)")
            else:
                missed.append(f"{provider} (accepts, not on the priority list)")
        tail = f"; never ran: {', '.join(missed)}" if missed else ""
        return f"{head}; ran {ran}{tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "sites": self.sites,
            "ran": dict(self.ran),
            "never_ran": self.never_ran,
            "line": self.line(),
        }


def _typed(value: Any, kind: type, what: str) -> Any:
    # bool is an int subclass: true is not a count
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        article = "an" if kind.__name__[0] in "aeiou" else "a"
        raise TypeError(f"{what!r} must be {article} {kind.__name__}, got {value!r:.60}")
    return value


def _count(value: Any) -> int:
    """A site's call count: a whole number of at least 1 (a site is recorded when called)."""
    if _typed(value, int, "count") < 1:
        raise TypeError(f"'count' must be at least 1, got {value!r}")
    return value


def _site_from_dict(d: Any) -> CallSite:
    if not isinstance(d, dict):
        raise TypeError(f"a call site must be an object, got {d!r:.60}")
    tokens = d["tokens"]
    if tokens is not None and (not isinstance(tokens, (int, str)) or isinstance(tokens, bool)):
        raise TypeError(f"'tokens' must be an integer, a string or null, got {tokens!r:.60}")
    notes = []
    for c in _typed(d["candidates"], list, "candidates"):
        c = _typed(c, dict, "candidate")
        notes.append(
            CandidateNote(
                *(_typed(c[k], str, k) for k in ("provider", "status", "reason", "source"))
            )
        )
    mismatch = d.get("mismatch")
    return CallSite(
        site=_typed(d["site"], str, "site"),
        op=_typed(d["op"], str, "op"),
        overload=_typed(d["overload"], str, "overload"),
        args=tuple(_typed(a, str, "args") for a in _typed(d["args"], list, "args")),
        tokens=tokens,
        bucket=_typed(d["bucket"], str, "bucket"),
        ran=_typed(d["ran"], str, "ran"),
        batch_invariant=_typed(d["batch_invariant"], bool, "batch_invariant"),
        candidates=tuple(notes),
        source=_typed(d.get("source", ""), str, "source"),
        count=_count(d.get("count", 1)),
        mismatch=None if mismatch is None else _typed(mismatch, str, "mismatch"),
    )


# -- recording -----------------------------------------------------------------


class _Sites:
    """Call sites in first-seen order, repeated ones counted."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[Any, ...], CallSite] = {}

    def add(self, site: CallSite) -> None:
        key = site.key()
        seen = self._by_key.get(key)
        self._by_key[key] = site if seen is None else replace(seen, count=seen.count + 1)

    def all(self) -> tuple[CallSite, ...]:
        return tuple(self._by_key.values())


class _ModuleStack:
    """The modules the planning thread is running, kept by global forward pre/post hooks.

    The hooks are process-wide and fire for every thread's modules; only the
    thread that entered the stack is tracked (the recording dispatch mode is
    thread-local too), so a thread serving another model meanwhile neither
    names this plan's sites nor pops its entries.
    """

    def __init__(self, root: Any) -> None:
        self.stack: list[torch.nn.Module] = []
        self.thread = threading.get_ident()
        self.root = root if isinstance(root, torch.nn.Module) else None
        self.names = (
            {id(m): name for name, m in self.root.named_modules()} if self.root is not None else {}
        )
        self._handles: list[Any] = []

    def __enter__(self) -> _ModuleStack:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._push),
            hooks.register_module_forward_hook(self._pop, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()

    def _push(self, module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() == self.thread:
            self.stack.append(module)

    def _pop(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self.thread:
            return
        while self.stack and self.stack.pop() is not module:
            pass

    def path(self) -> str | None:
        """The innermost module below the root, by its name in the root (a module
        outside the root by its type); None at the root itself or outside modules."""
        for module in reversed(self.stack):
            if module is self.root:
                return None
            name = self.names.get(id(module))
            if name:
                return name
            if self.root is None or id(module) not in self.names:
                return type(module).__name__
        return None


def _caller_source() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_internal(filename):
            return source_line(filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


_READS = 16
"""Attempts at reading a call's selection within one registry generation."""


def _read_selection(op: IrOp, call: tuple[Any, ...]) -> tuple[IrOpImpl, Candidates, str, bool]:
    """What the selection cache runs for ``call``, what ``select()`` decides, and
    the bucket, read in one registry generation; the last item says whether they were.

    Another thread's ``apply()`` or registration between the reads would make
    them describe two states and the comparison report a mismatch that is only
    that change. A change bumps the generation once it is complete
    (``settled_generation`` waits for one in progress), so an unchanged
    generation means one state; otherwise read again. If the registry moves
    on every attempt, the last reading is returned unchecked: no verdict.
    """
    for _ in range(_READS):
        since = generation()
        impl = op.selected_impl(*call)
        found = op.candidates(*call)
        bucket = bucket_of(op, call)
        if settled_generation() == since:
            return impl, found, bucket, True
    return impl, found, bucket, False


class _EagerRecorder(TorchDispatchMode):
    """Records every IR op call; runs it unchanged."""

    def __init__(self, modules: _ModuleStack) -> None:
        super().__init__()
        self.modules = modules
        self.sites = _Sites()
        self.unchecked = 0
        """Calls whose selection could not be read in one generation (not cross-checked)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == NAMESPACE:
            self.sites.add(self._site(func, args, kwargs))
        return func(*args, **kwargs)

    def _site(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> CallSite:
        op = get_op(func._schema.name.split("::", 1)[1])
        bound = op.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = bound.args
        # what the torch op's kernel runs (the selection cache, as the fast path)
        # against the one selection rule, both in one registry state
        impl, found, bucket, checked = _read_selection(op, call)
        self.unchecked += not checked
        rule = found.selected.provider
        mismatch = (
            None
            if rule == impl.provider or not checked
            else f"the eager selection cache ran {impl.provider!r}, select() chooses {rule!r}"
        )
        tokens = token_count(op, call)
        source = _caller_source()
        return CallSite(
            site=self.modules.path() or source,
            op=op.name,
            overload=func._overloadname,
            args=describe_args(op, call),
            tokens=tokens,
            bucket=bucket,
            ran=impl.provider,
            batch_invariant=impl.batch_invariant,
            candidates=notes_for(found, impl.provider),
            source=source,
            mismatch=mismatch,
        )


def _is_compiled(fn: Any) -> bool:
    """A callable made by ``torch.compile`` (a module or a function)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(fn, OptimizedModule) or hasattr(fn, "_torchdynamo_orig_callable")


def plan(model_or_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Plan:
    """Run ``model_or_fn(*args, **kwargs)`` once; return the kernel :class:`Plan` of the run.

    For a callable from ``torch.compile(..., backend="vllm_ir")`` the call must
    compile it (Inductor's caches are turned off for it): a callable that
    already compiled for these inputs runs without lowering anything, and
    that is an error saying so.
    """
    env = selection_env()
    notes: list[str] = []
    if _is_compiled(model_or_fn):
        sites = _run_compiled(model_or_fn, args, kwargs)
        mode = "compiled"
    else:
        # no hooks while Dynamo traces: the compiled plan reads nn_module_stack
        with _ModuleStack(model_or_fn) as modules, _EagerRecorder(modules) as recorder:
            model_or_fn(*args, **kwargs)
        sites = recorder.sites.all()
        mode = "eager"
        if recorder.unchecked:
            notes.append(
                f"{recorder.unchecked} calls ran while other threads kept changing the "
                "registry: their impl was not cross-checked with select()"
            )
    if not sites:
        notes.append("no IR op was called (is the model kernelized?)")
    return Plan(mode, env.platform, env.batch_invariant, sites, tuple(notes))


def _run_compiled(fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[CallSite, ...]:
    from vllm_ir.testing.isolation import inductor_caches_off

    with collecting_lowered() as lowered, inductor_caches_off():
        fn(*args, **kwargs)
    if not lowered:
        raise RuntimeError(
            "plan(): the compiled callable lowered no IR op during this call: it had "
            "already compiled for these inputs (or its backend is not vllm_ir). Plan a "
            "fresh torch.compile(model, backend='vllm_ir'), or call torch._dynamo.reset() first"
        )
    sites = _Sites()
    for site in lowered:
        sites.add(site)
    return sites.all()
