"""``supports_args`` builders for the norm family, shared by the provider packages.

The kernels of ``rms_norm`` and ``fused_add_rms_norm`` (cpu, cuda, triton
and the vendor wrappers) accept the same kind of arguments and differ only
in device types, dtypes and layout: :func:`norm_supports_args` builds both
predicates from those. Public through :mod:`vllm_ir.provider`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

__all__ = ["TensorCheck", "norm_supports_args"]

TensorCheck = Callable[..., bool]
"""A ``supports_args`` predicate."""


def norm_supports_args(
    device_types: str | Iterable[str],
    dtypes: Iterable[torch.dtype],
    *,
    rms_layout: Callable[[Tensor], bool] | None = None,
    fused_layout: Callable[[Tensor, Tensor], bool] | None = None,
    available: Callable[[], bool] | None = None,
) -> tuple[TensorCheck, TensorCheck]:
    """``(rms_norm_supports, fused_add_rms_norm_supports)`` for one kind of kernel.

    Both accept strided ``x`` of rank >= 1 on one of ``device_types`` with a
    dtype in ``dtypes``, a weight of ``x``'s dtype and rank 1 (or none), and no
    ``variance_size``; ``fused_add_rms_norm`` also wants ``x_residual`` of
    ``x``'s dtype and rank. ``rms_layout(x)`` and ``fused_layout(x, x_residual)``
    add what the kernel needs of the layout (use the predicates of this module,
    which never guard); ``available()`` is asked last (a kernel that is built on
    first use, say).
    """
    devices = frozenset([device_types] if isinstance(device_types, str) else device_types)
    accepted = frozenset(dtypes)

    def tensors_ok(x: Tensor, weight: Tensor | None) -> bool:
        return (
            x.device.type in devices
            and x.dtype in accepted
            and x.layout == torch.strided
            and x.ndim >= 1
            and (weight is None or (weight.dtype == x.dtype and weight.ndim == 1))
        )

    def rms_norm_supports(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> bool:
        return (
            variance_size is None
            and tensors_ok(x, weight)
            and (rms_layout is None or rms_layout(x))
            and (available is None or available())
        )

    def fused_add_rms_norm_supports(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> bool:
        return (
            variance_size is None
            and x_residual.dtype == x.dtype
            and x_residual.ndim == x.ndim
            and tensors_ok(x, weight)
            and (fused_layout is None or fused_layout(x, x_residual))
            and (available is None or available())
        )

    return rms_norm_supports, fused_add_rms_norm_supports
