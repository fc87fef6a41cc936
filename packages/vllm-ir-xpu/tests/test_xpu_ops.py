"""The wrapper ops on any machine: schemas, fake impls, opcheck, and one node per impl call."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir_xpu import layernorm, ops
from xpu_stand_ins import StandInXpuKernels

RMS = torch.ops.vllm_ir_xpu.rms_norm.default
FUSED = torch.ops.vllm_ir_xpu.fused_add_rms_norm.default


@pytest.mark.parametrize(
    ("op", "schema", "written"),
    [
        (RMS, "vllm_ir_xpu::rms_norm(Tensor x, Tensor weight, float epsilon) -> Tensor", set()),
        (
            FUSED,
            "vllm_ir_xpu::fused_add_rms_norm(Tensor(a0!) x, Tensor(a1!) x_residual, "
            "Tensor weight, float epsilon) -> ()",
            {"x", "x_residual"},
        ),
    ],
    ids=["rms_norm", "fused_add_rms_norm"],
)
def test_schema_marks_written_arguments(op: Any, schema: str, written: set[str]) -> None:
    assert str(op._schema) == schema
    mutable = {a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write}
    assert mutable == written


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
def test_fake_impls_give_metadata_without_the_kernels(dtype: torch.dtype) -> None:
    # no stand-in installed: fake impls never touch the vendor kernels
    with FakeTensorMode():
        x = torch.empty(3, 5, 64, dtype=dtype, device="xpu")
        residual = torch.empty_like(x)
        w = torch.empty(64, dtype=dtype, device="xpu")
        out = RMS(x, w, 1e-6)
        assert out.shape == x.shape
        assert out.dtype == dtype
        assert out.device.type == "xpu"
        assert out.is_contiguous()
        assert FUSED(x, residual, w, 1e-6) is None


def test_fake_impls_check_dtypes() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 8, dtype=torch.float16, device="xpu")
        with pytest.raises(RuntimeError, match=r"weight has dtype torch.float32 but x has"):
            RMS(x, torch.empty(8, device="xpu"), 1e-6)
        xd = torch.empty(2, 8, dtype=torch.float64, device="xpu")
        with pytest.raises(RuntimeError, match=r"x has dtype torch.float64; the XPU kernels"):
            FUSED(xd, torch.empty_like(xd), torch.empty(8, dtype=torch.float64, device="xpu"), 1e-6)


def _args(dtype: torch.dtype, *shape: int, strided: bool = False) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    hidden = shape[-1]
    x = torch.randn(*shape[:-1], 2 * hidden if strided else hidden, generator=gen).to(dtype)
    if strided:
        x = x[..., :hidden]
    return (
        x,
        torch.randn(*shape, generator=gen).to(dtype),
        torch.randn(hidden, generator=gen).to(dtype),
    )


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize(
    ("shape", "strided"), [((4, 64), False), ((2, 3, 96), False), ((4, 128), True)]
)
def test_opcheck_rms_norm(
    kernels: StandInXpuKernels, dtype: torch.dtype, shape: tuple[int, ...], strided: bool
) -> None:
    x, _, w = _args(dtype, *shape, strided=strided)
    torch.library.opcheck(RMS, (x, w, 1e-6))


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize(
    ("shape", "strided"), [((4, 64), False), ((2, 3, 96), False), ((4, 128), True)]
)
def test_opcheck_fused_add_rms_norm(
    kernels: StandInXpuKernels, dtype: torch.dtype, shape: tuple[int, ...], strided: bool
) -> None:
    x, r, w = _args(dtype, *shape, strided=strided)
    torch.library.opcheck(FUSED, (x, r, w, 1e-6))


def test_impls_trace_to_one_opaque_node_each() -> None:
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(4, 64, dtype=torch.bfloat16, device="xpu")
        r = torch.empty_like(x)
        w = torch.empty(64, dtype=torch.bfloat16, device="xpu")
        rms = make_fx(lambda x, w: layernorm.rms_norm(x, w, 1e-6))(x, w)
        fused = make_fx(lambda x, r, w: layernorm.fused_add_rms_norm(x, r, w, 1e-6))(x, r, w)
    rms_targets = [n.target for n in rms.graph.nodes if n.op == "call_function"]
    fused_targets = [n.target for n in fused.graph.nodes if n.op == "call_function"]
    assert rms_targets == [RMS]
    assert fused_targets == [FUSED]


def test_missing_weight_traces_to_a_ones_tensor() -> None:
    with FakeTensorMode():
        x = torch.empty(4, 64, dtype=torch.float16, device="xpu")
        gm = make_fx(lambda x: layernorm.rms_norm(x, None, 1e-6))(x)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets[-1] == RMS
    assert len(targets) == 2
