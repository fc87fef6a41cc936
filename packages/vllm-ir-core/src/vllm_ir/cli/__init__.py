"""The ``vllm-ir`` command: ``ops``, ``explain``, ``bench``, ``demo``."""

from vllm_ir.cli.main import main

__all__ = ["main"]
