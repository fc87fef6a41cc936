"""One IR op call site of a whole-model kernel plan (:mod:`vllm_ir.planning`).

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
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ir.dispatch import Candidates

__all__ = [
    "DEFAULT_BUCKET_BOUNDS",
    "CallSite",
    "CandidateNote",
    "bucket_label",
    "collecting_lowered",
    "compiled_call_site",
    "describe_args",
    "module_path_of",
    "notes_for",
    "record_lowered",
    "token_count",
]

DEFAULT_BUCKET_BOUNDS: tuple[int, ...] = (16, 256)
"""Upper token bounds of the default size buckets: decode (<= 16), <= 256, larger.

TODO(buckets): once bucketed priorities land, read the bounds of the op's
priority table instead (the buckets branch owns that representation)."""


def token_count(op: Any, args: Sequence[Any]) -> int | str | None:
    """Product of all but the last dim of the op's first activation.

    An ``int`` for concrete sizes, the symbolic expression as a string for a
    dynamic size under ``torch.compile``, ``None`` when the op has no tensor
    activation.
    """
    names = list(op.signature.parameters)
    if not op.activations:
        return None
    value = args[names.index(op.activations[0])]
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if not isinstance(value, torch.Tensor):
        return None
    dims = list(value.shape[:-1])
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    product: Any = 1
    for d in dims:
        product = product * d
    return str(product)


def bucket_label(tokens: int | str | None, bounds: Sequence[int] = DEFAULT_BUCKET_BOUNDS) -> str:
    """The size bucket of ``tokens``: ``<=16``, ``<=256``, ``>256`` for the default bounds;
    ``dynamic`` for a symbolic size, ``-`` for an op without a tensor activation."""
    if tokens is None:
        return "-"
    if isinstance(tokens, str):
        return "dynamic"
    for bound in bounds:
        if tokens <= bound:
            return f"<={bound}"
    return f">{bounds[-1]}" if bounds else "all"


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
    bucket: str
    ran: str
    """The provider whose impl ran (eager: ``op.dispatch``; compiled: the lowering's)."""
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
        return (self.site, self.op, self.overload, self.args, self.ran, self.candidates)


# -- module paths and source lines ---------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__ or "") + os.sep
_CORE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
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


def record_lowered(node: Any, op: Any, fake_args: Sequence[Any], provider: str) -> None:
    """Called by the lowering pass for each node it lowers; a no-op outside
    :func:`collecting_lowered`."""
    found = _collector.get()
    if found is not None:
        found.append(compiled_call_site(node, op, fake_args, provider))


def compiled_call_site(node: Any, op: Any, fake_args: Sequence[Any], provider: str) -> CallSite:
    """The call site of one lowered FX node (called inside the lowering's
    compiled-selection scope, so ``candidates`` answers as the lowering selected)."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode([a for a in fake_args if isinstance(a, torch.Tensor)])
    shape_env = getattr(fake_mode, "shape_env", None)
    # asking every impl must not add a guard to the graph being compiled
    quiet = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
    with quiet:
        try:
            notes = notes_for(op.candidates(*fake_args), provider)
        except Exception as e:  # an impl's supports_args failing on FakeTensors
            notes = (CandidateNote(provider, "ran", "chosen by the lowering", ""),)
            notes += (CandidateNote("?", "rejected", f"candidates() failed: {e}", ""),)
        tokens = token_count(op, fake_args)
        args = describe_args(op, fake_args)
    source = source_of_stack_trace(node.meta.get("stack_trace"))
    site = module_path_of(node.meta) or source or f"(graph node {node.name})"
    return CallSite(
        site=site,
        op=op.name,
        overload="default",
        args=args,
        tokens=tokens,
        bucket=bucket_label(tokens),
        ran=provider,
        batch_invariant=op.impls[provider].batch_invariant,
        candidates=notes,
        source=source,
    )
