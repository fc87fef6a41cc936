"""The ``vllm_ir`` torch.compile backend: Inductor with vllm-ir's passes.

Pipeline per graph::

    Dynamo graph (vllm_ir.* nodes, maybe_inplace included)
      pre-grad      InplaceFunctionalizationPass   maybe_inplace -> default, donations checked
      AOTAutograd   functionalization
      joint pre     AbsoluteViewRecordPass         as_strided input offsets recorded
      (Inductor's no-op removal)
      post-grad pre LoweringPass.pre               functional impls inlined
      (Inductor's own post-grad passes: pattern matching, reinplacing)
      post-grad post LoweringPass.post             inplace impls inlined, with clones
                     CloneEliminationPass          unnecessary clones removed
                     AbsoluteViewPass              as_strided addressed from storage roots
      Inductor codegen
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import fx
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass
from vllm_ir_cli.flags import BUILTIN_PASSES

from vllm_ir._base.logger import get_logger
from vllm_ir._discovery.providers import ensure_loaded
from vllm_ir._op.op import IrOp
from vllm_ir._selection.buckets import assume_range
from vllm_ir.compilation._absolute_views import AbsoluteViewPass, AbsoluteViewRecordPass
from vllm_ir.compilation._autotune import Autotuner
from vllm_ir.compilation._bucket_branches import ranges_text
from vllm_ir.compilation._bucket_switch import SizeSwitch, plan_switch, switch_between
from vllm_ir.compilation._clone_elimination import CloneEliminationPass
from vllm_ir.compilation._context import PassContext, pass_context
from vllm_ir.compilation._functionalize import InplaceFunctionalizationPass
from vllm_ir.compilation._fusion import NormQuantFusionPass
from vllm_ir.compilation._lowering import (
    RUNTIME_SELECTED,
    LoweringPass,
    selection_counts,
    selections_counted_since,
)
from vllm_ir.compilation._sequence_parallel import SequenceParallelismPass
from vllm_ir.compilation._upstream_hazards import as_strided_input_mutation, has_dynamic_inputs
from vllm_ir.config import IrOpPriorityConfig, IrPassConfig, KernelConfig
from vllm_ir.priority import PrioritySpec, user_priority

__all__ = ["BUCKET_DISPATCH", "ComposedPass", "VllmIRBackend", "compile", "vllm_ir_backend"]

BucketDispatch = Literal["graphs", "branches"]
BUCKET_DISPATCH: tuple[BucketDispatch, ...] = ("graphs", "branches")
"""How a dynamic graph runs per-size selections (:attr:`VllmIRBackend.bucket_dispatch`)."""

logger = get_logger(__name__)

_BUILTIN_PASSES: dict[str, Callable[[], Any]] = {
    "fuse_norm_quant": NormQuantFusionPass,
    "sequence_parallel": SequenceParallelismPass,
}
"""Factories of the built-in passes, by the names of ``vllm_ir_cli.flags.BUILTIN_PASSES``."""
if set(_BUILTIN_PASSES) != set(BUILTIN_PASSES):  # the one list of names, shared with the CLI
    raise ImportError(f"built-in passes {sorted(_BUILTIN_PASSES)} != {sorted(BUILTIN_PASSES)}")

_HOOKS = (
    "pre_grad_custom_pass",
    "joint_custom_pre_pass",
    "post_grad_custom_pre_pass",
    "post_grad_custom_post_pass",
)


class ComposedPass(CustomGraphPass):
    """Runs passes in order; its uuid is None (no caching) if any pass lacks one."""

    def __init__(self, *passes: Callable[[fx.Graph], Any]) -> None:
        self.passes = passes

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> Any:
        h = hashlib.sha256()
        for p in self.passes:
            uuid = p.uuid() if isinstance(p, CustomGraphPass) else None
            if uuid is None:
                return None
            h.update(repr(uuid).encode())
        return h.hexdigest()


def _user_priorities() -> dict[str, PrioritySpec]:
    """Every op's user list now (empty ones too: later changes must not leak in)."""
    ensure_loaded()  # providers may declare ops
    return {name: user_priority(name)[0] for name in IrOp.registry}


class VllmIRBackend:
    """A torch.compile backend running Inductor with vllm-ir's passes.

    Priorities are those in force when the backend is created, unless
    ``priority`` is given. ``ir_passes`` run on the functional post-grad graph
    while it still holds IR nodes (one node per op call: fusion and
    transformation passes match those), before lowering; give them a
    ``uuid()`` (:class:`~vllm_ir.compilation.VllmIRPass`) or Inductor's cache is
    bypassed. Inductor hooks the user already set in ``torch._inductor.config``
    are kept: vllm-ir's pass runs first, then theirs.

    Usage (``torch.compile(model, backend="vllm_ir")`` creates one per graph)::

        backend = ir.VllmIRBackend(priority={"rms_norm": ["native"]})
        compiled = torch.compile(model, backend=backend)
        compiled(x)
        backend.lowering_pass.selected_impls  # {'rms_norm': {'rms_norm': 'native'}}
        backend.pass_contexts[0].clones_removed

    >>> import vllm_ir as ir
    >>> ir.VllmIRBackend(priority={"rms_norm": ["native"]}).lowering_pass.priorities["rms_norm"]
    ('native',)
    """

    def __init__(
        self,
        *,
        priority: IrOpPriorityConfig | Mapping[str, Sequence[str]] | None = None,
        options: Mapping[str, Any] | None = None,
        ir_passes: Sequence[Callable[[fx.Graph], Any]] = (),
        passes: IrPassConfig | Mapping[str, bool] | None = None,
        autotune: bool | Autotuner = False,
        bucket_dispatch: BucketDispatch = "graphs",
    ) -> None:
        if bucket_dispatch not in BUCKET_DISPATCH:
            raise ValueError(
                f"bucket_dispatch must be one of {', '.join(map(repr, BUCKET_DISPATCH))}, "
                f"got {bucket_dispatch!r}"
            )
        self.bucket_dispatch = bucket_dispatch
        """How a dynamic graph with bucketed priorities runs each bucket's impl:
        ``"graphs"``, one compiled graph per size range, picked per call
        (:mod:`~vllm_ir.compilation._bucket_switch`); ``"branches"``, one graph
        with a ``torch.cond`` per op call (:mod:`~vllm_ir.compilation._bucket_branches`).
        ``"graphs"`` falls back to branches where ops count different sizes."""
        given: Mapping[str, Sequence[str]]
        if priority is None:
            given = {}
        elif isinstance(priority, IrOpPriorityConfig):
            given = priority.to_dict()
        else:
            given = IrOpPriorityConfig.from_dict(priority).to_dict()
        # every op pinned, so later priority changes never reach this backend
        self.lowering_pass = LoweringPass({**_user_priorities(), **given})
        # autotune: the lowering times the candidates its priorities accept
        self.autotuner = Autotuner() if autotune is True else autotune or None
        self.lowering_pass.autotuner = self.autotuner
        if not isinstance(passes, IrPassConfig):
            passes = IrPassConfig(**(passes or {}))
        self.passes = passes
        self.ir_passes = (*(_BUILTIN_PASSES[name]() for name in passes.enabled()), *ir_passes)
        """Fusion / transformation passes over IR nodes, run post-grad before lowering:
        the enabled built-in ones (``passes``), then the user's (``ir_passes``)."""
        self.functionalization_pass = InplaceFunctionalizationPass()
        self.clone_elimination_pass = CloneEliminationPass()
        self.absolute_view_pass = AbsoluteViewPass()
        self.absolute_view_record_pass = AbsoluteViewRecordPass()
        self.options = dict(options or {})
        bad = [k for k in self.options if k in _HOOKS]
        if bad:
            raise ValueError(
                f"options may not set {', '.join(bad)}: set them in torch._inductor.config, "
                "and VllmIRBackend composes them with its own passes"
            )
        self.pass_contexts: list[PassContext] = []
        """One per compiled graph: donations, selections, clone counts, timings."""

    @classmethod
    def from_config(cls, config: KernelConfig, **kwargs: Any) -> VllmIRBackend:
        """A backend with ``config``'s priorities, passes and autotuning (``kwargs`` go to it too).

        >>> import vllm_ir as ir
        >>> cfg = ir.KernelConfig.from_cli_args(["--ir-autotune=off"])
        >>> ir.VllmIRBackend.from_config(cfg).autotuner is None
        True
        """
        tuner = (
            Autotuner(margin=config.autotune_margin, buckets=config.autotune_buckets)
            if config.autotune
            else False
        )
        return cls(priority=config.priority, passes=config.ir_passes, autotune=tuner, **kwargs)

    def _hooks(self) -> dict[str, Any]:
        ours = {
            "pre_grad_custom_pass": self.functionalization_pass,
            "joint_custom_pre_pass": self.absolute_view_record_pass,
            "post_grad_custom_pre_pass": (
                ComposedPass(*self.ir_passes, self.lowering_pass.pre)
                if self.ir_passes
                else self.lowering_pass.pre
            ),
            "post_grad_custom_post_pass": ComposedPass(
                self.lowering_pass.post, self.clone_elimination_pass, self.absolute_view_pass
            ),
        }
        hooks = {}
        for name, mine in ours.items():
            theirs = getattr(inductor_config, name)
            hooks[name] = mine if theirs is None else ComposedPass(mine, theirs)
        return hooks

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        dynamic = has_dynamic_inputs(example_inputs)
        hazard = as_strided_input_mutation(gm.graph, dynamic=dynamic)
        # autotune measures per bucket inside one graph: it keeps the branches
        if hazard is None and dynamic and self.bucket_dispatch == "graphs" and not self.autotuner:
            switch = plan_switch(
                gm, example_inputs, self.lowering_pass.size_plan, self.lowering_pass.select_at
            )
            if switch is not None:
                return self._compile_pieces(gm, example_inputs, switch)
        return self._compile(gm, example_inputs, hazard)

    def _compile_pieces(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], switch: SizeSwitch
    ) -> Any:
        """One compile per size range of ``switch``; each node's selection recorded
        as its pieces' providers (``<=16:native;cpu_c``), like a branched node."""
        outer = self.lowering_pass.selected_impls
        pieces, selected = [], []
        try:
            for low, high in switch.ranges:
                self.lowering_pass.selected_impls = {}
                piece = fx.GraphModule(gm, _graph_copy(gm.graph))
                with assume_range(switch.expr, low, high):
                    pieces.append(self._compile(piece, example_inputs, None))
                selected.append(self.lowering_pass.selected_impls)
        finally:
            self.lowering_pass.selected_impls = outer
        bounds = [*switch.highs, None]
        for op_name in {name for per_piece in selected for name in per_piece}:
            nodes = {n for per_piece in selected for n in per_piece.get(op_name, {})}
            for node in nodes:
                ran = [per_piece.get(op_name, {}).get(node, "?") for per_piece in selected]
                outer.setdefault(op_name, {})[node] = ranges_text(
                    list(zip(bounds, ran, strict=True))
                )
        logger.debug("compiled a graph per size range %s of %s", switch.ranges, switch.expr)
        return switch_between(switch, pieces)

    def _compile(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], hazard: str | None
    ) -> Any:
        from torch._inductor.compile_fx import compile_fx

        ctx = PassContext()
        self.pass_contexts.append(ctx)
        if hazard is not None:
            # torch's own compile of this graph would be wrong (upstream_hazards)
            logger.warning(
                "vllm-ir runs a graph eagerly instead of compiling it: %s; torch 2.13's "
                "AOTAutograd miscompiles that with dynamic shapes (docs/compile.md)",
                hazard,
            )
            ctx.eager_fallback = hazard
            return gm.forward
        counted = selection_counts()
        with pass_context(ctx), inductor_config.patch({**self.options, **self._hooks()}):
            compiled = compile_fx(gm, list(example_inputs))
        # counted by the lowering, or replayed by a cache hit
        if any(
            provider == RUNTIME_SELECTED
            for nodes in selections_counted_since(counted).values()
            for provider in nodes.values()
        ):
            compiled = _selecting_at_runtime(
                compiled,  # type: ignore[arg-type]  # compile_fx's union: a callable here
                self.lowering_pass.runtime_selection,
            )
        # the post-grad pre pass always runs when Inductor compiles the graph
        ctx.from_cache = "lowering_functional" not in ctx.timings_ms
        if ctx.from_cache:
            # No pass ran; the hit replayed the selections counted when the
            # cached graph was compiled (_lowering._SELECTED): report those.
            selected = self.lowering_pass.selected_impls
            for op_name, nodes in selections_counted_since(counted).items():
                selected.setdefault(op_name, {}).update(nodes)
            ctx.selected_impls = selected
            logger.debug(
                "graph served from Inductor's cache: vllm-ir passes did not run; "
                "selections when it was compiled: %s",
                selected,
            )
            return compiled
        logger.debug(
            "compiled a graph: %d maybe_inplace functionalized, selections %s, "
            "clones inserted %d, removed %d",
            ctx.functionalized,
            ctx.selected_impls,
            ctx.clones_inserted,
            ctx.clones_removed,
        )
        return compiled


def _selecting_at_runtime(
    compiled: Callable[..., Any], selection: Callable[[], Any]
) -> Callable[..., Any]:
    """``compiled``, run in ``selection()``: its IR nodes left in the graph select
    their impl per call with the backend's priorities, not the caller's."""

    def run(*args: Any) -> Any:
        with selection():
            return compiled(*args)

    return run


def _graph_copy(graph: fx.Graph) -> fx.Graph:
    """A copy whose nodes a compile may rewrite (metadata shared, not copied)."""
    copy = fx.Graph()
    output = copy.graph_copy(graph, {})
    copy.output(output)
    return copy


def vllm_ir_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """The backend registered as ``torch.compile(..., backend="vllm_ir")``.

    torch.compile hands a named backend its ``mode`` and ``options``: the mode
    becomes Inductor's options for it (``"reduce-overhead"``: CUDA graphs), as
    with ``backend="inductor"``; explicit ``options`` win.
    """
    from torch._inductor import list_mode_options

    merged = {**list_mode_options(mode), **(options or {})} if mode else dict(options or {})
    return VllmIRBackend(options=merged)(gm, example_inputs)


def compile(
    model: Any,
    *,
    priority: IrOpPriorityConfig | Mapping[str, Sequence[str]] | None = None,
    options: Mapping[str, Any] | None = None,
    ir_passes: Sequence[Callable[[fx.Graph], Any]] = (),
    passes: IrPassConfig | Mapping[str, bool] | None = None,
    autotune: bool | Autotuner = False,
    bucket_dispatch: BucketDispatch = "graphs",
    **torch_compile_kwargs: Any,
) -> Any:
    """``torch.compile(model, backend=VllmIRBackend(...), **torch_compile_kwargs)``.

    The backend is reachable as ``compiled.vllm_ir_backend`` where the result
    accepts attributes (modules and functions do).
    """
    backend = VllmIRBackend(
        priority=priority,
        options=options,
        ir_passes=ir_passes,
        passes=passes,
        autotune=autotune,
        bucket_dispatch=bucket_dispatch,
    )
    compiled = torch.compile(model, backend=backend, **torch_compile_kwargs)
    with contextlib.suppress(AttributeError):
        compiled.vllm_ir_backend = backend  # type: ignore[attr-defined]
    return compiled
