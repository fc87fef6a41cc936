"""The ``torch.ops`` namespace of the IR ops, chosen once at import.

It is ``vllm_ir`` unless vLLM's own IR (``vllm.ir``, shipped by vLLM 0.32 to
0.34: 0.34 still ships it, though its deprecation notices say 0.34.0 removes
it) is installed or the ``vllm_ir`` torch namespace already holds ops when this
module is imported; then it is ``vllm_ir_core``. vLLM's IR registers its ops in ``vllm_ir`` at
import (``Library("vllm_ir", "FRAGMENT")``) with the same names as ours
(``rms_norm``, ``fused_add_rms_norm``), and torch refuses a second definition
of an op, so the two cannot share the namespace. The test is on what is
*installed* (a ``vllm/ir`` package), not on vLLM's version nor on what is
imported, so both import orders give the same answer in one environment, and
a vLLM that drops ``vllm.ir`` gets ``vllm_ir`` back with no change here.

Code that names IR ops in ``torch.ops`` goes through :data:`NAMESPACE`:

>>> import torch, vllm_ir as ir
>>> getattr(torch.ops, ir.NAMESPACE).rms_norm.default is ir.ops.rms_norm.torch_op
True
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

__all__ = ["DEFAULT_NAMESPACE", "FALLBACK_NAMESPACE", "NAMESPACE", "choose_namespace"]

DEFAULT_NAMESPACE = "vllm_ir"
"""The namespace where nothing else claims it (no vLLM, or a vLLM without ``vllm.ir``)."""

FALLBACK_NAMESPACE = "vllm_ir_core"
"""The namespace beside vLLM 0.32 to 0.34, whose ``vllm.ir`` owns ``vllm_ir``."""


def vllm_ships_ir() -> bool:
    """Whether the installed ``vllm`` has the ``vllm.ir`` package (imports nothing)."""
    if "vllm.ir" in sys.modules:
        return True
    try:
        # top-level find_spec locates the package without running its __init__
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):  # a broken or half-imported vllm
        return False
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    return any((Path(loc) / "ir" / "__init__.py").is_file() for loc in locations)


def namespace_has_ops(namespace: str) -> bool:
    """Whether any operator is already defined in torch namespace ``namespace``."""
    prefix = f"{namespace}::"
    return any(name.startswith(prefix) for name in torch._C._dispatch_get_all_op_names())


def choose_namespace() -> str:
    """The namespace this process registers the IR ops in (see the module docstring)."""
    if not vllm_ships_ir() and not namespace_has_ops(DEFAULT_NAMESPACE):
        return DEFAULT_NAMESPACE
    if namespace_has_ops(FALLBACK_NAMESPACE):
        raise RuntimeError(
            f"torch namespaces {DEFAULT_NAMESPACE!r} and {FALLBACK_NAMESPACE!r} both already "
            "hold operators: vllm_ir was imported twice (under two module paths?) or another "
            "library claims them; import vllm_ir once, from one location"
        )
    return FALLBACK_NAMESPACE


NAMESPACE: str = choose_namespace()
"""``torch.ops.<NAMESPACE>.<op>`` is every IR op; also ``vllm_ir.NAMESPACE``."""
