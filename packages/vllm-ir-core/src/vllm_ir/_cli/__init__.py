"""The ``vllm-ir`` command: ``ops``, ``explain``, ``bench``, ``demo``."""

from vllm_ir._cli.main import main

__all__ = ["main"]
