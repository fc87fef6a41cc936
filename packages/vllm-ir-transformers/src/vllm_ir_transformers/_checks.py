"""Checks shared by the layer analyses: can a weight be handed to an IR op, and
do two probe results agree.

A layer is only replaced when its weights are plain, materialized floating-point
tensors and a probe shows that the replacement computes what the layer computes.
Each check returns ``None`` when it passes and the reason otherwise, so the
analyses can collect reasons for the report instead of raising.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from vllm_ir.provider import Tolerance

__all__ = [
    "FLOAT_DTYPES",
    "NotApplicable",
    "Probed",
    "active_problem",
    "compare",
    "dtype_name",
    "probe_input",
    "weight_problem",
]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes the IR ops serve; every replacement is probed in each of them."""


class NotApplicable(Exception):
    """A layer cannot be replaced; the message is the reason shown in the report."""


@dataclass(frozen=True, kw_only=True)
class Probed:
    """What every layer analysis records besides its own mapping (the base of the
    ``*Spec`` classes; keyword-only, after each spec's own fields)."""

    dtypes: tuple[torch.dtype, ...]
    """The dtypes the probe verified; the replacement runs only in these."""
    rejected: tuple[tuple[torch.dtype, str], ...]
    """The dtypes it failed in, with the reason."""
    how: str
    """How the probe's result compared with the layer's (for the report)."""
    name: str = ""
    """The module's name in the kernelized model (for logs)."""


def weight_problem(name: str, tensor: Tensor | None) -> str | None:
    """Why ``tensor`` cannot be passed to an IR op, or ``None`` if it can."""
    if tensor is None:
        return f"{name} is None"
    data = tensor.data if isinstance(tensor, nn.Parameter) else tensor
    if type(data) is not torch.Tensor:
        # DTensor, quantized tensor subclasses, FakeTensor, ...
        return f"{name} is a {type(data).__name__}, not a plain tensor (sharded or quantized?)"
    if data.is_meta:
        return f"{name} is on the meta device (not materialized)"
    if data.dtype not in FLOAT_DTYPES:
        return f"{name} has dtype {data.dtype} (quantized?); supported: float32, float16, bfloat16"
    if data.layout is not torch.strided:
        return f"{name} has layout {data.layout}, not strided"
    return None


def probe_input(shape: tuple[int, ...], like: Tensor, seed: int = 0) -> Tensor:
    """A deterministic random activation with ``like``'s dtype and device."""
    gen = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(*shape, generator=gen) + 0.25
    return x.to(dtype=like.dtype, device=like.device)


def compare(got: Tensor, want: Tensor, tol: Tolerance) -> tuple[bool, str]:
    """``(agrees, how)``: bit-exact, within ``tol``, or the largest difference."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return (
            False,
            f"result {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}",
        )
    if torch.equal(got, want):
        return True, "bit-exact on the probe"
    try:
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)
    except AssertionError:
        diff = (got.float() - want.float()).abs().max().item()
        return False, f"max abs difference {diff:.3g} beyond atol={tol.atol}, rtol={tol.rtol}"
    diff = (got.float() - want.float()).abs().max().item()
    return True, f"within tolerance on the probe (max abs difference {diff:.3g})"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def active_problem(
    verified: tuple[torch.dtype, ...],
    rejected: tuple[tuple[torch.dtype, str], ...],
    dtype: torch.dtype,
) -> str | None:
    """Why a replacement probed in ``verified`` dtypes does not run at ``dtype`` (None: it does)."""
    if dtype in verified:
        return None
    for d, reason in rejected:
        if d == dtype:
            return f"not equivalent in {dtype_name(d)}: {reason}"
    return f"{dtype_name(dtype)} was not probed (probed: {', '.join(map(dtype_name, verified))})"


def weighted_problem(
    name: str,
    weight: Tensor | None,
    dtype: torch.dtype,
    verified: tuple[torch.dtype, ...],
    rejected: tuple[tuple[torch.dtype, str], ...],
    inputs: str = "input",
) -> str | None:
    """Why a replacement that multiplies by the weight ``name`` does not run on ``dtype``
    ``inputs`` (None: it does): a weight it cannot use, of another dtype, or ``dtype``
    not verified (:func:`active_problem`)."""
    problem = weight_problem(name, weight)
    if problem:
        return problem
    assert weight is not None  # weight_problem names a missing one
    if weight.dtype != dtype:
        return f"{name} is {weight.dtype}, {inputs} {dtype}"
    return active_problem(verified, rejected, dtype)
