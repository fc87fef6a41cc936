"""What the norm family's impls share, across the provider packages.

The kernels of ``rms_norm`` and ``fused_add_rms_norm`` (cpu, cuda, triton,
the vendor wrappers, a third party's) accept the same kind of arguments and
are wired the same way; they differ in device types, dtypes, layout and the
kernel call. Here, for provider authors (``from vllm_ir.kits.norms import ...``):

* :func:`norm_supports_args`: both ``supports_args`` predicates from those;
* :func:`fused_add_in_place`: the in-place ``fused_add_rms_norm`` impl, with
  the op's signature, over a kernel that writes both activations;
* :func:`register_norm_impls`: the pair registered (``fused_add_rms_norm``
  declared ``inplace``), and with a kernel of vLLM's numerics also
  ``vllm_rms_norm`` (the ``rms_norm`` impl: the ops agree for a weight of
  ``x``'s dtype, the only weight these predicates accept) and
  ``vllm_fused_add_rms_norm``.

>>> import torch
>>> def kernel(x, x_residual, weight, epsilon, variance_size):
...     x_residual.add_(x)
...     x.copy_(torch.nn.functional.rms_norm(x_residual, x.shape[-1:], weight, epsilon))
>>> impl = fused_add_in_place(kernel, module=__name__, doc="an example")
>>> x, r = torch.ones(2, 4), torch.ones(2, 4)
>>> out, residual = impl(x, r, None, 1e-6)
>>> out is x, residual is r, residual[0, 0].item()
(True, True, 2.0)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from vllm_ir._schema.tolerances import NORM_TOLERANCES

__all__ = [
    "NORM_TOLERANCES",
    "TensorCheck",
    "fused_add_in_place",
    "norm_supports_args",
    "register_norm_impls",
]

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


FusedKernel = Callable[[Tensor, Tensor, "Tensor | None", float, "int | None"], object]
"""``(x, x_residual, weight, epsilon, variance_size)``: writes the rounded sum into
``x_residual`` and its RMSNorm into ``x``."""


def fused_add_in_place(
    kernel: FusedKernel, *, module: str, doc: str, name: str = "fused_add_rms_norm"
) -> Callable[..., tuple[Tensor, Tensor]]:
    """The in-place ``fused_add_rms_norm`` impl over ``kernel``: returns ``(x, x_residual)``.

    The function has the op's signature; it is named ``name``, credited to
    ``module`` (the impl's package, for attribution and reprs) and documented
    by ``doc``. ``kernel`` gets every argument, ``variance_size`` included
    (most kernels leave refusing it to their ``supports_args``).
    """

    def fused_add_rms_norm(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        kernel(x, x_residual, weight, epsilon, variance_size)
        return x, x_residual

    fused_add_rms_norm.__module__ = module
    fused_add_rms_norm.__name__ = fused_add_rms_norm.__qualname__ = name
    fused_add_rms_norm.__doc__ = doc
    return fused_add_rms_norm


def register_norm_impls(
    provider: str,
    rms_norm: Callable[..., Any],
    fused_add_rms_norm: Callable[..., Any],
    *,
    supported: bool,
    supports_args: tuple[TensorCheck, TensorCheck],
    vllm_fused_add_rms_norm: Callable[..., Any] | None = None,
    **flags: Any,
) -> None:
    """Register ``rms_norm`` and the in-place ``fused_add_rms_norm`` impls of ``provider``.

    ``supports_args`` is the pair :func:`norm_supports_args` returns; ``flags``
    (``batch_invariant``, ``unsupported_reason``) go to every registration.
    With ``vllm_fused_add_rms_norm`` (in place, vLLM's numerics: the fp32 sum
    normalized), ``vllm_rms_norm`` and ``vllm_fused_add_rms_norm`` are
    registered too, under the same predicates.
    """
    from vllm_ir import ops

    rms_supports, fused_supports = supports_args
    rms_ops, fused = [ops.rms_norm], [(ops.fused_add_rms_norm, fused_add_rms_norm)]
    if vllm_fused_add_rms_norm is not None:
        rms_ops.append(ops.vllm_rms_norm)
        fused.append((ops.vllm_fused_add_rms_norm, vllm_fused_add_rms_norm))
    for op in rms_ops:
        op.register_impl(provider, supported=supported, supports_args=rms_supports, **flags)(
            rms_norm
        )
    for op, fn in fused:
        op.register_impl(
            provider, supported=supported, supports_args=fused_supports, inplace=True, **flags
        )(fn)
