"""Shared fixtures: throwaway ops, and state that every test leaves as it found it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir import dispatch, priority
from vllm_ir.eager import set_dispatch_check

_counter = itertools.count()

# Every eager call in this suite re-validates its cached selection against an
# uncached select() (VLLM_IR_CHECK_DISPATCH): a mismatch fails the test.
set_dispatch_check(True)


def unique(prefix: str) -> str:
    return f"{prefix}_{next(_counter)}"


@pytest.fixture(autouse=True)
def _isolated_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Process-wide priorities, env-driven selection and caches reset per test."""
    for var in ("VLLM_BATCH_INVARIANT", "VLLM_IR_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    priority.set_process_priority({}, replace=True)
    yield
    priority.set_process_priority({}, replace=True)
    dispatch.invalidate_caches()


@pytest.fixture
def make_op() -> Iterator[Callable[..., ir.IrOp]]:
    """``make_op(fn, **register_op_kwargs)`` with a unique name, removed afterwards."""
    created: list[ir.IrOp] = []

    def make(fn: Callable[..., object], **kwargs: object) -> ir.IrOp:
        op = ir.register_op(name=unique(fn.__name__), **kwargs)(fn)  # type: ignore[arg-type]
        created.append(op)
        return op

    yield make
    for op in created:
        op._unregister()


def scale(x: Tensor, factor: float) -> Tensor:
    """A minimal op used where the op's maths do not matter."""
    return x * factor


def add_then_double(x: Tensor, x_other: Tensor) -> tuple[Tensor, Tensor]:
    """A two-activation op with allow_inplace semantics: (2 * (x + y), x + y)."""
    s = x + x_other
    return s * 2, s


@pytest.fixture
def scale_op(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    return make_op(scale)


@pytest.fixture
def inplace_op(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    op = make_op(add_then_double, allow_inplace=True)

    @op.register_impl("writes_inputs", inplace=True)
    def _impl(x: Tensor, x_other: Tensor) -> tuple[Tensor, Tensor]:
        x_other.add_(x)
        torch.mul(x_other, 2, out=x)
        return x, x_other

    return op
