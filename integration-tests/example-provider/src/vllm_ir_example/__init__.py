"""An example vllm-ir provider: the ``example`` impls of ``rms_norm`` and ``fused_add_rms_norm``.

Importing this module only builds :data:`provider`; vllm-ir imports the
kernels through ``provider.register`` when it discovers installed providers.
"""

from __future__ import annotations

from vllm_ir import API_VERSION, PlatformDefaults, ProviderSpec

__all__ = ["PROVIDER", "provider"]

PROVIDER = "example"
"""The provider name of every impl this package registers."""


def _register() -> None:
    # imported here, not at module level, so that discovering (or merely
    # importing) the package costs nothing until vllm-ir loads providers
    from vllm_ir_example._kernels import register_kernels

    register_kernels()


provider = ProviderSpec(
    name=PROVIDER,
    api_version=API_VERSION,
    register=_register,
    defaults=(
        PlatformDefaults(
            "cpu",
            eager={"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]},
            # Inductor fuses the native function into its neighbours
            compiled={"rms_norm": ["native"]},
        ),
    ),
)
