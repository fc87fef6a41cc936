"""Whether the ``xpu_kernels`` impls can run in this process, and if not, why.

The answer is computed once, when vllm-ir registers the impls (provider
discovery), and becomes their static ``supported`` flag. Checks, in order:

1. torch sees an Intel GPU (``torch.xpu.is_available()``);
2. vllm-xpu-kernels is installed, and its extension ``vllm_xpu_kernels._C``
   imports (importing it registers the kernels as ``torch.ops._C.*``);
3. it defines the two ops the impls call with the schemas they were written
   for (:data:`SCHEMAS`), with kernels for the ``XPU`` dispatch key.

vllm-xpu-kernels is imported only by step 2, that is, only when torch sees an
XPU: on any other machine nothing vendor-specific is imported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata

import torch
from vllm_ir.kits.vendor import AvailabilityCache, VendorAvailability, import_vendor

__all__ = [
    "DISTRIBUTION",
    "EXTENSION",
    "SCHEMAS",
    "Availability",
    "current",
    "forced",
    "probe",
]

DISTRIBUTION = "vllm-xpu-kernels"
"""The pip name of Intel's vLLM XPU kernels."""

PACKAGE = "vllm_xpu_kernels"
EXTENSION = "vllm_xpu_kernels._C"
"""The module whose import registers the kernels in the ``torch.ops._C`` namespace."""

SCHEMAS = {
    "rms_norm": ("result", "input", "weight", "epsilon"),
    "fused_add_rms_norm": ("input", "residual", "weight", "epsilon"),
}
"""Argument names of the ``_C`` ops the impls call (``csrc/torch_bindings.cpp``)."""

WRITTEN = {"rms_norm": ("result",), "fused_add_rms_norm": ("input", "residual")}
"""The arguments each op writes (``Tensor!`` in its schema)."""

DEVICE_TYPE = "xpu"

INSTALL_HINT = (
    "pip install vllm-xpu-kernels (a release built for your torch XPU version; "
    "see https://github.com/vllm-project/vllm-xpu-kernels)"
)


@dataclass(frozen=True)
class Availability(VendorAvailability):
    """The outcome of :func:`probe` (:class:`vllm_ir.kits.vendor.VendorAvailability`), on ``xpu``.

    ``vendor_version`` is the installed vllm-xpu-kernels version, when known.
    """

    device_type: str = DEVICE_TYPE


def _xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    try:
        return bool(xpu is not None and xpu.is_available())
    except Exception:  # a broken driver stack reads as "no XPU"
        return False


def _vendor_version() -> str | None:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        module = sys.modules.get(PACKAGE)
        version = getattr(module, "__version__", None)
        return str(version) if version is not None else None


def _check_op(name: str) -> str | None:
    """Why ``torch.ops._C.<name>`` is not the op the impls call, or ``None``."""
    try:
        op = getattr(torch.ops._C, name).default
    except (AttributeError, RuntimeError):
        return f"it defines no torch.ops._C.{name}"
    arguments = op._schema.arguments
    names = tuple(a.name for a in arguments)
    written = tuple(a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write)
    if names != SCHEMAS[name] or written != WRITTEN[name]:
        return (
            f"its _C::{name} has the schema {op._schema}, not the one this package was "
            f"written for ({', '.join(SCHEMAS[name])}; writes {', '.join(WRITTEN[name])})"
        )
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{name}", "XPU"):
        return f"its _C::{name} has no XPU kernel"
    return None


def probe() -> Availability:
    """Check this process now (see the module docstring); never raises."""
    if not _xpu_available():
        return Availability(
            False,
            f"torch {torch.__version__} sees no Intel GPU (torch.xpu.is_available() is False); "
            "the xpu_kernels impls need an XPU build of torch and an Intel GPU",
        )
    extension = import_vendor(
        EXTENSION,
        package=PACKAGE,
        not_installed=f"{DISTRIBUTION} is not installed; {INSTALL_HINT}",
        shown=EXTENSION,
    )
    if isinstance(extension, str):
        return _no_kernels(extension)
    version = _vendor_version()
    problems = [p for p in map(_check_op, SCHEMAS) if p is not None]
    if problems:
        return _no_kernels(
            f"{DISTRIBUTION} {version or '(version unknown)'} is not the API this package "
            f"targets: {'; '.join(problems)}"
        )
    return Availability(True, None, DEVICE_TYPE, hardware=True, vendor_version=version)


def _no_kernels(reason: str) -> Availability:
    return Availability(False, reason, DEVICE_TYPE, hardware=True)


_answers: AvailabilityCache[Availability] = AvailabilityCache(lambda: probe())

current = _answers.current
""":func:`probe`'s answer for this process, computed on first use and kept."""

forced = _answers.forced
"""Testing hook: :func:`current` answers the given :class:`Availability` inside the block
(stand-in ``_C`` kernels on CPU tensors: ``Availability(True, device_type="cpu")``)."""
