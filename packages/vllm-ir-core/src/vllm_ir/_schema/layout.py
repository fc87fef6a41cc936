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

import functools

import torch
from torch import SymInt, Tensor

__all__ = [
    "apart",
    "contiguous",
    "may_overlap_itself",
    "rows_flatten_free",
    "storage_span",
    "storages_meet",
]


def _known(condition: object) -> bool:
    """``condition`` holds for every value its symbols may take.

    Eager sizes are plain ints, so their comparisons are plain bools: answered
    here, without importing torch's symbolic-shapes module (and sympy with
    it, 1.5 s of every ``import vllm_ir`` otherwise). Only a ``SymBool``
    (under compile, where that module is loaded already) asks it.
    """
    if isinstance(condition, bool):
        return condition
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(condition))  # type: ignore[arg-type]


def _row_stride(t: Tensor) -> int | SymInt | bool | None:
    """The row stride of ``t.reshape(-1, t.shape[-1])`` if that is a view with
    unit-stride rows: ``True`` when there is no outer dimension to step over,
    ``None`` when it is not (or symbolic sizes leave it open)."""
    if t.dim() == 0:
        return None
    if not (_known(t.stride(-1) == 1) or _known(t.shape[-1] == 1)):
        return None
    # Walk the outer dimensions from the inside out; a size-1 dimension is
    # never stepped over, so its stride does not matter (a sequence-first
    # batch-1 tensor (S, 1, H) has any stride there).
    row_stride: int | SymInt | None = None  # of the innermost outer dim stepped over
    inner: tuple[int | SymInt, int | SymInt] | None = None  # (stride, size) of the last one
    for i in reversed(range(t.dim() - 1)):
        if _known(t.shape[i] == 1):
            continue
        if inner is None:
            row_stride = t.stride(i)
        elif not _known(t.stride(i) == inner[0] * inner[1]):
            return None
        inner = (t.stride(i), t.shape[i])
    return True if row_stride is None else row_stride


def rows_flatten_free(t: Tensor) -> bool:
    """``t.reshape(-1, t.shape[-1])`` is a view whose rows have unit stride.

    The row stride may exceed the row length (a slice of wider rows); the
    strides of size-1 dimensions are ignored, as ``view`` ignores them.
    """
    return _row_stride(t) is not None


def contiguous(t: Tensor) -> bool:
    """``t`` is contiguous, judged without guards (``False`` when symbolic sizes leave it open).

    As ``Tensor.is_contiguous()``, the strides of size-1 dimensions are ignored.
    """
    row_stride = _row_stride(t)
    if row_stride is None:
        return False
    return row_stride is True or _known(row_stride == t.shape[-1])


def may_overlap_itself(t: Tensor) -> bool:
    """Two elements of ``t`` may share memory (rows from ``expand``, a row
    stride below the row length): writing ``t`` in place is not elementwise.

    For eager tensors (plain sizes). Conservative: ``False`` proves no
    overlap (each dimension's stride steps past everything the smaller
    strides reach); ``True`` means the strides do not prove it.

    >>> import torch
    >>> may_overlap_itself(torch.empty(1, 8).expand(4, 8))
    True
    >>> may_overlap_itself(torch.empty(4, 16)[:, :8])
    False
    """
    if t.is_contiguous():
        return False
    dims = sorted((int(st), int(sz)) for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1)
    reach = 0  # the largest offset the smaller strides reach
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def storage_span(t: Tensor) -> tuple[int, int]:
    """The address range ``[start, end)`` of ``t``'s storage (eager tensors)."""
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def storages_meet(a: Tensor, b: Tensor) -> bool:
    """The memory of ``a``'s storage and ``b``'s share an address: one storage,
    or two storage objects over one buffer (``torch.from_numpy`` of two views
    of one array, ``torch.frombuffer`` twice). Eager tensors.

    Decided by addresses, as torch's own overlap checks are: storage identity
    (``torch._C._is_alias_of``) misses the second case.

    >>> import numpy as np, torch
    >>> buf = np.zeros(8, dtype=np.float32)
    >>> storages_meet(torch.from_numpy(buf[:5]), torch.from_numpy(buf[4:]))
    True
    >>> storages_meet(torch.empty(4), torch.empty(4))
    False
    """
    start_a, end_a = storage_span(a)
    start_b, end_b = storage_span(b)
    return start_a < end_b and start_b < end_a


# (byte offset from the first tensor's data, sizes, strides, item size): all
# ``apart`` reads of a tensor
_Layout = tuple[int, torch.Size, tuple[int, ...], int]


def _layout(t: Tensor, offset: int) -> _Layout:
    return offset, t.shape, t.stride(), t.element_size()


def _byte_layout(layout: _Layout) -> tuple[int, int, int, int]:
    """``(start, end, period, width)`` in bytes of a tensor of non-negative strides.

    Its bytes lie in ``[start, end)``, and each in some ``[start + i * period,
    start + i * period + width)``: ``i`` steps its largest-stride dimension
    (``period`` 0 when no dimension has two elements), ``width`` spans the others.
    """
    begin, shape, strides, item = layout
    dims = [(st * item, sz) for sz, st in zip(shape, strides, strict=True) if sz > 1]
    span = sum(st * (sz - 1) for st, sz in dims)
    if not dims:
        return begin, begin + item, 0, item
    period, size = max(dims)
    return begin, begin + span + item, period, span - period * (size - 1) + item


def apart(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` share no byte of memory, proven from their sizes, strides
    and data addresses (views of one buffer, through one storage object or
    several; eager tensors, plain sizes).

    Conservative: ``True`` proves it; ``False`` means the layouts do not. Proven
    when their byte ranges do not meet, or when both are rows of one period (the
    stride of each one's largest-stride dimension) whose windows within a period
    do not meet: the query and key columns of one ``qkv`` tensor.

    >>> import torch
    >>> qkv = torch.empty(8, 1536)
    >>> q, k, v = qkv.split([1024, 256, 256], dim=-1)
    >>> apart(q, k), apart(q, qkv), apart(qkv[:, :1025], k)
    (True, False, False)
    """
    if a.layout != torch.strided or b.layout != torch.strided:
        return False
    # addresses relative to a's data: the memo below sees the same few keys each step
    return _layouts_apart(_layout(a, 0), _layout(b, b.data_ptr() - a.data_ptr()))


# an eager call of maybe_inplace asks this for every pair of views it is given:
# the same few layouts each decode step (a memo costs 1 us, the arithmetic 5)
@functools.lru_cache(maxsize=1024)
def _layouts_apart(a: _Layout, b: _Layout) -> bool:
    if 0 in a[1] or 0 in b[1]:  # no elements
        return True
    if any(st < 0 for st in (*a[2], *b[2])):
        return False
    start_a, end_a, period_a, width_a = _byte_layout(a)
    start_b, end_b, period_b, width_b = _byte_layout(b)
    if end_a <= start_b or end_b <= start_a:
        return True
    period = period_a or period_b  # one element is a row of any period
    if period == 0 or period_a not in (0, period) or period_b not in (0, period):
        return False
    if width_a > period or width_b > period:
        return False
    gap = (start_b - start_a) % period  # where b's window starts within a's period
    return gap >= width_a and gap + width_b <= period
