"""Kernel priorities for vLLM's layers, from ``VLLM_IR_*`` environment variables.

vLLM's own per-op priority flag (``--ir-op-priority``) is deprecated with its
IR (0.33 and 0.34 warn that 0.34.0 removes it; 0.34.0 still has both) and
only reaches ``vllm.ir``'s ops, so the plugin reads its own settings, in every
process vLLM starts (it loads the plugin in each):

- ``VLLM_IR_PRIORITY_FILE=PATH``: a JSON priority file, ``{"OP": ["a", "b"]}``
  or what ``vllm-ir tune --out PATH`` writes.
- ``VLLM_IR_PRIORITY_<OP>=a,b``: one op's list, e.g.
  ``VLLM_IR_PRIORITY_VLLM_RMS_NORM=cpu_c,native``; overrides the file for that
  op. Only the ops vLLM's layers call (:data:`vllm_ir_vllm.OPS`) may be set:
  a list for another op would change nothing, so it is an error that names
  the op the layer calls (``RMS_NORM``: ``VLLM_RMS_NORM``).

A ``VLLM_IR_*`` variable that nothing reads (a typo) is an error naming the
nearest valid one. The file is read where a model is built, when the first
replaced layer is: processes that run no model (vLLM's API server and engine
front) never read it, and the worker reads it with its own thread count and
rank (``{rank}`` in the name; vLLM's workers set no ``RANK``, their
torch.distributed rank is known by then).

>>> cfg = priority_config({"VLLM_IR_PRIORITY_SILU_AND_MUL": "native"})
>>> cfg.to_dict()
{'silu_and_mul': ['native']}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import vllm_ir as ir
from vllm_ir import IrOpPriorityConfig
from vllm_ir.provider import envs

__all__ = [
    "LAYER_OPS",
    "MODEL_VARIABLE",
    "PRIORITY_FILE",
    "PRIORITY_PREFIX",
    "check_file",
    "priority_config",
]

PRIORITY_FILE = "VLLM_IR_PRIORITY_FILE"
"""A JSON priority file (``vllm-ir tune`` output or a plain ``{op: [providers]}``)."""

PRIORITY_PREFIX = "VLLM_IR_PRIORITY_"
"""``VLLM_IR_PRIORITY_<OP>=a,b``: the priority list of op ``<op>`` (lower case)."""


LAYER_OPS = (
    "vllm_rms_norm",
    "vllm_fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
    "rotary_embedding_fp32",
)
"""The IR ops the replaced layers call (:mod:`vllm_ir_vllm.layers`)."""

_CALLED_INSTEAD = {
    "rms_norm": "vllm_rms_norm",
    "fused_add_rms_norm": "vllm_fused_add_rms_norm",
}
"""Seed ops whose vLLM layer calls the op with vLLM's numerics instead."""

MODEL_VARIABLE = "VLLM_IR_VLLM_MODEL"
"""The model directory ``vllm_ir_vllm.tune_model`` sizes vLLM's layers for."""


def _check_names(environ: Mapping[str, str]) -> None:
    # VLLM_IR_PRIORITY_<OP> is checked by op (_per_op); names it offers for a typo
    per_op = {PRIORITY_PREFIX + name.upper() for name in (*LAYER_OPS, *ir.ops.__all__)}
    rest = {k: v for k, v in environ.items() if not k.startswith(PRIORITY_PREFIX)}
    unknown = envs.unknown_variables(rest, {PRIORITY_FILE, MODEL_VARIABLE, *per_op})
    if unknown:
        name, near = unknown[0]
        hint = f"; did you mean {near}?" if near else " (docs/vllm.md lists them)"
        others = f" (also unknown: {', '.join(n for n, _ in unknown[1:])})" if unknown[1:] else ""
        raise ValueError(f"{name} is not a variable vllm-ir reads{hint}{others}")


def _check_layer_op(key: str, op_name: str) -> None:
    if op_name in LAYER_OPS:
        return
    try:
        ir.get_op(op_name)
    except KeyError:
        return  # an op no package defines: the config's error, naming the known ops
    instead = _CALLED_INSTEAD.get(op_name)
    if instead is not None:
        raise ValueError(
            f"{key}: vLLM's layers never call {op_name}, so this list would change nothing; "
            f"they call {instead}: set {PRIORITY_PREFIX}{instead.upper()}"
        )
    raise ValueError(
        f"{key}: vLLM's layers never call {op_name}, so this list would change nothing; "
        f"they call {', '.join(LAYER_OPS)}"
    )


def check_file(environ: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` where ``VLLM_IR_PRIORITY_FILE`` names no file, at startup:
    the file itself is read where a model is built (:func:`vllm_ir_vllm.on_first_layer`),
    a ``{rank}`` file there only."""
    env = os.environ if environ is None else environ
    path = env.get(PRIORITY_FILE, "").strip()
    if path and "{rank}" not in path and not Path(path).is_file():
        raise ValueError(f"{PRIORITY_FILE}={path!r}: no such file")


def _per_op(environ: Mapping[str, str]) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    for key, value in sorted(environ.items()):
        if not key.startswith(PRIORITY_PREFIX) or key == PRIORITY_FILE:
            continue
        op_name = key[len(PRIORITY_PREFIX) :].lower()
        _check_layer_op(key, op_name)
        providers = [p.strip() for p in value.split(",")]
        if not op_name or not value.strip() or any(not p for p in providers):
            raise ValueError(
                f"{key}={value!r}: expected {PRIORITY_PREFIX}<OP>=a,b with a comma-separated "
                "list of providers, e.g. VLLM_IR_PRIORITY_VLLM_RMS_NORM=cpu_c,native"
            )
        lists[op_name] = providers
    return lists


def priority_config(
    environ: Mapping[str, str] | None = None, *, read_file: bool = True
) -> IrOpPriorityConfig | None:
    """The configured priorities, or None when nothing is set; ``read_file=False``:
    the per-op variables only (the file waits for the rank).

    Raises ``ValueError`` naming the variable for an unreadable file, an
    unknown op or provider, a malformed list, a list for an op vLLM's layers
    never call, or a ``VLLM_IR_*`` variable nothing reads.
    """
    env = os.environ if environ is None else environ
    _check_names(env)
    config = None
    path = env.get(PRIORITY_FILE, "").strip()
    if path and read_file:
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
