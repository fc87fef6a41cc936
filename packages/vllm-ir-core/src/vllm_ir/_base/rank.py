"""This process's rank, for per-rank files (``{rank}`` in a path)."""

from __future__ import annotations

import os

import torch

__all__ = ["process_rank"]


def process_rank() -> tuple[str, str] | None:
    """This process's rank as ``(where it came from, value)``: ``RANK``, else
    ``LOCAL_RANK``, else torch.distributed's rank once its process group is up
    (vLLM's workers set neither variable); None where no rank is known.

    >>> import os; os.environ["RANK"] = "3"
    >>> process_rank()
    ('RANK', '3')
    >>> del os.environ["RANK"]
    """
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value:
            return name, value
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return "torch.distributed's rank", str(dist.get_rank())
    return None
