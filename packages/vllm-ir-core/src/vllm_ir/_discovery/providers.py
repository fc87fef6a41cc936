"""Provider discovery through the ``vllm_ir.providers`` entry-point group.

A provider package declares, in its ``pyproject.toml``::

    [project.entry-points."vllm_ir.providers"]
    cpu_c = "vllm_ir_cpu:provider"

where ``provider`` is a :class:`ProviderSpec` (or a function returning one).
A package may also declare a platform, through the ``vllm_ir.platforms``
group (see :mod:`vllm_ir._base.platform`); those entry points load first, under
the same allow-list and failure rules, so providers see the platform.
Discovery runs lazily, once per process, on the first selection or listing.
``VLLM_IR_PROVIDERS`` limits it to the named entry points. A provider that
fails to load — an import error, a malformed spec, an incompatible API
version, anything raised by its import or its ``register`` (``SystemExit``
included; only ``KeyboardInterrupt`` propagates) — is logged with its name and
cause, everything it registered is rolled back (see
:mod:`vllm_ir._base.registration`), and the rest of vllm-ir keeps working. A
provider still loading after ``VLLM_IR_PROVIDER_LOAD_WARN_S`` seconds is named
in a warning; it cannot be interrupted.

Fork safety: a child forked while another thread runs discovery would
inherit the discovery lock held by a thread it does not have, and that
thread's half-registered provider. The child gets a new lock, rolls back
what the interrupted provider had registered, and runs discovery again at
its first call (the providers already loaded stay loaded). A fork from the
discovering thread itself (a provider's ``register`` forking) changes
nothing: that thread goes on in the child.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from vllm_ir import envs
from vllm_ir._base.cache import invalidate_caches, on_before_selection
from vllm_ir._base.logger import get_logger
from vllm_ir._base.platform import ENTRY_POINT_GROUP as PLATFORM_GROUP
from vllm_ir._base.platform import Platform, RegisteredPlatform, add_platform, platforms
from vllm_ir._base.registration import (
    RegistrationHandle,
    current_registration_log,
    record,
    recording_registrations,
)
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._base.text import typed_repr
from vllm_ir._discovery.stamps import device_table
from vllm_ir._selection.buckets import BucketedPriority, as_priority
from vllm_ir._version import API_VERSION, __version__
from vllm_ir.priority import (
    MODES,
    PlatformDefaults,
    add_platform_defaults,
    add_tuned_table,
    remove_platform_defaults,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "LoadedProvider",
    "ProviderLoadError",
    "ProviderSpec",
    "ensure_loaded",
    "load_errors",
    "load_platform",
    "load_provider",
    "loaded_providers",
    "register_platform",
]

ENTRY_POINT_GROUP = "vllm_ir.providers"

logger = get_logger(__name__)


@dataclass(frozen=True)
class ProviderSpec:
    """What a provider package tells vllm-ir about itself.

    Attributes:
        name: the provider package's short name (usually its main provider name).
        api_version: the :data:`vllm_ir.provider.API_VERSION` it was written against.
        register: imports the package's kernels and calls ``register_impl``.
        defaults: default priorities per platform, for eager and compiled mode.
        tuned: tables measured by the package's authors, per device: the key is a
            device as tuning stamps name it (``"NVIDIA H200"``, or ``"cpu:AVX512"``
            for a CPU's vector ISA), the value an op -> providers (or buckets)
            table; the one matching this machine is the "provider table" layer
            (:data:`vllm_ir.priority.TUNED_LAYERS`), below a user's tuning files.

    >>> import vllm_ir as ir
    >>> from vllm_ir.provider import API_VERSION
    >>> ProviderSpec(name="my_kernels", api_version=API_VERSION, register=lambda: None)
    ProviderSpec(name='my_kernels', api_version=1, defaults=())
    """

    name: str
    api_version: int
    register: Callable[[], object] = field(repr=False)
    defaults: Sequence[PlatformDefaults] = ()
    tuned: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # a malformed spec must fail here, in the provider's own import, and
        # never reach selection, where it would break every caller of its ops
        if not isinstance(self.defaults, (str, bytes, Mapping)) and isinstance(
            self.defaults, Iterable
        ):
            object.__setattr__(self, "defaults", tuple(self.defaults))  # read an iterator once
        check_spec(self)


_VALID = object()


def check_spec(spec: ProviderSpec) -> None:
    """Raise ``TypeError`` / ``ValueError`` with a one-line reason if ``spec`` is malformed."""
    name = spec.name
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(
            f"ProviderSpec.name must be a provider name such as 'acme_kernels', "
            f"got {typed_repr(name)}"
        )
    where = f"ProviderSpec {name!r}"
    if isinstance(spec.api_version, bool) or not isinstance(spec.api_version, int):
        raise TypeError(
            f"{where}: api_version must be an int (vllm_ir.provider.API_VERSION), "
            f"got {typed_repr(spec.api_version)}"
        )
    if not callable(spec.register):
        raise TypeError(
            f"{where}: register must be a function that registers the impls, "
            f"got {typed_repr(spec.register)}"
        )
    defaults = spec.defaults
    # __post_init__ made any iterable a tuple: anything else is the wrong kind
    bad: object = defaults
    if isinstance(defaults, tuple):
        bad = next((d for d in defaults if not isinstance(d, PlatformDefaults)), _VALID)
    if bad is not _VALID:
        raise TypeError(
            f"{where}: defaults must be a sequence of vllm_ir.provider.PlatformDefaults, e.g. "
            f"(PlatformDefaults('cuda', eager={{'rms_norm': [{name!r}]}}),), got {typed_repr(bad)}"
        )
    for d in defaults:
        # PlatformDefaults checks itself when built; this catches one altered since
        PlatformDefaults(d.platform, d.eager, d.compiled, d.rank)
    _check_tuned(spec.tuned, where)


def _check_tuned(tuned: object, where: str) -> None:
    example = "e.g. {'NVIDIA H200': {'rms_norm': ['my_kernels', 'native']}}"
    if not isinstance(tuned, Mapping):
        raise TypeError(f"{where}: tuned must map device names to tables, {example}")
    for device, table in tuned.items():
        if not isinstance(device, str) or not isinstance(table, Mapping):
            raise TypeError(
                f"{where}: tuned must map device names to op tables, {example}; "
                f"got {typed_repr(device)}: {typed_repr(table)}"
            )
        for op_name, entry in table.items():
            as_priority(entry, f"{where}: tuned[{device!r}][{op_name!r}]")


def _check_defaults_name_known_ops(spec: ProviderSpec, package: str) -> None:
    """Defaults naming an op that does not exist would silently never apply."""
    for d in spec.defaults:
        for mode in MODES:
            for op_name, providers in d.for_mode(mode).items():
                op = RUNTIME.ops.get(op_name)
                if op is None:
                    raise ValueError(
                        f"ProviderSpec {spec.name!r} ({package}): {d.platform} {mode} defaults "
                        f"name unknown IR op {op_name!r}; known ops: "
                        f"{', '.join(sorted(RUNTIME.ops))}"
                    )
                named = (
                    providers.providers() if isinstance(providers, BucketedPriority) else providers
                )
                unknown = [p for p in named if p not in op.registered_impls]
                if unknown:  # another package's provider, maybe not installed: not an error
                    logger.debug(
                        "provider %r (%s): %s %s defaults of op %r name provider(s) %s, which "
                        "no loaded package registered (yet); known: %s",
                        spec.name,
                        package,
                        d.platform,
                        mode,
                        op_name,
                        ", ".join(map(repr, unknown)),
                        ", ".join(sorted(op.registered_impls)),
                    )


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


# the data lives on the runtime (vllm_ir._base.runtime); this module holds the rules
_state = RUNTIME.discovery


def _one_line(e: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, cut to ``limit`` characters."""
    text = " ".join(str(e).split()) or repr(e)
    if len(text) > limit:
        text = f"{text[: limit - 3]}..."
    return f"{type(e).__name__}: {text}"


@contextlib.contextmanager
def _warn_if_slow(entry_point: str, package: str) -> Iterator[None]:
    """A provider still loading after a few seconds is named in a warning.

    Python cannot interrupt a thread, so a hanging provider still blocks
    discovery; the warning says which one it is and how to skip it.
    """
    delay = envs.provider_load_warn_s()
    start = time.monotonic()
    _state.in_progress = (entry_point, package, start)
    timer = None
    if delay > 0:
        timer = threading.Timer(
            delay,
            lambda: logger.warning(
                "provider %r (%s) is still loading after %.0f s; every thread's first "
                "vllm-ir call waits for it; leave it out of %s to skip it",
                entry_point,
                package,
                delay,
                envs.VLLM_IR_PROVIDERS,
            ),
        )
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        _state.in_progress = None
        if timer is not None:
            timer.cancel()
        elapsed = time.monotonic() - start
        if 0 < delay <= elapsed:
            logger.warning("provider %r (%s) took %.1f s to load", entry_point, package, elapsed)


def _package_of(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ep.value.split(":")[0].split(".")[0]
    return f"{dist.name} {dist.version}"


def _resolve_spec(ep_name: str, obj: object) -> ProviderSpec:
    spec = obj() if callable(obj) and not isinstance(obj, ProviderSpec) else obj
    if not isinstance(spec, ProviderSpec):
        raise TypeError(
            f"entry point {ep_name!r} must name a vllm_ir.provider.ProviderSpec or a function "
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
    with recording_registrations(package) as log:
        _state.current_log = log
        try:
            loaded = _load_and_register(entry_point, package, obj)
        finally:
            _state.current_log = None
    _state.loaded[entry_point] = loaded
    _state.registrations[entry_point] = log
    return loaded


def _load_and_register(entry_point: str, package: str, obj: object) -> LoadedProvider:
    if isinstance(obj, _Loader):
        obj = obj.load()
    spec = _resolve_spec(entry_point, obj)
    check_spec(spec)  # again: it may have been altered since it was built
    if spec.api_version != API_VERSION:
        raise RuntimeError(
            f"provider {spec.name!r} ({package}) was written for vllm-ir provider API "
            f"{spec.api_version}, but the installed vllm-ir-core {__version__} provides "
            f"API {API_VERSION}; install a {package.split()[0]} release built for "
            f"vllm-ir-core {__version__}, or a vllm-ir-core that provides API {spec.api_version}"
        )
    spec.register()
    _check_defaults_name_known_ops(spec, package)
    add_platform_defaults(package.split()[0], spec.defaults)
    table = device_table(spec.tuned)
    if table is not None:
        add_tuned_table("provider table", package.split()[0], table)
    return LoadedProvider(entry_point, package, spec)


@dataclass(frozen=True)
class _Loader:
    """Defers ``EntryPoint.load`` (the provider's import) into the recorded scope."""

    entry_point: metadata.EntryPoint

    def load(self) -> object:
        return self.entry_point.load()


def _claimed_twice(
    eps: list[metadata.EntryPoint], group: str = ENTRY_POINT_GROUP, what: str = "entry point"
) -> dict[str, ProviderLoadError]:
    """Entry-point names that two installed distributions both declare.

    Which one ``importlib.metadata`` lists first depends on install order, so
    neither is loaded: an error naming both, the same whatever the order.
    """
    by_name: dict[str, dict[str, metadata.EntryPoint]] = {}
    for ep in eps:
        by_name.setdefault(ep.name, {}).setdefault(_package_of(ep), ep)
    errors = {}
    for name, claims in by_name.items():
        if len(claims) < 2:
            continue
        listed = " and ".join(f"{pkg} ({claims[pkg].value})" for pkg in sorted(claims))
        cause = (
            f"{what} {name!r} of group {group} is declared by {len(claims)} "
            f"installed distributions: {listed}; neither is loaded. Uninstall all but one, or "
            f"rename the {what} in one package"
        )
        errors[name] = ProviderLoadError(name, ", ".join(sorted(claims)), cause)
    return errors


def register_platform(platform: Platform, package: str | None = None) -> RegistrationHandle:
    """Declare ``platform`` and its default priorities for this process.

    ``package`` (``"name version"``) defaults to the provider package loading
    now. A name another package declared is refused, naming both packages.
    Undone by the returned handle, or with the rest of a failed provider load.
    """
    if package is None:
        log = current_registration_log()
        package = (log.package if log is not None else None) or "?"
    handle = add_platform(platform, package)
    source = f"{package.split()[0]} (platform {platform.name})"
    try:  # checked like any provider's defaults; rank 1: the platform's own come first
        defaults = PlatformDefaults(platform.name, platform.eager, platform.compiled, rank=1)
        add_platform_defaults(source, [defaults])
    except BaseException:
        handle.remove()
        raise

    def undo() -> None:
        handle.remove()
        remove_platform_defaults(source)

    return record(RegistrationHandle(f"platform {platform.name!r} and its defaults", undo))


def load_platform(entry_point: str, package: str, obj: object) -> RegisteredPlatform:
    """Check and register one platform entry point; raises on any problem, registering nothing.

    ``obj`` is what the entry point names: a :class:`~vllm_ir._base.platform.Platform`
    or a function returning one, whose name must be the entry point's.
    """
    with recording_registrations(package):
        if isinstance(obj, _Loader):
            obj = obj.load()
        found = obj() if callable(obj) and not isinstance(obj, Platform) else obj
        if not isinstance(found, Platform):
            raise TypeError(
                f"platform entry point {entry_point!r} must name a vllm_ir.provider.Platform "
                f"or a function returning one, got {type(found).__name__}"
            )
        if found.name != entry_point:
            raise ValueError(
                f"platform entry point {entry_point!r} declares a platform named "
                f"{found.name!r}; name the entry point after its platform"
            )
        register_platform(found, package)
    return platforms()[entry_point]


def _platform_key(name: str) -> str:
    """The :func:`load_errors` key of a platform entry point that failed."""
    return f"{name} (platform)"


def _discover_platforms(allow: frozenset[str] | None) -> None:
    """Load the platform entry points, before any provider's ``register`` reads the platform."""
    eps = sorted(metadata.entry_points(group=PLATFORM_GROUP), key=lambda ep: ep.name)
    twice = _claimed_twice(eps, PLATFORM_GROUP, "platform")
    for name, error in twice.items():
        if (allow is None or name in allow) and name not in platforms():
            _state.errors[_platform_key(name)] = error
            logger.warning("platform %r is skipped: %s", name, error.cause)
    for ep in eps:
        if (allow is not None and ep.name not in allow) or ep.name in twice:
            continue
        if ep.name in platforms():
            continue
        package = _package_of(ep)
        try:
            with _warn_if_slow(ep.name, package):
                load_platform(ep.name, package, _Loader(ep))
            logger.debug("platform %r declared by %s", ep.name, package)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            error = ProviderLoadError(
                _platform_key(ep.name), package, _one_line(e), traceback.format_exc()
            )
            _state.errors[error.entry_point] = error
            logger.warning(
                "platform %r (%s) failed to load and is skipped: %s", ep.name, package, error.cause
            )


def _discover() -> None:
    allow = envs.provider_allow_list()
    _discover_platforms(allow)
    eps = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    names = {ep.name for ep in eps}
    twice = _claimed_twice(eps)
    for name, error in twice.items():
        if (allow is None or name in allow) and name not in _state.loaded:
            _state.errors[name] = error
            logger.warning("provider %r is skipped: %s", name, error.cause)
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
        if ep.name in _state.loaded or ep.name in twice:
            continue
        package = _package_of(ep)
        logger.debug("loading provider %r from package %s (%s)", ep.name, package, ep.value)
        try:
            with _warn_if_slow(ep.name, package):
                load_provider(ep.name, package, _Loader(ep))
            logger.debug("provider %r loaded from %s", ep.name, package)
        except KeyboardInterrupt:  # the user's, not the provider's: stop, rolled back
            raise
        except BaseException as e:  # SystemExit from a provider's argparse, too
            error = ProviderLoadError(ep.name, package, _one_line(e), traceback.format_exc())
            _state.errors[ep.name] = error
            logger.warning(
                "provider %r (%s) failed to load and is skipped: %s",
                ep.name,
                package,
                error.cause,
            )
    _report_platform_defaults_of_unknown_ops()


def _report_platform_defaults_of_unknown_ops() -> None:
    """A platform's defaults naming an op no package declared would silently never apply.

    Checked once every provider has loaded (a provider may declare the op); each
    unknown op is a load error of the platform, whose other defaults still apply.
    """
    for name, registered in platforms().items():
        for mode in MODES:
            defaults = getattr(registered.platform, mode)
            unknown = sorted(op for op in defaults if op not in RUNTIME.ops)
            if not unknown:
                continue
            cause = (
                f"{mode} defaults name unknown IR op(s) {', '.join(map(repr, unknown))}; known "
                f"ops: {', '.join(sorted(RUNTIME.ops))}"
            )
            key = _platform_key(name)
            _state.errors[key] = ProviderLoadError(key, registered.package, cause, "")
            logger.warning("platform %r (%s): %s", name, registered.package, cause)


def ensure_loaded() -> None:
    """Discover and load the installed providers, once per process."""
    if _state.loaded_once:
        return
    # checked before discovery: providers' register() reads the platform, and a
    # bad value must fail this call, not every later one (a provider recorded
    # as failed stays unloaded for the process)
    envs.platform_override()
    delay = envs.provider_load_warn_s()
    if not _state.lock.acquire(timeout=delay) if delay > 0 else not _state.lock.acquire():
        busy = _state.in_progress
        if busy is not None:
            logger.warning(
                "waiting for provider %r (%s), loading in another thread for %.0f s",
                busy[0],
                busy[1],
                time.monotonic() - busy[2],
            )
        _state.lock.acquire()
    try:
        if _state.loaded_once or _state.loading:  # loading: a provider's register() re-entered
            return
        _state.loading = True
        try:
            _discover()
        finally:
            _state.loading = False
            _state.loaded_once = True
    finally:
        _state.lock.release()
    invalidate_caches()


def loaded_providers() -> dict[str, LoadedProvider]:
    """Entry-point name -> provider, for every provider that loaded."""
    ensure_loaded()
    return dict(_state.loaded)


def load_errors() -> dict[str, ProviderLoadError]:
    """Entry-point name -> error, for every provider that failed to load."""
    ensure_loaded()
    return dict(_state.errors)


def _before_selection() -> None:
    ensure_loaded()  # looked up at call time: tests may replace it


# discovery runs before the first selection; the op machinery never imports this module
on_before_selection(_before_selection)
