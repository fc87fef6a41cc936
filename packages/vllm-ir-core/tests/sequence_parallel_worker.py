"""One rank of the sequence-parallelism test (run by test_sequence_parallel.py).

Each rank holds a partial sum (as after a row-parallel linear layer); the
model all-reduces it and normalizes. Writes the compiled output, the
single-process reference and the collectives of the final graph to JSON.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import vllm_ir as ir

TOKENS, HIDDEN = 6, 16


class Model(torch.nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, HIDDEN))

    def forward(self, partial: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        full = fc.all_reduce(partial, "sum", dist.group.WORLD)
        if self.fused:
            out, res = ir.ops.fused_add_rms_norm(full, residual, self.weight, 1e-6)
            return out + res
        return ir.ops.rms_norm(full, self.weight, 1e-6)


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    partials = [
        torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(r))
        for r in range(world)
    ]
    residual = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(99))
    results = {}
    collectives: dict[str, list[str]] = {}

    class Record(ir.compilation.VllmIRPass):
        name = "record_collectives"

        def run(self, graph: torch.fx.Graph) -> None:
            collectives[label] = [
                str(n.target) for n in graph.nodes if "_c10d_functional" in str(n.target)
            ]

    for label, fused in (("rms_norm", False), ("fused_add_rms_norm", True)):
        model = Model(fused)
        torch._dynamo.reset()
        backend = ir.VllmIRBackend(passes={"sequence_parallel": True}, ir_passes=[Record()])
        with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
            got = torch.compile(model, backend=backend)(partials[rank], residual)
            full = sum(partials)
            if fused:
                o, r = ir.ops.fused_add_rms_norm.native(full, residual, model.weight, 1e-6)
                want = o + r
            else:
                want = ir.ops.rms_norm.native(full, model.weight, 1e-6)
        results[label] = {
            "max_diff": (got - want).abs().max().item(),
            "rewritten": backend.pass_contexts[0].fusions.get("sequence_parallel", 0),
            "collectives": collectives[label],
        }
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "world": world, "results": results}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    os._exit(0)
