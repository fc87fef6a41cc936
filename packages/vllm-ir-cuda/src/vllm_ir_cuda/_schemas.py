"""The kernel ops' schemas, without torch: what the package implements is read from
here at import (:data:`vllm_ir_cuda.provider`'s defaults), before anything is defined.

Each kernel op is named after the IR op it serves; :mod:`vllm_ir_cuda.ops` defines them.
"""

from __future__ import annotations

__all__ = ["SCHEMAS"]

SCHEMAS = {
    "rms_norm": "rms_norm(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()",
    "fused_add_rms_norm": (
        "fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight, "
        "float epsilon) -> ()"
    ),
    "vllm_fused_add_rms_norm": (
        "vllm_fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight, "
        "float epsilon) -> ()"
    ),
    "silu_and_mul": "silu_and_mul(Tensor(a!) out, Tensor x) -> ()",
    "gelu_and_mul": "gelu_and_mul(Tensor(a!) out, Tensor x, str approximate) -> ()",
    "rotary_embedding": (
        "rotary_embedding(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, "
        "bool is_neox) -> ()"
    ),
    "static_scaled_fp8_quant": (
        "static_scaled_fp8_quant(Tensor(a!) out, Tensor x, Tensor scale) -> ()"
    ),
    "dynamic_per_token_fp8_quant": (
        "dynamic_per_token_fp8_quant(Tensor(a!) out, Tensor(b!) scales, Tensor x, "
        "Tensor? scale_ub) -> ()"
    ),
    "rms_norm_static_fp8_quant": (
        "rms_norm_static_fp8_quant(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon, "
        "Tensor scale) -> ()"
    ),
    "fused_add_rms_norm_static_fp8_quant": (
        "fused_add_rms_norm_static_fp8_quant(Tensor(a!) out, Tensor x, Tensor(b!) x_residual, "
        "Tensor? weight, float epsilon, Tensor scale) -> ()"
    ),
}
"""Schema of each op, as defined in the ``vllm_ir_cuda`` namespace."""
