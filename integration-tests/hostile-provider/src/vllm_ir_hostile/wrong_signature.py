"""An impl whose parameter is called ``eps`` where the op says ``epsilon``."""

from __future__ import annotations

import vllm_ir as ir
from torch import Tensor


def _register() -> None:
    @ir.ops.rms_norm.register_impl("hostile_signature")
    def _impl(
        x: Tensor, weight: Tensor | None, eps: float, variance_size: int | None = None
    ) -> Tensor:
        return x


provider = ir.provider.ProviderSpec(
    name="hostile_signature", api_version=ir.provider.API_VERSION, register=_register
)
