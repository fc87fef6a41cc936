"""The version of this package (also part of the kernels' build cache key)."""

__version__ = "0.1.0"
