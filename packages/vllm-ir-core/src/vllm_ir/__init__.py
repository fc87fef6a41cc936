"""vllm-ir: a functional intermediate representation for LLM inference kernels.

Model code calls IR ops; a priority list picks the kernel, identically in
eager mode and under ``torch.compile``.

>>> import torch, vllm_ir as ir
>>> x, w = torch.randn(4, 64), torch.ones(64)
>>> y = ir.ops.rms_norm(x, w, 1e-6)
>>> with ir.ops.rms_norm.set_priority(["native"]):
...     ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider
'native'
"""

from typing import TYPE_CHECKING

from vllm_ir import ops
from vllm_ir._base import moved_modules as _moved_modules
from vllm_ir._base.namespace import NAMESPACE
from vllm_ir._base.torch_wrap import enable_torch_wrap, torch_wrap_enabled
from vllm_ir._discovery.providers import load_errors, loaded_providers
from vllm_ir._op.op import IrOp, get_op, register_op
from vllm_ir._schema.impl import NATIVE as NATIVE  # provider authors: vllm_ir.provider
from vllm_ir._schema.impl import IrOpImpl
from vllm_ir._schema.samples import SampleInput as SampleInput  # likewise
from vllm_ir._schema.tolerances import Tolerance
from vllm_ir._version import __version__
from vllm_ir.config import (
    IrOpPriorityConfig,
    IrPassConfig,
    KernelConfig,
    clear_process_priority,
    parse_ir_op_priority_args,
)
from vllm_ir.selection import invalidate_caches

if TYPE_CHECKING:  # served lazily by __getattr__; named here for type checkers
    from vllm_ir._tools.planning import Plan, plan  # noqa: F401
    from vllm_ir.config import load_tuning_file  # noqa: F401

# The compile integration imports Inductor (seconds): loaded on first use.
_LAZY = {
    "VllmIRBackend": "vllm_ir.compilation",
    "compile": "vllm_ir.compilation",
    # served here but not in __all__ (it holds the 20 model-author names): the kernel
    # plan, and applying a tuning file as the tuning-file layer
    "plan": "vllm_ir._tools.planning",
    "Plan": "vllm_ir._tools.planning",
    "load_tuning_file": "vllm_ir.config",
}

_MOVED = {
    # the provider contract: what provider packages use lives in vllm_ir.provider
    "API_VERSION": "vllm_ir.provider",
    "PlatformDefaults": "vllm_ir.provider",
    "ProviderSpec": "vllm_ir.provider",
    "RegistrationHandle": "vllm_ir.provider",
    "RegistrationLog": "vllm_ir.provider",
    "current_platform": "vllm_ir.provider",
    "recording_registrations": "vllm_ir.provider",
    # selection internals
    "IrOpInplaceOverload": "vllm_ir.compilation.ir_nodes",
    "PriorityEntry": "vllm_ir.priority",
    "Selection": "vllm_ir.selection",
    "compiled_selection": "vllm_ir.priority",
}
"""Names that left the top level: still served here, with a DeprecationWarning, for one release."""


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MOVED:
        from vllm_ir._base.deprecation import warn_deprecated

        warn_deprecated(
            f"vllm_ir.{name} is deprecated: use {_MOVED[name]}.{name} "
            "(the old name goes in the next release)"
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
    if name in ("compilation", "testing", "provider"):
        return importlib.import_module(f"vllm_ir.{name}")
    if f"vllm_ir.{name}" in _moved_modules.MOVED:  # an internal module's old name
        from vllm_ir._base.deprecation import warn_deprecated

        old = f"vllm_ir.{name}"
        warn_deprecated(_moved_modules.message(old))
        return importlib.import_module(_moved_modules.MOVED[old])
    raise AttributeError(f"module 'vllm_ir' has no attribute {name!r}")


# For model authors. ``NATIVE`` and ``SampleInput`` stay importable here; they
# are declared for provider authors in vllm_ir.provider.
__all__ = [
    "IrOp",
    "IrOpImpl",
    "IrOpPriorityConfig",
    "IrPassConfig",
    "KernelConfig",
    "NAMESPACE",
    "Tolerance",
    "VllmIRBackend",
    "__version__",
    "clear_process_priority",
    "compile",
    "enable_torch_wrap",
    "get_op",
    "invalidate_caches",
    "load_errors",
    "loaded_providers",
    "ops",
    "parse_ir_op_priority_args",
    "register_op",
    "torch_wrap_enabled",
]


def _deprecated_backend(self: KernelConfig, **kwargs: object) -> object:
    """Deprecated: use ``VllmIRBackend.from_config(config, **kwargs)``."""
    from vllm_ir._base.deprecation import warn_deprecated
    from vllm_ir.compilation import VllmIRBackend

    warn_deprecated(
        "KernelConfig.backend() is deprecated; use vllm_ir.VllmIRBackend.from_config(config)"
    )
    return VllmIRBackend.from_config(self, **kwargs)  # type: ignore[arg-type]


# set here, above both the configuration and the compile integration: no upward import
KernelConfig.backend = _deprecated_backend  # type: ignore[method-assign]

_moved_modules.install()  # old import paths of the internal modules, for one release
