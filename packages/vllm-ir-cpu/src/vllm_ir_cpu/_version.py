"""The version of vllm-ir-cpu (also part of its kernel build cache key)."""

__version__ = "0.1.0"
