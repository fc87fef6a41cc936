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

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

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
class Availability:
    """The outcome of :func:`probe`.

    Attributes:
        supported: the impls can run here.
        reason: why they cannot (``None`` when supported).
        device_type: the device type of the tensors the impls accept.
        hardware: torch sees the GPU; when the impls are unsupported all the
            same, the vendor library is missing or broken (worth a warning).
        vendor_version: AITER's version when it was imported, else ``None``.
    """

    supported: bool
    reason: str | None = None
    device_type: str = DEVICE_TYPE
    hardware: bool = False
    vendor_version: str | None = None


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
    module = sys.modules.get(MODULE)
    if module is None:
        try:
            found = importlib.util.find_spec(MODULE) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return _no_aiter(f"AITER is not installed (no module named {MODULE!r}); {INSTALL_HINT}")
        try:
            module = importlib.import_module(MODULE)
        except Exception as e:  # a broken vendor install must not break vllm-ir
            return _no_aiter(f"importing {MODULE!r} failed: {type(e).__name__}: {e}")
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


_detected: Availability | None = None
_forced: Availability | None = None


def current() -> Availability:
    """:func:`probe`'s answer for this process, computed on first use and kept."""
    global _detected
    if _forced is not None:
        return _forced
    if _detected is None:
        _detected = probe()
    return _detected


@contextlib.contextmanager
def forced(availability: Availability) -> Iterator[Availability]:
    """Testing hook: :func:`current` answers ``availability`` inside the block.

    Lets the wiring be tested on machines without a ROCm GPU, with a stand-in
    ``aiter`` module on CPU tensors (``Availability(True, device_type="cpu")``).
    It changes only what is registered inside the block.
    """
    global _forced
    previous = _forced
    _forced = availability
    try:
        yield availability
    finally:
        _forced = previous
