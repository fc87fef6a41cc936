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

from vllm_ir.provider import RegistrationHandle, get_logger

from vllm_ir_vllm._version import __version__
from vllm_ir_vllm.settings import priority_config

__all__ = ["OPS", "__version__", "register", "unregister"]

OPS = (
    "vllm_rms_norm",
    "vllm_fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
    "rotary_embedding_fp32",
)
"""The IR ops the replaced layers call (:mod:`vllm_ir_vllm.layers`)."""

logger = get_logger("vllm_ir.vllm")

_applied: RegistrationHandle | None = None
"""Takes back the process-wide priorities :func:`register` applied."""


def register() -> None:
    """The ``vllm.general_plugins`` entry point; safe to call more than once.

    Raises ``SystemExit`` with one line naming the variable when a
    ``VLLM_IR_*`` priority setting is wrong: vLLM then stops at startup,
    before loading a model, printing that line (no traceback).
    """
    global _applied
    try:
        config = priority_config()
    except ValueError as e:
        # vLLM's load_general_plugins() lets what a plugin raises propagate, so
        # a ValueError ends the process in a traceback through vLLM's startup;
        # SystemExit's message is all Python prints (in worker processes too).
        raise SystemExit(f"vllm-ir-vllm: {e}") from None
    try:
        from vllm_ir_vllm import layers
    except ImportError as e:  # no vLLM, or one without CustomOp layers
        logger.warning("vllm-ir-vllm: this vLLM's layers cannot be replaced (%s)", e)
        return
    if config is not None:
        # a handle takes back its own setting only: a second register() replaces
        # the first's, so unregister() leaves what was there before the plugin
        if _applied is not None:
            _applied.remove()
        _applied = config.apply()
    done = layers.register_layers()
    if done:
        logger.info("vllm-ir routes vLLM's %s through vllm-ir ops", ", ".join(done))


def unregister() -> None:
    """Remove the layer replacements and restore the priorities ``register`` replaced.

    Layers built before stay what they are; new ones are vLLM's in-tree classes.
    """
    global _applied
    try:
        from vllm_ir_vllm import layers
    except ImportError:
        return
    layers.unregister_layers()
    if _applied is not None:
        _applied.remove()
        _applied = None
