"""The provider contract: everything a provider package may use of vllm-ir core.

A provider package (``vllm-ir-cpu``, ``-triton``, ``-cuda``, ``-rocm``,
``-xpu``, or a third party's) imports only ``vllm_ir`` (ops and their
``register_impl``), this module, ``vllm_ir.ops`` and ``vllm_ir.testing``. The
repository enforces it with import-linter contracts (``.importlinter``), so
the rest of core can move without breaking providers. :data:`API_VERSION`
covers this module: a change that breaks it bumps the version.

What is here:

* declaring a provider package: :class:`ProviderSpec`, :class:`PlatformDefaults`,
  :data:`API_VERSION`; a platform of its own: :class:`Platform` (named by a
  ``vllm_ir.platforms`` entry point, or :func:`register_platform` in-process),
  :func:`device_type`, :func:`privateuse1_available`; its registrations:
  :class:`RegistrationHandle`, :class:`RegistrationLog`, :func:`recording_registrations`;
* :func:`deferred_register`: the spec's ``register``, importing the kernels
  only when vllm-ir registers them;
* infrastructure: :func:`get_logger`, :func:`current_platform`, :mod:`envs`
  (every environment variable, typed and validated),
  :func:`build_extension` / :class:`ExtensionBuildError` / :func:`cache_root`;
* layout predicates that never guard a compiled graph: :func:`contiguous`,
  :func:`rows_flatten_free`, :func:`may_overlap_itself`;
* tolerances: :class:`Tolerance` and the shared constants;
* what the norm family's impls share (:mod:`vllm_ir._norms`):
  :func:`norm_supports_args`, :func:`fused_add_in_place`, :func:`register_norm_impls`;
* the vendor-wrapper helper that vendor packages configure from a table
  (:mod:`vllm_ir._vendor`): :class:`VendorNorm` (opaque ops, impls, their
  ``supports_args``, registration, the ``python -m`` report),
  :class:`VendorAvailability` and :class:`AvailabilityCache` (the probe's
  answer), :func:`import_vendor`, :func:`rows_view`, :func:`vendor_provider_spec`,
  :func:`unsupported_reason_attribute`.

>>> import torch
>>> from vllm_ir.provider import norm_supports_args
>>> rms, fused = norm_supports_args("cpu", (torch.float32,))
>>> x, w = torch.randn(4, 8), torch.ones(8)
>>> rms(x, w, 1e-6), rms(x, w, 1e-6, variance_size=4), rms(x.half(), w, 1e-6)
(True, False, False)
>>> fused(x, torch.randn(4, 8), w, 1e-6)
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_ir import envs
from vllm_ir._impl import NATIVE
from vllm_ir._layout import contiguous, may_overlap_itself, rows_flatten_free
from vllm_ir._logger import get_logger
from vllm_ir._norms import (
    TensorCheck,
    fused_add_in_place,
    norm_supports_args,
    register_norm_impls,
)
from vllm_ir._platform import Platform, current_platform, device_type, privateuse1_available
from vllm_ir._providers import ProviderSpec, register_platform
from vllm_ir._registration import RegistrationHandle, RegistrationLog, recording_registrations
from vllm_ir._samples import SampleInput
from vllm_ir._tolerances import (
    DEFAULT_TOLERANCES,
    EXACT,
    FP8_DYNAMIC_SCALE,
    FP8_ONE_STEP,
    NORM_TOLERANCES,
    Tolerance,
    fp8_steps_apart,
)
from vllm_ir._vendor import (
    AvailabilityCache,
    VendorAvailability,
    VendorNorm,
    import_vendor,
    rows_view,
    unsupported_reason_attribute,
    vendor_provider_spec,
)
from vllm_ir._version import API_VERSION
from vllm_ir.priority import PlatformDefaults

if TYPE_CHECKING:
    from vllm_ir._extension import ExtensionBuildError, cache_root

__all__ = [
    "API_VERSION",
    "AvailabilityCache",
    "DEFAULT_TOLERANCES",
    "EXACT",
    "FP8_DYNAMIC_SCALE",
    "FP8_ONE_STEP",
    "NATIVE",
    "NORM_TOLERANCES",
    "ExtensionBuildError",
    "Platform",
    "PlatformDefaults",
    "ProviderSpec",
    "RegistrationHandle",
    "RegistrationLog",
    "SampleInput",
    "TensorCheck",
    "Tolerance",
    "VendorAvailability",
    "VendorNorm",
    "build_extension",
    "cache_root",
    "contiguous",
    "current_platform",
    "deferred_register",
    "device_type",
    "envs",
    "fp8_steps_apart",
    "fused_add_in_place",
    "get_logger",
    "import_vendor",
    "may_overlap_itself",
    "norm_supports_args",
    "privateuse1_available",
    "recording_registrations",
    "register_norm_impls",
    "register_platform",
    "rows_flatten_free",
    "rows_view",
    "unsupported_reason_attribute",
    "vendor_provider_spec",
]


def build_extension(*args: Any, **kwargs: Any) -> Any:
    """:func:`vllm_ir._extension.build_extension`: compile and load a C++/CUDA extension, cached.

    Imported on first use (importing a provider package builds nothing), and
    looked up per call, so replacing ``vllm_ir._extension.build_extension``
    (a test's fake build) reaches here too.
    """
    from vllm_ir import _extension as extension

    return extension.build_extension(*args, **kwargs)


def deferred_register(target: str, *args: Any) -> Callable[[], None]:
    """A ``ProviderSpec.register`` that imports ``"module:function"`` and calls it with ``args``.

    The import happens only when vllm-ir registers the provider (during
    discovery, attributed to the package and rolled back if it fails), so
    importing the package, or only building its spec, loads no kernels.

    >>> register = deferred_register("json:dumps", [1])
    >>> register()
    """
    module, _, function = target.partition(":")
    if not module or not function:
        raise ValueError(f"deferred_register wants 'module:function', got {target!r}")

    def register() -> None:
        import importlib

        getattr(importlib.import_module(module), function)(*args)

    register.__qualname__ = f"deferred_register({target!r})"
    return register


def __getattr__(name: str) -> Any:
    # the kernel-build module loads on first use: a provider package's import stays light
    if name in ("ExtensionBuildError", "cache_root"):
        from vllm_ir import _extension as extension

        return getattr(extension, name)
    raise AttributeError(f"module 'vllm_ir.provider' has no attribute {name!r}")
