"""vllm-ir's torch.compile integration: the backend and its passes."""

from vllm_ir.compile.backend import ComposedPass, VllmIRBackend, compile, vllm_ir_backend
from vllm_ir.compile.clone_elimination import CloneEliminationPass, eliminate_clones
from vllm_ir.compile.context import PassContext, get_pass_context, pass_context
from vllm_ir.compile.functionalize import InplaceFunctionalizationPass
from vllm_ir.compile.lowering import LoweringPass
from vllm_ir.compile.pass_base import DUMP_ENV, VllmIRPass

__all__ = [
    "DUMP_ENV",
    "CloneEliminationPass",
    "ComposedPass",
    "InplaceFunctionalizationPass",
    "LoweringPass",
    "PassContext",
    "VllmIRBackend",
    "VllmIRPass",
    "compile",
    "eliminate_clones",
    "get_pass_context",
    "pass_context",
    "vllm_ir_backend",
]
