"""IR ops under torch's transforms, and with nested tensors: the native result.

A "kernel" here computes on detached tensors, as a C++ or Triton kernel
does: it carries no autograd or forward-AD information, so a transform that
reached it would lose the derivative silently.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import vllm_ir as ir
from torch import Tensor


def cube(x: Tensor, factor: float) -> Tensor:
    return x * x * x * factor


@pytest.fixture
def kernel_op(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    op = make_op(cube)

    @op.register_impl("kernel")
    def kernel(x: Tensor, factor: float) -> Tensor:
        d = x.detach()
        return d * d * d * factor

    return op


X = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
T = torch.linspace(0.5, 2.0, 12).reshape(3, 4)


def test_jvp_gives_the_native_tangent(kernel_op: ir.IrOp) -> None:
    with kernel_op.set_priority(["kernel"]):
        assert kernel_op.select(X, 2.0).impl.provider == "kernel"
        out, tangent = torch.func.jvp(lambda a: kernel_op(a, 2.0), (X,), (T,))
    _, want = torch.func.jvp(lambda a: cube(a, 2.0), (X,), (T,))
    torch.testing.assert_close(tangent, want)
    torch.testing.assert_close(out, cube(X, 2.0))


def test_forward_ad_gives_the_native_tangent(kernel_op: ir.IrOp) -> None:
    with kernel_op.set_priority(["kernel"]), fwAD.dual_level():
        got = fwAD.unpack_dual(kernel_op(fwAD.make_dual(X, T), 2.0)).tangent
        want = fwAD.unpack_dual(cube(fwAD.make_dual(X, T), 2.0)).tangent
    assert got is not None
    torch.testing.assert_close(got, want)


def test_forward_ad_of_maybe_inplace(inplace_op: ir.IrOp) -> None:
    x, y = torch.randn(4), torch.randn(4)
    with inplace_op.set_priority(["writes_inputs"]), fwAD.dual_level():
        out, total = inplace_op.maybe_inplace(fwAD.make_dual(x, torch.ones(4)), y)
        tangent = fwAD.unpack_dual(total).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, torch.ones(4))
    torch.testing.assert_close(fwAD.unpack_dual(out).primal, 2 * (x + y))


@pytest.mark.parametrize("provider", ["native", "kernel"])
def test_func_grad_and_jacrev(kernel_op: ir.IrOp, provider: str) -> None:
    with kernel_op.set_priority([provider]):
        grad = torch.func.grad(lambda a: kernel_op(a, 2.0).sum())(X)
        jac = torch.func.jacrev(lambda a: kernel_op(a, 2.0))(X[0])
    torch.testing.assert_close(grad, 6.0 * X * X)
    torch.testing.assert_close(jac, torch.diag(6.0 * X[0] * X[0]))


def test_jacfwd_and_hessian(kernel_op: ir.IrOp) -> None:
    with kernel_op.set_priority(["kernel"]):
        jac = torch.func.jacfwd(lambda a: kernel_op(a, 2.0))(X[0])
        hess = torch.func.hessian(lambda a: kernel_op(a, 2.0).sum())(X[0])
    torch.testing.assert_close(jac, torch.diag(6.0 * X[0] * X[0]))
    torch.testing.assert_close(hess, torch.diag(12.0 * X[0]))


def test_the_torch_op_under_a_transform_raises_torchs_error(kernel_op: ir.IrOp) -> None:
    # documented: only ir.ops.<op>(...) routes transforms to the native function
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda a: kernel_op.torch_op(a, 2.0).sum())(X)


def test_vmap_and_vmap_of_grad(kernel_op: ir.IrOp) -> None:
    with kernel_op.set_priority(["kernel"]):
        kernel_op(X[0], 2.0)  # a cached key of the per-sample shape
        out = torch.func.vmap(lambda a: kernel_op(a, 2.0))(X)
        grads = torch.func.vmap(torch.func.grad(lambda a: kernel_op(a, 2.0).sum()))(X)
    torch.testing.assert_close(out, cube(X, 2.0))
    torch.testing.assert_close(grads, 6.0 * X * X)


def test_plain_backward_still_goes_through_the_torch_op(kernel_op: ir.IrOp) -> None:
    x = X.clone().requires_grad_()
    with kernel_op.set_priority(["kernel"]):
        out = kernel_op(x, 2.0)
    assert out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(x.grad, 6.0 * X * X)


def test_jagged_nested_tensor_gives_the_native_result(scale_op: ir.IrOp) -> None:
    njt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=torch.jagged)
    out = scale_op(njt, 3.0)
    for got, part in zip(out.unbind(), njt.unbind(), strict=True):
        torch.testing.assert_close(got, part * 3.0)
