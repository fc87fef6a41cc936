"""Post-grad: remove the clones that are provably unnecessary.

A clone protects its source from a later in-place write to the copy. It can
go when writing into the source instead is unobservable:

1. the clone is the source's exact twin: same shape and strides, and the
   source starts its storage (offset 0), so even a view taken with an
   absolute storage offset (``as_strided(clone, size, stride, 0)``) addresses
   the same elements (a clone that makes a tensor contiguous for a kernel
   stays);
2. nothing writes the source, or any alias of it, after the clone;
3. something writes the clone (or a view of it); the first such write is W
   (a copy the lowering made for an activation the impl never writes goes
   too, unless the copy is a graph output);
4. nothing reads the source or any alias of it — view, ``as_strided``,
   aliasing ``reshape``, getitem of a multi-output op, graph output — at or
   after W;
5. no value computed from the source before W is used at or after W (other
   than as an argument of W itself, when W is an opaque kernel): Inductor
   computes pointwise readers lazily, and a reader it materializes after W
   would see the written memory (torch 2.13 orders the readers it realizes
   for a mutation after the mutating kernel);
6. if the source is (a view of) a graph input, the caller donated exactly
   that input to ``maybe_inplace`` at this call: the lowering records the
   donated inputs by name, from the pre-grad graph, because Inductor's
   ``remove_noop_ops`` may have replaced a donated copy by its original;
7. and, for a graph input, W is not an ATen op: Inductor's C++ backend in
   torch 2.13 can crash (``KeyError: 'bufN'``) compiling ATen ops that mutate
   graph inputs, so those clones stay.

A write is whatever an op's schema declares; an op without a schema (a
higher-order op such as ``triton_kernel_wrapper_mutation``) writes every
tensor it receives. Aliasing comes from the FakeTensors in node meta (shared
storage), so every op torch can run on FakeTensors is understood, not just a
list of view ops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx
from torch._inductor import lowering as inductor_lowering
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

from vllm_ir.compilation._aliasing import AliasGroups, written_args
from vllm_ir.compilation._context import get_pass_context
from vllm_ir.compilation._lowering import ACTIVATION_CLONE_META
from vllm_ir.compilation._pass_base import VllmIRPass

__all__ = ["CloneEliminationPass", "eliminate_clones"]


class CloneEliminationPass(VllmIRPass):
    name = "clone_elimination"

    def run(self, graph: fx.Graph) -> None:
        ctx = get_pass_context()
        removed, kept = eliminate_clones(graph)
        ctx.clones_removed += removed
        ctx.clones_kept.update(kept)


def eliminate_clones(graph: fx.Graph) -> tuple[int, dict[str, str]]:
    """Remove provably unnecessary clones; returns (removed, {kept clone: reason})."""
    aliases = AliasGroups(graph)
    order = {n: i for i, n in enumerate(graph.nodes)}
    removed = 0
    kept: dict[str, str] = {}
    for clone in [n for n in graph.nodes if n.target is torch.ops.aten.clone.default]:
        reason = _why_needed(clone, aliases, order)
        if reason is not None:
            kept[clone.name] = reason
            continue
        source = clone.args[0]
        assert isinstance(source, fx.Node)
        _pass_on_donation(clone, aliases.aliases(clone), order)
        clone.replace_all_uses_with(source)
        graph.erase_node(clone)
        aliases.merge(source, clone)
        removed += 1
    return removed, kept


def _pass_on_donation(
    clone: fx.Node, copy_aliases: set[fx.Node], order: dict[fx.Node, int]
) -> None:
    """Once ``clone`` goes, values derived from it live in its source's memory.

    A later call that was donated such a value (the first call's output, say)
    may write what the first call's caller donated: the same memory, which
    is why the first clone could go. Without this the later clone would see
    an undonated graph input and stay; with it, a copy merged into an
    undonated input (never written) passes on nothing.
    """
    info = clone.meta.get(ACTIVATION_CLONE_META)
    granted = info.get("donated_inputs", frozenset()) if info else frozenset()
    if not granted:
        return
    for member in copy_aliases:
        for user in member.users:
            later = user.meta.get(ACTIVATION_CLONE_META)
            if (
                user.target is torch.ops.aten.clone.default
                and order[user] > order[clone]
                and later is not None
                and later["donated"]
            ):
                inherited = later.get("donated_inputs", frozenset()) | granted
                user.meta[ACTIVATION_CLONE_META] = {**later, "donated_inputs": inherited}


def _value(node: fx.Node) -> object:
    return node.meta.get("val")


def _writes_after(members: set[fx.Node], position: int, order: dict[fx.Node, int]) -> list[fx.Node]:
    """Nodes after ``position`` that write one of ``members``, in graph order."""
    found = {
        user
        for m in members
        for user in m.users
        if order[user] > position and m in written_args(user)
    }
    return sorted(found, key=order.__getitem__)


def _why_needed(clone: fx.Node, aliases: AliasGroups, order: dict[fx.Node, int]) -> str | None:
    source = clone.args[0]
    copy, original = _value(clone), _value(source) if isinstance(source, fx.Node) else None
    if not isinstance(source, fx.Node) or not isinstance(original, torch.Tensor):
        return "source is not a tensor node"
    if not isinstance(copy, torch.Tensor) or not aliases.groups(clone):
        return "clone has no tensor metadata"
    reason = _layout_differs(clone, copy, original)
    if reason is not None:
        return reason
    source_aliases = aliases.aliases(source)
    copy_aliases = aliases.aliases(clone)
    writes = _writes_after(copy_aliases, order[clone], order)
    source_writes = _writes_after(source_aliases, order[clone], order)
    if source_writes:
        return f"source written after the clone: by {source_writes[0].name}"
    if not writes:
        # A copy the lowering made for an activation the impl turned out not to
        # write: both hold the same values to the end, so one suffices, unless
        # the copy leaves the graph (an output must not start aliasing another).
        if ACTIVATION_CLONE_META not in clone.meta:
            return "clone is never written"
        if any(u.op == "output" for m in copy_aliases for u in m.users):
            return "clone is never written and is returned as a graph output"
        return None
    first_write = writes[0]
    for member in source_aliases:
        for user in member.users:
            if user is not clone and order[user] >= order[first_write]:
                if user.op == "output":
                    return f"source returned as graph output after the write: {member.name}"
                return f"source read after the write: {member.name} by {user.name}"
    reason = _read_early_used_late(clone, source_aliases, first_write, order)
    if reason is not None:
        return reason
    inputs = {m for m in source_aliases if m.op == "placeholder"}
    if inputs:
        info = clone.meta.get(ACTIVATION_CLONE_META)
        if not info or not info["donated"]:
            return "source is a graph input that was not donated"
        undonated = sorted(m.name for m in inputs if m.name not in info.get("donated_inputs", ()))
        if undonated:
            return f"source aliases graph input {undonated[0]}, which the caller did not donate"
        namespaces = [
            w.target.namespace for w in writes if isinstance(w.target, torch._ops.OpOverload)
        ]
        if "aten" in namespaces:
            return "ATen op would mutate a graph input (torch 2.13 Inductor CPU bug)"
    return None


def _layout_differs(clone: fx.Node, copy: torch.Tensor, original: torch.Tensor) -> str | None:
    memory_format = clone.kwargs.get("memory_format")
    if memory_format not in (None, torch.preserve_format):
        return "changes layout"
    if not _provably_equal(copy.shape, original.shape) or not _provably_equal(
        copy.stride(), original.stride()
    ):
        return "changes layout"
    if not statically_known_true(sym_eq(original.storage_offset(), 0)):
        return "source has a storage offset (views of the copy may address absolute offsets)"
    return None


# ATen ops Inductor always computes into a buffer of their own where they
# stand (extern kernels and GEMM templates), never lazily inside a consumer.
_EXTERN_ATEN = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.baddbmm.default,
        torch.ops.aten.convolution.default,
    }
)


def _computed_in_place(node: fx.Node) -> bool:
    """Whether Inductor materializes ``node``'s result at its position.

    True for the GEMMs above and for ops Inductor has no lowering for (they
    become fallback kernels, whose inputs are realized when they run); False
    for everything Inductor may fuse into a later consumer — and for
    anything unknown.
    """
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if target in _EXTERN_ATEN or target in inductor_lowering.fallbacks:
        return True
    return target not in inductor_lowering.lowerings and (
        target.overloadpacket not in inductor_lowering.lowerings
    )


def _provably_equal(a: Sequence[object], b: Sequence[object]) -> bool:
    if len(a) != len(b):
        return False
    return all(statically_known_true(sym_eq(x, y)) for x, y in zip(a, b, strict=True))


def _read_early_used_late(
    clone: fx.Node, source_aliases: set[fx.Node], write: fx.Node, order: dict[fx.Node, int]
) -> str | None:
    """A value derived from the source before ``write`` that is used at or after it."""
    limit = order[write]
    opaque_write = isinstance(write.target, torch._ops.OpOverload) and (
        write.target.namespace != "aten"
    )
    seen: set[fx.Node] = set()
    frontier = [
        u
        for m in source_aliases
        for u in m.users
        if u is not clone and u not in source_aliases and order[u] < limit
    ]
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if _computed_in_place(node):
            continue  # its result is a buffer computed here, before the write
        for user in node.users:
            if order[user] < limit:
                frontier.append(user)
            elif not (user is write and opaque_write):
                return (
                    f"{node.name} reads the source before the write and is used by "
                    f"{user.name} after it (Inductor may compute it late)"
                )
    return None
