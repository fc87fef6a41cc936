"""The two overloads: default never mutates; maybe_inplace may reuse memory."""

from __future__ import annotations

import torch
import vllm_ir as ir


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(4.0), torch.ones(4)


def test_maybe_inplace_with_inplace_impl_reuses_memory(inplace_op: ir.IrOp) -> None:
    x, y = _inputs()
    with inplace_op.set_priority(["writes_inputs"]):
        out, total = inplace_op.maybe_inplace(x, y)
    assert out.data_ptr() == x.data_ptr()
    assert total.data_ptr() == y.data_ptr()
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0]


def test_default_overload_clones_for_inplace_impl(inplace_op: ir.IrOp) -> None:
    x, y = _inputs()
    with inplace_op.set_priority(["writes_inputs"]):
        out, total = inplace_op(x, y)
    assert (x.tolist(), y.tolist()) == (_inputs()[0].tolist(), _inputs()[1].tolist())
    assert out.data_ptr() != x.data_ptr()
    assert total.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_maybe_inplace_with_functional_impl_leaves_inputs(inplace_op: ir.IrOp) -> None:
    x, y = _inputs()
    out, _ = inplace_op.maybe_inplace(x, y)  # native: functional
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert out.data_ptr() != x.data_ptr()


def test_torch_op_overloads_never_alias_outputs(inplace_op: ir.IrOp) -> None:
    # behind the dispatcher a schema cannot say "may alias": inplace impls run on copies
    packet = getattr(torch.ops.vllm_ir, inplace_op.name)
    with inplace_op.set_priority(["writes_inputs"]):
        for overload in (packet.default, packet.maybe_inplace):
            x, y = _inputs()
            out, total = overload(x, y)
            assert out.data_ptr() != x.data_ptr()
            assert total.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_fused_add_rms_norm_overloads_agree() -> None:
    op = ir.ops.fused_add_rms_norm
    for sample in op.sample_inputs(torch.float32):
        want = op(*sample.clone().args)
        got = op.maybe_inplace(*sample.clone().args)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_maybe_inplace_schema_marks_activations_mutable() -> None:
    schema = torch.ops.vllm_ir.fused_add_rms_norm.maybe_inplace._schema
    mutable = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert mutable == ["x", "x_residual"]
    default = torch.ops.vllm_ir.fused_add_rms_norm.default._schema
    assert not any(a.alias_info for a in default.arguments)
