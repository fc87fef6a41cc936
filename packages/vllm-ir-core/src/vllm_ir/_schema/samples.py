"""Sample inputs: what each op ships so tests and benchmarks exercise it alike."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SampleInput", "SampleInputGenerator"]


@dataclass(frozen=True)
class SampleInput:
    """Positional arguments of one op call, with a name for test ids."""

    args: tuple[Any, ...]
    name: str

    def clone(self) -> SampleInput:
        """A deep copy of the tensors, so an in-place impl cannot spoil the next run."""
        return SampleInput(
            tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in self.args), self.name
        )


SampleInputGenerator = Callable[[torch.dtype, torch.device], Iterator[SampleInput]]
"""``generator(dtype, device)`` yields the sample calls of an op."""
