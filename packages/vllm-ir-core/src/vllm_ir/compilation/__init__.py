"""vllm-ir's torch.compile integration: the backend and its passes.

Each name is imported from its module on first use (PEP 562), so a process
that needs only part of this package, such as ``vllm-ir tune`` (the
autotuner), does not load Dynamo and Inductor for the backend.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_ir.compilation._autotune import Autotuner, Timer, TuningRecord, WallClockTimer
    from vllm_ir.compilation._backend import (
        ComposedPass,
        VllmIRBackend,
        compile,
        vllm_ir_backend,
    )
    from vllm_ir.compilation._clone_elimination import CloneEliminationPass, eliminate_clones
    from vllm_ir.compilation._context import PassContext, get_pass_context, pass_context
    from vllm_ir.compilation._functionalize import InplaceFunctionalizationPass
    from vllm_ir.compilation._fusion import NormQuantFusionPass
    from vllm_ir.compilation._lowering import LoweringPass
    from vllm_ir.compilation._pass_base import DUMP_ENV, VllmIRPass
    from vllm_ir.compilation._rank_agreement import set_tuning_group
    from vllm_ir.compilation._sequence_parallel import SequenceParallelismPass

_MODULE_OF = {
    "Autotuner": "_autotune",
    "Timer": "_autotune",
    "TuningRecord": "_autotune",
    "WallClockTimer": "_autotune",
    "ComposedPass": "_backend",
    "VllmIRBackend": "_backend",
    "compile": "_backend",
    "vllm_ir_backend": "_backend",
    "CloneEliminationPass": "_clone_elimination",
    "eliminate_clones": "_clone_elimination",
    "PassContext": "_context",
    "get_pass_context": "_context",
    "pass_context": "_context",
    "InplaceFunctionalizationPass": "_functionalize",
    "NormQuantFusionPass": "_fusion",
    "LoweringPass": "_lowering",
    "DUMP_ENV": "_pass_base",
    "VllmIRPass": "_pass_base",
    "SequenceParallelismPass": "_sequence_parallel",
    "set_tuning_group": "_rank_agreement",
}
"""Where each name of ``__all__`` is defined."""

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
    "set_tuning_group",
    "vllm_ir_backend",
]


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    # the submodules, as attributes, as when this package imported them all
    private = name.startswith("_") and not name.startswith("__")
    if private and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
