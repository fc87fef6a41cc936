"""The version of vllm-ir-triton."""

__version__ = "0.1.0"
