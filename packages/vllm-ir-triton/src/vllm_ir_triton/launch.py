"""Kernel launches on real tensors, and the launch configurations.

Two configurations, both one program per row:

* ``fast`` (provider ``triton``): the whole row in one block when it fits
  (``BLOCK = next_power_of_2(hidden)`` up to :data:`MAX_FUSED_BYTES` of
  input), read once and kept in registers; longer rows loop over blocks of
  that maximum. ``num_warps`` grows with the block.
* ``batch_invariant`` (provider ``triton_batch_invariant``): a fixed block of
  :data:`BATCH_INVARIANT_BLOCK` columns and :data:`BATCH_INVARIANT_WARPS`
  warps whatever the shapes, so the reduction order of a row depends on its
  length alone.

Rows are addressed with a row and a column stride, so any input whose
leading dimensions collapse into one (every contiguous tensor, strided rows,
a slice of the hidden dimension, even a transposed last dimension) is read
in place. Others (e.g. a permuted 3-D view) are copied to contiguous rows,
and for the in-place kernel the results are copied back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from vllm_ir_triton.kernels import fused_add_rms_norm_kernel, rms_norm_kernel

__all__ = [
    "BATCH_INVARIANT_BLOCK",
    "BATCH_INVARIANT_WARPS",
    "MAX_FUSED_BYTES",
    "LaunchConfig",
    "fused_add_rms_norm_",
    "launch_config",
    "rms_norm",
]

MAX_FUSED_BYTES = 65536
"""The longest row (in bytes of input) read in a single block by the fast configuration."""

BATCH_INVARIANT_BLOCK = 1024
"""Block (columns) of the batch-invariant configuration, as vLLM's batch-invariant RMSNorm."""

BATCH_INVARIANT_WARPS = 4


@dataclass(frozen=True)
class LaunchConfig:
    """How one row is processed: block width, single pass or loop, warps."""

    block: int
    single_pass: bool
    num_warps: int


def launch_config(
    hidden: int, element_size: int, *, batch_invariant: bool, max_block: int | None = None
) -> LaunchConfig:
    """The configuration for rows of ``hidden`` elements of ``element_size`` bytes.

    Depends on the row, never on the number of rows. ``max_block`` caps the
    block (tests use it to exercise the loop on short rows).
    """
    if batch_invariant:
        block = BATCH_INVARIANT_BLOCK if max_block is None else max_block
        return LaunchConfig(block, hidden <= block, BATCH_INVARIANT_WARPS)
    cap = MAX_FUSED_BYTES // element_size if max_block is None else max_block
    block = min(triton.next_power_of_2(max(hidden, 1)), cap)
    num_warps = min(max(block // 256, 1), 8)
    return LaunchConfig(block, hidden <= block, num_warps)


_MAX_COLUMN_OFFSET = 2**31 - 1
"""Column offsets are 32-bit in the kernels (row offsets are 64-bit)."""


def _rows(t: Tensor) -> Tensor | None:
    """A 2-D view (rows, hidden) of ``t`` sharing its memory that the kernels can
    address, or None (then the caller works on a contiguous copy)."""
    if t.dim() == 1:
        rows: Tensor | None = t.unsqueeze(0)
    elif t.dim() == 2:
        rows = t
    else:
        try:
            rows = t.view(-1, t.shape[-1])
        except RuntimeError:  # the leading dimensions do not collapse into one stride
            rows = None
    if rows is not None and (rows.shape[1] - 1) * abs(rows.stride(1)) > _MAX_COLUMN_OFFSET:
        return None
    return rows


def _checked_weight(x: Tensor, weight: Tensor | None, op: str) -> Tensor | None:
    """``weight``, checked to be a 1-D tensor of ``hidden`` elements on ``x``'s device."""
    if weight is None:
        return None
    if weight.device != x.device:
        raise ValueError(f"{op}: weight is on {weight.device} but x is on {x.device}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{op}: weight of shape {tuple(weight.shape)} does not match rows of "
            f"{x.shape[-1]} elements"
        )
    return weight


def rms_norm(
    x: Tensor,
    weight: Tensor | None,
    epsilon: float,
    *,
    batch_invariant: bool = False,
    max_block: int | None = None,
) -> Tensor:
    """RMSNorm of ``x`` into a new contiguous tensor of ``x``'s dtype."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    hidden = x.shape[-1]
    weight = _checked_weight(x, weight, "rms_norm")
    rows = _rows(x)
    if rows is None:
        rows = x.contiguous().view(-1, hidden)
    out_rows = out.view(-1, hidden)
    cfg = launch_config(
        hidden, x.element_size(), batch_invariant=batch_invariant, max_block=max_block
    )
    rms_norm_kernel[(rows.shape[0],)](
        rows,
        rows.stride(0),
        rows.stride(1),
        weight if weight is not None else rows,
        weight.stride(0) if weight is not None else 0,
        out_rows,
        out_rows.stride(0),
        out_rows.stride(1),
        hidden,
        epsilon,
        HAS_WEIGHT=weight is not None,
        BLOCK=cfg.block,
        SINGLE_PASS=cfg.single_pass,
        num_warps=cfg.num_warps,
    )
    return out


def fused_add_rms_norm_(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    *,
    batch_invariant: bool = False,
    max_block: int | None = None,
) -> None:
    """In place: ``x_residual += x`` (rounded to the dtype), then ``x = rms_norm(x_residual)``.

    ``x`` and ``x_residual`` must have the same shape (the caller checks).
    """
    if x_residual.shape != x.shape or x_residual.device != x.device:
        raise ValueError(
            f"fused_add_rms_norm_: x_residual {tuple(x_residual.shape)} on {x_residual.device} "
            f"must have the shape and device of x {tuple(x.shape)} on {x.device}"
        )
    if x.numel() == 0:
        return
    hidden = x.shape[-1]
    weight = _checked_weight(x, weight, "fused_add_rms_norm_")
    x_rows, r_rows = _rows(x), _rows(x_residual)
    copy_back = x_rows is None or r_rows is None
    if x_rows is None or r_rows is None:
        x_rows = x.contiguous().view(-1, hidden)
        r_rows = x_residual.contiguous().view(-1, hidden)
    cfg = launch_config(
        hidden, x.element_size(), batch_invariant=batch_invariant, max_block=max_block
    )
    fused_add_rms_norm_kernel[(x_rows.shape[0],)](
        x_rows,
        x_rows.stride(0),
        x_rows.stride(1),
        r_rows,
        r_rows.stride(0),
        r_rows.stride(1),
        weight if weight is not None else x_rows,
        weight.stride(0) if weight is not None else 0,
        hidden,
        epsilon,
        HAS_WEIGHT=weight is not None,
        BLOCK=cfg.block,
        SINGLE_PASS=cfg.single_pass,
        num_warps=cfg.num_warps,
    )
    if copy_back:
        x.copy_(x_rows.view(x.shape))
        x_residual.copy_(r_rows.view(x_residual.shape))
