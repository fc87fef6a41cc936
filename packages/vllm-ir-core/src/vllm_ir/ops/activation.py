"""Gated activations."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_ir.op import register_op
from vllm_ir.samples import SampleInput

__all__ = ["silu_and_mul"]


@register_op
def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(gate) * up`` where ``gate, up`` are the two halves of the last dim."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@silu_and_mul.register_input_generator
def _silu_and_mul_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    gen = torch.Generator().manual_seed(2)
    for shape in ((1, 128), (7, 192), (2, 3, 2000)):
        x = torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)
        yield SampleInput((x,), "x".join(map(str, shape)))
    # an odd half width (17), no multiple of any vector width
    x = torch.randn(5, 34, generator=gen).to(dtype=dtype, device=device)
    yield SampleInput((x,), "5x34-odd-half")
