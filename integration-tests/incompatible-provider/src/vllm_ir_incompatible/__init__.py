"""A provider written for provider API 999, which core must refuse without calling it."""

from __future__ import annotations

import vllm_ir as ir

__all__ = ["API_VERSION", "register_calls", "provider"]

API_VERSION = 999

register_calls: list[str] = []
"""Appended to by ``register``: the tests check that core never called it."""


def _register() -> None:
    register_calls.append("register")


provider = ir.provider.ProviderSpec(
    name="incompatible", api_version=API_VERSION, register=_register
)
