"""Numerical tolerances per dtype, in one place, for tests and benchmarks.

What a kernel can promise against the native function depends on whether it
reduces. Summation order is the only freedom a faithful kernel has (every
other step is an IEEE operation or a round-to-nearest-even conversion it can
reproduce), so:

* **Elementwise ops and exact reductions** (``static_scaled_fp8_quant``;
  ``dynamic_per_token_fp8_quant``, whose ``amax`` is a maximum): bit-exact
  (:data:`EXACT`). The kernel must divide with IEEE division (Triton's ``/``
  is approximate on NVIDIA GPUs) and compute the dynamic scale as native does
  on the same device (see :data:`FP8_DYNAMIC_SCALE`).
* **Norms** (a sum of squares in fp32): ``inv_rms`` differs from torch's by a
  few fp32 ulps, so ``y = round(x * inv_rms)`` can land one ulp of the dtype
  away where ``x * inv_rms`` is that close to a rounding midpoint; native then
  rounds ``y * weight`` again. A one-ulp change of ``y`` moves the product by
  ``|w| * ulp(y) <= 2**-p * |out|`` (``p`` = significand bits after the point:
  10 for float16, 7 for bfloat16), and the two roundings add at most one ulp
  of ``out``: ``|got - want| <= 2 * 2**-p * |out|``, i.e. two ulps.
  :data:`NORM_TOLERANCES` states that (``rtol = 2**-(p - 1)`` plus slack),
  with ``atol`` for results near zero (and subnormals).
* **Norm + FP8 quantization**: the pre-quantization value is the norm's
  (within two ulps of the dtype, far below one FP8 step of ``2**-3``
  relative), so it crosses at most one FP8 rounding boundary: at most **one
  FP8 step** (:data:`FP8_ONE_STEP`), and only where a norm result differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ir._base.deprecation import warn_deprecated
from vllm_ir._base.registration import RegistrationHandle, on_snapshot, record

__all__ = [
    "DEFAULT_TOLERANCES",
    "EXACT",
    "FP8_DYNAMIC_SCALE",
    "FP8_ONE_STEP",
    "NORM_TOLERANCES",
    "Tolerance",
    "ToleranceTable",
    "fp8_steps_apart",
    "tolerance_for",
]


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


EXACT = Tolerance(atol=0.0, rtol=0.0)
"""Bit for bit: elementwise ops whose every step is an IEEE operation or a rounding."""

FP8_ONE_STEP = Tolerance(atol=2.0**-9, rtol=2.0**-3)
"""One ``float8_e4m3fn`` step: ``2**-3`` relative for normals (3 significand bits),
``2**-9`` absolute for subnormals (the format's smallest step)."""

FP8_DYNAMIC_SCALE = "amax * float32(1 / 448) on CUDA; amax / 448 (IEEE) on CPU"
"""How the native ``dynamic_per_token_fp8_quant`` computes a row's scale on each
device. ``amax / FP8_MAX`` divides by a Python scalar: ATen's CUDA kernel then
multiplies by the scalar's float32 reciprocal, its CPU kernel divides. The two
can differ by one float32 ulp, and a quantized value whose ``x / scale`` is
that close to an FP8 tie rounds to the neighbouring code. A kernel that is
exact on both devices computes the scale the way its device's native does."""

NORM_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    # two float16 ulps (2 * 2**-10 relative) plus slack; atol: one ulp at 1.0
    torch.float16: Tolerance(atol=1e-3, rtol=2.5e-3),
    # two bfloat16 ulps (2 * 2**-7 = 1.56e-2 relative) plus slack
    torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
}
"""RMSNorm results (rounded twice, as native does) against native: two ulps (see above)."""


def fp8_steps_apart(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many ``float8_e4m3fn`` codes apart each pair of values is (NaN pairs: 0).

    The codes of a sign are ordered like their values, so the distance is the
    difference of sign-magnitude integers; ``+0`` and ``-0`` are 0 apart.
    """

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.uint8).to(torch.int16)
        mag = bits & 0x7F
        return torch.where(bits >= 0x80, -mag, mag)

    both_nan = got.float().isnan() & want.float().isnan()
    apart = (ordinal(got) - ordinal(want)).abs()
    return torch.where(both_nan, torch.zeros_like(apart), apart)


class ToleranceTable(Mapping[torch.dtype, Tolerance]):
    """One op's tolerances per dtype (``IrOp.tolerances``): read like a dict.

    Entries are added with :meth:`register`, which returns a
    :class:`~vllm_ir.RegistrationHandle` and is recorded like every other
    registration, so a failed provider load takes its entries back and a
    later registration for the same dtype is not undone by an earlier one's
    removal. Item assignment and ``update()`` still work for one release,
    with a ``DeprecationWarning``, through :meth:`register`.

    >>> import torch, vllm_ir as ir
    >>> table = ToleranceTable("doc_op")
    >>> handle = table.register({torch.float16: ir.Tolerance(atol=1e-2, rtol=1e-2)})
    >>> table[torch.float16].atol, len(table)
    (0.01, 1)
    >>> handle.remove()
    >>> len(table)
    0
    """

    __slots__ = ("_entries", "_layers", "op_name")

    def __init__(self, op_name: str) -> None:
        self.op_name = op_name
        self._entries: dict[torch.dtype, Tolerance] = {}
        # per dtype, the registrations in force, oldest first: removing one
        # leaves the newest of the others
        self._layers: dict[torch.dtype, list[tuple[object, Tolerance]]] = {}

    def __getitem__(self, dtype: torch.dtype) -> Tolerance:
        return self._entries[dtype]

    def __iter__(self) -> Iterator[torch.dtype]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ToleranceTable({self.op_name}, {self._entries!r})"

    def register(self, tolerances: Mapping[torch.dtype, Tolerance]) -> RegistrationHandle:
        """Use ``tolerances`` for this op's dtypes until the handle is removed."""
        checked = dict(tolerances)
        for dtype, tolerance in checked.items():
            if not isinstance(dtype, torch.dtype) or not isinstance(tolerance, Tolerance):
                raise TypeError(
                    f"tolerances of op {self.op_name!r} map a torch.dtype to a "
                    f"vllm_ir.Tolerance, got {type(dtype).__name__} -> {type(tolerance).__name__}"
                )
        token = object()
        for dtype, tolerance in checked.items():
            self._layers.setdefault(dtype, []).append((token, tolerance))
            self._entries[dtype] = tolerance

        def undo() -> None:
            for dtype in checked:
                layers = [entry for entry in self._layers.get(dtype, []) if entry[0] is not token]
                if layers:
                    self._layers[dtype] = layers
                    self._entries[dtype] = layers[-1][1]
                else:
                    self._layers.pop(dtype, None)
                    self._entries.pop(dtype, None)

        names = ", ".join(str(d).removeprefix("torch.") for d in checked)
        return record(RegistrationHandle(f"tolerances of op {self.op_name!r} ({names})", undo))

    def __setitem__(self, dtype: torch.dtype, tolerance: Tolerance) -> None:
        self._deprecated("op.tolerances[dtype] = ...")
        self.register({dtype: tolerance})

    def update(self, other: Mapping[torch.dtype, Tolerance] = (), /, **_: Any) -> None:  # type: ignore[assignment]
        self._deprecated("op.tolerances.update(...)")
        self.register(dict(other))

    def _deprecated(self, spelling: str) -> None:
        warn_deprecated(
            f"{spelling} is deprecated: use ir.ops.{self.op_name}.register_tolerances({{...}}), "
            "which returns a handle (the old spelling goes in the next release)",
            stacklevel=3,
        )


def tolerance_for(
    dtype: torch.dtype, overrides: Mapping[torch.dtype, Tolerance] | None = None
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


def _snapshot_defaults() -> Callable[[], str | None]:
    before = dict(DEFAULT_TOLERANCES)

    def restore() -> str | None:
        if before == DEFAULT_TOLERANCES:
            return None
        DEFAULT_TOLERANCES.clear()
        DEFAULT_TOLERANCES.update(before)
        return "default tolerances"

    return restore


# a failed provider load puts back any default tolerance it changed
on_snapshot(_snapshot_defaults)
