"""Pre-grad: ``maybe_inplace`` -> ``default``, after checking the donation is honoured.

A donated activation may be overwritten by the op, so nothing may read it —
or any view or alias of it, taken before or after the call — once the op has
run. Such a program raises ``ValueError`` naming the op, the activation and
the reader. Each rewritten node remembers which of its arguments were
donated (``meta["custom"]``), which the lowering and clone elimination read
after AOTAutograd.
"""

from __future__ import annotations

from torch import fx

from vllm_ir.compilation.aliasing import AliasGroups
from vllm_ir.compilation.context import DONATED_META, Donation, get_pass_context
from vllm_ir.compilation.ir_nodes import call_args, ir_op_of, is_ir_node
from vllm_ir.compilation.pass_base import VllmIRPass

__all__ = ["InplaceFunctionalizationPass"]


class InplaceFunctionalizationPass(VllmIRPass):
    name = "inplace_functionalization"

    def run(self, graph: fx.Graph) -> None:
        nodes = [n for n in graph.nodes if is_ir_node(n, "maybe_inplace")]
        if not nodes:
            return
        ctx = get_pass_context()
        aliases = AliasGroups(graph)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for node in nodes:
            op = ir_op_of(node)
            args = call_args(node, op)
            donated: list[int] = []
            seen: dict[fx.Node, str] = {}
            for name in op.activations:
                index = list(op.signature.parameters).index(name)
                value = args[index]
                if not isinstance(value, fx.Node):
                    continue
                if value in seen:
                    raise ValueError(
                        f"{op.name}.maybe_inplace: {value.name} is passed as both "
                        f"{seen[value]!r} and {name!r}; a tensor can be donated once per call"
                    )
                seen[value] = name
                group = aliases.aliases(value)
                _check_not_read_after(op.name, name, value, node, group, order)
                donated.append(index)
                ctx.donations.append(
                    Donation(
                        op.name,
                        node.name,
                        name,
                        value.name,
                        any(m.op == "placeholder" for m in group),
                    )
                )
            node.target = op.torch_op
            node.meta.setdefault("custom", {})[DONATED_META] = tuple(donated)
            ctx.functionalized += 1


def _check_not_read_after(
    op_name: str,
    arg_name: str,
    value: fx.Node,
    call: fx.Node,
    group: set[fx.Node],
    order: dict[fx.Node, int],
) -> None:
    for member in group:
        for user in member.users:
            if user is call or order[user] < order[call]:
                continue
            via = "" if member is value else f" through its alias {member.name}"
            reader = "the graph output" if user.op == "output" else f"{user.name} ({user.target})"
            raise ValueError(
                f"{op_name}.maybe_inplace donates activation {arg_name!r} ({value.name}), "
                f"but {reader} reads it{via} after the call. A donated tensor may hold "
                "garbage afterwards: clone it before the call, or call the default "
                f"overload ir.ops.{op_name}(...) which leaves its inputs intact."
            )
