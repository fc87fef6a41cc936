"""Environment variables read by vllm-ir, in one place.

Each is read when it is needed, not at import. ``VLLM_BATCH_INVARIANT`` and
``VLLM_IR_PLATFORM`` steer selection, which is cached: they are read once per
cache generation, at its first selection, so cached and new selections never
mix two values. Set them before the first call of an op, or call
:func:`vllm_ir.invalidate_caches` after changing them.
"""

from __future__ import annotations

import os

__all__ = [
    "VLLM_BATCH_INVARIANT",
    "VLLM_IR_CHECK_DISPATCH",
    "VLLM_IR_PLATFORM",
    "VLLM_IR_PROVIDERS",
    "VLLM_IR_PROVIDER_LOAD_WARN_S",
    "VLLM_LOGGING_LEVEL",
    "batch_invariant",
    "check_dispatch",
    "logging_level",
    "platform_override",
    "provider_allow_list",
    "provider_load_warn_s",
]

VLLM_BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
"""``1`` restricts selection to impls registered with ``batch_invariant=True``."""

VLLM_IR_PROVIDERS = "VLLM_IR_PROVIDERS"
"""Comma-separated allow-list of provider entry points to load; unset loads all,
``none`` loads none."""

VLLM_IR_PROVIDER_LOAD_WARN_S = "VLLM_IR_PROVIDER_LOAD_WARN_S"
"""Seconds a provider may take to load before a warning names it (default 5; 0: never)."""

VLLM_LOGGING_LEVEL = "VLLM_LOGGING_LEVEL"
"""Level of the ``vllm_ir`` logger; ``DEBUG`` logs every selection and rejection."""

VLLM_IR_PLATFORM = "VLLM_IR_PLATFORM"
"""Overrides platform detection (``cuda``, ``rocm``, ``xpu``, ``cpu``)."""

VLLM_IR_CHECK_DISPATCH = "VLLM_IR_CHECK_DISPATCH"
"""``1`` re-validates every cached eager call against an uncached selection and
raises on a difference (slow: a debugging and testing aid). Read when an op is
declared; :func:`vllm_ir.eager.set_dispatch_check` switches it at run time."""

_TRUE = {"1", "true", "yes", "on"}


def check_dispatch() -> bool:
    return os.environ.get(VLLM_IR_CHECK_DISPATCH, "0").strip().lower() in _TRUE


def batch_invariant() -> bool:
    return os.environ.get(VLLM_BATCH_INVARIANT, "0").strip().lower() in _TRUE


def provider_allow_list() -> frozenset[str] | None:
    raw = os.environ.get(VLLM_IR_PROVIDERS)
    if raw is None or not raw.strip():
        return None
    if raw.strip().lower() == "none":
        return frozenset()
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def logging_level() -> str | None:
    raw = os.environ.get(VLLM_LOGGING_LEVEL)
    return raw.strip().upper() if raw and raw.strip() else None


def platform_override() -> str | None:
    raw = os.environ.get(VLLM_IR_PLATFORM)
    return raw.strip().lower() if raw and raw.strip() else None


def provider_load_warn_s() -> float:
    raw = os.environ.get(VLLM_IR_PROVIDER_LOAD_WARN_S, "").strip()
    if not raw:
        return 5.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{VLLM_IR_PROVIDER_LOAD_WARN_S}={raw[:40]!r} is not a number of seconds; "
            "set it to e.g. 5, or 0 to never warn"
        ) from None
    return max(value, 0.0)
