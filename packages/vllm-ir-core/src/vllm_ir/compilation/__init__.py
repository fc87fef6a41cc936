"""vllm-ir's torch.compile integration: the backend and its passes."""

from vllm_ir.compilation._autotune import Autotuner, Timer, TuningRecord, WallClockTimer
from vllm_ir.compilation._backend import ComposedPass, VllmIRBackend, compile, vllm_ir_backend
from vllm_ir.compilation._clone_elimination import CloneEliminationPass, eliminate_clones
from vllm_ir.compilation._context import PassContext, get_pass_context, pass_context
from vllm_ir.compilation._functionalize import InplaceFunctionalizationPass
from vllm_ir.compilation._fusion import NormQuantFusionPass
from vllm_ir.compilation._lowering import LoweringPass
from vllm_ir.compilation._pass_base import DUMP_ENV, VllmIRPass
from vllm_ir.compilation._sequence_parallel import SequenceParallelismPass

__all__ = [
    "DUMP_ENV",
    "Autotuner",
    "CloneEliminationPass",
    "ComposedPass",
    "InplaceFunctionalizationPass",
    "LoweringPass",
    "NormQuantFusionPass",
    "PassContext",
    "SequenceParallelismPass",
    "Timer",
    "TuningRecord",
    "VllmIRBackend",
    "VllmIRPass",
    "WallClockTimer",
    "compile",
    "eliminate_clones",
    "get_pass_context",
    "pass_context",
    "vllm_ir_backend",
]
