"""vllm-ir-cuda: CUDA kernels for vllm-ir, registered as provider ``vllm_c``.

Impls of nine core ops (``rms_norm``, ``silu_and_mul``, ``gelu_and_mul``, FP8
quantization alone and after a norm; ``fused_add_rms_norm``, its FP8 variant
and ``rotary_embedding`` in place), backed by the
CUDA kernels in ``csrc/``. Importing this package only builds
:data:`provider`: vllm-ir imports the impls through ``provider.register`` when
it discovers installed providers, and the kernels are compiled on their first
call with CUDA tensors (or ahead of time, by ``python -m vllm_ir_cuda build``).

Default priorities (the design's CUDA platform table): ``vllm_c`` first in
eager mode and Dynamo-only compilation; ``native`` first under Inductor,
which fuses it with its neighbours where an opaque kernel is a fusion barrier.
"""

from __future__ import annotations

from vllm_ir.provider import PlatformDefaults, ProviderSpec

from vllm_ir_cuda._schemas import SCHEMAS
from vllm_ir_cuda._version import __version__

__all__ = ["API_VERSION", "PROVIDER", "__version__", "provider"]

PROVIDER = "vllm_c"
"""The provider name of every impl this package registers."""

API_VERSION = 1
"""The vllm-ir provider API this package was written against."""

_OPS = (*SCHEMAS, "vllm_rms_norm")
"""The IR ops the kernels implement: one kernel op of the same name each, and
``vllm_rms_norm`` on the ``rms_norm`` kernel."""


def _register() -> None:
    # imported here, not at package import: registration runs only during
    # discovery, attributed to this package and rolled back if it fails
    from vllm_ir_cuda import layernorm, quant

    layernorm.register_kernels(PROVIDER)
    quant.register_kernels(PROVIDER, supported=layernorm.platform_supported())


provider = ProviderSpec(
    name=PROVIDER,
    api_version=1,  # the vllm-ir provider API this package is written against
    register=_register,
    defaults=(
        PlatformDefaults(
            "cuda",
            eager={op: [PROVIDER] for op in _OPS},
            compiled={op: ["native"] for op in _OPS},
            rank=100,
        ),
    ),
)
