"""IR ops give the gradients of their native semantics, whichever impl ran."""

from __future__ import annotations

import warnings

import torch
import vllm_ir as ir
from torch import Tensor


def _grads(fn, x: Tensor, r: Tensor, w: Tensor) -> tuple[Tensor, ...]:  # type: ignore[no-untyped-def]
    x, r, w = (t.detach().clone().requires_grad_() for t in (x, r, w))
    out, res = fn(x, r, w, 1e-6)
    (out.square().sum() + res.sum()).backward()
    return x.grad, r.grad, w.grad  # type: ignore[return-value]


def test_gradients_match_native() -> None:
    op = ir.ops.fused_add_rms_norm
    x, r, w = (
        torch.randn(3, 16, dtype=torch.float64),
        torch.randn(3, 16, dtype=torch.float64),
        torch.rand(16, dtype=torch.float64),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "autograd kernel was not registered"
        for call in (op, op.maybe_inplace):
            for got, want in zip(_grads(call, x, r, w), _grads(op.native, x, r, w), strict=True):
                torch.testing.assert_close(got, want)


def test_gradcheck_rms_norm() -> None:
    x = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(8, dtype=torch.float64, requires_grad=True)
    # the semantics compute in fp32, so finite differences need a coarse step
    assert torch.autograd.gradcheck(
        lambda a, b: ir.ops.rms_norm(a, b, 1e-6), (x, w), eps=1e-3, atol=1e-3, rtol=1e-2
    )


def test_weight_only_grad_and_no_weight() -> None:
    x = torch.randn(2, 8)
    w = torch.nn.Parameter(torch.ones(8))
    ir.ops.rms_norm(x, w, 1e-6).sum().backward()
    assert w.grad is not None
    x.requires_grad_()
    ir.ops.rms_norm(x, None, 1e-6).sum().backward()
    assert x.grad is not None


def test_maybe_inplace_with_grad_does_not_donate(inplace_op: ir.IrOp) -> None:
    x = torch.arange(4.0, requires_grad=True)
    y = torch.ones(4)
    with inplace_op.set_priority(["writes_inputs"]):
        out, _ = inplace_op.maybe_inplace(x, y)
    assert y.tolist() == [1.0] * 4  # degraded to the functional overload
    out.sum().backward()
    assert x.grad is not None
    assert x.grad.tolist() == [2.0] * 4


def list_sum(a: Tensor, ys: list[Tensor]) -> Tensor:
    return a * 2 + sum(y * (i + 1) for i, y in enumerate(ys))


def test_tensors_of_a_list_parameter_get_their_gradients(make_op) -> None:  # type: ignore[no-untyped-def]
    """Each tensor in a ``list[Tensor]`` argument gets native's gradient, whichever
    of them and of the other arguments require grad (reliability-v4 06)."""
    op = make_op(list_sum)
    for a_grad, grads in [(False, (True,)), (True, (True, False, True)), (True, ()), (False, ())]:
        a = torch.randn(3, requires_grad=a_grad)
        ys = [torch.randn(3, requires_grad=g) for g in grads]
        if not (a_grad or any(grads)):
            continue
        op(a, ys).sum().backward()
        for i, y in enumerate(ys):
            want = torch.full((3,), float(i + 1)) if y.requires_grad else None
            assert (y.grad is None) if want is None else torch.equal(y.grad, want)
        assert (a.grad is None) if not a_grad else torch.equal(a.grad, torch.full((3,), 2.0))
    a, y = (
        torch.randn(3, dtype=torch.double, requires_grad=True),
        torch.randn(3, dtype=torch.double),
    )
    assert torch.autograd.gradcheck(
        lambda a, y: op(a, [y, a]), (a, y.requires_grad_()), check_undefined_grad=False
    )
