"""The kernels through the whole compile pipeline: one compile, shared by the tests.

The model donates its activations with ``maybe_inplace``; the lowering places
the in-place kernel with clones of its activations and clone elimination must
remove every one of them. A second model quantizes each norm's output to FP8:
the ``fuse_norm_quant`` pass fuses the pairs and the fused ops lower to cpu_c.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import vllm_ir as ir
from cpu_c_testing import on_cpu_platform
from vllm_ir.testing import inductor_caches_off
from vllm_ir.testing.compiled import CompiledDecoderChecks
from vllm_ir_cpu import PROVIDER

pytestmark = on_cpu_platform

HIDDEN, LAYERS = 64, 3


no_cache = inductor_caches_off


class TestCompiledDecoder(CompiledDecoderChecks):
    """rms_norm, then per layer a linear and fused_add_rms_norm.maybe_inplace, cpu_c selected."""

    provider = PROVIDER
    batches = (5, 17)

    @pytest.fixture(scope="class")
    def provider_ready(self, kernels: Path) -> Path:
        return kernels


# -- norm + FP8 quant: the fusion pass, then the fused ops lowered to cpu_c ----

FUSED_CPU_C = {
    "rms_norm_static_fp8_quant": [PROVIDER],
    "fused_add_rms_norm_static_fp8_quant": [PROVIDER],
}
UNFUSED = ("rms_norm", "fused_add_rms_norm", "static_scaled_fp8_quant")


class QuantDecoder(torch.nn.Module):
    """rms_norm + static FP8 quant, then per layer a dequantizing linear,
    fused_add_rms_norm.maybe_inplace and a static quant: every norm is followed
    by a quant, so the fuse_norm_quant pass rewrites all LAYERS + 1 pairs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.linears = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS))
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(HIDDEN))
        self.register_buffer("scale", torch.tensor([0.02]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x
        q = ir.ops.static_scaled_fp8_quant(ir.ops.rms_norm(x, self.weight, 1e-6), self.scale)
        for linear in self.linears:
            h = linear(q.to(torch.float32) * self.scale)
            h, residual = ir.ops.fused_add_rms_norm.maybe_inplace(h, residual, self.weight, 1e-6)
            q = ir.ops.static_scaled_fp8_quant(h, self.scale)
        return q, residual


def test_norm_quant_fusion_lowers_to_cpu_c(kernels: Path) -> None:
    torch._dynamo.reset()
    model = QuantDecoder().eval()
    backend = ir.VllmIRBackend(priority=FUSED_CPU_C)
    fn = torch.compile(model, backend=backend, dynamic=True)
    x = torch.randn(7, HIDDEN)
    with no_cache(), torch.no_grad():
        got = fn(x.clone())
        with ir.IrOpPriorityConfig(**{op: [PROVIDER] for op in UNFUSED}).scope():
            eager = model(x.clone())
        with ir.IrOpPriorityConfig(**{op: ["native"] for op in UNFUSED}).scope():
            native = model(x.clone())
        got_other_batch = fn(torch.randn(3, HIDDEN))
    ctx = backend.pass_contexts[0]
    assert ctx.fusions["fuse_norm_quant"] == LAYERS + 1
    selected = backend.lowering_pass.selected_impls
    assert set(selected) == set(FUSED_CPU_C)
    assert len(selected["fused_add_rms_norm_static_fp8_quant"]) == LAYERS
    assert {p for nodes in selected.values() for p in nodes.values()} == {PROVIDER}
    # the fused kernels compute exactly the eager composition, and native's
    assert torch.equal(got[0].view(torch.uint8), eager[0].view(torch.uint8))
    assert torch.equal(got[1], eager[1])
    tol = ir.ops.fused_add_rms_norm_static_fp8_quant.tolerance(torch.float32)
    torch.testing.assert_close(got[0].float(), native[0].float(), atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(got[1], native[1])
    assert got_other_batch[0].shape == (3, HIDDEN)
    assert len(backend.pass_contexts) == 1  # dynamic batch: no recompile
    # The lowering copies both activations of each fused-add node; the residual's
    # copy goes (donated), and so does x's, which the kernel only reads.
    assert ctx.clones_inserted == 2 * LAYERS
    assert ctx.clones_removed == ctx.clones_inserted, ctx.clones_kept
    assert not ctx.clones_kept


# -- the autotune cache across processes ----------------------------------------

_AUTOTUNED = """
import json, torch, vllm_ir as ir
from vllm_ir.testing import TinyDecoder
torch.set_num_threads(1)
backend = ir.VllmIRBackend(autotune=True)
compiled = torch.compile(TinyDecoder(64, 2), backend=backend)
with torch.no_grad():
    compiled(torch.randn(16, 64))
records = {id(r): r for c in backend.pass_contexts for r in c.autotuned.values()}
print(json.dumps(sorted({(r.op, r.from_cache) for r in records.values()})))
"""


@pytest.mark.slow
def test_a_second_process_finds_every_autotune_record(kernels: Path, tmp_path: Path) -> None:
    """The kernels' lazily built library is not part of an impl's fingerprint
    (``__vllm_ir_caches__``): the records a process wrote before its kernels
    loaded are found by the next process, which measures nothing."""
    root = os.environ.get("VLLM_IR_CACHE_DIR") or str(Path.home() / ".cache" / "vllm_ir")
    cache = tmp_path / "cache"
    shutil.copytree(Path(root) / "extensions", cache / "extensions")  # built: not rebuilt
    env = {**os.environ, "VLLM_IR_CACHE_DIR": str(cache)}
    runs = []
    for i in range(2):
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / f"inductor{i}")  # a cold compile each
        done = subprocess.run(
            [sys.executable, "-c", _AUTOTUNED], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    ops = {"rms_norm", "fused_add_rms_norm"}
    assert {op for op, _ in runs[0]} == ops
    assert runs[0] == [[op, False] for op in sorted(ops)]  # measured
    assert runs[1] == [[op, True] for op in sorted(ops)]  # every record read back
