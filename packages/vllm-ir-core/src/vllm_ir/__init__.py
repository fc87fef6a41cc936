"""vllm-ir: a functional intermediate representation for LLM inference kernels.

Model code calls IR ops; a priority list picks the kernel, identically in
eager mode and under ``torch.compile``.

>>> import torch, vllm_ir as ir
>>> x, w = torch.randn(4, 64), torch.ones(64)
>>> y = ir.ops.rms_norm(x, w, 1e-6)
>>> with ir.ops.rms_norm.set_priority(["native"]):
...     ir.ops.rms_norm.dispatch(x, w, 1e-6).provider
'native'
"""

from vllm_ir import ops
from vllm_ir._version import API_VERSION, __version__
from vllm_ir.config import (
    IrOpPriorityConfig,
    IrPassConfig,
    KernelConfig,
    clear_process_priority,
    parse_ir_op_priority_args,
)
from vllm_ir.dispatch import Selection, invalidate_caches
from vllm_ir.impl import NATIVE, IrOpImpl
from vllm_ir.namespace import NAMESPACE
from vllm_ir.op import IrOp, IrOpInplaceOverload, get_op, register_op
from vllm_ir.platform import current_platform
from vllm_ir.priority import PlatformDefaults, PriorityEntry, compiled_selection
from vllm_ir.providers import ProviderSpec, load_errors, loaded_providers
from vllm_ir.registration import RegistrationHandle, RegistrationLog, recording_registrations
from vllm_ir.samples import SampleInput
from vllm_ir.tolerances import Tolerance

# The compile integration imports Inductor (seconds): loaded on first use.
_LAZY = {"VllmIRBackend": "vllm_ir.compilation", "compile": "vllm_ir.compilation"}


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in ("compilation", "testing"):
        return importlib.import_module(f"vllm_ir.{name}")
    raise AttributeError(f"module 'vllm_ir' has no attribute {name!r}")


__all__ = [
    "API_VERSION",
    "NATIVE",
    "IrOp",
    "IrOpImpl",
    "IrOpInplaceOverload",
    "IrOpPriorityConfig",
    "IrPassConfig",
    "KernelConfig",
    "NAMESPACE",
    "PlatformDefaults",
    "PriorityEntry",
    "ProviderSpec",
    "RegistrationHandle",
    "RegistrationLog",
    "SampleInput",
    "Selection",
    "Tolerance",
    "VllmIRBackend",
    "__version__",
    "clear_process_priority",
    "compile",
    "compiled_selection",
    "current_platform",
    "get_op",
    "invalidate_caches",
    "load_errors",
    "loaded_providers",
    "ops",
    "parse_ir_op_priority_args",
    "recording_registrations",
    "register_op",
]
