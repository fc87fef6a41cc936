"""The vllm_c impls of gelu_and_mul and rotary_embedding over CPU stand-ins of their
kernels: schemas, fake impls, the conformance kit, rotary's in-place contract, the
layouts copied and the sizes left to native, and what ``supports_args`` declines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import vllm_ir as ir
from cuda_stand_ins import STANDIN, StandInKernels, conformance_params
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir.testing import ConformanceCase
from vllm_ir_cuda import ops, quant

NAMES = ("gelu_and_mul", "rotary_embedding")
GELU = ir.ops.gelu_and_mul
ROPE = ir.ops.rotary_embedding


@pytest.fixture
def new_standin(cpu_kernels: StandInKernels) -> Iterator[StandInKernels]:
    """The vllm_c impl functions of the two ops, as provider STANDIN over the CPU kernels."""
    supports = quant.supports_args_for("cpu")
    for name in NAMES:
        ir.get_op(name).register_impl(
            STANDIN,
            supports_args=supports[name],
            inplace=name in quant.INPLACE,
            batch_invariant=True,
        )(quant.IMPLS[name])
    yield cpu_kernels
    for name in NAMES:
        if STANDIN in ir.get_op(name).registered_impls:
            ir.get_op(name).unregister_impl(STANDIN)


def _tables(tokens: tuple[int, ...], rot: int, dtype: torch.dtype = torch.float32):  # type: ignore[no-untyped-def]
    angles = torch.rand(*tokens, rot // 2) * 6
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)


# -- schemas and fakes --------------------------------------------------------------


def test_schemas_mark_written_arguments() -> None:
    for op, written in ((ops.gelu_and_mul, {"out"}), (ops.rotary_embedding, {"query", "key"})):
        assert str(op._schema) == f"vllm_ir_cuda::{ops.SCHEMAS[op._schema.name.split('::')[1]]}"
        mutable = {a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write}
        assert mutable == written
        assert op._schema.returns == []


def test_fake_impls_check_like_the_binding() -> None:
    with FakeTensorMode():
        x = torch.empty(2, 8, dtype=torch.float16, device="cuda")
        out = torch.empty(2, 4, dtype=torch.float16, device="cuda")
        assert ops.gelu_and_mul(out, x, "tanh") is None
        with pytest.raises(RuntimeError, match='approximate must be "none" or "tanh", got "fast"'):
            ops.gelu_and_mul(out, x, "fast")
        with pytest.raises(RuntimeError, match=r"out has dtype torch\.float32 but x has"):
            ops.gelu_and_mul(out.float(), x, "none")
        q = torch.empty(3, 4, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(3, 1, 64, dtype=torch.bfloat16, device="cuda")
        cs = torch.empty(3, 64, dtype=torch.bfloat16, device="cuda")
        assert ops.rotary_embedding(q, k, cs, cs, True) is None
        with pytest.raises(RuntimeError, match=r"cos has dtype torch\.float32 but query has"):
            ops.rotary_embedding(q, k, cs.float(), cs, True)
        with pytest.raises(RuntimeError, match=r"must both have shape \[3, rotary_dim\]"):
            ops.rotary_embedding(q, k, cs.unsqueeze(0), cs.unsqueeze(0), True)
        with pytest.raises(RuntimeError, match="must have the same token dimensions"):
            ops.rotary_embedding(
                q, torch.empty(2, 1, 64, dtype=q.dtype, device="cuda"), cs, cs, True
            )
        wide = torch.empty(3, 66, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(RuntimeError, match=r"rotary_dim \(cos\.size\(-1\) = 66\) must be"):
            ops.rotary_embedding(q, k, wide, wide, True)


def test_rotary_impl_traces_to_one_kernel_call_in_place() -> None:
    mode = FakeTensorMode()
    with mode:
        q = torch.empty(5, 4, 64, dtype=torch.float16, device="cuda")
        k = torch.empty(5, 2, 64, dtype=torch.float16, device="cuda")
        c = torch.empty(5, 32, dtype=torch.float16, device="cuda")
        gm = make_fx(lambda q, k, c, s: quant.rotary_embedding(q, k, c, s, False))(q, k, c, c)
    calls = [n for n in gm.graph.nodes if n.target is ops.rotary_embedding]
    assert len(calls) == 1
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert list(calls[0].args[:2]) == placeholders[:2]  # the query and key passed in
    assert not [n for n in gm.graph.nodes if "copy" in str(n.target)]


def test_cpu_tensors_are_refused_with_the_reason() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="runs on CUDA tensors only, got tensors on cpu"):
        ops.gelu_and_mul(torch.empty(2, 4), x, "none")
    with pytest.raises(RuntimeError, match="runs on CUDA tensors only"):
        ops.rotary_embedding(x[None], x[None], x[:1], x[:1], True)


def test_opcheck_kernel_ops_over_standins(cpu_kernels: StandInKernels) -> None:
    x = torch.randn(4, 64, dtype=torch.float16)
    torch.library.opcheck(ops.gelu_and_mul, (torch.empty(4, 32, dtype=x.dtype), x, "tanh"))
    cos, sin = _tables((6,), 32, torch.float16)
    q, k = torch.randn(6, 4, 64, dtype=x.dtype), torch.randn(6, 2, 64, dtype=x.dtype)
    torch.library.opcheck(ops.rotary_embedding, (q, k, cos, sin, True))


# -- the impls over the stand-ins ---------------------------------------------------


@pytest.mark.parametrize(("op_name", "check", "dtype"), conformance_params(NAMES))
def test_conformance_kit(new_standin: StandInKernels, op_name: str, check: str, dtype) -> None:  # type: ignore[no-untyped-def]
    ConformanceCase(ir.get_op(op_name), STANDIN, check, dtype, "cpu").check()


@pytest.mark.parametrize("name", NAMES)
def test_samples_reach_the_kernel(new_standin: StandInKernels, name: str) -> None:
    op = ir.get_op(name)
    with op.set_priority([STANDIN, "native"]):
        samples = list(op.sample_inputs(torch.bfloat16, "cpu"))
        for sample in samples:
            assert op.selected_impl(*sample.args).provider == STANDIN, sample.name
            op(*sample.args)
    assert new_standin.calls[name] == len(samples)


def test_rotary_writes_query_and_key_in_place(new_standin: StandInKernels) -> None:
    q, k = torch.randn(7, 8, 128), torch.randn(7, 2, 128)
    cos, sin = _tables((7,), 128)
    q0, k0 = q.clone(), k.clone()
    want = ROPE.native(q0, k0, cos, sin)
    with ROPE.set_priority([STANDIN]):
        got = ROPE(q, k, cos, sin)  # default overload: inputs untouched
        assert torch.equal(q, q0)
        assert torch.equal(k, k0)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        got = ROPE.maybe_inplace(q, k, cos, sin)
    assert got[0] is q
    assert got[1] is k
    torch.testing.assert_close((q, k), want, rtol=0, atol=0)


def test_rotary_partial_dims_leave_the_other_channels(new_standin: StandInKernels) -> None:
    q, k = torch.randn(3, 2, 22), torch.randn(3, 1, 22)
    cos, sin = _tables((3,), 18)
    q0, k0 = q.clone(), k.clone()
    quant.rotary_embedding(q, k, cos, sin, False)
    assert torch.equal(q[..., 18:], q0[..., 18:])
    assert torch.equal(k[..., 18:], k0[..., 18:])
    torch.testing.assert_close((q, k), ROPE.native(q0, k0, cos, sin, False), rtol=0, atol=0)
    assert new_standin.calls["rotary_embedding"] == 1


def test_rotary_layouts_written_back(new_standin: StandInKernels) -> None:
    # Hugging Face's [batch, heads, seq, head] as its transpose(1, 2), cos/sin [1, seq, rot]
    # broadcast over the batch; and a query whose channels are strided
    q = torch.randn(2, 4, 5, 64).transpose(1, 2)
    k = torch.randn(2, 2, 5, 64).transpose(1, 2)
    cos, sin = _tables((1, 5), 64)
    want = ROPE.native(q.clone(), k.clone(), cos, sin)
    got = quant.rotary_embedding(q, k, cos, sin)
    assert got[0] is q
    assert got[1] is k
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    qs = torch.randn(64, 3, 2).permute(1, 2, 0)  # (3, 2, 64), channel stride 6
    ks = torch.randn(3, 1, 64)
    cos, sin = _tables((3,), 64)
    want = ROPE.native(qs.clone(), ks.clone(), cos, sin)
    got = quant.rotary_embedding(qs, ks, cos, sin)
    assert got[0] is qs
    assert qs.stride() == (2, 1, 6)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert new_standin.calls["rotary_embedding"] == 2


def test_sizes_the_kernels_do_not_take_are_computed_by_native(
    new_standin: StandInKernels,
) -> None:
    q, k = torch.randn(4, 2, 16), torch.randn(4, 1, 16)
    for cos, sin in (
        _tables((4,), 18),  # rotary_dim wider than the head
        (torch.randn(4, 7), torch.randn(4, 7)),  # odd rotary_dim (native computes neox)
        _tables((2, 4), 16),  # cos/sin of more token dims than query's
    ):
        try:
            want = ROPE.native(q, k, cos, sin)
        except RuntimeError as exc:
            with pytest.raises(RuntimeError, match=str(exc)[:20]):
                quant.rotary_embedding(q, k, cos, sin)
            continue
        got = quant.rotary_embedding(q, k, cos, sin)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    q1, k1 = torch.randn(1, 2, 16), torch.randn(1, 1, 16)
    cos, sin = _tables((4,), 16)  # broadcast the output beyond query's shape
    got = quant.rotary_embedding(q1, k1, cos, sin)
    assert got[0].shape == (4, 2, 16)
    torch.testing.assert_close(got, ROPE.native(q1, k1, cos, sin), rtol=0, atol=0)
    k_other = torch.randn(3, 1, 16)  # another token count than the query's
    cos3, sin3 = _tables((1,), 16)
    got = quant.rotary_embedding(q, k_other, cos3, sin3)
    torch.testing.assert_close(got, ROPE.native(q, k_other, cos3, sin3), rtol=0, atol=0)
    odd = r"gelu_and_mul: x's last dimension \(7\) must be even"  # the op's error, no launch
    with pytest.raises(ValueError, match=odd):
        quant.gelu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match=odd):
        ir.ops.gelu_and_mul.native(torch.randn(2, 7))
    assert sum(new_standin.calls.values()) == 0


def test_supports_args_declines_what_the_kernels_cannot_take() -> None:
    gelu = quant.supports_args_for("cpu")["gelu_and_mul"]
    rope = quant.supports_args_for("cpu")["rotary_embedding"]
    x = torch.randn(4, 64, dtype=torch.float16)
    assert gelu(x, "none")
    assert gelu(x, "tanh")
    assert not gelu(x, "sigmoid")  # native's error, not a kernel flag
    assert not gelu(x.double(), "none")
    assert not quant.supports_args_for("cuda")["gelu_and_mul"](x, "none")
    q, k = torch.randn(3, 4, 64), torch.randn(3, 2, 64)
    cos, sin = _tables((3,), 64)
    assert rope(q, k, cos, sin, True)
    assert not quant.supports_args_for("cuda")["rotary_embedding"](q, k, cos, sin)
    assert not rope(q.double(), k.double(), cos.double(), sin.double())  # a dtype not taken
    assert not rope(q.half(), k.half(), cos, sin)  # native promotes with float32 tables
    assert not rope(q, k, cos, sin.half())
    assert not rope(q[0], k[0], cos, sin)  # rank below the tables': native broadcasts
    assert not rope(q, k, cos[None], sin[None])
    assert not rope(q, k, cos, sin[None])  # tables of different ranks
    assert not rope(q[0, 0], k[0, 0], cos[0], sin[0])  # no heads dimension
    assert not rope(q.to_sparse(), k, cos, sin)
