"""The IR ops: ``vllm_ir.ops.<name>`` for every op declared anywhere.

Core declares its ops here, one module per family; ops declared by other
packages with :func:`vllm_ir.register_op` appear here too.
"""

from __future__ import annotations

from vllm_ir.op import IrOp, get_op
from vllm_ir.ops.layernorm import fused_add_rms_norm, rms_norm

__all__ = ["fused_add_rms_norm", "rms_norm"]


def __getattr__(name: str) -> IrOp:
    # ops registered by providers appear after discovery
    try:
        return get_op(name)
    except KeyError as e:
        raise AttributeError(e.args[0]) from None
