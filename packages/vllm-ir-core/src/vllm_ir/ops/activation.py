"""Gated activations: ``act(gate) * up`` over the two halves of the last dim.

The last dimension of ``x`` must be even: an odd one is a ``ValueError`` with
one message (:func:`check_gated_width`), raised by the native functions and,
before any kernel runs, by every provider's impl.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_ir._op.op import register_op
from vllm_ir._schema.samples import SampleInput
from vllm_ir._schema.tolerances import Tolerance

__all__ = ["GELU_APPROXIMATIONS", "check_gated_width", "gelu_and_mul", "silu_and_mul"]

GELU_APPROXIMATIONS = ("none", "tanh")
"""The ``approximate`` values of ``gelu_and_mul``, as ``torch.nn.functional.gelu``'s."""


def check_gated_width(op: str, x: Tensor) -> None:
    """Raise ``ValueError`` unless ``x``'s last dimension is even (``op``: the op's name).

    ``silu_and_mul`` and ``gelu_and_mul`` take ``x`` as ``(..., 2 * d)``: the gate
    and the up projection side by side. Their native functions and every
    provider's impl call this first, so an odd width gets this one error
    whichever impl is selected (without it, native would broadcast a width of 1
    or 3 and fail on others with torch's size-mismatch error). A kernel binding
    keeps its own check as the last line of defense.
    """
    width = x.shape[-1]
    if width % 2:
        raise ValueError(
            f"{op}: x's last dimension ({width}) must be even: "
            "it holds the gate and the up projection"
        )


@register_op
def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(gate) * up`` where ``gate, up`` are the two halves of the last dim.

    An odd last dim is a ``ValueError`` (:func:`check_gated_width`).
    """
    check_gated_width("silu_and_mul", x)
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@register_op
def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """``gelu(gate, approximate) * up`` where ``gate, up`` are the two halves of the last dim.

    ``approximate`` is ``"none"`` (erf: vLLM's ``gelu_and_mul``) or ``"tanh"``
    (``gelu_tanh_and_mul``; Hugging Face's ``gelu_pytorch_tanh``), as in
    ``torch.nn.functional.gelu``. An odd last dim is a ``ValueError``
    (:func:`check_gated_width`).
    """
    check_gated_width("gelu_and_mul", x)
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate=approximate) * x[..., d:]


# The GELU is rounded to the dtype, then multiplied and rounded again (as
# native does). A kernel's erf/tanh may differ from ATen's by an fp32 ulp or
# two, which moves the rounded GELU by at most one ulp of the dtype where it
# is that close to a midpoint; the product then lands at most two ulps away
# (the argument of vllm_ir._schema.tolerances for norms). fp32: a few ulps of erf.
gelu_and_mul.register_tolerances(
    {
        torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
        torch.float16: Tolerance(atol=1e-3, rtol=2.5e-3),
        torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
    }
)


def _gated_inputs(
    seed: int, dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[Tensor, str]]:
    # every width even: an odd one is an error (check_gated_width), not a sample
    gen = torch.Generator().manual_seed(seed)
    for shape in ((1, 128), (7, 192), (2, 3, 2000)):
        x = torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)
        yield x, "x".join(map(str, shape))
    # an odd half width (17), no multiple of any vector width
    x = torch.randn(5, 34, generator=gen).to(dtype=dtype, device=device)
    yield x, "5x34-odd-half"


@silu_and_mul.register_input_generator
def _silu_and_mul_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    for x, tag in _gated_inputs(2, dtype, device):
        yield SampleInput((x,), tag)


@gelu_and_mul.register_input_generator
def _gelu_and_mul_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    for approximate in GELU_APPROXIMATIONS:
        for x, tag in _gated_inputs(3, dtype, device):
            # a wide range: GELU's erf/tanh saturate beyond |x| ~ 4
            yield SampleInput((x * 2, approximate), f"{tag}-{approximate}")
    # strided rows: the last dim contiguous, rows apart
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4))
    x = x.to(dtype=dtype, device=device)
    yield SampleInput((x[:, :128], "tanh"), "4x128-strided-rows-tanh")
