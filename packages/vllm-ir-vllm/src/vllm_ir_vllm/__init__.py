"""vllm-ir inside vLLM: vLLM's RMSNorm and SiluAndMul layers run through vllm-ir selection.

vLLM loads :func:`register` through the ``vllm.general_plugins`` entry point
in every process. It applies the ``VLLM_IR_*`` priorities
(:mod:`vllm_ir_vllm.settings`) and replaces vLLM's ``RMSNorm`` and
``SiluAndMul`` (in-tree and hardware-agnostic) and the Transformers backend's
``TPAwareRMSNorm`` with classes that call ``vllm_ir.ops``
(:mod:`vllm_ir_vllm.layers`). :func:`unregister` undoes both.
:func:`vllm_ir_vllm.report.layer_report` says, for a built model, which layers
run which impl. Importing this package does not import vLLM.
"""

from __future__ import annotations

import functools
import logging
import os

from vllm_ir import IrOpPriorityConfig
from vllm_ir.compilation import set_tuning_group
from vllm_ir.provider import RegistrationHandle, get_logger

from vllm_ir_vllm._version import __version__
from vllm_ir_vllm.settings import LAYER_OPS, PRIORITY_FILE, check_file, priority_config

__all__ = ["OPS", "__version__", "register", "unregister"]

OPS = LAYER_OPS
"""The IR ops the replaced layers call (:mod:`vllm_ir_vllm.layers`)."""

logger = get_logger("vllm_ir.vllm")

_announce = logging.getLogger("vllm.vllm_ir_vllm")
"""Under vLLM's ``vllm`` logger, whose handler prints INFO by default: the one line
per process that says the plugin is on (``vllm_ir``'s own loggers print warnings only
unless ``VLLM_LOGGING_LEVEL`` is set)."""

_applied: RegistrationHandle | None = None
"""Takes back the process-wide priorities :func:`register` applied."""

_file_waits = False
"""``VLLM_IR_PRIORITY_FILE`` is set and not read yet in this process."""


def _fail(e: ValueError) -> SystemExit:
    # vLLM's load_general_plugins() lets what a plugin raises propagate, so a
    # ValueError ends the process in a traceback through vLLM's startup;
    # SystemExit's message is all Python prints (in worker processes too).
    return SystemExit(f"vllm-ir-vllm: {e}")


def _settings(read_file: bool) -> IrOpPriorityConfig | None:
    try:
        if not read_file:
            check_file()
        return priority_config(read_file=read_file)
    except ValueError as e:
        raise _fail(e) from None


def _apply(config: IrOpPriorityConfig | None, read_file: bool) -> str:
    """Apply ``config`` (replacing what this plugin applied before); what it sets."""
    global _applied
    # a handle takes back its own setting only: applying again replaces the earlier
    # one, so unregister() leaves what was there before the plugin
    if _applied is not None:
        _applied.remove()
        _applied = None
    if config is not None:
        _applied = config.apply()
    lists = config.to_dict() if config is not None else {}
    text = ", ".join(f"{op}={','.join(map(str, p))}" for op, p in lists.items()) or "defaults"
    path = os.environ.get(PRIORITY_FILE, "").strip()
    if path:
        how = "read" if read_file else "read where a model is built, at its first layer"
        text += f"; {PRIORITY_FILE}={path} ({how}, above provider and platform defaults)"
    return text


def _tensor_parallel_group() -> None:
    """Autotuning agrees within vLLM's tensor-parallel group (whose ranks compile the same
    graphs; pipeline stages do not), not the whole world (:mod:`vllm_ir.compilation`).
    Set at each layer built: an engine built after another has new groups."""
    try:
        from vllm.distributed import parallel_state

        group = parallel_state.get_tp_group().cpu_group
    except (ImportError, AssertionError, AttributeError):  # no distributed setup here
        return
    set_tuning_group(group)


def on_first_layer() -> None:
    """In a process that builds a model (called as each replaced layer is built: after
    vLLM's distributed setup): autotune agreement over the tensor-parallel group, and
    ``VLLM_IR_PRIORITY_FILE`` read, so a ``{rank}`` file is the worker's and stamps are
    checked against the worker's thread count."""
    global _file_waits
    _tensor_parallel_group()
    if not _file_waits:
        return
    _file_waits = False
    import torch

    applied = _apply(_settings(True), True)
    _announce.info(
        "vllm-ir priorities in this worker (threads: %d): %s", torch.get_num_threads(), applied
    )


def _declare_to_vllm() -> None:
    """Add the ``VLLM_IR_*`` variables set here (each checked: something reads it) to
    vLLM's table of its variables, which vLLM checks after loading plugins: else it
    calls each one unknown (or fails, with ``fail_on_environ_validation``)."""
    from vllm import envs as vllm_envs

    table = getattr(vllm_envs, "environment_variables", None)
    if not isinstance(table, dict):
        return
    for name in os.environ:
        if name.startswith("VLLM_IR_"):
            table.setdefault(name, functools.partial(os.environ.get, name))


def register() -> None:
    """The ``vllm.general_plugins`` entry point; safe to call more than once.

    Raises ``SystemExit`` with one line naming the variable when a
    ``VLLM_IR_*`` setting is wrong: vLLM then stops at startup, before
    loading a model, printing that line (no traceback).
    """
    global _file_waits
    waits = bool(os.environ.get(PRIORITY_FILE, "").strip())
    config = _settings(read_file=not waits)
    try:
        from vllm_ir_vllm import layers
    except ImportError as e:  # no vLLM, or one without CustomOp layers
        logger.warning("vllm-ir-vllm: this vLLM's layers cannot be replaced (%s)", e)
        return
    _file_waits = waits
    applied = _apply(config, read_file=not waits)
    _declare_to_vllm()
    done = layers.register_layers()
    if done:
        _announce.info(
            "vllm-ir routes vLLM's %s through vllm-ir ops; priorities: %s",
            ", ".join(done),
            applied,
        )


def unregister() -> None:
    """Remove the layer replacements and restore the priorities ``register`` replaced.

    Layers built before stay what they are; new ones are vLLM's in-tree classes.
    """
    global _applied, _file_waits
    _file_waits = False
    try:
        from vllm_ir_vllm import layers
    except ImportError:
        return
    layers.unregister_layers()
    set_tuning_group("default")
    if _applied is not None:
        _applied.remove()
        _applied = None
