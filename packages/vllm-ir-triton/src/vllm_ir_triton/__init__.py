"""vllm-ir-triton: Triton kernels for vllm-ir, providers ``triton`` and ``triton_batch_invariant``.

Impls of ``rms_norm`` and (in place) ``fused_add_rms_norm`` for both;
``triton`` also implements ``silu_and_mul``, ``gelu_and_mul``, ``rotary_embedding``,
``static_scaled_fp8_quant``,
``dynamic_per_token_fp8_quant``, ``rms_norm_static_fp8_quant`` and (the new
residual in place) ``fused_add_rms_norm_static_fp8_quant``. Importing this
package only builds :data:`provider`; vllm-ir imports the kernels through
``provider.register`` when it discovers installed providers, and Triton
compiles them on their first call.

The kernels run on GPUs Triton drives (platforms ``cuda``, ``rocm``, ``xpu``)
and, on CPU, only in Triton's interpreter: set ``TRITON_INTERPRET=1`` before
vllm-ir loads its providers (tests do; it is ~100x slower than eager torch).

Default priorities: ``triton`` (then, for the norms, ``triton_batch_invariant``,
reached only when ``VLLM_BATCH_INVARIANT=1`` rejects ``triton``) after the
vendor providers in eager mode, with a rank below theirs; ``native`` under
Inductor.

>>> import vllm_ir_triton
>>> vllm_ir_triton.provider.name
'triton'
"""

from __future__ import annotations

from vllm_ir.provider import PlatformDefaults, ProviderSpec, deferred_register

from vllm_ir_triton._version import __version__

__all__ = [
    "API_VERSION",
    "BATCH_INVARIANT_PROVIDER",
    "DEFAULTS_RANK",
    "PROVIDER",
    "__version__",
    "provider",
]

PROVIDER = "triton"
"""The provider of the fast impls (no batch-invariance promise)."""

BATCH_INVARIANT_PROVIDER = "triton_batch_invariant"
"""The provider of the batch-invariant impls (``batch_invariant=True``)."""

DEFAULTS_RANK = -10
"""Rank of this package's platform defaults: below the default ``0`` and the
vendor packages' ``100`` (vllm-ir-cuda), so every vendor or third-party list
comes first and Triton is the portable fallback before ``native``."""

API_VERSION = 1
"""The vllm-ir provider API this package was written against."""

_OPS = ("rms_norm", "fused_add_rms_norm", "vllm_rms_norm", "vllm_fused_add_rms_norm")
"""Ops implemented by both providers."""

_TRITON_ONLY_OPS = (
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding",
    "static_scaled_fp8_quant",
    "dynamic_per_token_fp8_quant",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
)
"""Ops implemented by ``triton`` alone."""


provider = ProviderSpec(
    name=PROVIDER,
    api_version=API_VERSION,
    # Triton and the kernels load only when vllm-ir discovers the provider
    # (attributed, rolled back on failure), not at package import
    register=deferred_register("vllm_ir_triton.impls:register_impls"),
    defaults=tuple(
        PlatformDefaults(
            platform,
            eager={
                **{op: [PROVIDER, BATCH_INVARIANT_PROVIDER] for op in _OPS},
                **{op: [PROVIDER] for op in _TRITON_ONLY_OPS},
            },
            # Inductor fuses the native functions with their neighbours; an
            # opaque kernel is a fusion barrier (see the README)
            compiled={op: ["native"] for op in (*_OPS, *_TRITON_ONLY_OPS)},
            rank=DEFAULTS_RANK,
        )
        for platform in ("cuda", "rocm", "xpu")
    ),
)
"""The entry point ``triton`` of the ``vllm_ir.providers`` group."""
