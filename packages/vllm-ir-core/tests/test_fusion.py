"""Norm + FP8 quant fusion: one pattern per IR op, independent of impls."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir.compilation import NormQuantFusionPass, pass_context
from vllm_ir.compilation._context import DONATED_META
from vllm_ir.compilation._functionalize import InplaceFunctionalizationPass

H = 32
SCALE = torch.tensor([0.02])
QUANT = ir.ops.static_scaled_fp8_quant


def inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(4, H, generator=g),
        torch.randn(4, H, generator=g),
        torch.rand(H, generator=g),
    )


def targets(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if str(n.target).startswith("vllm_ir.")]


def fuse(fn, *args):  # type: ignore[no-untyped-def]
    gm = make_fx(fn, tracing_mode="fake")(*args, SCALE)
    with pass_context() as ctx:
        InplaceFunctionalizationPass()(gm.graph)
        NormQuantFusionPass()(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return gm, ctx


def norm_quant(x, r, w, scale):  # type: ignore[no-untyped-def]
    return QUANT(ir.ops.rms_norm(x, w, 1e-6), scale)


def norm_used_twice(x, r, w, scale):  # type: ignore[no-untyped-def]
    y = ir.ops.rms_norm(x, w, 1e-6)
    return QUANT(y, scale), y.sum()


def norm_with_variance_size(x, r, w, scale):  # type: ignore[no-untyped-def]
    return QUANT(ir.ops.rms_norm(x, w, 1e-6, 16), scale)


def add_norm_quant(x, r, w, scale):  # type: ignore[no-untyped-def]
    y, r = ir.ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
    return QUANT(y, scale), r * 2


def add_norm_used_twice(x, r, w, scale):  # type: ignore[no-untyped-def]
    y, r = ir.ops.fused_add_rms_norm(x, r, w, 1e-6)
    return QUANT(y, scale), y + r


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (norm_quant, ["vllm_ir.rms_norm_static_fp8_quant.default"]),
        (norm_used_twice, ["vllm_ir.rms_norm.default", "vllm_ir.static_scaled_fp8_quant.default"]),
        (
            norm_with_variance_size,
            ["vllm_ir.rms_norm.default", "vllm_ir.static_scaled_fp8_quant.default"],
        ),
        (add_norm_quant, ["vllm_ir.fused_add_rms_norm_static_fp8_quant.default"]),
        (
            add_norm_used_twice,
            ["vllm_ir.fused_add_rms_norm.default", "vllm_ir.static_scaled_fp8_quant.default"],
        ),
    ],
)
def test_pattern_matches_only_when_safe(fn, expected: list[str]) -> None:  # type: ignore[no-untyped-def]
    gm, ctx = fuse(fn, *inputs())
    assert targets(gm) == expected
    assert ctx.fusions["fuse_norm_quant"] == (1 if len(expected) == 1 else 0)
    want = fn(*(t.clone() for t in inputs()), SCALE)
    got = gm(*(t.clone() for t in inputs()), SCALE)
    for g, w in zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]:
        tol = QUANT.tolerance(torch.float32)
        torch.testing.assert_close(g.float(), w.float(), atol=tol.atol, rtol=tol.rtol)


def test_fused_node_keeps_the_donation_record() -> None:
    gm, _ = fuse(add_norm_quant, *inputs())
    node = next(n for n in gm.graph.nodes if "fp8_quant" in str(n.target))
    assert node.meta["custom"][DONATED_META] == (0, 1)


def test_pass_config_switches_fusion() -> None:
    on = ir.VllmIRBackend()
    off = ir.VllmIRBackend(passes={"fuse_norm_quant": False})
    assert [type(p).__name__ for p in on.ir_passes] == ["NormQuantFusionPass"]
    assert off.ir_passes == ()
    assert ir.KernelConfig(ir_passes={"fuse_norm_quant": False}).ir_passes == ir.IrPassConfig(
        fuse_norm_quant=False
    )
    with pytest.raises(ValueError, match="unknown IR pass"):
        ir.IrPassConfig(fuse_everything=True)
    with pytest.raises(ValueError, match="expected on or off"):
        ir.config.parse_ir_pass_args(["--ir-pass.fuse_norm_quant=maybe"])


class NormQuantModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(H, H)
        self.weight = torch.nn.Parameter(torch.rand(H))
        self.register_buffer("scale", SCALE.clone())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, r = ir.ops.fused_add_rms_norm.maybe_inplace(self.linear(x), x, self.weight, 1e-6)
        return QUANT(y, self.scale), r


@pytest.mark.parametrize("fusion", [True, False])
def test_compiled_equals_eager_with_fusion_on_and_off(fusion: bool) -> None:
    torch._dynamo.reset()
    model = NormQuantModel().eval()
    backend = ir.VllmIRBackend(passes={"fuse_norm_quant": fusion})
    x = torch.randn(6, H)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        want = model(x.clone())
        got = torch.compile(model, backend=backend)(x.clone())
    assert backend.pass_contexts[0].fusions.get("fuse_norm_quant", 0) == int(fusion)
    selected = backend.lowering_pass.selected_impls
    assert ("fused_add_rms_norm_static_fp8_quant" in selected) is fusion
    tol = QUANT.tolerance(torch.float32)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(got[1], want[1])
