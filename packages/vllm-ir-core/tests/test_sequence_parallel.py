"""Sequence parallelism on a real 2-process gloo group (CPU), bounded in time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import vllm_ir as ir

WORKER = Path(__file__).with_name("sequence_parallel_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_rank_gloo_rewrite_matches_single_process(tmp_path: Path) -> None:
    world, port = 2, _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "VLLM_IR_PROVIDERS": "none",
        }
        out = tmp_path / f"rank{rank}.json"
        procs.append(
            (
                out,
                subprocess.Popen(
                    [sys.executable, str(WORKER), str(out)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
            )
        )
    for _, proc in procs:
        try:
            log, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for _, p in procs:
                p.kill()
            pytest.fail("sequence-parallel workers did not finish in 300 s")
        assert proc.returncode == 0, log
    for out, _ in procs:
        report = json.loads(out.read_text())
        for label, result in report["results"].items():
            assert result["rewritten"] == 1, (label, result)
            assert result["max_diff"] < 1e-5, (label, result)
            gathers = 1 if label == "rms_norm" else 2
            assert (
                result["collectives"].count("_c10d_functional.reduce_scatter_tensor.default") == 1
            )
            assert (
                result["collectives"].count("_c10d_functional.all_gather_into_tensor.default")
                == gathers
            )
            assert "_c10d_functional.all_reduce.default" not in result["collectives"]


def test_pass_is_off_by_default_and_switchable() -> None:
    assert "sequence_parallel" not in ir.IrPassConfig().enabled()
    backend = ir.VllmIRBackend(passes={"sequence_parallel": True})
    assert [type(p).__name__ for p in backend.ir_passes] == [
        "NormQuantFusionPass",
        "SequenceParallelismPass",
    ]


def test_values_without_a_token_dimension_are_left_alone() -> None:
    """A 1-D value (the hidden dim alone) and a residual that broadcasts over the
    tokens cannot be split over ranks: the pass says why and leaves them."""
    import torch
    from torch import fx
    from vllm_ir.compilation._sequence_parallel import SequenceParallelismPass

    graph = fx.Graph()
    reduce = graph.call_function(torch.ops.aten.clone.default, (graph.placeholder("x"),))
    wait = graph.call_function(torch.ops.aten.clone.default, (reduce,))
    graph.output(graph.call_function(torch.ops.aten.clone.default, (wait,)))
    residual = graph.placeholder("residual")
    why = SequenceParallelismPass._unsupported(wait, reduce, torch.empty(8), "g")
    assert why == "a 1-D value has no token dimension to split"
    residual.meta["val"] = torch.empty(1, 8)
    why = SequenceParallelismPass._unsupported(wait, reduce, torch.empty(4, 8), "g", residual)
    assert why == "the residual's shape (1, 8) is not the value's (4, 8)"
