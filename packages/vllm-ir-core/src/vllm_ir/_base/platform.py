"""Which platform this process runs on: built in (``cuda``, ``rocm``, ``xpu``, ``cpu``)
or declared by an installed package.

A package declares a platform with a :class:`Platform` named by an entry
point of the group :data:`ENTRY_POINT_GROUP`::

    [project.entry-points."vllm_ir.platforms"]
    nova = "nova_ir.platform:platform"

(or in-process with ``vllm_ir.provider.register_platform``). The platform says how it is
detected, which torch device type its tensors have (a PrivateUse1 backend
renamed with ``torch.utils.rename_privateuse1_backend`` included) and its
default priorities. Platform entry points load before the providers, so a
provider's ``register`` already sees the platform; their *names* are known
from the installed metadata before anything loads, so
``PlatformDefaults("nova", ...)`` and ``VLLM_IR_PLATFORM=nova`` are accepted
as soon as the package is installed.

Detection: the declared platforms whose ``detect()`` answers true; exactly
one is the platform, several are an error naming them (set
``VLLM_IR_PLATFORM`` to choose), none leaves the built-in detection.
``VLLM_IR_PLATFORM`` overrides it all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata

import torch

from vllm_ir import envs
from vllm_ir._base.cache import before_selection, invalidating
from vllm_ir._base.logger import get_logger
from vllm_ir._base.registration import RegistrationHandle, record
from vllm_ir._base.runtime import RUNTIME

__all__ = [
    "BUILTIN_DEVICE_TYPES",
    "ENTRY_POINT_GROUP",
    "PLATFORMS",
    "Platform",
    "RegisteredPlatform",
    "current_platform",
    "device_type",
    "installed_platform_names",
    "known_platforms",
    "platform_problem",
    "platforms",
    "add_platform",
    "privateuse1_available",
    "redetect",
]

logger = get_logger(__name__)

ENTRY_POINT_GROUP = "vllm_ir.platforms"
PLATFORMS = envs.PLATFORMS
"""The built-in platforms."""

BUILTIN_DEVICE_TYPES: Mapping[str, str] = {
    "cuda": "cuda",
    "rocm": "cuda",
    "xpu": "xpu",
    "cpu": "cpu",
}
"""The torch device type of each built-in platform's tensors (ROCm runs on torch's ``cuda``)."""


def _privateuse1_name() -> str:
    return str(torch._C._get_privateuse1_backend_name())


def privateuse1_available(device_type: str) -> bool:
    """PrivateUse1 detection: the backend is renamed to ``device_type`` and its
    device module (``torch.<device_type>``) says it is available."""
    if _privateuse1_name() != device_type:
        return False
    module = getattr(torch, device_type, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False


@dataclass(frozen=True)
class Platform:
    """A platform an installed package declares (the provider contract).

    Attributes:
        name: the platform's name, a lower-case identifier (``"nova"``), as
            ``VLLM_IR_PLATFORM`` and ``PlatformDefaults`` spell it.
        device_type: the torch device type of its tensors (``"cpu"``,
            ``"cuda"``, or the name a PrivateUse1 backend was renamed to).
        detect: returns whether this process runs on the platform; ``None``
            with ``privateuse1=True``: :func:`privateuse1_available`.
        privateuse1: ``device_type`` is a PrivateUse1 backend renamed with
            ``torch.utils.rename_privateuse1_backend``; it is detected only
            once the backend carries that name.
        eager: default priorities in eager mode (op -> providers), like
            upstream's ``Platform.get_default_ir_op_priority``.
        compiled: default priorities when Inductor compiles the graph.

    >>> Platform("nova", device_type="cpu", detect=lambda: False).name
    'nova'
    """

    name: str
    device_type: str
    detect: Callable[[], bool] | None = field(default=None, repr=False)
    privateuse1: bool = False
    eager: Mapping[str, Sequence[str]] = field(default_factory=dict)
    compiled: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
            raise ValueError(
                f"Platform.name must be a lower-case identifier such as 'nova', got {name!r:.60}"
            )
        if name in PLATFORMS:
            raise ValueError(
                f"Platform {name!r}: {name} is a built-in platform; a package cannot "
                f"declare it again (built in: {', '.join(PLATFORMS)})"
            )
        if not isinstance(self.device_type, str) or not self.device_type.isidentifier():
            raise ValueError(
                f"Platform {name!r}: device_type must be a torch device type such as "
                f"'cpu' or a renamed PrivateUse1 backend, got {self.device_type!r:.60}"
            )
        if not isinstance(self.privateuse1, bool):
            raise TypeError(f"Platform {name!r}: privateuse1 must be a bool")
        if self.detect is None and not self.privateuse1:
            raise TypeError(
                f"Platform {name!r}: detect must be a function returning whether this "
                "process runs on the platform (only a privateuse1 platform has a default)"
            )
        if self.detect is not None and not callable(self.detect):
            raise TypeError(f"Platform {name!r}: detect must be callable, got {self.detect!r:.60}")
        if not self.privateuse1:
            try:
                torch.device(self.device_type)
            except RuntimeError:
                raise ValueError(
                    f"Platform {name!r}: torch knows no device type {self.device_type!r}; "
                    "for a PrivateUse1 backend pass privateuse1=True (and rename the "
                    "backend with torch.utils.rename_privateuse1_backend)"
                ) from None

    def detected(self) -> bool:
        """Whether this process runs on the platform (``detect()``, or PrivateUse1's)."""
        if self.privateuse1 and _privateuse1_name() != self.device_type:
            return False
        if self.detect is None:
            return privateuse1_available(self.device_type)
        return bool(self.detect())


@dataclass(frozen=True)
class RegisteredPlatform:
    """A declared platform and the package that declared it."""

    platform: Platform
    package: str


# the data lives on the runtime (vllm_ir._base.runtime); this module holds the rules
_platforms = RUNTIME.platforms


def platforms() -> dict[str, RegisteredPlatform]:
    """Name -> declared platform, for every platform registered so far."""
    return dict(_platforms.registered)


def installed_platform_names() -> frozenset[str]:
    """Names of the platforms installed packages declare (their entry points), unloaded."""
    try:
        return frozenset(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # broken metadata must not break core
        return frozenset()


def known_platforms() -> tuple[str, ...]:
    """The built-in platforms, then every declared or installed one (sorted)."""
    extra = (set(_platforms.registered) | installed_platform_names()) - set(PLATFORMS)
    return (*PLATFORMS, *sorted(extra))


def platform_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a platform name (to end a one-line error with
    the value), or ``None`` if it names a built-in, declared or installed platform."""
    if isinstance(name, str) and name in known_platforms():
        return None
    return f"must be one of {', '.join(known_platforms())} (built in or installed)"


def add_platform(platform: Platform, package: str) -> RegistrationHandle:
    """Declare ``platform`` (declared by ``package``) for this process; its defaults are
    added by :func:`vllm_ir._discovery.providers.register_platform`, the public entry.

    A name another package declared is refused, naming both packages.
    """
    if not isinstance(platform, Platform):
        raise TypeError(
            f"register_platform takes a vllm_ir.provider.Platform, got {type(platform).__name__}"
        )
    entry = RegisteredPlatform(platform, package)
    with _platforms.lock:
        existing = _platforms.registered.get(platform.name)
        if existing is not None:
            raise ValueError(
                f"platform {platform.name!r} is declared by both {existing.package} and "
                f"{package}; uninstall one, or rename the platform in one package"
            )
        with invalidating():
            _platforms.registered[platform.name] = entry
            _platforms.detected.clear()

    def undo() -> None:
        with _platforms.lock:
            if _platforms.registered.get(platform.name) is entry:
                with invalidating():
                    del _platforms.registered[platform.name]
                    _platforms.detected.clear()

    return record(RegistrationHandle(f"platform {platform.name!r}", undo))


def redetect() -> None:
    """Forget the detected platform (cached once found): after a backend became available
    (a PrivateUse1 rename, say); selection caches are invalidated too."""
    with _platforms.lock, invalidating():
        _platforms.detected.clear()


def _detect_builtin() -> str:
    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return "cpu"


def _detect() -> str:
    if _platforms.detected:
        return _platforms.detected[0]
    # installed platforms load in discovery (platforms first): detect after it, so a
    # process never settles on a built-in platform before an installed one loaded;
    # outside the lock: discovery registers platforms (a no-op once it ran or while
    # it runs, when providers ask for the platform)
    if installed_platform_names() - set(_platforms.registered):
        before_selection()
    with _platforms.lock:
        if _platforms.detected:
            return _platforms.detected[0]
        found = []
        for name, entry in sorted(_platforms.registered.items()):
            try:
                if entry.platform.detected():
                    found.append(name)
            except Exception as e:  # a vendor probe that raises: not this platform
                logger.warning(
                    "platform %r (%s): detect() raised %s: %s; treated as not detected",
                    name,
                    entry.package,
                    type(e).__name__,
                    e,
                )
        if len(found) > 1:
            raise ValueError(
                f"several declared platforms detect this machine: "
                f"{', '.join(f'{n} ({_platforms.registered[n].package})' for n in found)}; "
                f"set {envs.VLLM_IR_PLATFORM} to one of them"
            )
        result = found[0] if found else _detect_builtin()
        _platforms.detected.append(result)
        return result


def current_platform() -> str:
    """The platform whose default priorities apply.

    ``VLLM_IR_PLATFORM`` overrides detection, e.g. to inspect another
    platform's default priorities on this machine.

    >>> current_platform() in known_platforms()
    True
    """
    override = envs.platform_override()  # a bad value raises, naming the variable
    return _detect() if override is None else override


def device_type(platform: str | None = None) -> str:
    """The torch device type of ``platform``'s tensors (default: the current platform)."""
    name = platform or current_platform()
    if name in BUILTIN_DEVICE_TYPES:
        return BUILTIN_DEVICE_TYPES[name]
    before_selection()  # discovery: declared platforms load then
    entry = _platforms.registered.get(name)
    if entry is None:
        raise LookupError(f"platform {name!r} is installed but not loaded (no provider ran yet)")
    return entry.platform.device_type


def describe(platform: str | None = None) -> str:
    """One line for the CLI: the platform, its device type and who declared it."""
    name = platform or current_platform()
    if name not in BUILTIN_DEVICE_TYPES:
        before_selection()  # discovery: declared platforms load then
    entry = _platforms.registered.get(name)
    if entry is None and name not in BUILTIN_DEVICE_TYPES:
        why = f"left out by {envs.VLLM_IR_PROVIDERS}, or it failed to load"
        return f"{name} (installed, not loaded: {why})"
    if entry is None:
        return f"{name} (built in, device {BUILTIN_DEVICE_TYPES.get(name, '?')})"
    kind = "PrivateUse1 device" if entry.platform.privateuse1 else "device"
    return f"{name} (declared by {entry.package}, {kind} {entry.platform.device_type})"


# envs checks VLLM_IR_PLATFORM's value against the known platforms through this hook
envs.set_platform_names(known_platforms)
