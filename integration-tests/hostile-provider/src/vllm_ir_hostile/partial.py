"""Registers an impl, loosens a tolerance, sets priorities, defines a torch op, then fails."""

from __future__ import annotations

import torch
import vllm_ir as ir
from torch import Tensor

from vllm_ir_hostile import TORCH_NAMESPACE

FAILURE = "vllm-ir-hostile-provider: failure after a partial registration"


def _register() -> None:
    @ir.ops.rms_norm.register_impl("hostile_partial")
    def _impl(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        return x

    ir.ops.rms_norm.register_tolerances({torch.float32: ir.Tolerance(atol=1.0, rtol=1.0)})
    ir.IrOpPriorityConfig(rms_norm=["hostile_partial"]).apply()

    @torch.library.custom_op(f"{TORCH_NAMESPACE}::kernel", mutates_args=())
    def kernel(x: Tensor) -> Tensor:
        return x.clone()

    raise RuntimeError(FAILURE)


provider = ir.provider.ProviderSpec(
    name="hostile_partial", api_version=ir.provider.API_VERSION, register=_register
)
