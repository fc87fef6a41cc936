"""A test-only out-of-tree platform, ``nova`` (device: the CPU), and a provider for it.

The platform entry point names :data:`platform`; the provider entry point
names :data:`provider`. Importing this module builds both and nothing else.
"""

from __future__ import annotations

import os

from vllm_ir.provider import API_VERSION, Platform, PlatformDefaults, ProviderSpec

__all__ = ["PROVIDER", "platform", "provider"]

PROVIDER = "nova_kernels"


def _detect() -> bool:
    # a vendor probes its driver here; the test platform is present when told so
    return os.environ.get("VLLM_IR_NOVA_PRESENT") == "1"


platform = Platform(
    "nova",
    device_type="cpu",
    detect=_detect,
    eager={"rms_norm": [PROVIDER, "native"]},
    compiled={"rms_norm": ["native"]},
)


def _register() -> None:
    import torch
    from torch import Tensor
    from vllm_ir import ops
    from vllm_ir.provider import current_platform

    @ops.rms_norm.register_impl(PROVIDER, supported=current_platform() == "nova")
    def rms_norm(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        """nova's rms_norm: the native maths, in float32."""
        return ops.rms_norm.native(x, weight, epsilon, variance_size).to(torch.float32).to(x.dtype)


provider = ProviderSpec(
    name=PROVIDER,
    api_version=API_VERSION,
    register=_register,
    # a provider's defaults for the out-of-tree platform: accepted since nova is installed
    defaults=(PlatformDefaults("nova", eager={"fused_add_rms_norm": ["native"]}),),
)
