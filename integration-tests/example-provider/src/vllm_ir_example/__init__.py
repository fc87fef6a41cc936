"""An example vllm-ir provider: the ``example`` impls of ``rms_norm`` and ``fused_add_rms_norm``.

Importing this module only builds :data:`provider`; vllm-ir imports the
kernels through ``provider.register`` when it discovers installed providers.
"""

from __future__ import annotations

from vllm_ir.provider import API_VERSION, PlatformDefaults, ProviderSpec, deferred_register

__all__ = ["PROVIDER", "provider"]

PROVIDER = "example"
"""The provider name of every impl this package registers."""


provider = ProviderSpec(
    name=PROVIDER,
    api_version=API_VERSION,
    # imported when vllm-ir loads providers, not at module level, so that
    # discovering (or merely importing) the package costs nothing until then
    register=deferred_register("vllm_ir_example._kernels:register_kernels"),
    defaults=(
        PlatformDefaults(
            "cpu",
            eager={"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]},
            # Inductor fuses the native function into its neighbours
            compiled={"rms_norm": ["native"]},
        ),
    ),
)
