"""vllm_ir._schema.layout: the guard-free layout predicates agree with torch on real tensors."""

from __future__ import annotations

import random

import pytest
import torch
from vllm_ir._schema.layout import contiguous, rows_flatten_free


def _flattens_to_unit_stride_rows(t: torch.Tensor) -> bool:
    try:
        rows = t.view(-1, t.shape[-1])
    except RuntimeError:
        return False
    return t.shape[-1] == 1 or rows.stride(-1) == 1


def test_sequence_first_batch_1_rows_flatten() -> None:
    seq_first = torch.randn(1, 16, 128).transpose(0, 1)
    assert seq_first.shape == (16, 1, 128)
    assert seq_first.stride() == (128, 2048, 1)
    assert rows_flatten_free(seq_first)
    assert contiguous(seq_first)


@pytest.mark.parametrize(
    ("tensor", "rows", "dense"),
    [
        (torch.empty(4, 256)[:, :128], True, False),  # a slice of wider rows
        (torch.empty(128, 4).t(), False, False),  # column stride 4
        (torch.empty(3, 4, 64).transpose(0, 1), False, False),  # flatten would copy
        (torch.empty(16, 1, 64).as_strided((16, 1, 64), (7, 64, 1)), True, False),  # overlapping
        (torch.empty(2, 3, 8), True, True),
        (torch.tensor(1.0), False, False),
    ],
)
def test_examples(tensor: torch.Tensor, rows: bool, dense: bool) -> None:
    assert rows_flatten_free(tensor) is rows
    assert contiguous(tensor) is dense


def test_random_layouts_agree_with_view_and_is_contiguous() -> None:
    rng = random.Random(0)
    storage = torch.empty(4096)
    checked = 0
    for _ in range(5000):
        rank = rng.randint(1, 4)
        shape = [rng.choice([1, 1, 2, 3, 4]) for _ in range(rank)]
        strides = [rng.choice([0, 1, 2, 3, 4, 6, 8, 12, 24, 48]) for _ in range(rank)]
        t = storage.as_strided(shape, strides)
        assert rows_flatten_free(t) == _flattens_to_unit_stride_rows(t), (shape, strides)
        assert contiguous(t) == t.is_contiguous(), (shape, strides)
        checked += 1
    assert checked == 5000


def test_symbolic_sizes_answer_without_guards() -> None:
    """Under compile (a ``SymInt`` row length) the predicates ask torch's
    symbolic-shapes module, imported on first need: a question the symbols
    leave open is ``False`` and adds no guard."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    shape_env = ShapeEnv()
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
    real = torch.empty(8, 64)
    with FakeTensorMode(shape_env=shape_env) as mode:
        t = mode.from_tensor(
            real,
            static_shapes=False,
            source=ConstantSource("t"),
            symbolic_context=dynamic,
        )
        part = t[:, :3]  # slicing guards (s1 >= 3); the predicates must add none
        guards = len(shape_env.guards)
        assert isinstance(t.shape[-1], torch.SymInt)
        assert rows_flatten_free(t)  # unit stride rows, whatever the sizes
        assert rows_flatten_free(part)
        assert contiguous(t)
        assert not contiguous(part)  # row stride s1 vs length 3: open, so False
    assert len(shape_env.guards) == guards
