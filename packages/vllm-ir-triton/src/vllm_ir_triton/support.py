"""Where the Triton kernels can run: the static ``supported`` flag and the device check.

Triton compiles for GPUs: NVIDIA (platform ``cuda``), AMD (``rocm``; its
tensors live on torch's ``cuda`` device) and Intel (``xpu``), each through a
backend that the installed Triton must ship (``nvidia``, ``amd``, ``intel``).
On CPU tensors the kernels run only in Triton's interpreter, switched on by
``TRITON_INTERPRET=1`` *before* Triton compiles anything (``triton.jit``
reads it when the kernels module is imported, i.e. when vllm-ir discovers
this provider). The interpreter executes each program with numpy, about a
hundred times slower than eager PyTorch: it exists so that the kernels,
their wiring and the compile integration are testable on any machine, and is
never a production path. Hence:

* ``supported`` (static, at registration) is true on the ``cuda``, ``rocm``
  and ``xpu`` platforms when torch sees such a device and Triton has the
  matching backend, and on ``cpu`` only under the interpreter (which also
  runs on GPU tensors, copying them to the host and back);
* ``supports_args`` additionally requires tensors on a device the kernels
  run on (``cuda``/``xpu``, or ``cpu`` under the interpreter), so a CPU
  tensor on a GPU machine falls back to the next provider.
"""

from __future__ import annotations

import importlib.util

import torch
from vllm_ir.provider import current_platform

__all__ = [
    "GPU_PLATFORMS",
    "INTERPRET_ENV",
    "device_types",
    "interpreted",
    "platform_supported",
    "triton_backend_for",
    "unsupported_reason",
]

INTERPRET_ENV = "TRITON_INTERPRET"
"""Triton's switch for its CPU interpreter (``1``)."""

GPU_PLATFORMS: dict[str, tuple[str, str]] = {
    "cuda": ("nvidia", "cuda"),
    "rocm": ("amd", "cuda"),
    "xpu": ("intel", "xpu"),
}
"""vllm-ir platform -> (Triton backend it needs, torch device type of its tensors)."""


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (as decorated at import)."""
    from vllm_ir_triton import kernels

    return kernels.INTERPRETED


def triton_backend_for(platform: str) -> str | None:
    """The Triton backend ``platform`` needs, or None when it has none."""
    entry = GPU_PLATFORMS.get(platform)
    return entry[0] if entry else None


def _installed_backends() -> frozenset[str]:
    if importlib.util.find_spec("triton") is None:
        return frozenset()
    import triton.backends

    return frozenset(getattr(triton.backends, "backends", {}))


def _device_available(platform: str) -> bool:
    if platform == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu is not None and xpu.is_available()
    is_rocm = torch.version.hip is not None
    return torch.cuda.is_available() and is_rocm == (platform == "rocm")


def unsupported_reason(platform: str | None = None) -> str | None:
    """Why the kernels cannot run on ``platform`` (default: this one), or None."""
    platform = platform or current_platform()
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if platform == "cpu":
        if interpreted():
            return None
        return f"the cpu platform needs Triton's interpreter ({INTERPRET_ENV}=1 before import)"
    backend = triton_backend_for(platform)
    if backend is None:
        return f"Triton has no backend for platform {platform!r}"
    if interpreted():
        return None  # the interpreter copies device tensors to the host and back
    if not _device_available(platform):
        return f"torch sees no {platform} device (VLLM_IR_PLATFORM={platform} on another machine?)"
    if backend not in _installed_backends():
        installed = ", ".join(sorted(_installed_backends())) or "none"
        return (
            f"the installed Triton has no {backend!r} backend for platform {platform!r} "
            f"(installed: {installed})"
        )
    return None


def platform_supported(platform: str | None = None) -> bool:
    """The static ``supported`` flag of every impl of this package."""
    return unsupported_reason(platform) is None


def device_types(platform: str | None = None) -> frozenset[str]:
    """The torch device types whose tensors the kernels take on ``platform``."""
    platform = platform or current_platform()
    types = {GPU_PLATFORMS[platform][1]} if platform in GPU_PLATFORMS else set()
    if interpreted():
        types.add("cpu")
    return frozenset(types)
