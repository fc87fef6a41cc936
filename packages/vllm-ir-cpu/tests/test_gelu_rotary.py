"""gelu_and_mul and both RoPE ops on cpu_c: conformance, exactness, the in-place contract."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import vllm_ir as ir
from cpu_c_testing import DTYPES, on_cpu_platform
from vllm_ir.testing import ConformanceCase, conformance_cases
from vllm_ir_cpu import PROVIDER
from vllm_ir_cpu.library import kernel_ops

pytestmark = on_cpu_platform

GELU = ir.ops.gelu_and_mul
ROPE = ir.ops.rotary_embedding
ROPE_FP32 = ir.ops.rotary_embedding_fp32
OPS = [GELU, ROPE, ROPE_FP32]
KERNELS = kernel_ops()


@pytest.mark.parametrize("case", conformance_cases(PROVIDER, ops=OPS), ids=str)
def test_conformance(kernels: Path, case: ConformanceCase) -> None:
    case.check()


def _results(op: ir.IrOp, sample: ir.SampleInput) -> dict[str, object]:
    with op.set_priority([PROVIDER]):
        assert op.selected_impl(*sample.args).provider == PROVIDER, sample.name
        got = {"op": op(*sample.clone().args)}
        if op.allow_inplace:
            got["maybe_inplace"] = op.maybe_inplace(*sample.clone().args)
    return got


@pytest.mark.parametrize("op", [ROPE, ROPE_FP32], ids=lambda op: op.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotary_is_bit_exact_in_every_dtype(kernels: Path, op: ir.IrOp, dtype: torch.dtype) -> None:
    # each product and the sum rounded as native's separate kernels round (for
    # rotary_embedding_fp32: in fp32, then once to the dtype): no FMA
    for sample in op.sample_inputs(dtype):
        want = op.native(*sample.clone().args)
        for how, got in _results(op, sample).items():
            for g, w in zip(got, want, strict=True):  # type: ignore[call-overload]
                assert torch.equal(g, w), f"{sample.name} {how}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gelu_and_mul_is_bit_exact_in_half_dtypes(kernels: Path, dtype: torch.dtype) -> None:
    # the erf form; the tanh form trades exactness for a 3x cheaper tanh (tolerance)
    torch.set_num_threads(1)  # ATen's parallel split could move its vectorized boundary
    for sample in GELU.sample_inputs(dtype):
        if sample.args[1] != "none":
            continue
        # ATen's own kernel: on a contiguous gate (one row) ATen hands F.gelu to oneDNN
        # where oneDNN takes the dtype (fp16 on CPUs with AVX512-FP16), whose erf
        # differs by an ulp near -1 (x = -4.65); the tolerance covers that path
        with torch.backends.mkldnn.flags(enabled=False):
            want = GELU.native(*sample.clone().args)
        assert torch.equal(_results(GELU, sample)["op"], want), sample.name  # type: ignore[arg-type]


def test_rotary_maybe_inplace_writes_into_hf_transposed_views(kernels: Path) -> None:
    # Hugging Face's [batch, heads, seq, head] projections, passed as transpose(1, 2)
    q_hf = torch.randn(2, 4, 3, 64, dtype=torch.bfloat16)
    k_hf = torch.randn(2, 2, 3, 64, dtype=torch.bfloat16)
    cos, sin = torch.randn(2, 2, 3, 32, dtype=torch.bfloat16).unbind(0)  # partial: 32 of 64
    q, k = q_hf.transpose(1, 2), k_hf.transpose(1, 2)
    want = ROPE.native(q.clone(), k.clone(), cos, sin, True)
    pass_through = q_hf[..., 32:].clone()
    with ROPE.set_priority([PROVIDER]):
        got_q, got_k = ROPE.maybe_inplace(q, k, cos, sin, True)
    assert got_q.data_ptr() == q.data_ptr()
    assert got_k.data_ptr() == k.data_ptr()
    assert torch.equal(got_q, want[0])
    assert torch.equal(got_k, want[1])
    assert torch.equal(q_hf[..., 32:], pass_through)


def test_rotary_default_overload_leaves_inputs_untouched(kernels: Path) -> None:
    sample = next(ROPE.sample_inputs(torch.float32))
    before = sample.clone()
    with ROPE.set_priority([PROVIDER]):
        ROPE(*sample.args)
    for a, b in zip(sample.args, before.args, strict=True):
        assert not isinstance(a, torch.Tensor) or torch.equal(a, b)


def test_functional_kernel_matches_native(kernels: Path) -> None:
    for sample in ROPE.sample_inputs(torch.bfloat16):
        got = KERNELS["rotary_embedding_functional"](*sample.args)
        want = ROPE.native(*sample.args)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), sample.name
        assert all(g.is_contiguous() for g in got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck_kernels(kernels: Path, dtype: torch.dtype) -> None:
    for sample in GELU.sample_inputs(dtype):
        torch.library.opcheck(KERNELS["gelu_and_mul"], sample.clone().args)
    for sample in ROPE.sample_inputs(dtype):
        for name in ("rotary_embedding", "rotary_embedding_functional", "rotary_embedding_fp32"):
            torch.library.opcheck(KERNELS[name], sample.clone().args)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        # cos in fp32 with bf16 query: native promotes the result to fp32
        (
            (
                torch.randn(3, 2, 8, dtype=torch.bfloat16),
                torch.randn(3, 1, 8, dtype=torch.bfloat16),
                torch.randn(3, 8),
                torch.randn(3, 8),
                True,
            ),
            "mixed dtypes",
        ),
        # cos with a dim query lacks: native broadcasts the output over it
        (
            (
                torch.randn(3, 2, 8),
                torch.randn(3, 1, 8),
                torch.randn(2, 3, 8),
                torch.randn(2, 3, 8),
            ),
            "cos of higher rank",
        ),
    ],
)
def test_rotary_declined_arguments_fall_back_to_native(
    kernels: Path, args: tuple[object, ...], why: str
) -> None:
    with ROPE.set_priority([PROVIDER]):
        assert ROPE.selected_impl(*args).provider == "native", why
        got = ROPE(*args)
    want = ROPE.native(*args)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), why


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_within_tolerance_far_out(kernels: Path, approximate: str) -> None:
    # erf/tanh saturate; exp overflows to inf and underflows to 0 in the fast tanh
    x = torch.linspace(-60, 60, 4 * 2051).reshape(2, -1)  # an odd half: 2051
    want = GELU.native(x, approximate)
    got = KERNELS["gelu_and_mul"](x, approximate)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **vars(GELU.tolerance(torch.float32)))


def test_gelu_unknown_approximate_is_natives_error(kernels: Path) -> None:
    x = torch.randn(2, 8)
    with GELU.set_priority([PROVIDER]):
        assert GELU.selected_impl(x, "fast").provider == "native"
        with pytest.raises(RuntimeError, match="approximate"):
            GELU(x, "fast")
    with pytest.raises(RuntimeError, match="approximate must be 'none' or 'tanh', got 'fast'"):
        KERNELS["gelu_and_mul"](x, "fast")


@pytest.mark.parametrize(
    ("cos_width", "message"),
    [(7, "rotary_dim .* must be even"), (10, "rotary_dim .* at most head_size 8, got 10")],
)
@pytest.mark.parametrize(
    ("kernel", "op"),
    [
        ("rotary_embedding_functional", "rotary_embedding"),
        ("rotary_embedding", "rotary_embedding"),
        ("rotary_embedding_fp32", "rotary_embedding_fp32"),
    ],
)
def test_rotary_kernel_errors_say_what_is_wrong(
    kernels: Path, cos_width: int, message: str, kernel: str, op: str
) -> None:
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    cos = torch.randn(3, cos_width)
    with pytest.raises(RuntimeError, match=f"vllm_ir_cpu::{op}: {message}"):
        KERNELS[kernel](q, k, cos, cos, True)
    with pytest.raises(RuntimeError, match=f"vllm_ir_cpu::{op}: key has dtype Double but query"):
        KERNELS[kernel](q, k.double(), cos[:, :8], cos[:, :8], True)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_rotary_of_head_size_zero_is_natives_empty_result(kernels: Path, is_neox: bool) -> None:
    # head_size 0 once counted rows as numel / head_size: a division by zero (SIGFPE)
    q, k, c = torch.randn(2, 4, 0), torch.randn(2, 4, 0), torch.randn(2, 0)
    with ROPE.set_priority([PROVIDER]):
        assert ROPE.selected_impl(q, k, c, c, is_neox).provider == PROVIDER
        out = ROPE(q, k, c, c, is_neox)
        inplace = ROPE.maybe_inplace(q.clone(), k.clone(), c, c, is_neox)
    for got in (out, inplace):
        assert [tuple(t.shape) for t in got] == [(2, 4, 0), (2, 4, 0)]
