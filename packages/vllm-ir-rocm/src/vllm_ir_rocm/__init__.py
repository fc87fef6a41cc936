"""vllm-ir-rocm: AMD AITER kernels for vllm-ir, registered as provider ``aiter``.

Impls of ``rms_norm`` and (in place) ``fused_add_rms_norm`` backed by AITER
(:mod:`vllm_ir_rocm.ops` names the entry points). Importing this package
imports neither AITER nor the impls: vllm-ir registers them through
:data:`provider` when it discovers installed providers. The impls are
``supported`` only on a ROCm build of torch that sees a GPU and imports AITER;
anywhere else they are registered unsupported, and :data:`UNSUPPORTED_REASON`
(or ``python -m vllm_ir_rocm``) says why.

Default priorities on ROCm (the vLLM IR design's table):

* eager and Dynamo-only: ``aiter``, then ``vllm_c``, then ``native``. The list
  names ``vllm_c`` itself, so the order holds whether or not vllm-ir-cuda
  contributes ROCm defaults; a provider that is not installed or not
  supported is skipped. With vllm-ir-triton installed (rank -10), ``triton``
  and ``triton_batch_invariant`` come after ``vllm_c``, before ``native``.
* under Inductor: ``native`` first (Inductor fuses it; an opaque kernel is a
  fusion barrier).

>>> import vllm_ir_rocm
>>> vllm_ir_rocm.provider.name, vllm_ir_rocm.DEFAULTS_RANK
('aiter', 200)
"""

from __future__ import annotations

from vllm_ir.kits.vendor import unsupported_reason_attribute, vendor_provider_spec
from vllm_ir.provider import deferred_register

from vllm_ir_rocm._version import __version__

__all__ = [
    "API_VERSION",
    "DEFAULTS_RANK",
    "PROVIDER",
    "UNSUPPORTED_REASON",
    "__version__",
    "provider",
]

PROVIDER = "aiter"
"""The provider name of every impl this package registers."""

API_VERSION = 1
"""The vllm-ir provider API this package was written against."""

DEFAULTS_RANK = 200
"""Rank of the ROCm defaults: above vllm-ir-cuda's ``100`` and vllm-ir-triton's
``-10``, so on ROCm this package's list (``aiter``, ``vllm_c``) comes first."""

provider = vendor_provider_spec(
    PROVIDER,
    api_version=API_VERSION,
    # imported only during discovery (attributed to this package, rolled back
    # if loading fails), not at package import
    register=deferred_register("vllm_ir_rocm.layernorm:register_kernels", PROVIDER),
    platform="rocm",
    eager=[PROVIDER, "vllm_c"],
    rank=DEFAULTS_RANK,
)
"""The entry point ``aiter`` of the ``vllm_ir.providers`` group."""


# computed on first access: on the vendor's machine this imports the vendor library
__getattr__ = unsupported_reason_attribute(__name__, "vllm_ir_rocm.availability")

UNSUPPORTED_REASON: str | None
"""Why the ``aiter`` impls cannot run in this process, or ``None`` if they can
(computed on first access; see :mod:`vllm_ir_rocm.availability`)."""
