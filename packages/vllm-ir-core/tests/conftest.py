"""Shared fixtures: throwaway ops, and state that every test leaves as it found it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from importlib import metadata

import pytest
import torch
import vllm_ir as ir
from fake_entry_points import Entry, serving
from torch import Tensor
from vllm_ir import priority
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._discovery import providers
from vllm_ir._selection.eager import set_selection_check
from vllm_ir.testing import isolated

_counter = itertools.count()

# Every eager call in this suite re-validates its cached selection against an
# uncached select() (VLLM_IR_CHECK_SELECTION): a mismatch fails the test.
set_selection_check(True)


def unique(prefix: str) -> str:
    return f"{prefix}_{next(_counter)}"


@pytest.fixture(autouse=True)
def _isolated_state() -> Iterator[None]:
    """Process-wide priorities, env-driven selection and caches reset per test."""
    with isolated():
        yield


@pytest.fixture
def dynamo_reset_after() -> Iterator[None]:
    """Dynamo's caches emptied after the test (modules that compile many programs use it)."""
    yield
    torch._dynamo.reset()


@pytest.fixture
def selection_check_off() -> Iterator[None]:
    """The production path: no re-selection per cached call (for tests that count
    how often ``supports_args`` runs)."""
    set_selection_check(False)
    try:
        yield
    finally:
        set_selection_check(True)


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


@pytest.fixture
def fresh_discovery(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, object]]:
    """Discovery state reset, and a fake entry-point table the test fills in."""
    table: dict[str, object] = {}

    def listed() -> Iterator[Entry]:
        return ((name, f"fake_provider_{name}", "provider", obj) for name, obj in table.items())

    entry_points = serving(monkeypatch, providers.ENTRY_POINT_GROUP, listed, metadata.entry_points)
    monkeypatch.setattr(providers.metadata, "entry_points", entry_points)
    monkeypatch.setattr(RUNTIME.discovery, "loaded_once", False)
    monkeypatch.setattr(RUNTIME.discovery, "loaded", {})
    monkeypatch.setattr(RUNTIME.discovery, "errors", {})
    monkeypatch.setattr(RUNTIME.discovery, "registrations", {})
    yield table
    for name in table:
        priority.remove_platform_defaults(f"fake_provider_{name}")
