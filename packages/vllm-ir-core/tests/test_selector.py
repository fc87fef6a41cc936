"""The per-op Selector: one miss routine behind the fast path, selected_impl() and the torch op."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir._selection.selector import Selector


@pytest.fixture
def counted(scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the op's selector missed (selected anew)."""
    misses: list[int] = [0]
    real = Selector.miss

    def miss(self: Selector, args: tuple[object, ...]) -> object:
        if self is scale_op.selector:
            misses[0] += 1
        return real(self, args)

    monkeypatch.setattr(Selector, "miss", miss)
    return misses


def test_every_path_shares_one_selection_cache(
    scale_op: ir.IrOp, counted: list[int], selection_check_off: None
) -> None:
    @scale_op.register_impl("half", supports_args=lambda x, factor: factor > 0)
    def half(x: Tensor, factor: float) -> Tensor:
        return x * factor

    x = torch.ones(3, 4)
    with scale_op.set_priority(["half"]):
        assert scale_op(x, 2.0).eq(2.0).all()  # the fast path's miss
        assert counted[0] == 1
        # the same key: selected_impl() and the torch op find the cached selection
        assert scale_op.selected_impl(x, 2.0).provider == "half"
        scale_op.torch_op(x, 2.0)
        assert counted[0] == 1
        # a new batch size of a known class: the fast path misses, the selector hits
        scale_op(torch.ones(5, 4), 2.0)
        assert counted[0] == 1
        assert scale_op.selected_impl(x, -1.0).provider == "native"  # a new key: one miss
        assert counted[0] == 2
    assert scale_op.selected_impl(x, 2.0) is scale_op.select(x, 2.0).impl


def test_the_cache_holds_exactly_what_select_returns(scale_op: ir.IrOp) -> None:
    @scale_op.register_impl("neg", supports_args=lambda x, factor: factor < 0)
    def neg(x: Tensor, factor: float) -> Tensor:
        return x * factor

    with scale_op.set_priority(["neg"]):
        for factor in (-2.0, 3.0, -1.0, 0.0):
            args = (torch.ones(2), factor)
            cached = scale_op.selector.impl_for(args)
            assert cached is scale_op.select(*args).impl
            key = scale_op.selection_key(*args)
            assert scale_op.selector.cache_of("eager")[key] is cached


def test_the_cache_views_are_read_only(scale_op: ir.IrOp) -> None:
    with pytest.raises(TypeError):
        scale_op.selector.impls["x"] = scale_op.selector.impls["native"]  # type: ignore[index]
    with pytest.raises(TypeError):
        scale_op.selector.cache_of("eager")[("k",)] = None  # type: ignore[index]


def test_dispatch_is_the_deprecated_name_of_selected_impl(scale_op: ir.IrOp) -> None:
    x = torch.ones(2)
    with pytest.warns(DeprecationWarning, match=r"selected_impl\(\)"):
        impl = scale_op.dispatch(x, 2.0)
    assert impl is scale_op.selected_impl(x, 2.0)


def test_calls_never_raise_while_another_thread_unregisters_an_impl(scale_op: ir.IrOp) -> None:
    """A selection sees the impls before or after another thread's change, never half of it
    (select() once checked an impl, then looked it up again: KeyError in between)."""
    import sys
    import threading
    import time

    def quick(x: Tensor, factor: float) -> Tensor:
        return x * factor

    scale_op.register_impl("quick")(quick)
    errors: list[str] = []
    stop = time.monotonic() + 2.0
    x = torch.ones(2, 4)

    def call() -> None:
        while time.monotonic() < stop:
            try:
                scale_op.select(x, 2.0)
                scale_op(x, 2.0)
            except Exception as e:  # any escape is the failure
                errors.append(f"{type(e).__name__}: {e}")

    def churn() -> None:
        while time.monotonic() < stop:
            scale_op.unregister_impl("quick")
            scale_op.register_impl("quick")(quick)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the window shows within a second
    # process-wide (the fixture resets it), so every thread tries "quick" first
    ir.IrOpPriorityConfig.from_dict({scale_op.name: ["quick"]}).apply()
    try:
        threads = [threading.Thread(target=call) for _ in range(2)]
        threads.append(threading.Thread(target=churn))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
