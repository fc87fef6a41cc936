"""Post-grad, on IR: sequence parallelism around RMSNorm.

An ``all_reduce`` whose result feeds only an RMSNorm computes the same
normalized tokens on every rank. Split the tokens instead::

    all_reduce(x) -> rms_norm
      becomes
    reduce_scatter(x) -> rms_norm(own tokens) -> all_gather

and for ``fused_add_rms_norm`` the residual is sliced to the rank's tokens and
both outputs are gathered. The same bytes cross the network (reduce-scatter +
all-gather = all-reduce) while each rank normalizes 1/world of the tokens.

The pass works on ``torch.distributed`` functional collectives
(``_c10d_functional``), so it runs on gloo on CPU and NCCL on GPUs. It leaves
a match alone, and logs why, unless the token count is static and divisible
by the world size and the all-reduced value has no other user. The graph it
produces is specific to this rank; its ``uuid()`` covers rank and world size.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

from vllm_ir._base.logger import get_logger
from vllm_ir.compilation._context import get_pass_context
from vllm_ir.compilation._lowering import _propagate_fake
from vllm_ir.compilation._pass_base import VllmIRPass
from vllm_ir.compilation.ir_nodes import call_args, ir_op_of, is_ir_node
from vllm_ir.ops import fused_add_rms_norm, rms_norm

__all__ = ["SequenceParallelismPass"]

logger = get_logger(__name__)

_c10d = torch.ops._c10d_functional


def _group(group_name: Any) -> Any:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


class SequenceParallelismPass(VllmIRPass):
    name = "sequence_parallel"

    def cache_state(self) -> Any:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        return (dist.get_rank(), dist.get_world_size())

    def run(self, graph: fx.Graph) -> None:
        rewritten = 0
        for node in [n for n in graph.nodes if is_ir_node(n, "default")]:
            op = ir_op_of(node)
            if op is rms_norm or op is fused_add_rms_norm:
                rewritten += self._rewrite(graph, node, op)
        ctx = get_pass_context()
        ctx.fusions[self.name] = ctx.fusions.get(self.name, 0) + rewritten

    def _rewrite(self, graph: fx.Graph, node: fx.Node, op: Any) -> int:
        args = call_args(node, op)
        wait = args[0]
        if not (isinstance(wait, fx.Node) and wait.target is _c10d.wait_tensor.default):
            return 0
        reduce = wait.args[0]
        if not (isinstance(reduce, fx.Node) and reduce.target is _c10d.all_reduce.default):
            return 0
        source, reduce_op, group_name = reduce.args[:3]
        value = wait.meta.get("val")
        residual = args[1] if op is fused_add_rms_norm else None
        why = self._unsupported(wait, reduce, value, group_name, residual)
        if why:
            logger.debug("%s: %s left alone: %s", self.name, node.name, why)
            return 0
        assert isinstance(value, torch.Tensor)
        group = _group(group_name)
        world, rank = group.size(), group.rank()
        fake_mode = detect_fake_mode([value])
        new_nodes: list[fx.Node] = []

        def add(target: Any, *call: Any) -> fx.Node:
            created = graph.call_function(target, call)
            new_nodes.append(created)
            return created

        with graph.inserting_before(node):
            scattered = add(
                _c10d.reduce_scatter_tensor.default, source, reduce_op, world, group_name
            )
            shard = add(_c10d.wait_tensor.default, scattered)
            for created in new_nodes:
                _propagate_fake(created, fake_mode)
            new_args = [shard, *args[1:]]
            if op is fused_add_rms_norm:
                residual = args[1]
                tokens = value.shape[0] // world
                new_args[1] = add(
                    torch.ops.aten.slice.Tensor, residual, 0, rank * tokens, (rank + 1) * tokens
                )
                _propagate_fake(new_args[1], fake_mode)
            local = add(op.torch_op, *new_args)
            local.meta.update({k: v for k, v in node.meta.items() if k != "val"})
            _propagate_fake(local, fake_mode)
            outputs = (
                [local] if op is rms_norm else [add(operator.getitem, local, i) for i in range(2)]
            )
            gathered = []
            for out in outputs:
                _propagate_fake(out, fake_mode)
                full = add(_c10d.all_gather_into_tensor.default, out, world, group_name)
                _propagate_fake(full, fake_mode)
                done = add(_c10d.wait_tensor.default, full)
                _propagate_fake(done, fake_mode)
                gathered.append(done)
        if op is rms_norm:
            node.replace_all_uses_with(gathered[0])
        else:
            for user in list(node.users):
                user.replace_all_uses_with(gathered[user.args[1]])  # type: ignore[index]
                graph.erase_node(user)
        graph.erase_node(node)
        graph.erase_node(wait)
        graph.erase_node(reduce)
        logger.debug(
            "%s: %s now normalizes %d of %d tokens on rank %d",
            self.name,
            node.name,
            value.shape[0] // world,
            value.shape[0],
            rank,
        )
        return 1

    @staticmethod
    def _unsupported(
        wait: fx.Node, reduce: fx.Node, value: Any, group_name: Any, residual: Any = None
    ) -> str | None:
        if len(wait.users) != 1 or len(reduce.users) != 1:
            return "the all-reduced value has other users"
        if not isinstance(value, torch.Tensor):
            return "no tensor metadata"
        # dim 0 is a token dimension only with a hidden dimension after it
        if value.dim() < 2:
            return f"a {value.dim()}-D value has no token dimension to split"
        if residual is not None:
            # the residual is sliced along the same tokens: it must have them all
            rval = residual.meta.get("val") if isinstance(residual, fx.Node) else None
            if not isinstance(rval, torch.Tensor) or tuple(rval.shape) != tuple(value.shape):
                shape = tuple(rval.shape) if isinstance(rval, torch.Tensor) else None
                return f"the residual's shape {shape} is not the value's {tuple(value.shape)}"
        tokens = value.shape[0]
        if not isinstance(tokens, int):
            return "the token count is dynamic"
        world = _group(group_name).size()
        if tokens % world:
            return f"{tokens} tokens do not divide over {world} ranks"
        return None
