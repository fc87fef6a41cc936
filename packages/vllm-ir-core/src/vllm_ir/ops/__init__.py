"""The IR ops: ``vllm_ir.ops.<name>`` for every op declared anywhere.

Core declares its ops here, one module per family; ops declared by other
packages with :func:`vllm_ir.register_op` appear here too.
"""

from __future__ import annotations

from vllm_ir._op.op import IrOp, get_op
from vllm_ir.ops.activation import gelu_and_mul, silu_and_mul
from vllm_ir.ops.layernorm import (
    fused_add_rms_norm,
    rms_norm,
    vllm_fused_add_rms_norm,
    vllm_rms_norm,
)
from vllm_ir.ops.quant import (
    dynamic_per_token_fp8_quant,
    fused_add_rms_norm_static_fp8_quant,
    rms_norm_static_fp8_quant,
    static_scaled_fp8_quant,
)
from vllm_ir.ops.rotary import rotary_embedding, rotary_embedding_fp32

__all__ = [
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm",
    "fused_add_rms_norm_static_fp8_quant",
    "gelu_and_mul",
    "rms_norm",
    "rms_norm_static_fp8_quant",
    "rotary_embedding",
    "rotary_embedding_fp32",
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "vllm_fused_add_rms_norm",
    "vllm_rms_norm",
]


def __getattr__(name: str) -> IrOp:
    # ops registered by providers appear after discovery
    try:
        return get_op(name)
    except KeyError as e:
        raise AttributeError(e.args[0]) from None
