"""Numerical tolerances per dtype, in one place, for tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DEFAULT_TOLERANCES", "Tolerance", "tolerance_for"]


@dataclass(frozen=True)
class Tolerance:
    """``torch.testing.assert_close`` tolerances for one dtype."""

    atol: float
    rtol: float


DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=1e-3, rtol=1e-3),
    # one bf16 ulp at 1.0 is 2**-7; kernels may round intermediate sums differently
    torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
}


def tolerance_for(
    dtype: torch.dtype, overrides: dict[torch.dtype, Tolerance] | None = None
) -> Tolerance:
    """The tolerance for ``dtype``, with per-op ``overrides`` taking precedence.

    >>> tolerance_for(torch.float32)
    Tolerance(atol=1e-05, rtol=1e-05)
    """
    if overrides and dtype in overrides:
        return overrides[dtype]
    try:
        return DEFAULT_TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(str(d) for d in DEFAULT_TOLERANCES)
        raise KeyError(f"no tolerance defined for {dtype}; known dtypes: {known}") from None
