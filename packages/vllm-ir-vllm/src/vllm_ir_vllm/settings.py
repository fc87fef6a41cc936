"""Kernel priorities for vLLM's layers, from ``VLLM_IR_*`` environment variables.

vLLM's own per-op priority flag (``--ir-op-priority``) is deprecated with its
IR (0.33 and 0.34 warn that 0.34.0 removes it; 0.34.0 still has both) and
only reaches ``vllm.ir``'s ops, so the plugin reads its own settings, in every
process vLLM starts (it loads the plugin in each):

- ``VLLM_IR_PRIORITY_FILE=PATH``: a JSON priority file, ``{"OP": ["a", "b"]}``
  or what ``vllm-ir tune --out PATH`` writes.
- ``VLLM_IR_PRIORITY_<OP>=a,b``: one op's list, e.g.
  ``VLLM_IR_PRIORITY_RMS_NORM=cpu_c,native``; overrides the file for that op.

>>> cfg = priority_config({"VLLM_IR_PRIORITY_SILU_AND_MUL": "native"})
>>> cfg.to_dict()
{'silu_and_mul': ['native']}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from vllm_ir import IrOpPriorityConfig

__all__ = ["PRIORITY_FILE", "PRIORITY_PREFIX", "priority_config"]

PRIORITY_FILE = "VLLM_IR_PRIORITY_FILE"
"""A JSON priority file (``vllm-ir tune`` output or a plain ``{op: [providers]}``)."""

PRIORITY_PREFIX = "VLLM_IR_PRIORITY_"
"""``VLLM_IR_PRIORITY_<OP>=a,b``: the priority list of op ``<op>`` (lower case)."""


def _per_op(environ: Mapping[str, str]) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    for key, value in sorted(environ.items()):
        if not key.startswith(PRIORITY_PREFIX) or key == PRIORITY_FILE:
            continue
        op_name = key[len(PRIORITY_PREFIX) :].lower()
        providers = [p.strip() for p in value.split(",")]
        if not op_name or not value.strip() or any(not p for p in providers):
            raise ValueError(
                f"{key}={value!r}: expected {PRIORITY_PREFIX}<OP>=a,b with a comma-separated "
                "list of providers, e.g. VLLM_IR_PRIORITY_RMS_NORM=cpu_c,native"
            )
        lists[op_name] = providers
    return lists


def priority_config(environ: Mapping[str, str] | None = None) -> IrOpPriorityConfig | None:
    """The configured priorities, or None when nothing is set.

    Raises ``ValueError`` naming the variable for an unreadable file, an
    unknown op or provider, or a malformed list.
    """
    env = os.environ if environ is None else environ
    config = None
    path = env.get(PRIORITY_FILE, "").strip()
    if path:
        try:
            config = IrOpPriorityConfig.from_json(Path(path))
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"{PRIORITY_FILE}={path!r}: {e}") from None
    per_op = _per_op(env)
    if per_op:
        try:
            overrides = IrOpPriorityConfig(**per_op)
        except (ValueError, TypeError) as e:
            names = ", ".join(f"{PRIORITY_PREFIX}{op.upper()}" for op in per_op)
            raise ValueError(f"{names}: {e}") from None
        config = overrides if config is None else config.merged(overrides)
    return config
