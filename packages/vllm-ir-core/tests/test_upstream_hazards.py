"""Which Dynamo graphs the backend runs eagerly because torch compiles them wrongly."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, fx
from vllm_ir.compilation._upstream_hazards import as_strided_input_mutation, has_dynamic_inputs


def check(fn: Callable[..., Tensor], x: Tensor) -> tuple[str | None, str | None, bool]:
    """For the graph Dynamo hands a backend (dynamic shapes): the hazard found,
    the hazard found when told the shapes are static, and whether the inputs
    are dynamic (Dynamo clears the graph after the backend returns, so the
    checks run inside it)."""
    seen: list[tuple[str | None, str | None, bool]] = []

    def backend(gm: fx.GraphModule, example_inputs: list[object]) -> Callable[..., object]:
        dynamic = has_dynamic_inputs(example_inputs)
        seen.append(
            (
                as_strided_input_mutation(gm.graph, dynamic=dynamic),
                as_strided_input_mutation(gm.graph, dynamic=False),
                dynamic,
            )
        )
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=True)(x)
    return seen[0]


def strided_then_written(x: Tensor) -> Tensor:
    v = x.as_strided((2, x.shape[1]), x.stride(), x.storage_offset() + x.stride(0))
    x[0] += 1
    return v * 1


def strided_of_a_slice_then_written_through_another(x: Tensor) -> Tensor:
    v = x[1:].as_strided((2, x.shape[1]), x.stride(), x.storage_offset() + x.stride(0))
    x.t().mul_(2)
    return v * 1


def strided_not_written(x: Tensor) -> Tensor:
    return x.as_strided((2, x.shape[1]), x.stride(), x.storage_offset() + x.stride(0)) * 1


def written_not_strided(x: Tensor) -> Tensor:
    x.add_(1)
    return x[1:3] * 1


def strided_of_a_copy_written(x: Tensor) -> Tensor:
    y = x.clone()
    v = y.as_strided((2, x.shape[1]), x.stride(), y.stride(0))
    y.add_(1)
    return v * 1


@pytest.mark.parametrize(
    ("fn", "hazard"),
    [
        (strided_then_written, True),
        (strided_of_a_slice_then_written_through_another, True),
        (strided_not_written, False),
        (written_not_strided, False),
        (strided_of_a_copy_written, False),
    ],
)
def test_only_as_strided_views_of_written_inputs_are_hazards(
    fn: Callable[..., Tensor], hazard: bool
) -> None:
    found, _, dynamic = check(fn, torch.arange(48.0).view(6, 8)[1:5])
    assert dynamic
    assert (found is not None) == hazard, found


def test_static_shapes_are_not_a_hazard() -> None:
    _, found_static, _ = check(strided_then_written, torch.zeros(4, 8))
    assert found_static is None
    assert not has_dynamic_inputs([torch.zeros(4, 8), 3])
