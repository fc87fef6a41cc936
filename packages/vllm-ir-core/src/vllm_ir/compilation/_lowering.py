"""Post-grad: replace each IR node by the traced graph of its selected impl.

Selection is the eager one, run on the node's FakeTensors with the
compile-mode priorities. Two stages, because of where Inductor looks:

* ``pre`` (``post_grad_custom_pre_pass``) lowers every node whose impl is
  functional, before Inductor's own post-grad pattern passes, so that e.g.
  the residual add of a lowered ``fused_add_rms_norm`` still folds into a
  preceding ``addmm``.
  A functional impl is traced *functionalized* (in-place ops on its own
  buffers become functional ops, mutating custom ops ``auto_functionalized``,
  as AOTAutograd would have traced them), because Inductor's passes that
  follow assume a functional graph: ``remove_noop_ops`` drops the ``clone``
  of ``out = x.clone(); out.mul_(2)`` and the ``mul_`` would then write ``x``.
* ``post`` (``post_grad_custom_post_pass``) lowers the impls that write into
  their inputs. They are traced with clones of their activations (the
  default overload never mutates its inputs); clone elimination then drops
  the clones that are provably unnecessary. Raw in-place kernels are placed
  after Inductor's passes because those assume a functional graph.

A node whose size buckets cannot be branched on (``BranchUnsupported``: an
unbacked size, ...) or whose token count has no value left under the graph's
guards is left in the graph as the IR op: it selects its impl at run time, as
in eager mode, under this pass's priorities (``runtime_selection``; one log
line per node).

Each ``(impl, argument metadata)`` is traced once per compile and its graph
reused for every other node with the same metadata (dtype, device, shape,
strides and storage offset of every tensor: an impl may read any of them
while traced). Traces are never reused across compiles: symbolic sizes of the
same name stand for other sizes under other guards after a recompile.
"""

from __future__ import annotations

import contextlib
import json
import operator
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import fx
from torch._dynamo.utils import counters
from torch._guards import detect_fake_mode
from torch._inductor.fx_passes.post_grad import decompose_auto_functionalized
from torch._inductor.pattern_matcher import fwd_only
from torch._subclasses.fake_tensor import FakeTensor, fake_tensor_tls
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    PendingUnbackedSymbolNotFound,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from vllm_ir._base.fingerprint import code_fingerprint
from vllm_ir._base.logger import get_logger
from vllm_ir._op.callsite import is_collecting, record_lowered
from vllm_ir._op.op import IrOp
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir._selection.buckets import SizePlan, assumed_range
from vllm_ir.compilation._aliasing import AliasGroups, is_write, written_args
from vllm_ir.compilation._bucket_branches import (
    Branch,
    BranchUnsupported,
    branch_buckets,
    branch_outputs_hazard,
    bucket_branches,
    describe_branches,
    emit_cond,
    emit_product,
    emit_size,
    nested_cond_module,
    plain_strides,
    require_orderable_strides,
    size_symbol_operands,
)
from vllm_ir.compilation._context import (
    DONATED_INPUTS_META,
    DONATED_META,
    PassContext,
    get_pass_context,
)
from vllm_ir.compilation._functionalize import input_signature
from vllm_ir.compilation._pass_base import Uncacheable, VllmIRPass
from vllm_ir.compilation.ir_nodes import call_args, ir_op_of, is_ir_node
from vllm_ir.priority import (
    compiled_selection,
    effective_priority,
    freeze_priority,
    scoped_priority,
)
from vllm_ir.selection import selection_env

__all__ = [
    "ACTIVATION_CLONE_META",
    "RUNTIME_SELECTED",
    "LoweringPass",
    "selection_counts",
    "selections_counted_since",
]

logger = get_logger(__name__)

ACTIVATION_CLONE_META = "vllm_ir_activation_clone"
"""``meta`` key on clones the lowering inserts for an inplace impl:
``{"op": ..., "argument": ..., "donated": bool, "donated_inputs": frozenset[str]}``:
whether the caller donated the argument, and the names of the graph inputs it
donated with it — the only graph inputs the copy's writes may be moved to."""

RUNTIME_SELECTED = "<runtime>"
"""The provider ``selected_impls`` records for a node left to select its impl at run time."""

_RUNTIME_META = "vllm_ir_runtime_selection"
"""``meta`` key on an IR node left in the graph (its reason): no stage lowers it."""

_MAX_ROUNDS = 8  # impls may call other IR ops; each round lowers one level

_SELECTED = "vllm_ir_selected:"
"""Prefix of the Inductor counters that record each lowered node's provider.

Inductor saves the counters a compile increments with the graph in its FX
cache (``counter_deltas``) and adds them again on a hit, when no pass runs:
they carry ``selected_impls`` with the cached graph (:func:`selections_counted_since`)."""


def _count_selection(op_name: str, node_name: str, provider: str) -> None:
    counters["inductor"][_SELECTED + json.dumps([op_name, node_name, provider])] += 1


def selection_counts() -> dict[str, int]:
    """The selection counters now (to diff against after a compile)."""
    return {k: v for k, v in counters["inductor"].items() if k.startswith(_SELECTED)}


def selections_counted_since(before: Mapping[str, int]) -> dict[str, dict[str, str]]:
    """``selected_impls`` as counted since ``before``: by the passes, or replayed by a cache hit."""
    found: dict[str, dict[str, str]] = {}
    for key, count in selection_counts().items():
        if count > before.get(key, 0):
            op_name, node_name, provider = json.loads(key[len(_SELECTED) :])
            found.setdefault(op_name, {})[node_name] = provider
    return found


class _Trace(NamedTuple):
    """An impl traced for one argument metadata, shared by every node with it."""

    gm: fx.GraphModule
    fresh: frozenset[fx.Node]
    """Nodes whose copies may get a new FakeTensor directly (``_fresh_static_nodes``)."""
    absolute_views: bool
    """Whether the trace takes views at absolute storage offsets (``_addresses_storage``)."""


class _GraphState(NamedTuple):
    """What the lowering of one graph reads once, not per node."""

    context: PassContext
    collecting: bool
    """Whether :func:`vllm_ir.plan` collects call sites (``record_lowered``)."""


class LoweringPass:
    """Lowers IR nodes; ``selected_impls`` records every node's provider.

    ``selected_impls`` has the shape ``{"rms_norm": {"<node>": "<provider>"}}``.
    """

    def __init__(self, priorities: Mapping[str, Any]) -> None:
        self.priorities = {op: freeze_priority(p) for op, p in priorities.items()}
        self.autotuner: Any = None
        """An ``Autotuner`` choosing impls by measurement, or None: ``op.selected_impl``."""
        self.selected_impls: dict[str, dict[str, str]] = {}
        self._traced: dict[tuple[Any, ...], _Trace] = {}
        self._traced_env: weakref.ref[Any] | None = None
        """The ShapeEnv the traces in ``_traced`` were made in."""
        self._graph = _GraphState(PassContext(), collecting=False)
        self.pre = _LoweringStage(self, inplace=False)
        self.post = _LoweringStage(self, inplace=True)

    def size_plan(self, op: Any) -> SizePlan:
        """``op``'s size plan under this pass's compiled priorities."""
        with self._selection():
            return op.size_plan()  # type: ignore[no-any-return]

    def select_at(self, op: Any, args: Sequence[Any], tokens: int) -> IrOpImpl:
        """The impl this pass selects for ``op`` called with ``args`` as ``tokens`` tokens."""
        with self._selection():
            return op.selector.select(tuple(args), tokens=tokens).impl  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def _selection(self) -> Any:
        with scoped_priority(self.priorities), compiled_selection():
            yield

    def runtime_selection(self) -> Any:
        """The context a compiled graph runs in when some of its IR nodes select their
        impl at run time: this pass's priorities, as the lowering would select."""
        return self._selection()

    def cache_state(self) -> Any:
        """Every input of compiled selection and lowering (the FX graph cache key).

        The selection environment (``VLLM_BATCH_INVARIANT``, the platform), the
        effective compiled priorities, and for every impl they may pick: its
        flags, and the code of the impl, its ``supports_args`` and everything
        they call (:func:`~vllm_ir._base.fingerprint.code_fingerprint`);
        :class:`Uncacheable` when some of that code cannot be fingerprinted.
        """
        from vllm_ir._op.op import IrOp as _IrOp

        env = selection_env()
        state: list[Any] = [("env", env.batch_invariant, env.platform)]
        with self._selection():
            for name, op in sorted(_IrOp.registry.items()):
                impls = op.impls
                # one list per bucket (each bound stands for its bucket; None: the rest)
                for tokens in (*op.size_plan().bounds, None):
                    entries = [e.provider for e in effective_priority(name, tokens=tokens)]
                    picked = tuple(_impl_state(impls[p]) for p in entries if p in impls)
                    unhashed = [provider for provider, _, code in picked if code is None]
                    if unhashed:
                        return Uncacheable(
                            f"impl {unhashed[0]!r} of op {name!r} reaches state that cannot be "
                            "fingerprinted (vllm_ir._base.fingerprint)"
                        )
                    state.append((name, tokens, tuple(entries), picked))
        if self.autotuner is not None:
            state.append(self.autotuner.cache_state())
        # a graph compiled for one size range selects for it (bucket_switch)
        state.append(("sizes", assumed_range()))
        return tuple(state)

    def lower(self, graph: fx.Graph, *, inplace: bool) -> None:
        ctx = get_pass_context()
        self._graph = _GraphState(ctx, is_collecting())
        inputs = _donatable_inputs(graph, ctx)
        with self._selection():
            for _ in range(_MAX_ROUNDS):
                nodes = [n for n in graph.nodes if _lowerable(n)]
                lowered = 0
                for node in nodes:
                    lowered += self._lower_node(graph, node, inputs, inplace=inplace)
                if not lowered:
                    break
        if inplace:
            left = [n for n in graph.nodes if _lowerable(n)]
            if left:
                raise RuntimeError(
                    "vllm-ir lowering left IR nodes in the graph: "
                    + ", ".join(f"{n.name} ({n.target})" for n in left)
                )
        ctx.selected_impls = self.selected_impls

    def _record(self, op_name: str, node_name: str, provider: str) -> None:
        self.selected_impls.setdefault(op_name, {})[node_name] = provider
        _count_selection(op_name, node_name, provider)  # kept with a cached graph

    def _lower_node(
        self, graph: fx.Graph, node: fx.Node, inputs: list[str] | None, *, inplace: bool
    ) -> int:
        if is_ir_node(node, "maybe_inplace"):
            raise RuntimeError(
                f"{node.name}: {node.target} reached lowering; the pre-grad "
                "InplaceFunctionalizationPass must rewrite maybe_inplace first"
            )
        op = ir_op_of(node)
        args = call_args(node, op)
        fake_args = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
        branches = self._branches(op, node, fake_args)
        if branches == []:
            # Guards added since (an impl branching on the count, traced in another
            # piece of a graph compiled per size range) leave the count no value in
            # this range: the node never runs here, but must still compile.
            return self._select_at_runtime(node, op, "its token count has no value left here")
        if branches is not None and len(branches) > 1:
            return self._lower_branched(graph, node, op, args, fake_args, branches, inplace)
        if branches is not None:
            impl = branches[0][1]  # every bucket the token count can reach selects it
        elif self.autotuner is None:
            impl = op.selected_impl(*fake_args)
        else:
            impl = self.autotuner.choose(op, node.name, fake_args)
        if impl.inplace and not inplace:
            return 0
        if branches is None:
            trace = self._trace(op, impl, args, fake_args)
        else:
            try:  # a bucketed node: its impl may branch on an unbacked count
                with _unbacked_left_unbound(fake_args):
                    trace = self._trace(op, impl, args, fake_args)
            except _DATA_DEPENDENT as e:
                return self._select_at_runtime(node, op, str(e).splitlines()[0])
        if not inplace and trace.absolute_views:
            # Traced here, the impl saw its arguments before Inductor's no-op
            # removal, which may replace one (a copy) by an alias at another
            # storage offset: an absolute offset baked into the trace would
            # then address other memory. Lowered after that removal instead.
            return 0
        self._record(op.name, node.name, impl.provider)
        if self._graph.collecting:  # for vllm_ir.plan
            if branches is None:
                record_lowered(node, op, fake_args, impl.provider)
            else:
                _record_branches(node, op, fake_args, branches)
        _inline(graph, node, trace, args, op, _donations(node, inputs), self._graph.context)
        logger.debug("lowered %s to %s", node.name, impl.provider)
        return 1

    def _branches(self, op: IrOp, node: fx.Node, fake_args: list[Any]) -> list[Branch] | None:
        """The impl per size bucket a symbolic token count can reach (see
        ``_bucket_branches``), or None: a static count, or a table without
        buckets, selects one impl as eager does."""
        if self.autotuner is not None:
            return self.autotuner.choose_buckets(op, node.name, fake_args)  # type: ignore[no-any-return]
        tokens = op.tokens(*fake_args)
        plan = op.size_plan()
        if type(tokens) is int or not plan:
            return None
        full = tuple(fake_args)

        def choose(i: int, low: int, high: int) -> IrOpImpl:
            # the smallest count of bucket i the symbol can take represents it
            return op.selector.select(full, tokens=plan.lowest(i, low)).impl  # type: ignore[no-any-return]

        return bucket_branches(plan, tokens, choose)

    def _select_at_runtime(self, node: fx.Node, op: IrOp, reason: str) -> int:
        """Leave ``node`` in the graph as the IR op, which selects its impl when it runs."""
        node.meta[_RUNTIME_META] = reason
        self._record(op.name, node.name, RUNTIME_SELECTED)
        logger.warning(
            "vllm-ir: %s (%s) selects its impl at run time, as in eager mode: %s",
            node.name,
            op.name,
            reason,
        )
        return 0

    def _lower_branched(
        self,
        graph: fx.Graph,
        node: fx.Node,
        op: IrOp,
        args: list[Any],
        fake_args: list[Any],
        branches: list[Branch],
        inplace: bool,
    ) -> int:
        """Lower ``node`` to nested ``torch.cond`` over its buckets (bucket_branches),
        or leave it to select at run time where a branch cannot carry its sizes."""
        if not inplace and any(impl.inplace for _, impl in branches):
            return 0  # an inplace branch: with the inplace impls, after Inductor's passes
        inserted_from = node.prev
        try:
            with _unbacked_left_unbound(fake_args):
                return self._emit_branches(graph, node, op, args, fake_args, branches, inplace)
        except (BranchUnsupported, *_DATA_DEPENDENT) as e:
            # nothing emitted yet but copies and size reads: drop them, keep the node
            n = node.prev
            while n is not inserted_from:
                before = n.prev
                if not n.users:
                    graph.erase_node(n)
                n = before
            return self._select_at_runtime(node, op, str(e).splitlines()[0])

    def _emit_branches(
        self,
        graph: fx.Graph,
        node: fx.Node,
        op: IrOp,
        args: list[Any],
        fake_args: list[Any],
        branches: list[Branch],
        inplace: bool,
    ) -> int:
        tensor_pos = [i for i, a in enumerate(args) if isinstance(a, fx.Node)]
        act = op.selector.tokens_at
        if act not in tensor_pos:
            raise RuntimeError(f"{node.name}: the token count's activation is not a tensor node")
        act_index = tensor_pos.index(act)
        operands = [args[i] for i in tensor_pos]
        fake_mode = detect_fake_mode([fake_args[i] for i in tensor_pos])
        traces = [self._trace(op, impl, args, fake_args, branch=True) for _, impl in branches]
        if any(t.absolute_views for t in traces):
            if not inplace:
                return 0  # after Inductor's no-op removal, which would drop the copies
            # A branch addresses its operands' storage, but Inductor counts a branch
            # input's storage from its first element: hand the branches contiguous
            # copies, whose storage starts there.
            args, fake_args = list(args), list(fake_args)
            with graph.inserting_before(node):
                for i in tensor_pos:
                    args[i] = _contiguous_copy(graph, args[i], fake_mode)
                    fake_args[i] = args[i].meta["val"]
            operands = [args[i] for i in tensor_pos]
        vals = [fake_args[i] for i in tensor_pos]
        with graph.inserting_before(node):
            symbols = size_symbol_operands(graph, vals)
        operands += symbols
        vals += [s.meta["val"] for s in symbols]
        modules = [
            self._trace(op, impl, args, fake_args, branch=True, symbols=vals[len(tensor_pos) :]).gm
            for _, impl in branches
        ]
        expected = node.meta["val"]
        expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        hazard = branch_outputs_hazard(vals[: len(tensor_pos)], expected, modules)
        if hazard is not None:
            raise BranchUnsupported(hazard)
        bounds = [b for b, _ in branches[:-1] if b is not None]
        assert len(bounds) == len(branches) - 1  # only the last branch is unbounded
        owner = graph.owning_module
        if owner is None:
            raise RuntimeError(f"{node.name}: the graph has no owning module to hold branches")
        rest = nested_cond_module(
            vals, act_index, bounds[1:], modules[1:], fake_mode, op.feature_dims
        )
        with graph.inserting_before(node):
            outs = emit_cond(
                graph,
                owner,
                operands,
                act_index,
                bounds[0],
                modules[0],
                rest,
                fake_mode,
                op.feature_dims,
            )
        if _returns_one(node):
            node.replace_all_uses_with(outs[0])
        else:
            for user in list(node.users):
                if user.target is not operator.getitem:
                    raise RuntimeError(f"{node.name}: unexpected user {user.format_node()}")
                index = user.args[1]
                assert isinstance(index, int)
                user.replace_all_uses_with(outs[index])
                graph.erase_node(user)
        graph.erase_node(node)
        self._record(op.name, node.name, describe_branches(branches))
        if self._graph.collecting:
            _record_branches(node, op, fake_args, branches)
        logger.debug("lowered %s to buckets %s", node.name, describe_branches(branches))
        return 1

    def _lower_nested(self, gm: fx.GraphModule) -> None:
        """Lower the IR nodes an impl's trace calls (a branch is a graph of its own)."""
        for _ in range(_MAX_ROUNDS):
            nodes = [n for n in gm.graph.nodes if _lowerable(n)]
            if not nodes:
                return
            for n in nodes:
                self._lower_node(gm.graph, n, None, inplace=True)
        gm.recompile()

    def _trace(
        self,
        op: IrOp,
        impl: IrOpImpl,
        args: list[Any],
        fake_args: list[Any],
        *,
        branch: bool = False,
        symbols: Sequence[Any] = (),
    ) -> _Trace:
        """The impl traced for these arguments' metadata. ``branch``: as a
        ``torch.cond`` branch: functional (an inplace impl runs on copies),
        returning a tuple of outputs with plain strides, with the IR ops it calls
        lowered too; ``symbols``: SymInts the branch takes after the tensors, so
        that its sizes' symbols are bound in it (``size_symbol_operands``)."""
        # A trace of op(c, c) reads one placeholder for both arguments: it must
        # not serve op(a, b), so which arguments are the same node is keyed too.
        same = tuple(next(j for j, b in enumerate(args) if b is a) for a in args)
        key = (op.name, impl.provider, impl.impl_fn, branch, same, *map(_metadata, fake_args))
        key += tuple(map(str, symbols))
        tensor_pos = [i for i, a in enumerate(args) if isinstance(a, fx.Node)]
        fake_mode = detect_fake_mode([fake_args[i] for i in tensor_pos])
        self._forget_other_shape_envs(fake_mode)
        cached = self._traced.get(key)
        if cached is not None:
            return cached
        constants = list(fake_args)
        activations = op.activation_indices if impl.inplace else frozenset()

        def call(*tensors: torch.Tensor) -> Any:
            full = list(constants)
            for i, t in zip(tensor_pos, tensors, strict=True):
                full[i] = t.clone() if i in activations else t
            out = impl.impl_fn(*full)
            if not branch:
                return out
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)  # cond returns tuples
            return tuple(plain_strides(o) if isinstance(o, torch.Tensor) else o for o in outs)

        # The clones must survive tracing: no no-op removal for inplace impls.
        # In the arguments' fake mode, tensors an impl allocates are fake too.
        names = list(op.signature.parameters)
        tensor_names = [names[i] for i in tensor_pos]
        functional = branch or not impl.inplace
        traced = _functionalized(call, op, impl, tensor_names) if functional else call
        inputs = [fake_args[i] for i in tensor_pos]
        if symbols:
            tensors_only, count = traced, len(inputs)

            def traced(*values: Any) -> Any:  # the symbols only bind sizes
                return tensors_only(*values[:count])

        with (
            fake_mode if fake_mode is not None else contextlib.nullcontext(),
            _captured_tensors_as_constants(),
        ):
            gm = fwd_only(traced, [*inputs, *symbols], run_functional_passes=False)
        _check_constants_unwritten(gm, op, impl)
        if functional:
            gm.graph.eliminate_dead_code()
        if branch:
            self._lower_nested(gm)
            if impl.inplace:
                # an inplace kernel, functionalized: Inductor lowers no auto_functionalized
                # inside a subgraph, and post-grad passes never run on one made here;
                # decomposed, it writes the branch's own copies of the activations
                decompose_auto_functionalized(gm.graph)
                gm.recompile()
        trace = _Trace(gm, _fresh_static_nodes(gm), _addresses_storage(gm))
        self._traced[key] = trace
        return trace

    def _forget_other_shape_envs(self, fake_mode: Any) -> None:
        """Keep traces of this compile's ShapeEnv only.

        A trace is valid under the guards its ShapeEnv held when it was made (an
        impl branching on ``rows <= 8`` adds that guard); after a recompile the
        same symbol names (``s0``) stand for sizes under other guards, so a trace
        never outlives the ShapeEnv it was made in.
        """
        owner = getattr(fake_mode, "shape_env", None) or fake_mode
        current = self._traced_env() if self._traced_env is not None else None
        if owner is None or current is not owner:
            self._traced.clear()
            self._traced_env = weakref.ref(owner) if owner is not None else None


class _LoweringStage(VllmIRPass):
    def __init__(self, lowering: LoweringPass, *, inplace: bool) -> None:
        self.lowering = lowering
        self.inplace = inplace
        self.name = "lowering_inplace" if inplace else "lowering_functional"

    def run(self, graph: fx.Graph) -> None:
        self.lowering.lower(graph, inplace=self.inplace)

    def cache_state(self) -> Any:
        state = self.lowering.cache_state()
        return state if isinstance(state, Uncacheable) else (self.inplace, state)


_DATA_DEPENDENT = (GuardOnDataDependentSymNode, PendingUnbackedSymbolNotFound)
"""A trace that branched on, or made, a size no graph input gives: plain Inductor runs
such a node as the op, and so does the lowering (run-time selection)."""


@contextlib.contextmanager
def _unbacked_left_unbound(fake_args: Sequence[Any]) -> Iterator[None]:
    """On an error, forget the unbacked symbols made since entering: the node stays
    the IR op, so no node of the graph binds them, and a later trace would find
    them pending (``PendingUnbackedSymbolNotFound``)."""
    mode = detect_fake_mode([a for a in fake_args if isinstance(a, torch.Tensor)])
    env = getattr(mode, "shape_env", None)
    pending = None if env is None else len(env.pending_fresh_unbacked_symbols)
    try:
        yield
    except BaseException:
        if env is not None and pending is not None:
            del env.pending_fresh_unbacked_symbols[pending:]
        raise


def _lowerable(node: fx.Node) -> bool:
    """An IR node not left to select its impl at run time."""
    return is_ir_node(node) and _RUNTIME_META not in node.meta


def _record_branches(
    node: fx.Node, op: IrOp, fake_args: list[Any], branches: Sequence[Branch]
) -> None:
    """For :func:`vllm_ir.plan`: one call site per runtime branch (bucket -> impl)."""
    for label, rep, impl in branch_buckets(op, fake_args, branches):
        record_lowered(node, op, fake_args, impl.provider, branch=(label, rep))


def _returns_one(node: fx.Node) -> bool:
    """Whether the node's value is one tensor (not a tuple its users index)."""
    return isinstance(node.meta.get("val"), torch.Tensor)


def _impl_state(impl: IrOpImpl) -> tuple[Any, ...]:
    """What of an impl a lowered graph depends on."""
    flags = (impl.supported, impl.inplace, impl.batch_invariant, impl.supports_args is None)
    return (impl.provider, flags, code_fingerprint(impl.impl_fn, impl.supports_args))


_ABSOLUTE_VIEWS = frozenset(
    {
        torch.ops.aten.as_strided.default,
        torch.ops.aten.as_strided_.default,
        torch.ops.aten.as_strided_scatter.default,
        torch.ops.aten.sym_storage_offset.default,  # with dynamic shapes
    }
)


def _addresses_storage(gm: fx.GraphModule) -> bool:
    """Whether the trace takes views at absolute storage offsets (or reads one)."""
    return any(n.target in _ABSOLUTE_VIEWS for n in gm.graph.nodes)


def _metadata(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (
            value.dtype,
            value.device,
            tuple(map(str, value.shape)),
            tuple(map(str, value.stride())),
            str(value.storage_offset()),
        )
    return (type(value), repr(value))


@contextlib.contextmanager
def _captured_tensors_as_constants() -> Iterator[None]:
    """Let the trace read real tensors the impl did not get as arguments.

    An impl may read a module-level table, a closure's tensor or an object's
    attribute. The arguments' FakeTensorMode refuses real tensors by default;
    allowed, ``make_fx`` records each as a ``get_attr`` constant, which
    ``_copy_constant`` moves onto the compiled graph, as Dynamo does for the
    tensors a leaf function captures (``fake_tensor_tls`` is how it does so).
    """
    old = fake_tensor_tls.allow_non_fake_inputs_override
    fake_tensor_tls.allow_non_fake_inputs_override = True
    try:
        yield
    finally:
        fake_tensor_tls.allow_non_fake_inputs_override = old


def _check_constants_unwritten(gm: fx.GraphModule, op: IrOp, impl: IrOpImpl) -> None:
    """An impl may read a tensor it did not receive, never write one.

    The compiled graph holds such a tensor as a constant (a copy, once served
    from the cache), so a write would not reach the caller's tensor as it does
    in eager mode.
    """
    constants = gm.graph.find_nodes(op="get_attr")
    if not constants:
        return
    aliases = AliasGroups(gm.graph)
    for node in gm.graph.nodes:
        for written in written_args(node):
            hit = aliases.aliases(written).intersection(constants)
            if hit:
                raise RuntimeError(
                    f"{op.name}: impl {impl.provider!r} writes a tensor it did not receive as "
                    f"an argument ({node.target} on a module-level, captured or attribute "
                    "tensor). Such tensors are constants of the compiled graph: pass the "
                    "tensor as an argument, or allocate the buffer inside the impl"
                )


def _functionalized(fn: Any, op: IrOp, impl: IrOpImpl, tensor_names: Sequence[str]) -> Any:
    """``fn`` traced through functionalization, as AOTAutograd traces a model.

    An impl declared functional that writes one of its arguments breaks its
    contract; it is an error here rather than a write that the functional
    graph silently drops.
    """

    def run(*tensors: torch.Tensor) -> Any:
        mode = FunctionalTensorMode()
        guard = torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
        )
        with guard, mode:
            wrapped = [FunctionalTensor.to_functional(t) for t in tensors]
            out = fn(*wrapped)
            for name, arg in zip(tensor_names, wrapped, strict=True):
                torch._sync(arg)
                if torch._functionalize_has_data_mutation(arg.elem):  # type: ignore[attr-defined]
                    raise RuntimeError(
                        f"{op.name}: impl {impl.provider!r} is registered as functional but "
                        f"writes its argument {name!r}; register it with inplace=True, "
                        "or write into a tensor it allocates"
                    )

            def unwrap(t: FunctionalTensor) -> torch.Tensor:
                torch._sync(t)
                return torch._from_functional_tensor(t.elem)

            return pytree.tree_map_only(FunctionalTensor, unwrap, out)

    return run


def _donatable_inputs(graph: fx.Graph, ctx: PassContext) -> list[str] | None:
    """Names of the graph inputs by pre-grad position, or None when the inputs
    no longer line up with the pre-grad graph's (then no input counts as
    donated: the clones protecting them stay)."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    if ctx.graph_inputs is None or ctx.graph_inputs != input_signature(graph):
        return None
    return [p.name for p in placeholders]


def _donations(node: fx.Node, inputs: list[str] | None) -> dict[int, frozenset[str]]:
    """Donated argument position -> names of the graph inputs it may write."""
    custom = node.meta.get("custom", {})
    donated_inputs = dict(custom.get(DONATED_INPUTS_META, ()))
    result = {}
    for index in custom.get(DONATED_META, ()):
        positions = donated_inputs.get(index, ())
        names = frozenset() if inputs is None else frozenset(inputs[p] for p in positions)
        result[index] = names
    return result


def _fresh_static_nodes(gm: fx.GraphModule) -> frozenset[fx.Node]:
    """Nodes whose value is a new tensor of static shape: aliasing nothing else
    in the trace. Their copies get a new FakeTensor built directly (~12 us)
    instead of re-running the op under FakeTensorMode (~100 us)."""
    seen: set[object] = set()
    fresh = set()
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        storage = StorageWeakRef(val.untyped_storage())
        static = all(isinstance(s, int) for s in (*val.shape, *val.stride()))
        if storage not in seen and n.op == "call_function" and static and not is_write(n):
            fresh.add(n)
        seen.add(storage)
    return frozenset(fresh)


def _copy_constant(graph: fx.Graph, gm: fx.GraphModule, node: fx.Node, fake_mode: Any) -> fx.Node:
    """A constant the impl created while traced (``torch.tensor([...])``), made
    an attribute of the graph's own module under a fresh name."""
    owner = graph.owning_module
    if owner is None:
        raise RuntimeError(
            f"an impl creates the constant {node.target!r}, but the graph being lowered "
            "has no owning module to hold it"
        )
    value = getattr(gm, str(node.target))
    i = 0
    while hasattr(owner, f"_vllm_ir_constant{i}"):
        i += 1
    name = f"_vllm_ir_constant{i}"
    if isinstance(value, torch.Tensor):
        owner.register_buffer(name, value, persistent=False)
    else:
        setattr(owner, name, value)
    new = graph.get_attr(name)
    if isinstance(value, torch.Tensor) and fake_mode is not None:
        new.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
    else:
        new.meta["val"] = value
    return new


def _contiguous_copy(graph: fx.Graph, node: fx.Node, fake_mode: Any) -> fx.Node:
    """A contiguous copy of ``node`` inserted into ``graph`` (at its insertion point).

    Inductor lowers a ``clone`` to whatever layout suits it (a column-major
    input's, say) whatever its ``memory_format``, and does not hold a
    ``torch.cond`` operand to the strides its branches were traced with: the
    copy's order is forced, so that a branch gets the contiguous tensor it expects.
    """
    copy = graph.call_function(
        torch.ops.aten.clone.default, (node,), {"memory_format": torch.contiguous_format}
    )
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        copy.meta["val"] = torch.ops.aten.clone.default(
            node.meta["val"], memory_format=torch.contiguous_format
        )
    from torch._inductor import inductor_prims  # defines prims.inductor_force_stride_order

    val = copy.meta["val"]
    require_orderable_strides(val)
    strides: list[Any] = []
    stride: Any = 1
    for dim in reversed(range(val.dim())):  # contiguous strides, symbolic ones as nodes
        strides.append(stride)
        if dim == 0:
            break
        stride = emit_product(graph, stride, emit_size(graph, copy, dim, val.shape[dim]))
    strides.reverse()
    forced = graph.call_function(inductor_prims.force_stride_order, (copy, strides))
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        forced.meta["val"] = inductor_prims.force_stride_order(val, list(val.stride()))
    return forced


def _new_fake_like(val: torch.Tensor, fake_mode: Any) -> torch.Tensor:
    meta = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")
    return FakeTensor(fake_mode, meta, val.device)


def _propagate_fake(node: fx.Node, fake_mode: Any) -> None:
    if node.op != "call_function":
        return

    def val(a: Any) -> Any:
        return a.meta["val"] if isinstance(a, fx.Node) else a

    args = fx.node.map_aggregate(node.args, val)
    kwargs = fx.node.map_aggregate(node.kwargs, val)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        node.meta["val"] = node.target(*args, **kwargs)  # type: ignore[operator]


def _inline(
    graph: fx.Graph,
    node: fx.Node,
    trace: _Trace,
    args: list[Any],
    op: IrOp,
    donated: Mapping[int, frozenset[str]],
    ctx: PassContext,
) -> None:
    gm, fresh = trace.gm, trace.fresh
    tensor_args = [(i, a) for i, a in enumerate(args) if isinstance(a, fx.Node)]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env: dict[fx.Node, Any] = {}
    position: dict[fx.Node, int] = {}
    for ph, (i, a) in zip(placeholders, tensor_args, strict=True):
        env[ph] = a
        position[ph] = i
    names = list(op.signature.parameters)
    fake_mode = detect_fake_mode([a.meta.get("val") for _, a in tensor_args])
    with graph.inserting_before(node):
        for n in gm.graph.nodes:
            if n.op in ("placeholder", "output"):
                continue
            if n.op == "get_attr":
                env[n] = _copy_constant(graph, gm, n, fake_mode)
                continue
            new = graph.node_copy(n, lambda x: env[x])
            env[n] = new
            # The trace is shared by every node with this metadata, so its
            # FakeTensors are too; give each copy its own, so storages (views,
            # in-place writes) alias exactly what they alias here.
            if n in fresh and fake_mode is not None:
                new.meta["val"] = _new_fake_like(n.meta["val"], fake_mode)
            else:
                _propagate_fake(new, fake_mode)
            src = n.args[0] if n.args else None
            if n.target is torch.ops.aten.clone.default and src in position:
                i = position[src]
                new.meta[ACTIVATION_CLONE_META] = {
                    "op": op.name,
                    "argument": names[i],
                    "donated": i in donated,
                    "donated_inputs": donated.get(i, frozenset()),
                }
                ctx.clones_inserted += 1

    def mapped(value: Any) -> Any:
        return env[value] if isinstance(value, fx.Node) else value

    result = gm.graph.output_node().args[0]
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise RuntimeError(f"{node.name}: unexpected user {user.format_node()}")
            index = user.args[1]
            assert isinstance(index, int)
            user.replace_all_uses_with(mapped(result[index]))
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(mapped(result))
    graph.erase_node(node)
