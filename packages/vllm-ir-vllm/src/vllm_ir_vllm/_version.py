"""The version of vllm-ir-vllm."""

__version__ = "0.1.0"
