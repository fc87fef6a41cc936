"""Whether the ``aiter`` impls can run in this process, and if not, why.

The answer is computed once, when vllm-ir registers the impls (provider
discovery), and becomes their static ``supported`` flag. Checks, in order:

1. torch is a ROCm build (``torch.version.hip`` is set);
2. it sees a GPU (``torch.cuda.is_available()``: ROCm devices are ``cuda``);
3. a module named ``aiter`` is installed, and it imports;
4. it is AMD's AITER, with the entry points the impls call
   (:data:`REQUIRED_FUNCTIONS`): PyPI's ``aiter`` is an unrelated project
   of the same import name.

AITER is imported only by step 3, that is, only on a ROCm build of torch
with a visible GPU: on any other machine nothing vendor-specific is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm_ir.kits.vendor import AvailabilityCache, VendorAvailability, import_vendor

__all__ = [
    "MODULE",
    "REQUIRED_FUNCTIONS",
    "Availability",
    "current",
    "forced",
    "probe",
]

MODULE = "aiter"
"""The import name of AMD's AITER."""

REQUIRED_FUNCTIONS = ("rmsnorm2d_fwd", "fused_add_rms_norm_cu")
"""The AITER entry points the impls call (see :mod:`vllm_ir_rocm.ops`)."""

DEVICE_TYPE = "cuda"
"""The device type of ROCm GPUs in torch."""

INSTALL_HINT = (
    "install AMD's AITER built for your ROCm release (the amd-aiter wheel, or "
    "from source: https://github.com/ROCm/aiter)"
)


@dataclass(frozen=True)
class Availability(VendorAvailability):
    """The outcome of :func:`probe` (:class:`vllm_ir.kits.vendor.VendorAvailability`), on ``cuda``.

    ``vendor_version`` is AITER's version when it was imported, else ``None``.
    """

    device_type: str = DEVICE_TYPE


def _torch_version() -> str:
    return str(torch.__version__)


def probe() -> Availability:
    """Check this process now (see the module docstring); never raises."""
    if not getattr(torch.version, "hip", None):
        return Availability(
            False,
            f"torch {_torch_version()} is not a ROCm build (torch.version.hip is None); "
            "AITER runs on AMD GPUs with a ROCm build of torch",
        )
    if not torch.cuda.is_available():
        return Availability(
            False,
            f"torch {_torch_version()} is a ROCm build (HIP {torch.version.hip}) but sees "
            "no GPU (torch.cuda.is_available() is False)",
        )
    module = import_vendor(
        MODULE, not_installed=f"AITER is not installed (no module named {MODULE!r}); {INSTALL_HINT}"
    )
    if isinstance(module, str):
        return _no_aiter(module)
    missing = [name for name in REQUIRED_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        where = getattr(module, "__file__", None) or "an unknown location"
        return _no_aiter(
            f"the module {MODULE!r} imported from {where} has no {', '.join(missing)}: it is "
            "not AMD's AITER (PyPI's 'aiter' is an unrelated project) or an AITER release "
            f"without these entry points; {INSTALL_HINT}",
        )
    version = getattr(module, "__version__", None)
    return Availability(
        True,
        None,
        DEVICE_TYPE,
        hardware=True,
        vendor_version=None if version is None else str(version),
    )


def _no_aiter(reason: str) -> Availability:
    return Availability(False, reason, DEVICE_TYPE, hardware=True)


_answers: AvailabilityCache[Availability] = AvailabilityCache(lambda: probe())

current = _answers.current
""":func:`probe`'s answer for this process, computed on first use and kept."""

forced = _answers.forced
"""Testing hook: :func:`current` answers the given :class:`Availability` inside the block
(a stand-in ``aiter`` module on CPU tensors: ``Availability(True, device_type="cpu")``)."""
