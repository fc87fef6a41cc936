"""vllm-ir-cpu: C++ CPU kernels for vllm-ir, provider ``cpu_c``.

Importing this package only builds :data:`provider`, a
:class:`vllm_ir.provider.ProviderSpec`; vllm-ir calls its ``register`` on discovery,
which defines the kernel ops' schemas and registers the IR impls. The C++
library is compiled (or loaded from the cache) on the first real kernel call,
never at import or discovery; ``python -m vllm_ir_cpu build`` does it ahead of
time.

>>> import vllm_ir_cpu
>>> vllm_ir_cpu.provider.name
'cpu_c'
"""

from __future__ import annotations

from vllm_ir.provider import PlatformDefaults, ProviderSpec, deferred_register

from vllm_ir_cpu._version import __version__

__all__ = ["OPS", "PROVIDER", "__version__", "provider"]

PROVIDER = "cpu_c"
"""The provider name of every impl this package registers."""


OPS = (
    "rms_norm",
    "fused_add_rms_norm",
    "vllm_rms_norm",
    "vllm_fused_add_rms_norm",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding",
    "rotary_embedding_fp32",
    "static_scaled_fp8_quant",
    "dynamic_per_token_fp8_quant",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
)
"""The IR ops this package implements."""

provider = ProviderSpec(
    name=PROVIDER,
    api_version=1,  # the vllm-ir provider API this package is written against
    # imported when vllm-ir registers the provider, so that discovering (or
    # importing) the package stays cheap
    register=deferred_register("vllm_ir_cpu.impls:register_impls"),
    defaults=(
        PlatformDefaults(
            "cpu",
            eager={op: [PROVIDER] for op in OPS},
            # Measured (README "Default priorities"; benchmarks/cpu_kernels.py and
            # this package's benchmarks/quant_kernels.py, table "model"): under
            # Inductor the native norms and silu_and_mul, fused with their
            # neighbours, beat the opaque kernels (0.16-0.67x the time), and the
            # fused norm + FP8 ops are at par in bf16 (0.73-1.0x); the FP8 quant
            # kernels beat Inductor's quantization code at 16-1024 tokens (1.08-1.99x;
            # 0.73-0.93x at 1 token). gelu_and_mul and rotary_embedding are
            # elementwise too: native, which Inductor fuses, as for silu_and_mul.
            compiled={
                **{op: ["native"] for op in OPS},
                "static_scaled_fp8_quant": [PROVIDER],
                "dynamic_per_token_fp8_quant": [PROVIDER],
            },
        ),
    ),
)
"""The entry point ``cpu_c`` of the ``vllm_ir.providers`` group."""
