"""Providers that misbehave at load, one per module (see the README)."""

from __future__ import annotations

TORCH_NAMESPACE = "vllm_ir_hostile"
"""The ``torch.library`` namespace the partial provider defines an op in."""
