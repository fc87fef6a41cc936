"""torch.library.opcheck over every op, overload, sample input and dtype."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir

CORE_OPS = sorted(ir.ops.__all__)
"""Every op core declares: a new op is checked without editing this file."""


def _overloads(op: ir.IrOp) -> list[torch._ops.OpOverload]:
    packet = getattr(getattr(torch.ops, ir.NAMESPACE), op.name)
    return [packet.default] + ([packet.maybe_inplace] if op.allow_inplace else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op_name", CORE_OPS)
def test_opcheck_core_ops(op_name: str, dtype: torch.dtype) -> None:
    op = ir.get_op(op_name)
    for overload in _overloads(op):
        for sample in op.sample_inputs(dtype):
            torch.library.opcheck(overload, sample.clone().args)


def test_opcheck_with_grad_inputs() -> None:
    op = ir.ops.fused_add_rms_norm
    for overload in _overloads(op):
        sample = next(op.sample_inputs(torch.float32)).clone()
        args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in sample.args)
        torch.library.opcheck(overload, args)


def test_opcheck_with_inplace_impl_selected(inplace_op: ir.IrOp) -> None:
    with inplace_op.set_priority(["writes_inputs"]):
        for overload in _overloads(inplace_op):
            torch.library.opcheck(overload, (torch.randn(3, 4), torch.randn(3, 4)))
