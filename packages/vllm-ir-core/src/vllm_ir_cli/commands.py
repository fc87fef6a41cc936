"""The ``vllm-ir`` commands' names and their usage error: what the torch-free
front end (:mod:`vllm_ir_cli`) and the commands (:mod:`vllm_ir._cli`) share."""

from __future__ import annotations

__all__ = ["COMMANDS", "UsageError"]

COMMANDS = {
    "ops": "vllm_ir._cli.ops_cmd",
    "explain": "vllm_ir._cli.explain",
    "bench": "vllm_ir._cli.bench",
    "demo": "vllm_ir._cli.demo",
    "tune": "vllm_ir._cli.tune",
    "plan": "vllm_ir._cli.plan_cmd",
}
"""Command name -> the module whose ``run(args)`` carries it out."""


class UsageError(ValueError):
    """Bad command-line input: printed as one line without a traceback, exit status 2."""
