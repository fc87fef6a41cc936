"""The wrapper ops on any machine: schemas, fake impls, opcheck, and one node per impl call."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rocm_stand_ins import StandInAiter
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir_rocm import layernorm, ops

RMS = torch.ops.vllm_ir_rocm.rms_norm.default
FUSED = torch.ops.vllm_ir_rocm.fused_add_rms_norm.default


@pytest.mark.parametrize(
    ("op", "schema", "written"),
    [
        (RMS, "vllm_ir_rocm::rms_norm(Tensor x, Tensor weight, float epsilon) -> Tensor", set()),
        (
            FUSED,
            "vllm_ir_rocm::fused_add_rms_norm(Tensor(a0!) x, Tensor(a1!) x_residual, "
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
def test_fake_impls_give_metadata_without_aiter(dtype: torch.dtype) -> None:
    # no stand-in installed: fake impls never touch the vendor module
    with FakeTensorMode():
        x = torch.empty(3, 5, 64, dtype=dtype, device="cuda")
        residual = torch.empty_like(x)
        w = torch.empty(64, dtype=dtype, device="cuda")
        out = RMS(x, w, 1e-6)
        assert out.shape == x.shape
        assert out.dtype == dtype
        assert out.device.type == "cuda"
        assert out.is_contiguous()
        assert FUSED(x, residual, w, 1e-6) is None


def test_fake_impls_check_dtypes() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 8, dtype=torch.float16, device="cuda")
        with pytest.raises(RuntimeError, match=r"weight has dtype torch.float32 but x has"):
            RMS(x, torch.empty(8, device="cuda"), 1e-6)
        xf = torch.empty(2, 8, dtype=torch.float32, device="cuda")
        with pytest.raises(RuntimeError, match=r"x has dtype torch.float32; AITER's RMSNorm"):
            FUSED(xf, torch.empty_like(xf), torch.empty(8, device="cuda"), 1e-6)


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
    aiter: StandInAiter, dtype: torch.dtype, shape: tuple[int, ...], strided: bool
) -> None:
    x, _, w = _args(dtype, *shape, strided=strided)
    torch.library.opcheck(RMS, (x, w, 1e-6))


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 96)])
def test_opcheck_fused_add_rms_norm(
    aiter: StandInAiter, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x, r, w = _args(dtype, *shape)
    torch.library.opcheck(FUSED, (x, r, w, 1e-6))


def test_impls_trace_to_one_opaque_node_each() -> None:
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(4, 64, dtype=torch.bfloat16, device="cuda")
        r = torch.empty_like(x)
        w = torch.empty(64, dtype=torch.bfloat16, device="cuda")
        rms = make_fx(lambda x, w: layernorm.rms_norm(x, w, 1e-6))(x, w)
        fused = make_fx(lambda x, r, w: layernorm.fused_add_rms_norm(x, r, w, 1e-6))(x, r, w)
    rms_targets = [n.target for n in rms.graph.nodes if n.op == "call_function"]
    fused_targets = [n.target for n in fused.graph.nodes if n.op == "call_function"]
    assert rms_targets == [RMS]
    assert fused_targets == [FUSED]


def test_missing_weight_traces_to_a_ones_tensor() -> None:
    with FakeTensorMode():
        x = torch.empty(4, 64, dtype=torch.float16, device="cuda")
        gm = make_fx(lambda x: layernorm.rms_norm(x, None, 1e-6))(x)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets[-1] == RMS
    assert len(targets) == 2
