"""The provider contract: everything a provider package may use of vllm-ir core.

A provider package (``vllm-ir-cpu``, ``-triton``, ``-cuda``, ``-rocm``,
``-xpu``, or a third party's) imports only ``vllm_ir`` (ops and their
``register_impl``), this module, ``vllm_ir.ops``, ``vllm_ir.testing`` and the
kits (``vllm_ir.kits``). The repository enforces it with import-linter
contracts (``.importlinter``), so the rest of core can move without breaking
providers. :data:`API_VERSION` covers this module: a change that breaks it
bumps the version.

What is here:

* declaring a provider package: :class:`ProviderSpec`, :class:`PlatformDefaults`,
  :data:`API_VERSION`; a platform of its own: :class:`Platform` (named by a
  ``vllm_ir.platforms`` entry point, or :func:`register_platform` in-process),
  :func:`device_type`, :func:`privateuse1_available`; its registrations:
  :class:`RegistrationHandle`, :class:`RegistrationLog`, :func:`recording_registrations`;
* :func:`deferred_register`: the spec's ``register``, importing the kernels
  only when vllm-ir registers them;
* infrastructure: :func:`get_logger`, :func:`current_platform`, :mod:`envs`
  (every environment variable, typed and validated), :func:`process_rank`,
  :func:`build_extension` / :class:`ExtensionBuildError` / :func:`cache_root` /
  :func:`cache_problem` (why a build could not use the cache here);
* layout predicates that never guard a compiled graph: :func:`contiguous`,
  :func:`rows_flatten_free`, :func:`may_overlap_itself`;
* tolerances: :class:`Tolerance`, :data:`EXACT` and :data:`DEFAULT_TOLERANCES`.

What one family of impls shares is not here but in the kits (:mod:`vllm_ir.kits`:
``norms``, ``vendor``, ``quant``), versioned with core; their old names here
still work for one release, with a ``DeprecationWarning``.

>>> from vllm_ir.provider import API_VERSION, ProviderSpec, PlatformDefaults
>>> spec = ProviderSpec(name="doc", register=lambda: None, api_version=API_VERSION,
...                     defaults=[PlatformDefaults("cpu", {"rms_norm": ["doc"]})])
>>> spec.name, spec.defaults[0].platform
('doc', 'cpu')
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_ir import envs
from vllm_ir._base.logger import get_logger
from vllm_ir._base.platform import Platform, current_platform, device_type, privateuse1_available
from vllm_ir._base.rank import process_rank
from vllm_ir._base.registration import RegistrationHandle, RegistrationLog, recording_registrations
from vllm_ir._discovery.providers import ProviderSpec, register_platform
from vllm_ir._schema.impl import NATIVE
from vllm_ir._schema.layout import contiguous, may_overlap_itself, rows_flatten_free
from vllm_ir._schema.samples import SampleInput
from vllm_ir._schema.tolerances import DEFAULT_TOLERANCES, EXACT, Tolerance
from vllm_ir._version import API_VERSION
from vllm_ir.kits import norms as _norms_kit
from vllm_ir.kits import quant as _quant_kit
from vllm_ir.kits import vendor as _vendor_kit
from vllm_ir.priority import PlatformDefaults

if TYPE_CHECKING:
    from vllm_ir._discovery.extension import ExtensionBuildError, cache_problem, cache_root

__all__ = [
    "API_VERSION",
    "DEFAULT_TOLERANCES",
    "EXACT",
    "NATIVE",
    "ExtensionBuildError",
    "Platform",
    "PlatformDefaults",
    "ProviderSpec",
    "RegistrationHandle",
    "RegistrationLog",
    "SampleInput",
    "Tolerance",
    "build_extension",
    "cache_problem",
    "cache_root",
    "contiguous",
    "current_platform",
    "deferred_register",
    "device_type",
    "envs",
    "get_logger",
    "may_overlap_itself",
    "privateuse1_available",
    "process_rank",
    "recording_registrations",
    "register_platform",
    "rows_flatten_free",
]


def build_extension(*args: Any, **kwargs: Any) -> Any:
    """Compile and load a C++/CUDA extension, cached
    (:func:`vllm_ir._discovery.extension.build_extension`).

    Imported on first use (importing a provider package builds nothing), and
    looked up per call, so replacing ``vllm_ir._discovery.extension.build_extension``
    (a test's fake build) reaches here too.
    """
    from vllm_ir._discovery import extension

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


_IN_KITS = {
    name: kit.__name__ for kit in (_norms_kit, _quant_kit, _vendor_kit) for name in kit.__all__
}
"""Names that left the contract for the kits (:mod:`vllm_ir.kits`): served here
with a ``DeprecationWarning`` for one release."""


def __getattr__(name: str) -> Any:
    # the kernel-build module loads on first use: a provider package's import stays light
    if name in ("ExtensionBuildError", "cache_problem", "cache_root"):
        from vllm_ir._discovery import extension

        return getattr(extension, name)
    if name in _IN_KITS:
        from vllm_ir._base.deprecation import warn_deprecated

        warn_deprecated(
            f"vllm_ir.provider.{name} is deprecated: import it from {_IN_KITS[name]} "
            "(the old name goes in the next release)"
        )
        return getattr(sys.modules[_IN_KITS[name]], name)
    raise AttributeError(f"module 'vllm_ir.provider' has no attribute {name!r}")
