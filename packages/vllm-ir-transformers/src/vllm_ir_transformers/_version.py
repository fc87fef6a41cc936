"""The version of vllm-ir-transformers."""

__version__ = "0.1.0"
