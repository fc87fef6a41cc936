"""The ``aiter`` impls of ``rms_norm`` and (in place) ``fused_add_rms_norm``.

Each impl has the op's native signature and calls one opaque op of
:mod:`vllm_ir_rocm.ops`. ``supports_args`` accepts what AITER computes
without any copy:

* fp16 and bf16 activations, with a weight of the same dtype (or none: the
  impls pass ones), on the device type of the platform (``cuda`` on ROCm);
* no ``variance_size`` (AITER normalizes over the whole last dimension);
* ``rms_norm``: ``x`` flattens to ``(-1, hidden)`` as a view with unit-stride
  rows; a flatten that would copy the tensor costs more than the kernel saves;
* ``fused_add_rms_norm``: ``x`` and ``x_residual`` contiguous (AITER's
  in-place kernel takes no strides), with the same rank.

Layout is judged by the predicates of :mod:`vllm_ir.provider`, from strides without guarding on
them, so a compiled graph never specializes on it.
"""

from __future__ import annotations

from vllm_ir.provider import contiguous, rows_flatten_free

from vllm_ir_rocm import availability, ops

__all__ = [
    "KIT",
    "contiguous",
    "fused_add_rms_norm",
    "register_kernels",
    "rms_norm",
    "rows_flatten_free",
    "supports_args_for",
]

KIT = ops.KIT
"""The vendor-wrapper table (:data:`vllm_ir_rocm.ops.KIT`)."""

rms_norm, fused_add_rms_norm = KIT.impls(
    ops,
    module=__name__,
    rms_doc="``aiter.rmsnorm2d_fwd`` on ``x``'s rows; a new tensor laid out as the native one.",
    fused_doc="""In place (``aiter.fused_add_rms_norm_cu``): returns ``(x, x_residual)``,
which it wrote.

``x_residual`` becomes ``x + x_residual`` (rounded to the dtype), ``x``
its RMSNorm times ``weight``.
""",
)


supports_args_for = KIT.supports_args_for


def register_kernels(provider: str = "aiter") -> availability.Availability:
    """Register both impls, ``supported`` as :func:`availability.current` says; returns it."""
    return KIT.register_kernels(provider, availability.current(), rms_norm, fused_add_rms_norm)
