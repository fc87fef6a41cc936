"""Post-grad, on IR: RMSNorm followed by static FP8 quantization -> one fused op.

Two patterns, one IR node each, whatever impls will be selected later:

* ``rms_norm(x, w, eps)`` -> ``static_scaled_fp8_quant(., scale)``
  becomes ``rms_norm_static_fp8_quant(x, w, eps, scale)``;
* ``fused_add_rms_norm(x, r, w, eps)[0]`` -> ``static_scaled_fp8_quant(., scale)``
  becomes ``fused_add_rms_norm_static_fp8_quant(x, r, w, eps, scale)``, whose
  second output replaces the residual.

A match is left alone when the normalized value has another user (it would
have to be computed anyway), when ``variance_size`` is set, or when the scale
is computed after the norm (the fused node takes the norm's place).
"""

from __future__ import annotations

import operator
from typing import Any

from torch import fx

from vllm_ir._base.logger import get_logger
from vllm_ir.compilation._context import get_pass_context
from vllm_ir.compilation._pass_base import VllmIRPass
from vllm_ir.compilation.ir_nodes import call_args, ir_op_of, is_ir_node
from vllm_ir.ops import (
    fused_add_rms_norm,
    fused_add_rms_norm_static_fp8_quant,
    rms_norm,
    rms_norm_static_fp8_quant,
    static_scaled_fp8_quant,
)

__all__ = ["NormQuantFusionPass"]

logger = get_logger(__name__)


def _op_node(node: Any, op: Any) -> bool:
    return isinstance(node, fx.Node) and is_ir_node(node, "default") and ir_op_of(node) is op


def _defined_before(value: Any, node: fx.Node, order: dict[fx.Node, int]) -> bool:
    return not isinstance(value, fx.Node) or order[value] < order[node]


class NormQuantFusionPass(VllmIRPass):
    name = "fuse_norm_quant"

    def run(self, graph: fx.Graph) -> None:
        order = {n: i for i, n in enumerate(graph.nodes)}
        fused = 0
        for quant in [n for n in graph.nodes if _op_node(n, static_scaled_fp8_quant)]:
            source, scale = call_args(quant, static_scaled_fp8_quant)
            if _op_node(source, rms_norm):
                fused += self._fuse_rms_norm(graph, quant, source, scale, order)
            elif (
                isinstance(source, fx.Node)
                and source.target is operator.getitem
                and source.args[1] == 0
                and _op_node(source.args[0], fused_add_rms_norm)
            ):
                fused += self._fuse_add_rms_norm(graph, quant, source, scale, order)
        ctx = get_pass_context()
        ctx.fusions[self.name] = ctx.fusions.get(self.name, 0) + fused
        if fused:
            logger.debug("%s: fused %d norm + quant pairs", self.name, fused)

    def _fuse_rms_norm(
        self,
        graph: fx.Graph,
        quant: fx.Node,
        norm: fx.Node,
        scale: Any,
        order: dict[fx.Node, int],
    ) -> int:
        x, weight, epsilon, variance_size = call_args(norm, rms_norm)
        if variance_size is not None or len(norm.users) != 1:
            return 0
        if not _defined_before(scale, norm, order):
            return 0
        with graph.inserting_before(norm):
            new = graph.call_function(
                rms_norm_static_fp8_quant.torch_op, (x, weight, epsilon, scale)
            )
        new.meta.update(quant.meta)
        quant.replace_all_uses_with(new)
        graph.erase_node(quant)
        graph.erase_node(norm)
        return 1

    def _fuse_add_rms_norm(
        self,
        graph: fx.Graph,
        quant: fx.Node,
        normed: fx.Node,
        scale: Any,
        order: dict[fx.Node, int],
    ) -> int:
        node = normed.args[0]
        assert isinstance(node, fx.Node)
        x, residual, weight, epsilon, variance_size = call_args(node, fused_add_rms_norm)
        if variance_size is not None or len(normed.users) != 1:
            return 0
        if not _defined_before(scale, node, order):
            return 0
        getitems = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if set(getitems) - {0, 1} or len(getitems) != len(node.users):
            return 0
        with graph.inserting_before(node):
            new = graph.call_function(
                fused_add_rms_norm_static_fp8_quant.torch_op, (x, residual, weight, epsilon, scale)
            )
            q = graph.call_function(operator.getitem, (new, 0))
            r = graph.call_function(operator.getitem, (new, 1))
        new.meta.update(node.meta)  # keeps the donation record of maybe_inplace
        residual_val = getitems[1].meta.get("val") if 1 in getitems else None
        new.meta["val"] = (quant.meta.get("val"), residual_val)
        q.meta.update(quant.meta)
        if 1 in getitems:
            r.meta.update(getitems[1].meta)
            getitems[1].replace_all_uses_with(r)
            graph.erase_node(getitems[1])
        quant.replace_all_uses_with(q)
        graph.erase_node(quant)
        graph.erase_node(normed)
        graph.erase_node(node)
        if not r.users:
            graph.erase_node(r)
        return 1
