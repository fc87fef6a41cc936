"""Hugging Face ``transformers`` models on vllm-ir ops.

``kernelize(model)`` finds the layers of a loaded model that compute an IR op
(RMSNorm, gated SiLU MLPs, residual add + RMSNorm in decoder layers), checks
each by probing what it computes, and routes it through ``vllm_ir.ops``: the
kernel is then chosen by vllm-ir's priorities, in eager mode and under
``torch.compile(backend="vllm_ir")``. ``undo(model)`` restores the model.

The layers are recognized by behaviour, not class names, so the package works
on any ``torch.nn.Module``; ``transformers`` is only needed to build the models.
"""

from __future__ import annotations

from vllm_ir_transformers._version import __version__
from vllm_ir_transformers.kernelize import SUPPORTED_OPS, is_kernelized, kernelize, undo
from vllm_ir_transformers.report import Replacement, Report, Skip

__all__ = [
    "SUPPORTED_OPS",
    "Replacement",
    "Report",
    "Skip",
    "__version__",
    "is_kernelized",
    "kernelize",
    "undo",
]
