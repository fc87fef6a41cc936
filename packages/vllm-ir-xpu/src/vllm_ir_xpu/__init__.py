"""vllm-ir-xpu: Intel GPU (XPU) kernels for vllm-ir, registered as provider ``xpu_kernels``.

Impls of ``rms_norm`` and (in place) ``fused_add_rms_norm`` backed by the
SYCL kernels of vllm-xpu-kernels (:mod:`vllm_ir_xpu.ops` names them).
Importing this package imports neither the kernels nor the impls: vllm-ir
registers them through :data:`provider` when it discovers installed
providers. The impls are ``supported`` only when ``torch.xpu.is_available()``
and ``vllm_xpu_kernels._C`` imports with the expected ops; anywhere else they
are registered unsupported, and :data:`UNSUPPORTED_REASON` (or
``python -m vllm_ir_xpu``) says why.

Default priorities on XPU (the vLLM IR design's table): ``xpu_kernels`` then
``native`` in eager mode and Dynamo-only compilation (with vllm-ir-triton
installed, its ``triton`` providers come between, at rank -10); ``native``
first under Inductor.

>>> import vllm_ir_xpu
>>> vllm_ir_xpu.provider.name, vllm_ir_xpu.DEFAULTS_RANK
('xpu_kernels', 100)
"""

from __future__ import annotations

from vllm_ir.kits.vendor import unsupported_reason_attribute, vendor_provider_spec
from vllm_ir.provider import deferred_register

from vllm_ir_xpu._version import __version__

__all__ = [
    "API_VERSION",
    "DEFAULTS_RANK",
    "PROVIDER",
    "UNSUPPORTED_REASON",
    "__version__",
    "provider",
]

PROVIDER = "xpu_kernels"
"""The provider name of every impl this package registers."""

API_VERSION = 1
"""The vllm-ir provider API this package was written against."""

DEFAULTS_RANK = 100
"""Rank of the XPU defaults: the platform vendor's, like vllm-ir-cuda's on CUDA,
above vllm-ir-triton's ``-10``."""

provider = vendor_provider_spec(
    PROVIDER,
    api_version=API_VERSION,
    # imported only during discovery (attributed to this package, rolled back
    # if loading fails), not at package import
    register=deferred_register("vllm_ir_xpu.layernorm:register_kernels", PROVIDER),
    platform="xpu",
    eager=[PROVIDER],
    rank=DEFAULTS_RANK,
)
"""The entry point ``xpu_kernels`` of the ``vllm_ir.providers`` group."""


# computed on first access: on the vendor's machine this imports the vendor library
__getattr__ = unsupported_reason_attribute(__name__, "vllm_ir_xpu.availability")

UNSUPPORTED_REASON: str | None
"""Why the ``xpu_kernels`` impls cannot run in this process, or ``None`` if they
can (computed on first access; see :mod:`vllm_ir_xpu.availability`)."""
