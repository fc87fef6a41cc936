"""One IR op call site of a whole-model kernel plan (:mod:`vllm_ir._tools.planning`).

A :class:`CallSite` says where an op was called (a module path such as
``model.layers.0.input_layernorm``, or ``file.py:12`` for a plain function),
with which arguments (metadata only, never data), how many tokens that is and
in which size bucket, which impl ran, and what the one selection rule
(:meth:`vllm_ir.IrOp.candidates`) made of every other impl.

Eager plans build call sites from a dispatch mode; compiled plans from the
lowering pass, which calls :func:`record_lowered` for every node it lowers
while :func:`collecting_lowered` is open (and does nothing otherwise: a
normal compile pays one context-variable read per node).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ir._selection.buckets import symbolic_range
from vllm_ir.selection import Candidates

__all__ = [
    "CallSite",
    "CandidateNote",
    "bucket_of",
    "collecting_lowered",
    "compiled_call_site",
    "describe_args",
    "is_collecting",
    "module_path_of",
    "notes_for",
    "record_lowered",
    "token_count",
]


def token_count(op: Any, args: Sequence[Any]) -> int | str:
    """The call's token count as selection sees it (:meth:`vllm_ir.IrOp.tokens`):
    an ``int`` for concrete sizes, the symbolic expression as a string for a
    dynamic size under ``torch.compile``."""
    tokens = op.tokens(*args)
    return tokens if type(tokens) is int else str(tokens)


def bucket_of(op: Any, args: Sequence[Any]) -> str:
    """The bucket of the op's effective priority table this call falls into
    (:meth:`~vllm_ir._selection.buckets.SizePlan.label`: ``<=16``, ``>256``), or
    ``all sizes`` when that table has no buckets.

    A symbolic count names its one bucket (from its value range, no guard), or
    ``all sizes`` when its range spans several that select alike (a range
    selecting differently is branched and recorded per branch instead).
    """
    plan = op.size_plan()
    tokens = op.tokens(*args)
    if type(tokens) is int:
        return plan.label_of(tokens)
    return plan.label_of_range(*symbolic_range(tokens))


def describe_args(op: Any, args: Sequence[Any]) -> tuple[str, ...]:
    """Per parameter, ``name: dtype[shape] device`` for tensors, ``name=value`` otherwise."""
    parts = []
    for name, value in zip(op.signature.parameters, args, strict=False):
        parts.append(f"{name}{_describe(value)}")
    return tuple(parts)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        shape = ", ".join(map(str, value.shape))
        return f": {dtype}[{shape}] {value.device}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return ": [" + "; ".join(_describe(v).removeprefix(": ") for v in value) + "]"
    return f"={value!r}"


@dataclass(frozen=True)
class CandidateNote:
    """What selection made of one impl at a call site.

    ``status``: ``ran``, ``lost`` (accepts, but another entry came first or
    was measured faster), ``rejected`` (with selection's reason), or
    ``not listed`` (accepts, but the priority list does not name it).
    """

    provider: str
    status: str
    reason: str
    source: str
    """Where the priority entry came from (``user``, a platform default, ...)."""


def notes_for(found: Candidates, ran: str) -> tuple[CandidateNote, ...]:
    """One note per impl of ``found`` (the op's :meth:`~vllm_ir.IrOp.candidates`),
    given the provider that ``ran``."""
    selected = next((d.provider for d in found if d.listed and d.accepted), None)
    notes: list[CandidateNote] = []
    seen: set[str] = set()
    for d in found:
        if d.provider in seen:  # a list naming a provider twice: its first entry decides
            continue
        seen.add(d.provider)
        if d.provider == ran:
            why = "first on the priority list that accepts"
            if ran != selected:
                why = f"chosen over {selected} (the priority list's pick) by the lowering"
            notes.append(CandidateNote(d.provider, "ran", why, d.entry.source))
        elif not d.accepted:
            notes.append(CandidateNote(d.provider, "rejected", d.reason, d.entry.source))
        elif not d.listed:
            why = "accepts, but the priority list does not name it"
            notes.append(CandidateNote(d.provider, "not listed", why, d.entry.source))
        elif d.provider == selected:
            why = f"the priority list's pick, but {ran} ran instead"
            notes.append(CandidateNote(d.provider, "lost", why, d.entry.source))
        else:
            why = f"accepts, but {selected} is earlier on the priority list"
            notes.append(CandidateNote(d.provider, "lost", why, d.entry.source))
    return tuple(notes)


@dataclass(frozen=True)
class CallSite:
    """One IR op call site (calls with the same site, op and metadata aggregate in ``count``)."""

    site: str
    """Module path (``model.layers.0.mlp``), else the calling source line (``app.py:12``)."""
    op: str
    overload: str
    args: tuple[str, ...]
    tokens: int | str | None
    """:meth:`vllm_ir.IrOp.tokens` (a string for a symbolic count; None in older plans)."""
    bucket: str
    """The bucket of the op's effective table (``<=16``, ``>256``), ``all sizes`` if it
    has none; for a node the lowering branched per bucket, the branch's bucket."""
    ran: str
    """The provider whose impl ran (eager: ``op.selected_impl``; compiled: the lowering's)."""
    batch_invariant: bool
    """Whether the impl that ran is batch invariant."""
    candidates: tuple[CandidateNote, ...]
    source: str = ""
    """The calling source line, where known."""
    count: int = 1
    mismatch: str | None = None
    """Set when the impl that ran is not the selection rule's (a soundness bug: reported)."""

    def key(self) -> tuple[Any, ...]:
        """What makes two calls the same call site (everything but ``count``)."""
        return (
            self.site,
            self.op,
            self.overload,
            self.args,
            self.bucket,
            self.ran,
            self.candidates,
        )


# -- module paths and source lines ---------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__ or "") + os.sep
_CORE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # vllm_ir/
_TESTING_DIR = _CORE_DIR + "testing" + os.sep


def source_line(filename: str, lineno: int, function: str) -> str:
    return f"{os.path.basename(filename)}:{lineno} ({function})"


def is_internal(filename: str) -> bool:
    """Frames of torch and of vllm-ir core (generated code included; the models
    of ``vllm_ir.testing`` excepted) are not call sites."""
    if filename.startswith(_CORE_DIR):
        return not filename.startswith(_TESTING_DIR)
    return filename.startswith(_TORCH_DIR) or filename.startswith("<vllm_ir generated")


_ROOT = re.compile(r"^L\[['\"][^'\"]+['\"]\]\.?")
_INDEX = re.compile(r"\[(\d+)\]")


def module_path_of(node_meta: dict[str, Any]) -> str | None:
    """The innermost module of an FX node's ``nn_module_stack``, as a dotted path
    (``L['self'].layers[0].norm`` -> ``layers.0.norm``), or None."""
    stack = node_meta.get("nn_module_stack")
    if not stack:
        return None
    path, _type = list(stack.values())[-1]
    path = _INDEX.sub(r".\1", _ROOT.sub("", str(path)))
    return path.replace("._modules['", ".").replace("']", "") or None


_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def source_of_stack_trace(trace: str | None) -> str:
    """The innermost user frame of an FX node's ``stack_trace`` (``""`` if none)."""
    found = ""
    for filename, line, function in _STACK_FRAME.findall(trace or ""):
        if not is_internal(filename):
            found = source_line(filename, int(line), function)
    return found


# -- the lowering's record ------------------------------------------------------

_collector: contextvars.ContextVar[list[CallSite] | None] = contextvars.ContextVar(
    "vllm_ir_lowered_call_sites", default=None
)


@contextlib.contextmanager
def collecting_lowered() -> Iterator[list[CallSite]]:
    """Collect a :class:`CallSite` for every IR node lowered inside the block."""
    found: list[CallSite] = []
    token = _collector.set(found)
    try:
        yield found
    finally:
        _collector.reset(token)


def is_collecting() -> bool:
    """Whether a :func:`collecting_lowered` block is open (the lowering skips
    describing branches otherwise)."""
    return _collector.get() is not None


def record_lowered(
    node: Any,
    op: Any,
    fake_args: Sequence[Any],
    provider: str,
    *,
    branch: tuple[str, int] | None = None,
) -> None:
    """Called by the lowering pass for each node it lowers, and for a node it
    branches per bucket once per branch with ``branch=(bucket label,
    representative token count)``; a no-op outside :func:`collecting_lowered`."""
    found = _collector.get()
    if found is not None:
        found.append(compiled_call_site(node, op, fake_args, provider, branch=branch))


def compiled_call_site(
    node: Any,
    op: Any,
    fake_args: Sequence[Any],
    provider: str,
    *,
    branch: tuple[str, int] | None = None,
) -> CallSite:
    """The call site of one lowered FX node, or of one branch of it (called inside
    the lowering's compiled-selection scope, so ``candidates`` answers as the
    lowering selected; a branch's at its representative token count)."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode([a for a in fake_args if isinstance(a, torch.Tensor)])
    shape_env = getattr(fake_mode, "shape_env", None)
    # asking every impl must not add a guard to the graph being compiled
    quiet = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
    with quiet:
        try:
            if branch is None:
                found = op.candidates(*fake_args)
            else:
                found = op.selector.candidates(tuple(fake_args), tokens=branch[1])
            notes = notes_for(found, provider)
        except Exception as e:  # an impl's supports_args failing on FakeTensors
            notes = (CandidateNote(provider, "ran", "chosen by the lowering", ""),)
            notes += (CandidateNote("?", "rejected", f"candidates() failed: {e}", ""),)
        tokens = token_count(op, fake_args)
        bucket = bucket_of(op, fake_args) if branch is None else branch[0]
        args = describe_args(op, fake_args)
    source = source_of_stack_trace(node.meta.get("stack_trace"))
    site = module_path_of(node.meta) or source or f"(graph node {node.name})"
    return CallSite(
        site=site,
        op=op.name,
        overload="default",
        args=args,
        tokens=tokens,
        bucket=bucket,
        ran=provider,
        batch_invariant=op.impls[provider].batch_invariant,
        candidates=notes,
        source=source,
    )
