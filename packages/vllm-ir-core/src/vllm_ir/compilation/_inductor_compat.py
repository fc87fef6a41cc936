"""What Inductor does differently across the torch versions vllm-ir supports.

The passes ask here, never compare versions themselves. Each difference is
found by feature detection and named with the torch versions it was seen on.

**Explicit ``as_strided`` offsets on graph inputs.** ``aten.as_strided(x,
size, stride, offset)`` addresses ``x``'s storage: the offset is absolute.
Inductor in torch 2.11 lowers it, for a graph input ``x``, relative to the
input's first element instead (the pointer it is handed), so on
``x = base[1:5]`` (storage offset 8) ``x.as_strided((2, 8), (8, 1), 8)``
reads rows 2..3 of ``base``, not rows 1..2; plain ``torch.compile`` too
(pytorch/pytorch#175325). torch 2.13's Inductor subtracts the input's storage
offset (pytorch/pytorch#180581, which gave the ``as_strided`` lowering its
``storage_offset_relative_to_input_storage`` keyword).
"""

from __future__ import annotations

import functools
import inspect

__all__ = ["as_strided_input_offsets_count_from_the_input"]


@functools.cache
def as_strided_input_offsets_count_from_the_input() -> bool:
    """Whether Inductor takes an explicit ``as_strided`` offset on a graph input
    as counted from the input's first element (torch 2.11), not from the start
    of its storage as eager does (torch 2.13 and later)."""
    from torch._inductor import lowering

    parameters = inspect.signature(lowering.as_strided).parameters
    return "storage_offset_relative_to_input_storage" not in parameters
