"""Every rank lowers an op to the same impl: the autotuner's choices, agreed over a group.

Ranks that time kernels alone choose differently under noise, and ranks of one
tensor-parallel group then round replicated activations differently. Under
torch.distributed each autotune decision ends with rank 0's choice broadcast to
the group (its first rank's), measured or read from the cache alike, so every
rank makes the same number of broadcasts in the same order as long as the
ranks compile the same graphs. Ranks that compile different graphs (pipeline
stages) must not share a group: :func:`set_tuning_group` names the group (the
vLLM plugin sets vLLM's tensor-parallel group), or ``None`` to decide alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vllm_ir._base.logger import get_logger

__all__ = ["agreed_winner", "set_tuning_group"]

logger = get_logger("vllm_ir.compilation.autotune")

_DEFAULT_GROUP: Any = object()
_group: Any = _DEFAULT_GROUP


def set_tuning_group(group: Any) -> Any:
    """Set the process group whose ranks lower each op alike; returns the previous one.

    ``group``: a ``torch.distributed`` process group, ``"default"`` (the default
    group, once initialized: the setting a process starts with), or ``None``
    (each rank keeps its own measurement).

    >>> previous = set_tuning_group(None)
    >>> set_tuning_group(previous) is None
    True
    """
    global _group
    previous = "default" if _group is _DEFAULT_GROUP else _group
    _group = _DEFAULT_GROUP if group == "default" else group
    return previous


def _agreeing_group() -> tuple[bool, Any]:
    """(whether ranks agree, the group argument of torch.distributed's calls)."""
    dist = torch.distributed
    if _group is None or not (dist.is_available() and dist.is_initialized()):
        return False, None
    group = None if _group is _DEFAULT_GROUP else _group
    try:
        return dist.get_world_size(group) > 1, group
    except (RuntimeError, ValueError):  # a group destroyed since it was set
        return False, None


def agreed_winner(op: str, winner: str, candidates: Sequence[str]) -> str:
    """``winner`` as the group's first rank chose it (this rank's own where no group
    agrees, or where that impl is not a candidate here: logged)."""
    agrees, group = _agreeing_group()
    if not agrees:
        return winner
    dist = torch.distributed
    box = [winner]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(box, src=src, group=group)
    chosen = str(box[0])
    if chosen == winner:
        return winner
    if chosen not in candidates:
        logger.warning(
            "autotune %s: rank %d chose %s, which is no candidate on this rank; this rank "
            "runs %s, so the ranks differ",
            op,
            src,
            chosen,
            winner,
        )
        return winner
    logger.info(
        "autotune %s: this rank measured %s fastest, rank %d chose %s: every rank runs %s",
        op,
        winner,
        src,
        chosen,
        chosen,
    )
    return chosen
