"""Post-grad: remove the clones that are provably unnecessary.

A clone protects its source from a later in-place write to the copy. It can
go when writing into the source instead is unobservable:

1. the clone keeps the source's layout (a clone that makes a tensor
   contiguous for a kernel stays);
2. nothing writes the source, or any alias of it, after the clone;
3. something writes the clone (or a view of it); the first such write is W
   (a copy the lowering made for an activation the impl never writes goes
   too, unless the copy is a graph output);
4. nothing reads the source or any alias of it — view, ``as_strided``,
   aliasing ``reshape``, getitem of a multi-output op, graph output — at or
   after W;
5. if the source is (a view of) a graph input, the caller donated it to
   ``maybe_inplace`` at this call;
6. and, for a graph input, W is not an ATen op: Inductor's C++ backend in
   torch 2.13 can crash (``KeyError: 'bufN'``) compiling ATen ops that mutate
   graph inputs, so those clones stay.

Aliasing comes from the FakeTensors in node meta (shared storage), so every
op torch can run on FakeTensors is understood, not just a list of view ops.
"""

from __future__ import annotations

import torch
from torch import fx

from vllm_ir.compilation.aliasing import AliasGroups, written_args
from vllm_ir.compilation.context import get_pass_context
from vllm_ir.compilation.lowering import ACTIVATION_CLONE_META
from vllm_ir.compilation.pass_base import VllmIRPass

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
        clone.replace_all_uses_with(source)
        graph.erase_node(clone)
        aliases.merge(source, clone)
        removed += 1
    return removed, kept


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
    memory_format = clone.kwargs.get("memory_format")
    if memory_format not in (None, torch.preserve_format) or copy.stride() != original.stride():
        return "changes layout"
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
    if any(m.op == "placeholder" for m in source_aliases):
        info = clone.meta.get(ACTIVATION_CLONE_META)
        if not info or not info["donated"]:
            return "source is a graph input that was not donated"
        namespaces = [
            w.target.namespace for w in writes if isinstance(w.target, torch._ops.OpOverload)
        ]
        if "aten" in namespaces:
            return "ATen op would mutate a graph input (torch 2.13 Inductor CPU bug)"
    return None
