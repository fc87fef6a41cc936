"""When vllm-ir's ops compute exactly what vLLM's hardware-agnostic layers do.

vLLM's ``RMSNorm.forward_native`` (0.33 and 0.34 alike) and vllm-ir's native functions (the
ops' semantics, ``vllm_ir.ops.layernorm``) differ in two places:

- **Weight dtype.** vLLM casts the normalized fp32 value to the *weight's*
  dtype, multiplies, then casts to the input dtype; vllm-ir casts to the
  *input's* dtype, then multiplies (a weight of another dtype promotes the
  result). Equal exactly when there is no weight or both dtypes agree.
- **Fused add.** vLLM normalizes the fp32 sum ``x.float() + residual.float()``;
  vllm-ir's ``fused_add_rms_norm`` normalizes the sum rounded to the input
  dtype (what a kernel that stores the new residual and re-reads it sees).
  Equal exactly for an fp32 ``x`` (and a residual that does not promote it) only.

``SiluAndMul`` is the same expression in both. Where they differ the layer
runs vLLM's own ``forward_native`` and logs why: never a silent numeric change.

>>> import torch
>>> rms_norm_mismatch(torch.float16, None, torch.float32) is None
False
>>> rms_norm_mismatch(torch.bfloat16, None, torch.bfloat16) is None
True
"""

from __future__ import annotations

import torch

__all__ = ["rms_norm_mismatch"]


def rms_norm_mismatch(
    x_dtype: torch.dtype, residual_dtype: torch.dtype | None, weight_dtype: torch.dtype | None
) -> str | None:
    """Why vllm-ir's op would not match vLLM's RMSNorm here, or None when it matches.

    ``residual_dtype`` is None for the plain norm (``rms_norm``), else the
    residual's dtype (``fused_add_rms_norm``); ``weight_dtype`` is None
    without a weight.
    """
    op = "rms_norm" if residual_dtype is None else "fused_add_rms_norm"
    if weight_dtype is not None and weight_dtype != x_dtype:
        return (
            f"{op}: the weight is {weight_dtype} but x is {x_dtype}; vLLM multiplies in the "
            "weight's dtype, vllm-ir in x's dtype"
        )
    if residual_dtype is None:
        return None
    if x_dtype != torch.float32:
        return (
            f"{op}: x is {x_dtype}; vLLM normalizes the fp32 sum x + residual, vllm-ir the sum "
            f"rounded to {x_dtype}"
        )
    if torch.promote_types(x_dtype, residual_dtype) != x_dtype:
        return (
            f"{op}: the residual is {residual_dtype} but x is {x_dtype}; vLLM adds in fp32, "
            f"vllm-ir in {torch.promote_types(x_dtype, residual_dtype)}"
        )
    return None
