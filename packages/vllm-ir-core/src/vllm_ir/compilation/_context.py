"""What one compilation's passes tell each other and the user."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DONATED_INPUTS_META",
    "DONATED_META",
    "Donation",
    "InputSignature",
    "PassContext",
    "get_pass_context",
    "pass_context",
]

DONATED_META = "vllm_ir_donated"
"""Key in an IR node's ``meta["custom"]``: the argument positions its caller
donated through ``maybe_inplace``. AOTAutograd copies ``meta["custom"]`` onto
the nodes it traces from a node, so the record reaches the post-grad graph
whatever AOTAutograd renames or reorders."""

DONATED_INPUTS_META = "vllm_ir_donated_inputs"
"""Key in an IR node's ``meta["custom"]``: for each donated argument position,
the positions of the graph inputs the donated value may share elements with
in the pre-grad graph, as ``((arg, (input, ...)), ...)``. Only those inputs
may be written.
Inductor rewrites arguments before the post-grad passes (``remove_noop_ops``
turns ``op(x.clone())`` into ``op(x)``), so a donated *copy* can reach the
lowering as the original graph input, which the caller never donated."""

InputSignature = tuple[tuple[str, object, int], ...]
"""Per graph input, in order: (kind, dtype, rank). Donated inputs are named by
position, trusted only where the post-grad graph's inputs have the same
signature as the pre-grad graph's (AOTAutograd may add, drop or merge inputs)."""


@dataclass(frozen=True)
class Donation:
    """One activation donated to ``maybe_inplace`` in the pre-grad graph."""

    op: str
    node: str
    argument: str
    value: str
    graph_input: bool


@dataclass
class PassContext:
    """State shared by the passes of one compilation (one graph)."""

    donations: list[Donation] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    """``maybe_inplace`` nodes that donate nothing because autograd needs their
    arguments (eager degrades them to the default overload too)."""
    declined_activations: list[tuple[str, str]] = field(default_factory=list)
    """``(node, activation)`` pairs not donated because a tensor of the same
    storage is read after the call and its elements cannot be proven apart
    from the activation's (the activation is then treated as not donated)."""
    graph_inputs: InputSignature | None = None
    """The pre-grad graph's input signature (see :data:`InputSignature`)."""
    functionalized: int = 0
    selected_impls: dict[str, dict[str, str]] = field(default_factory=dict)
    clones_inserted: int = 0
    clones_removed: int = 0
    clones_kept: dict[str, str] = field(default_factory=dict)
    eager_fallback: str | None = None
    """Why the graph was run eagerly instead of compiled (a program torch itself
    compiles wrongly, :mod:`vllm_ir.compilation._upstream_hazards`), or None."""
    views_rebased: int = 0
    """``as_strided`` views taken from the root of their view chain instead
    (see :mod:`vllm_ir.compilation._absolute_views`)."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    fusions: dict[str, int] = field(default_factory=dict)
    autotuned: dict[str, Any] = field(default_factory=dict)
    """With ``autotune``: node name -> its ``TuningRecord`` (candidates, times, winner),
    for every node that had more than one candidate."""
    from_cache: bool = False
    """Inductor served the graph from its caches, so no pass ran and the
    fields above are empty but ``selected_impls``: the selections made when the
    cached graph was compiled, kept with it (as Inductor counters). Disable
    ``fx_graph_cache`` (and ``torch._functorch.config.enable_autograd_cache``)
    to see the others again."""

    @property
    def donated_graph_inputs(self) -> list[str]:
        return [d.value for d in self.donations if d.graph_input]


_current: contextvars.ContextVar[PassContext | None] = contextvars.ContextVar(
    "vllm_ir_pass_context", default=None
)


def _current_context() -> PassContext | None:
    return _current.get()


def get_pass_context() -> PassContext:
    """The context of the compilation in progress."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "no vllm-ir compilation in progress: run passes through VllmIRBackend, "
            "or inside `with pass_context():`"
        )
    return ctx


@contextlib.contextmanager
def pass_context(ctx: PassContext | None = None) -> Iterator[PassContext]:
    ctx = ctx or PassContext()
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
