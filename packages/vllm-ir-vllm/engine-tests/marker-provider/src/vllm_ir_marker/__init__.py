"""The provider ``marker``: each op's native function, every call counted.

Installed next to the plugin in the engine tests, it is discovered through its
entry point in every process vLLM starts, so ``VLLM_IR_PRIORITY_<OP>=marker``
is a valid setting there and :data:`CALLS` proves which layers ran through
vllm-ir. It declares no platform defaults: it runs only where a priority names it.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import vllm_ir as ir
from vllm_ir.provider import API_VERSION, ProviderSpec
from vllm_ir_vllm import OPS

__all__ = ["CALLS", "OPS", "PROVIDER", "provider"]

PROVIDER = "marker"
CALLS: Counter[str] = Counter()
"""Op name -> calls of its marker impl in this process."""


def _counting(op: ir.IrOp) -> Any:
    @functools.wraps(op.native)
    def impl(*args: Any, **kwargs: Any) -> Any:
        CALLS[op.name] += 1
        return op.native(*args, **kwargs)

    return impl


def register() -> None:
    for name in OPS:
        op = ir.get_op(name)
        op.register_impl(PROVIDER, supported=True)(_counting(op))


provider = ProviderSpec(name=PROVIDER, api_version=API_VERSION, register=register)
