"""Provider discovery through the ``vllm_ir.providers`` entry-point group.

A provider package declares, in its ``pyproject.toml``::

    [project.entry-points."vllm_ir.providers"]
    cpu_c = "vllm_ir_cpu:provider"

where ``provider`` is a :class:`ProviderSpec` (or a function returning one).
Discovery runs lazily, once per process, on the first selection or listing.
``VLLM_IR_PROVIDERS`` limits it to the named entry points. A provider that
fails to load — an import error, an incompatible API version, an exception in
its ``register`` — is logged with its name and cause, its registrations are
rolled back, and the rest of vllm-ir keeps working.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata

from vllm_ir import envs
from vllm_ir._version import API_VERSION, __version__
from vllm_ir.cache import invalidate_caches
from vllm_ir.logger import get_logger
from vllm_ir.priority import PlatformDefaults, add_platform_defaults
from vllm_ir.registrations import recording_registrations

__all__ = [
    "ENTRY_POINT_GROUP",
    "LoadedProvider",
    "ProviderLoadError",
    "ProviderSpec",
    "ensure_loaded",
    "load_errors",
    "load_provider",
    "loaded_providers",
]

ENTRY_POINT_GROUP = "vllm_ir.providers"

logger = get_logger(__name__)


@dataclass(frozen=True)
class ProviderSpec:
    """What a provider package tells vllm-ir about itself.

    Attributes:
        name: the provider package's short name (usually its main provider name).
        api_version: the :data:`vllm_ir.API_VERSION` it was written against.
        register: imports the package's kernels and calls ``register_impl``.
        defaults: default priorities per platform, for eager and compiled mode.

    >>> import vllm_ir as ir
    >>> ProviderSpec(name="my_kernels", api_version=ir.API_VERSION, register=lambda: None)
    ProviderSpec(name='my_kernels', api_version=1, defaults=())
    """

    name: str
    api_version: int
    register: Callable[[], object] = field(repr=False)
    defaults: Sequence[PlatformDefaults] = ()


@dataclass(frozen=True)
class LoadedProvider:
    """A provider that loaded: its spec and the distribution it came from."""

    entry_point: str
    package: str
    spec: ProviderSpec


@dataclass(frozen=True)
class ProviderLoadError:
    """A provider that did not load, and why."""

    entry_point: str
    package: str
    cause: str
    details: str = field(repr=False, default="")


_lock = threading.RLock()
_loaded_once = False
_loading = False
_loaded: dict[str, LoadedProvider] = {}
_errors: dict[str, ProviderLoadError] = {}


def _package_of(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ep.value.split(":")[0].split(".")[0]
    return f"{dist.name} {dist.version}"


def _resolve_spec(ep_name: str, obj: object) -> ProviderSpec:
    spec = obj() if callable(obj) and not isinstance(obj, ProviderSpec) else obj
    if not isinstance(spec, ProviderSpec):
        raise TypeError(
            f"entry point {ep_name!r} must name a vllm_ir.ProviderSpec or a function "
            f"returning one, got {type(spec).__name__}"
        )
    return spec


def load_provider(entry_point: str, package: str, obj: object) -> LoadedProvider:
    """Check and register one provider; raises on any problem, registering nothing.

    ``obj`` is what the entry point names: a :class:`ProviderSpec` or a
    function returning one. During discovery the entry point itself is loaded
    inside the same recorded scope, so registrations a package makes when
    imported are attributed and rolled back like those of its ``register``.
    Exposed for tests and for embedding a provider without installing it.
    """
    with recording_registrations(package):
        loaded = _load_and_register(entry_point, package, obj)
    _loaded[entry_point] = loaded
    return loaded


def _load_and_register(entry_point: str, package: str, obj: object) -> LoadedProvider:
    if isinstance(obj, _Loader):
        obj = obj.load()
    spec = _resolve_spec(entry_point, obj)
    if spec.api_version != API_VERSION:
        raise RuntimeError(
            f"provider {spec.name!r} ({package}) was written for vllm-ir provider API "
            f"{spec.api_version}, but the installed vllm-ir-core {__version__} provides "
            f"API {API_VERSION}; install a {package.split()[0]} release built for "
            f"vllm-ir-core {__version__}, or a vllm-ir-core that provides API {spec.api_version}"
        )
    spec.register()
    add_platform_defaults(package.split()[0], spec.defaults)
    return LoadedProvider(entry_point, package, spec)


@dataclass(frozen=True)
class _Loader:
    """Defers ``EntryPoint.load`` (the provider's import) into the recorded scope."""

    entry_point: metadata.EntryPoint

    def load(self) -> object:
        return self.entry_point.load()


def _discover() -> None:
    allow = envs.provider_allow_list()
    eps = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    names = {ep.name for ep in eps}
    if allow is not None:
        for missing in sorted(allow - names):
            logger.warning(
                "%s names %r, but no such provider is installed; installed: %s",
                envs.VLLM_IR_PROVIDERS,
                missing,
                ", ".join(sorted(names)) or "none",
            )
    for ep in eps:
        if allow is not None and ep.name not in allow:
            logger.debug("provider %r skipped: not in %s", ep.name, envs.VLLM_IR_PROVIDERS)
            continue
        if ep.name in _loaded:
            continue
        package = _package_of(ep)
        try:
            load_provider(ep.name, package, _Loader(ep))
            logger.debug("provider %r loaded from %s", ep.name, package)
        except Exception as e:
            error = ProviderLoadError(
                ep.name, package, f"{type(e).__name__}: {e}", traceback.format_exc()
            )
            _errors[ep.name] = error
            logger.warning(
                "provider %r (%s) failed to load and is skipped: %s",
                ep.name,
                package,
                error.cause,
            )


def ensure_loaded() -> None:
    """Discover and load the installed providers, once per process."""
    global _loaded_once, _loading
    if _loaded_once:
        return
    with _lock:
        if _loaded_once or _loading:  # _loading: a provider's register() re-entered
            return
        _loading = True
        try:
            _discover()
        finally:
            _loading = False
            _loaded_once = True
    invalidate_caches()


def loaded_providers() -> dict[str, LoadedProvider]:
    """Entry-point name -> provider, for every provider that loaded."""
    ensure_loaded()
    return dict(_loaded)


def load_errors() -> dict[str, ProviderLoadError]:
    """Entry-point name -> error, for every provider that failed to load."""
    ensure_loaded()
    return dict(_errors)
