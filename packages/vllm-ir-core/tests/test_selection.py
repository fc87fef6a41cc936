"""Selection: priority order, supported, supports_args, batch invariance, the cache."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir import selection as dispatch


def _register(op: ir.IrOp, provider: str, result: float, **kwargs) -> None:  # type: ignore[no-untyped-def]
    def impl(x: Tensor, factor: float) -> Tensor:
        return torch.full_like(x, result)

    op.register_impl(provider, **kwargs)(impl)


def test_native_is_the_default(scale_op: ir.IrOp) -> None:
    x = torch.ones(2)
    assert scale_op.selected_impl(x, 3.0).provider == "native"
    assert scale_op(x, 3.0).tolist() == [3.0, 3.0]


def test_priority_order_is_followed(scale_op: ir.IrOp) -> None:
    _register(scale_op, "a", 1.0)
    _register(scale_op, "b", 2.0)
    x = torch.ones(2)
    with scale_op.set_priority(["b", "a"]):
        assert scale_op(x, 3.0)[0].item() == 2.0
    with scale_op.set_priority(["a", "b"]):
        assert scale_op(x, 3.0)[0].item() == 1.0
    # registered but not named by anyone: never selected
    assert scale_op(x, 3.0)[0].item() == 3.0


def test_unsupported_impl_is_skipped(scale_op: ir.IrOp) -> None:
    _register(scale_op, "absent", 1.0, supported=False)
    _register(scale_op, "present", 2.0)
    with scale_op.set_priority(["absent", "present"]):
        assert scale_op.selected_impl(torch.ones(1), 1.0).provider == "present"
        decisions = scale_op.select(torch.ones(1), 1.0).decisions
    assert [(d.entry.provider, d.accepted, d.reason) for d in decisions] == [
        ("absent", False, "not supported on this platform"),
        ("present", True, "selected"),
    ]


def test_supports_args_falls_back_per_call(scale_op: ir.IrOp) -> None:
    _register(scale_op, "positive", 1.0, supports_args=lambda x, factor: factor > 0)
    _register(scale_op, "fp32", 2.0, supports_args=lambda x, factor: x.dtype == torch.float32)
    with scale_op.set_priority(["positive", "fp32"]):
        assert scale_op.selected_impl(torch.ones(1), 1.0).provider == "positive"
        assert scale_op.selected_impl(torch.ones(1), -1.0).provider == "fp32"
        assert scale_op.selected_impl(torch.ones(1, dtype=torch.half), -1.0).provider == "native"
        # cached answers stay per metadata
        assert scale_op.selected_impl(torch.ones(1), 1.0).provider == "positive"


@pytest.mark.usefixtures("selection_check_off")  # counts supports_args calls
def test_supports_args_receives_the_call_arguments(make_op) -> None:  # type: ignore[no-untyped-def]
    seen = []

    def op_fn(x: Tensor, weight: Tensor | None, eps: float, size: int | None = None) -> Tensor:
        return x

    op = make_op(op_fn)

    def supports(x, weight, eps, size=None):  # type: ignore[no-untyped-def]
        seen.append((x.shape, weight is None, eps, size))
        return True

    op.register_impl("p", supports_args=supports)(lambda_impl_for(op_fn))
    with op.set_priority(["p"]):
        op(torch.ones(2, 3), None, 0.5)
        op(torch.ones(2, 3), torch.ones(3), eps=0.25, size=2)
    assert seen == [((2, 3), True, 0.5, None), ((2, 3), False, 0.25, 2)]


def lambda_impl_for(fn):  # type: ignore[no-untyped-def]
    def impl(x: Tensor, weight: Tensor | None, eps: float, size: int | None = None) -> Tensor:
        return fn(x, weight, eps, size)

    return impl


def test_supports_args_must_return_plain_bool(scale_op: ir.IrOp) -> None:
    _register(scale_op, "truthy", 1.0, supports_args=lambda x, factor: 1)
    with scale_op.set_priority(["truthy"]), pytest.raises(TypeError, match="plain bool"):
        scale_op(torch.ones(1), 1.0)


@pytest.mark.usefixtures("selection_check_off")  # counts supports_args calls
def test_selection_cached_on_metadata_not_batch_size(scale_op: ir.IrOp) -> None:
    calls = []

    def supports(x, factor):  # type: ignore[no-untyped-def]
        calls.append(tuple(x.shape))
        return True

    _register(scale_op, "counted", 1.0, supports_args=supports)
    with scale_op.set_priority(["counted"]):
        for batch in (2, 8, 64, 3):
            scale_op(torch.ones(batch, 4), 1.0)
        assert len(calls) == 1  # a new batch size (of 2 or more) reuses the selection
        scale_op(torch.ones(1, 4), 1.0)  # batch class 1: its own key, as Dynamo's 0/1
        scale_op(torch.ones(0, 4), 1.0)  # batch class 0
        assert len(calls) == 3
        scale_op(torch.ones(2, 4, dtype=torch.float64), 1.0)
        scale_op(torch.ones(4), 1.0)  # another ndim
        scale_op(torch.ones(4), 2.0)  # another non-tensor argument
        scale_op(torch.ones(2, 5), 1.0)  # another hidden size
    assert len(calls) == 7


def test_new_registration_invalidates_cache(scale_op: ir.IrOp) -> None:
    x = torch.ones(1)
    ir.priority.add_platform_defaults(
        "late-pkg",
        [
            ir.provider.PlatformDefaults(
                ir.provider.current_platform(), eager={scale_op.name: ["late"]}
            )
        ],
    )
    try:
        selection = scale_op.select(x, 1.0)
        assert selection.decisions[0].reason.startswith("not registered")
        assert scale_op.selected_impl(x, 1.0).provider == "native"  # now cached
        _register(scale_op, "late", 1.0)
        assert scale_op.selected_impl(x, 1.0).provider == "late"
    finally:
        ir.priority.remove_platform_defaults("late-pkg")


def test_batch_invariant_mode(scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(scale_op, "fast", 1.0)
    _register(scale_op, "stable", 2.0, batch_invariant=True)
    x = torch.ones(1)
    with scale_op.set_priority(["fast", "stable"]):
        assert scale_op.selected_impl(x, 1.0).provider == "fast"
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        ir.invalidate_caches()
        assert scale_op.selected_impl(x, 1.0).provider == "stable"
        reasons = [d.reason for d in scale_op.select(x, 1.0).decisions]
    assert reasons == ["not batch invariant (VLLM_BATCH_INVARIANT=1)", "selected"]


def test_batch_invariant_falls_back_to_native(scale_op: ir.IrOp, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _register(scale_op, "fast", 1.0)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    with scale_op.set_priority(["fast"]):
        assert scale_op.selected_impl(torch.ones(1), 1.0).provider == "native"


def test_unhashable_arguments_select_uncached(make_op) -> None:  # type: ignore[no-untyped-def]
    def sizes_op(x: Tensor, sizes: list[int]) -> Tensor:
        return x.reshape(sizes)

    op = make_op(sizes_op)
    assert op(torch.ones(4), [2, 2]).shape == (2, 2)
    assert op.selected_impl(torch.ones(4), [4]).provider == "native"


def test_compiled_mode_uses_compiled_defaults(scale_op: ir.IrOp) -> None:
    _register(scale_op, "kernel", 1.0)
    ir.priority.add_platform_defaults(
        "test-defaults",
        [
            ir.provider.PlatformDefaults(
                ir.provider.current_platform(),
                eager={scale_op.name: ["kernel"]},
                compiled={scale_op.name: ["native"]},
            )
        ],
    )
    try:
        x = torch.ones(1)
        assert scale_op.selected_impl(x, 1.0).provider == "kernel"
        with ir.priority.compiled_selection():
            assert scale_op.selected_impl(x, 1.0).provider == "native"
        assert scale_op.select(x, 1.0, mode="compiled").impl.provider == "native"
    finally:
        ir.priority.remove_platform_defaults("test-defaults")


def test_describe_is_data_free() -> None:
    text = dispatch.describe((torch.ones(2, 3, dtype=torch.bfloat16), None, 1e-6))
    assert text == "(Tensor(bfloat16, (2, 3), cpu), None, 1e-06)"


def test_device_type_is_part_of_the_key(scale_op: ir.IrOp) -> None:
    _register(scale_op, "cpu_only", 1.0, supports_args=lambda x, factor: x.device.type == "cpu")
    with scale_op.set_priority(["cpu_only"]):
        assert scale_op.selected_impl(torch.ones(2), 1.0).provider == "cpu_only"
        assert scale_op.selected_impl(torch.ones(2, device="meta"), 1.0).provider == "native"


def test_wrong_arity_names_the_op(scale_op: ir.IrOp) -> None:
    with pytest.raises(TypeError, match=rf"{scale_op.name}\(\) missing 1 required"):
        scale_op(torch.ones(1))
    with pytest.raises(TypeError, match=rf"{scale_op.name}\(x: torch.Tensor, factor: float\)"):
        scale_op.selected_impl(torch.ones(1))
    with pytest.raises(TypeError, match="missing a required argument: 'factor'"):
        scale_op.select(torch.ones(1))


def test_unsupported_reason_is_reported(scale_op: ir.IrOp) -> None:
    _register(scale_op, "gpu_only", 1.0, supported=False, unsupported_reason="needs a ROCm GPU")
    with scale_op.set_priority(["gpu_only"]):
        decision = scale_op.select(torch.ones(1), 1.0).decisions[0]
    assert decision.reason == "not supported on this platform: needs a ROCm GPU"
    with pytest.raises(TypeError, match="unsupported_reason must be a str"):
        scale_op.register_impl("bad", unsupported_reason=3)  # type: ignore[arg-type]
