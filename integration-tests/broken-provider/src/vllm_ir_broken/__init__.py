"""A provider that fails after a partial registration, to prove the rollback."""

from __future__ import annotations

import vllm_ir as ir
from torch import Tensor

__all__ = ["FAILURE", "REGISTERED", "provider"]

FAILURE = "vllm-ir-broken-provider: simulated failure after a partial registration"

REGISTERED: list[str] = []
"""Ops whose ``broken`` impl ``register`` stored before failing: the tests check
that it did register something, so the rollback they observe is real."""


def _rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)


def _register() -> None:
    ir.ops.rms_norm.register_impl("broken")(_rms_norm)
    REGISTERED.append("rms_norm")
    raise RuntimeError(FAILURE)


provider = ir.provider.ProviderSpec(
    name="broken",
    api_version=ir.provider.API_VERSION,
    register=_register,
    # must not apply: defaults of a provider that failed to load are dropped
    defaults=(ir.provider.PlatformDefaults("cpu", eager={"rms_norm": ["broken"]}),),
)
