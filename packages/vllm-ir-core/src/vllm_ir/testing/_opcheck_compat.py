"""What ``torch.library.opcheck`` does differently across the torch versions vllm-ir supports.

The kit asks here, never compares versions itself; each difference is found
by feature detection and named with the torch versions it was seen on.

**Strides on CPU.** opcheck's ``test_faketensor`` compares the fake impl's
outputs with the impl's (``CrossRefFakeMode``, then
``torch._prims_common.compare_tensor_meta``). torch 2.11 compares strides only
where a tensor is on CUDA (``check_significant_strides(only_cuda=True)``, the
default), so on CPU a fake impl with other strides than the impl passed;
torch 2.13 compares them on every device (pytorch/pytorch#177115, #183002).
Wrong fake strides make Inductor address an impl's output wrongly, so the kit
compares them on every torch: :func:`strides_compared_on_every_device`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

__all__ = ["strides_compared_on_every_device"]


@functools.cache
def _compares_strides_on_cpu() -> bool:
    """Whether torch's fake-tensor cross-check compares strides of CPU tensors."""
    import torch
    from torch._prims_common import compare_tensor_meta

    rows = torch.empty(2, 3)
    columns = rows.t().contiguous().t()  # the same sizes, other strides
    try:
        compare_tensor_meta(rows, columns, check_strides=True)
    except Exception:
        return True
    return False


@contextlib.contextmanager
def strides_compared_on_every_device() -> Iterator[None]:
    """Within the block, opcheck's fake-tensor test compares strides on every device.

    Where torch does not (2.11), its ``compare_tensor_meta`` is pointed at a
    stride check without the CUDA-only gate, as torch 2.13's is, for the
    block: process-wide, so run opcheck in it from one thread at a time.
    """
    if _compares_strides_on_cpu():
        yield
        return
    import torch._prims_common as prims_common

    original = prims_common.check_significant_strides
    prims_common.check_significant_strides = functools.partial(original, only_cuda=False)
    try:
        yield
    finally:
        prims_common.check_significant_strides = original
