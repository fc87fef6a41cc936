"""The ``xpu_kernels`` impls of ``rms_norm`` and (in place) ``fused_add_rms_norm``.

Each impl has the op's native signature and calls one opaque op of
:mod:`vllm_ir_xpu.ops`. ``supports_args`` accepts what the vllm-xpu-kernels
kernels compute without any copy:

* fp32, fp16 and bf16 activations, with a weight of the same dtype (or none:
  the impls pass ones), on ``xpu`` tensors;
* no ``variance_size`` (the kernels normalize over the whole last dimension);
* ``rms_norm``: ``x`` flattens to ``(-1, hidden)`` as a view with unit-stride
  rows (the kernel takes the row stride); a flatten that would copy the
  tensor costs more than the kernel saves;
* ``fused_add_rms_norm``: ``x`` as such rows, ``x_residual`` contiguous (the
  kernel indexes it densely), with the same rank.

Layout is judged by the predicates of :mod:`vllm_ir.provider`, from strides without guarding on
them, so a compiled graph never specializes on it.
"""

from __future__ import annotations

from vllm_ir.provider import contiguous, rows_flatten_free

from vllm_ir_xpu import availability, ops

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
"""The vendor-wrapper table (:data:`vllm_ir_xpu.ops.KIT`)."""

rms_norm, fused_add_rms_norm = KIT.impls(
    ops,
    module=__name__,
    rms_doc="``_C.rms_norm`` on ``x``'s rows; a new tensor laid out as the native one.",
    fused_doc="""In place (``_C.fused_add_rms_norm``): returns ``(x, x_residual)``, which it wrote.

``x_residual`` becomes ``x + x_residual`` (rounded to the dtype), ``x``
its RMSNorm times ``weight``.
""",
)


supports_args_for = KIT.supports_args_for


def register_kernels(provider: str = "xpu_kernels") -> availability.Availability:
    """Register both impls, ``supported`` as :func:`availability.current` says; returns it."""
    return KIT.register_kernels(provider, availability.current(), rms_norm, fused_add_rms_norm)
