"""The kernel ops' wiring on any machine: schemas, fake impls, and the first-call build."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import vllm_ir.provider
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir_cuda import _build, layernorm, ops

RMS = torch.ops.vllm_ir_cuda.rms_norm.default
FUSED = torch.ops.vllm_ir_cuda.fused_add_rms_norm.default


@pytest.mark.parametrize(
    ("op", "schema", "written"),
    [
        (
            RMS,
            "vllm_ir_cuda::rms_norm(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()",
            {"out"},
        ),
        (
            FUSED,
            "vllm_ir_cuda::fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, "
            "Tensor? weight, float epsilon) -> ()",
            {"x", "x_residual"},
        ),
    ],
    ids=["rms_norm", "fused_add_rms_norm"],
)
def test_schema_marks_written_arguments(op: Any, schema: str, written: set[str]) -> None:
    assert str(op._schema) == schema
    mutable = {a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write}
    assert mutable == written
    assert op._schema.returns == []


def _fake_cuda(mode: FakeTensorMode, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    with mode:
        return torch.empty(*shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
def test_fake_impls_leave_metadata_unchanged(dtype: torch.dtype) -> None:
    with FakeTensorMode():
        x = torch.empty(3, 5, 64, dtype=dtype, device="cuda")
        out = torch.empty_like(x)
        residual = torch.empty_like(x)
        w = torch.empty(64, dtype=dtype, device="cuda")
        assert RMS(out, x, w, 1e-6) is None
        assert FUSED(x, residual, None, 1e-6) is None
        assert out.shape == x.shape == residual.shape == (3, 5, 64)
        assert out.device.type == "cuda"


def test_fake_impls_check_dtypes() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 8, dtype=torch.float16, device="cuda")
        with pytest.raises(RuntimeError, match=r"weight has dtype torch.float32 but x has"):
            RMS(torch.empty_like(x), x, torch.empty(8, device="cuda"), 1e-6)
        xd = torch.empty(2, 8, dtype=torch.float64, device="cuda")
        with pytest.raises(RuntimeError, match=r"x has dtype torch.float64; the kernels take"):
            FUSED(xd, torch.empty_like(xd), None, 1e-6)


def test_impls_trace_to_one_kernel_call_each() -> None:
    mode = FakeTensorMode()
    x = _fake_cuda(mode, 4, 64, dtype=torch.bfloat16)
    r = _fake_cuda(mode, 4, 64, dtype=torch.bfloat16)
    w = _fake_cuda(mode, 64, dtype=torch.bfloat16)
    with mode:
        rms = make_fx(lambda x, w: layernorm.rms_norm(x, w, 1e-6))(x, w)
        fused = make_fx(lambda x, r, w: layernorm.fused_add_rms_norm(x, r, w, 1e-6))(x, r, w)
    targets = [n.target for n in rms.graph.nodes if n.op == "call_function"]
    assert RMS in targets
    assert targets.count(RMS) == 1
    # the output buffer is the first argument, x the second
    (call,) = [n for n in rms.graph.nodes if n.target is RMS]
    x_node = next(n for n in rms.graph.nodes if n.op == "placeholder")
    assert call.args[1] is x_node
    assert call.args[0] is not x_node
    fused_calls = [n for n in fused.graph.nodes if n.target is FUSED]
    assert len(fused_calls) == 1
    placeholders = [n for n in fused.graph.nodes if n.op == "placeholder"]
    assert list(fused_calls[0].args[:3]) == placeholders  # in place on x, x_residual


def test_cpu_tensors_are_refused_with_the_reason() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match=r"runs on CUDA tensors only, got tensors on cpu"):
        RMS(torch.empty_like(x), x, None, 1e-6)
    with pytest.raises(RuntimeError, match=r"runs on CUDA tensors only"):
        FUSED(x, x.clone(), None, 1e-6)


def _first_call_args() -> tuple[Any, ...]:
    mode = FakeTensorMode()
    x = _fake_cuda(mode, 2, 8, dtype=torch.float16)
    with mode:
        out = torch.empty_like(x)
    return out, x, None, 1e-6


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch")
def test_first_cuda_call_builds_and_reports_why_it_cannot() -> None:
    kernel = ops._build_on_first_call("rms_norm")
    with pytest.raises(vllm_ir.provider.ExtensionBuildError, match="not a CUDA build"):
        kernel(*_first_call_args())
    assert not _build.is_loaded()


def test_first_cuda_call_builds_once_with_the_build_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    if torch._C._dispatch_has_kernel_for_dispatch_key("vllm_ir_cuda::rms_norm", "CUDA"):
        pytest.skip("the real kernels are loaded in this process")
    calls: list[dict[str, Any]] = []

    def fake_build(name: str, version: str, sources: Any, **kwargs: Any) -> Any:
        calls.append({"name": name, "version": version, "sources": sources, **kwargs})
        return tmp_path / f"{name}.so"

    monkeypatch.setattr(vllm_ir.provider, "build_extension", fake_build)
    monkeypatch.setattr(_build, "_library", None)
    kernel = ops._build_on_first_call("rms_norm")
    # the stand-in build registers nothing: the op says so instead of recursing
    with pytest.raises(RuntimeError, match=r"registered no CUDA kernel for vllm_ir_cuda::rms_norm"):
        kernel(*_first_call_args())
    with pytest.raises(RuntimeError, match=r"registered no CUDA kernel"):
        kernel(*_first_call_args())
    assert len(calls) == 1  # built once per process
    (call,) = calls
    assert call["with_cuda"] is True
    assert call["name"] == _build.LIBRARY_NAME
    assert {p.name for p in call["sources"]} >= {"binding.cpp", "layernorm_kernels.cu"}
    flags = call["extra_cuda_cflags"]
    assert "-gencode=arch=compute_80,code=sm_80" in flags
    assert "-gencode=arch=compute_90,code=sm_90" in flags


def test_tracing_and_discovery_never_build(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm_ir as ir

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("built before the first kernel call")

    monkeypatch.setattr(vllm_ir.provider, "build_extension", refuse)
    assert "vllm_c" in ir.ops.rms_norm.impls
    # eager call on CPU: native (pinned: an installed CPU provider would build its own kernels)
    with ir.ops.rms_norm.set_priority(["native"]):
        ir.ops.rms_norm(torch.randn(2, 8), None, 1e-6)
    mode = FakeTensorMode()
    x = _fake_cuda(mode, 4, 64, dtype=torch.float16)
    with mode:
        make_fx(lambda x: layernorm.rms_norm(x, None, 1e-6))(x)
        make_fx(lambda x, r: layernorm.fused_add_rms_norm(x, r, None, 1e-6))(x, x.clone())
