"""Which platform this process runs on: ``cuda``, ``rocm``, ``xpu`` or ``cpu``."""

from __future__ import annotations

import functools

import torch

from vllm_ir import envs

__all__ = ["PLATFORMS", "current_platform"]

PLATFORMS = envs.PLATFORMS


@functools.cache
def _detect() -> str:
    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return "cpu"


def current_platform() -> str:
    """The platform whose default priorities apply.

    ``VLLM_IR_PLATFORM`` overrides detection, e.g. to inspect another
    platform's default priorities on this machine.

    >>> current_platform() in PLATFORMS
    True
    """
    override = envs.platform_override()  # a bad value raises, naming the variable
    return _detect() if override is None else override
