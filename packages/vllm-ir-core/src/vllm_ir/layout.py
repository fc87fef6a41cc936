"""Layout predicates for ``supports_args``, judged without guarding on sizes.

``supports_args`` runs on FakeTensors under compile, where reading a
symbolic size would specialize the graph. These answer from strides with
``statically_known_true``: ``False`` when symbolic sizes leave a question
open, so a compiled graph never gains a guard from them. Kernels that take
rows with a row stride ask :func:`rows_flatten_free`; kernels that index
densely ask :func:`contiguous`.

>>> import torch
>>> rows_flatten_free(torch.empty(4, 256)[:, :128]), contiguous(torch.empty(4, 256)[:, :128])
(True, False)
"""

from __future__ import annotations

from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["contiguous", "rows_flatten_free"]


def _known(condition: object) -> bool:
    return bool(statically_known_true(condition))  # type: ignore[arg-type]


def rows_flatten_free(t: Tensor) -> bool:
    """``t.reshape(-1, t.shape[-1])`` is a view whose rows have unit stride.

    The row stride may exceed the row length (a slice of wider rows).
    """
    if t.dim() == 0:
        return False
    if not (_known(t.stride(-1) == 1) or _known(t.shape[-1] == 1)):
        return False
    for i in range(t.dim() - 2):
        if _known(t.shape[i] == 1):
            continue  # a size-1 dimension's stride is never used
        if not _known(t.stride(i) == t.stride(i + 1) * t.shape[i + 1]):
            return False
    return True


def contiguous(t: Tensor) -> bool:
    """``t`` is contiguous, judged without guards (``False`` when symbolic sizes leave it open)."""
    if not rows_flatten_free(t):
        return False
    return t.dim() < 2 or _known(t.shape[-2] == 1) or _known(t.stride(-2) == t.shape[-1])
