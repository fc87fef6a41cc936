"""One compiled graph per size range, picked at run time without a guard.

A graph whose IR ops have bucketed priorities and a dynamic token count
would otherwise branch per op (:mod:`~vllm_ir.compilation._bucket_branches`:
a ``torch.cond`` per call, which Inductor cannot fuse across). When every
bucketed op of the graph counts its tokens with the same expression (the
usual case: ``x.shape[0]``, or batch times sequence), the backend instead cuts
that expression's value range at the union of the ops' bucket bounds and
compiles the graph once per piece, each with its range assumed
(:func:`vllm_ir._selection.buckets.assume_range`), so every op selects its one bucket
and fuses as with a fixed priority. The callable it returns reads the token
count from its arguments (a size input, or a tensor's dim) and runs the
piece's graph: no Dynamo guard, no recompile across sizes.

Each piece is a full Inductor compile (``n`` pieces cost ``n`` compiles,
each cached by Inductor like any graph). ``VllmIRBackend(bucket_dispatch=
"branches")`` keeps the per-op branches instead (one compile).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from vllm_ir._selection.buckets import SizePlan, symbolic_range
from vllm_ir.compilation.ir_nodes import call_args, ir_op_of, is_ir_node

__all__ = ["SizeSwitch", "plan_switch", "switch_between"]


@dataclass(frozen=True)
class SizeSwitch:
    """Where a graph is cut: its token count and the size range of each piece."""

    expr: Any
    """The token count (a sympy expression over the graph's size symbols)."""
    ranges: tuple[tuple[int, int], ...]
    """``(low, high)`` per piece, ascending; together the expression's value range."""
    read: Callable[[Sequence[Any]], int]
    """The token count of a call, from the compiled graph's arguments."""

    @property
    def highs(self) -> list[int]:
        """The largest count of each piece but the last (the cut points)."""
        return [high for _low, high in self.ranges[:-1]]

    def piece(self, tokens: int) -> int:
        """The piece serving a call of ``tokens`` tokens."""
        return bisect.bisect_left(self.highs, tokens)


def plan_switch(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    plan_of: Callable[[Any], SizePlan],
    select_at: Callable[[Any, Sequence[Any], int], Any],
) -> SizeSwitch | None:
    """How to cut ``gm`` (a Dynamo graph) by size, or None: no bucketed op with a
    symbolic token count, counts that differ between ops, a count not readable
    from the arguments, or one selection per op across the count's whole range.

    ``plan_of(op)`` gives an op's size plan and ``select_at(op, args,
    tokens)`` its impl for a call of ``tokens`` tokens, under the backend's
    priorities. Neighbouring ranges in which every op selects alike are one piece.
    """
    expr: Any = None
    cuts: set[int] = set()
    sample: Any = None
    calls = []
    for node in gm.graph.nodes:
        if not is_ir_node(node):
            continue
        op = ir_op_of(node)
        plan = plan_of(op)
        if not plan:
            continue
        args = [_fake(a) for a in call_args(node, op)]
        tokens = op.tokens(*args)
        if type(tokens) is int:
            continue
        if expr is not None and tokens.node.expr != expr:
            return None  # ops counting different sizes: branch per op instead
        expr, sample = tokens.node.expr, tokens
        cuts.update(plan.bounds)
        calls.append((op, args))
    if expr is None:
        return None
    low, high = symbolic_range(sample)
    every_op = SizePlan(tuple(sorted(cuts)))  # cut wherever some op's buckets change
    ranges: list[tuple[int, int]] = []
    chosen: list[tuple[Any, ...]] = []
    for i in every_op.indices(low, high):
        top = every_op.upper(i)
        start, end = every_op.lowest(i, low), high if top is None else min(top, high)
        picks = tuple(select_at(op, args, start) for op, args in calls)
        if chosen and chosen[-1] == picks:
            ranges[-1] = (ranges[-1][0], end)  # every op selects as below: one piece
        else:
            ranges.append((start, end))
            chosen.append(picks)
    if len(ranges) == 1:
        return None
    read = _reader(expr, gm, example_inputs)
    if read is None:
        return None
    return SizeSwitch(expr, tuple(ranges), read)


def switch_between(switch: SizeSwitch, pieces: Sequence[Callable[..., Any]]) -> Callable[..., Any]:
    """The compiled graph: each call runs the piece of its token count."""
    # bound once: a call reads the count and bisects, nothing more
    highs = switch.highs
    read = switch.read
    cut = bisect.bisect_left
    pieces = list(pieces)

    def run(*args: Any) -> Any:
        return pieces[cut(highs, read(args))](*args)

    run.size_switch = switch  # type: ignore[attr-defined]
    return run


def _fake(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return value.meta.get("example_value", value.meta.get("val"))
    return value


def _reader(
    expr: Any, gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> Callable[[Sequence[Any]], int] | None:
    """``args -> value of expr``: ``c * s1**k1 * ...`` with each symbol read from a
    size argument, else from a tensor argument's dim; None if one is not found."""
    import sympy  # only when compiling: importing vllm_ir does not load sympy

    coefficient, factors = 1, []
    for factor in sympy.Mul.make_args(expr):
        if factor.is_Integer:
            coefficient *= int(factor)
            continue
        base, power = factor.as_base_exp()
        if not (base.is_Symbol and power.is_Integer and int(power) > 0):
            return None
        where = _where(base, gm, example_inputs)
        if where is None:
            return None
        factors.append((*where, int(power)))

    def read(args: Sequence[Any]) -> int:
        total = coefficient
        for index, dim, power in factors:
            value = args[index] if dim is None else args[index].shape[dim]
            total *= value**power
        return int(total)

    return read


def _where(
    symbol: Any, gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> tuple[int, int | None] | None:
    """``(argument index, dim)`` holding ``symbol`` (dim None: a size argument)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return None
    tensors = []
    for index, node in enumerate(placeholders):
        value = node.meta.get("example_value", example_inputs[index])
        if isinstance(value, torch.SymInt) and value.node.expr == symbol:
            return index, None
        if isinstance(value, torch.Tensor):
            tensors.append((index, value))
    for index, value in tensors:
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                return index, dim
    return None
