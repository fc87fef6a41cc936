"""Versions of this package and of the provider API it speaks."""

__version__ = "0.1.0"

API_VERSION = 1
"""The provider API version.

Bumped on any change that breaks provider packages (``register_impl``'s
signature, :class:`~vllm_ir.provider.ProviderSpec`'s fields). A provider declares the
version it was written against and is refused at discovery when it differs.
"""
