"""Environment variables read by vllm-ir, in one place, each with one parser.

Every variable is an :class:`EnvVar` in :data:`ENV_VARS`: its accepted
values, its default and its parser. A value the parser does not accept is
*rejected* with one line naming the variable, what it was and what it
accepts: a ``ValueError`` where the variable is read (at a call), or — for
those read while ``vllm_ir`` is imported, where an error would make the
library unimportable — a warning, once per value, and the default.
The table in ``docs/design.md`` is :func:`markdown_table` (a test keeps
them equal).

Each is read when it is needed, not at import. ``VLLM_BATCH_INVARIANT`` and
``VLLM_IR_PLATFORM`` steer selection, which is cached: they are read once per
cache generation, at its first selection, so cached and new selections never
mix two values. Set them before the first call of an op, or call
:func:`vllm_ir.invalidate_caches` after changing them. ``VLLM_IR_PLATFORM``
is checked before provider discovery, so a bad value fails the call without
discovery running under it.
"""

from __future__ import annotations

import difflib
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ENV_VARS",
    "VLLM_BATCH_INVARIANT",
    "VLLM_IR_ACCEPT_STALE",
    "VLLM_IR_CACHE_DIR",
    "VLLM_IR_CHECK_SELECTION",
    "VLLM_IR_DUMP_GRAPHS",
    "VLLM_IR_PLATFORM",
    "VLLM_IR_PROVIDERS",
    "VLLM_IR_PROVIDER_LOAD_WARN_S",
    "VLLM_IR_TORCH_WRAP",
    "VLLM_IR_TRITON_DIRECT_LAUNCH",
    "VLLM_IR_TUNING_FILE",
    "VLLM_LOGGING_LEVEL",
    "EnvVar",
    "batch_invariant",
    "cache_dir",
    "check_selection",
    "dump_graphs_dir",
    "logging_level",
    "markdown_table",
    "platform_override",
    "provider_allow_list",
    "provider_load_warn_s",
    "read",
    "set_platform_names",
    "unknown_variables",
    "torch_wrap",
    "triton_direct_launch",
]

VLLM_BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
VLLM_IR_CACHE_DIR = "VLLM_IR_CACHE_DIR"
VLLM_IR_ACCEPT_STALE = "VLLM_IR_ACCEPT_STALE"
VLLM_IR_TUNING_FILE = "VLLM_IR_TUNING_FILE"
VLLM_IR_CHECK_SELECTION = "VLLM_IR_CHECK_SELECTION"
VLLM_IR_DUMP_GRAPHS = "VLLM_IR_DUMP_GRAPHS"
VLLM_IR_PLATFORM = "VLLM_IR_PLATFORM"
VLLM_IR_PROVIDERS = "VLLM_IR_PROVIDERS"
VLLM_IR_PROVIDER_LOAD_WARN_S = "VLLM_IR_PROVIDER_LOAD_WARN_S"
VLLM_IR_TORCH_WRAP = "VLLM_IR_TORCH_WRAP"
VLLM_IR_TRITON_DIRECT_LAUNCH = "VLLM_IR_TRITON_DIRECT_LAUNCH"
VLLM_LOGGING_LEVEL = "VLLM_LOGGING_LEVEL"

PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE = ("1", "true", "yes", "on", "y", "t", "enable", "enabled")
_FALSE = ("0", "false", "no", "off", "n", "f", "disable", "disabled")
_FLAG_VALUES = (
    "on: " + ", ".join(f"`{v}`" for v in _TRUE) + "; off: " + ", ".join(f"`{v}`" for v in _FALSE)
) + " (any case)"


class Rejected(ValueError):
    """A parser's refusal; :func:`read` adds the variable, the value and the accepted values
    (and the refusal's own text, if any, after them)."""


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: what it accepts and how it is parsed.

    ``parse`` gets the stripped value (never called for unset or empty, which
    mean ``default``) and returns the parsed value or raises :class:`Rejected`.
    ``invalid``: ``raise`` a ``ValueError`` where the variable is read, or
    ``warn`` and use the default (variables read during import).
    """

    name: str
    accepted: str
    default: str
    effect: str
    parse: Callable[[str], Any]
    default_value: Any = None
    invalid: Literal["raise", "warn"] = "raise"


def _flag(raw: str) -> bool:
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise Rejected


def _allow_list(raw: str) -> frozenset[str] | None:
    if raw.lower() == "none":
        return frozenset()
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    if not names:  # ",,": a list without a name is not "load none"
        _warn_once(
            VLLM_IR_PROVIDERS,
            raw,
            f"{VLLM_IR_PROVIDERS}={raw!r} names no provider, so all installed providers "
            "load; unset it to load all, or set it to 'none' to load none",
        )
        return None
    return names


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise Rejected from None
    if math.isnan(value) or value < 0:
        raise Rejected
    # inf, or more than a lock wait can express: never warn
    return 0.0 if value >= threading.TIMEOUT_MAX else value


# the known platforms (built in, declared, installed): set by vllm_ir._base.platform
_platform_names: list[Callable[[], tuple[str, ...]]] = [lambda: PLATFORMS]


def set_platform_names(names: Callable[[], tuple[str, ...]]) -> None:
    """Where ``VLLM_IR_PLATFORM``'s parser finds the platforms installed packages declare."""
    _platform_names[0] = names


def _platform(raw: str) -> str:
    value = raw.lower()
    if value in PLATFORMS:
        return value
    known = _platform_names[0]()
    if value not in known:
        extra = [p for p in known if p not in PLATFORMS]
        raise Rejected(f"installed platforms: {', '.join(extra) if extra else 'none'}")
    return value


def _level(raw: str) -> str:
    value = raw.upper()
    if value not in LOG_LEVELS:
        raise Rejected
    return value


def _path(raw: str) -> str:
    if "\0" in raw:
        raise Rejected
    return raw


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        VLLM_BATCH_INVARIANT,
        _FLAG_VALUES,
        "off",
        "Selection skips impls not registered with `batch_invariant=True`. Read once per "
        "cache generation (at its first selection); call `ir.invalidate_caches()` after "
        "changing it.",
        _flag,
        False,
    ),
    EnvVar(
        VLLM_IR_CHECK_SELECTION,
        _FLAG_VALUES,
        "off",
        "Every cached eager call is re-validated against an uncached `select()`; a mismatch "
        "raises `SelectionMismatch`. Read when an op is declared; "
        "`vllm_ir.testing.set_selection_check` switches it at run time. Slow: for tests and "
        "debugging.",
        _flag,
        False,
        "warn",
    ),
    EnvVar(
        VLLM_IR_PROVIDERS,
        "comma-separated entry-point names, or `none`",
        "all installed",
        "Allow-list of providers to load; `none` loads none. A list without a name "
        "(`,,`) loads all, with a warning; a name no installed provider has is warned "
        "about. Read once, at discovery.",
        _allow_list,
        None,
    ),
    EnvVar(
        VLLM_IR_PROVIDER_LOAD_WARN_S,
        "seconds, a number >= 0; `0` or `inf`: never warn",
        "5",
        "A provider still loading after this long is named in a warning.",
        _seconds,
        5.0,
    ),
    EnvVar(
        VLLM_LOGGING_LEVEL,
        "`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL` (any case)",
        "unset (logging's own)",
        "Level of the `vllm_ir` logger (a stderr handler is added if it has none). Read at "
        "first use.",
        _level,
        None,
        "warn",
    ),
    EnvVar(
        VLLM_IR_PLATFORM,
        "`cuda`, `rocm`, `xpu`, `cpu` (any case), or a platform an installed package declares",
        "detected",
        "Overrides platform detection, e.g. to inspect another platform's defaults. Checked "
        "before provider discovery; selection reads it once per cache generation, like "
        "`VLLM_BATCH_INVARIANT`.",
        _platform,
        None,
    ),
    EnvVar(
        VLLM_IR_CACHE_DIR,
        "a directory",
        "`~/.cache/vllm_ir`",
        "Where built kernels (`extensions/`) and autotuning results (`autotune/`) are kept.",
        _path,
        None,
    ),
    EnvVar(
        VLLM_IR_ACCEPT_STALE,
        _FLAG_VALUES,
        "off",
        "On: a tuning file's entries measured in another environment (device, threads, "
        "torch, triton, vllm-ir, an impl's package or code) are applied anyway, instead of "
        "being skipped with a warning. Read each time a tuning file is loaded.",
        _flag,
        False,
    ),
    EnvVar(
        VLLM_IR_TUNING_FILE,
        "a file (`{rank}` in it: this process's rank)",
        "unset",
        'A tuning file (what `vllm-ir tune --out` writes) applied as the "tuning file" layer: '
        "below explicit settings, above the local tuning cache, provider tables and platform "
        "defaults; eager mode. Read once, at the first selection.",
        _path,
        None,
    ),
    EnvVar(
        VLLM_IR_DUMP_GRAPHS,
        "a directory",
        "unset (no dumps)",
        "Each pass of the `vllm_ir` compile backend writes the graph it produced there, as "
        "`<pid>_<counter>_<pass>.txt`. Read each time a pass runs.",
        _path,
        None,
    ),
    EnvVar(
        VLLM_IR_TORCH_WRAP,
        _FLAG_VALUES,
        "on",
        "Off: trace-through mode, as `ir.enable_torch_wrap(False)`: calls under Dynamo, "
        "`make_fx` or a dispatch mode run the selected impl directly instead of the "
        "`torch.ops` op (no IR node in traced graphs). Read when `vllm_ir` is imported.",
        _flag,
        True,
        "warn",
    ),
    EnvVar(
        VLLM_IR_TRITON_DIRECT_LAUNCH,
        _FLAG_VALUES,
        "off",
        "vllm-ir-triton relaunches kernels it compiled once directly, skipping Triton's "
        "launcher. Read when vllm-ir-triton is imported.",
        _flag,
        False,
        "warn",
    ),
)

_BY_NAME = {v.name: v for v in ENV_VARS}
_warned: set[tuple[str, str]] = set()


def _warn_once(name: str, raw: str, message: str) -> None:
    if (name, raw) in _warned:
        return
    _warned.add((name, raw))
    warnings.warn(message, stacklevel=4)


def read(name: str) -> Any:
    """The parsed value of variable ``name`` (its default when unset or empty)."""
    var = _BY_NAME[name]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return var.default_value
    try:
        return var.parse(raw)
    except Rejected as e:
        message = f"{name}={raw[:60]!r} is not accepted; accepted values: " + var.accepted.replace(
            "`", ""
        )
        if e.args:
            message += f"; {e.args[0]}"
        if var.invalid == "warn":
            _warn_once(name, raw, f"{message}; ignored, using the default ({var.default})")
            return var.default_value
        raise ValueError(message) from None


def check_selection() -> bool:
    return bool(read(VLLM_IR_CHECK_SELECTION))


def batch_invariant() -> bool:
    return bool(read(VLLM_BATCH_INVARIANT))


def provider_allow_list() -> frozenset[str] | None:
    """``None``: load all; otherwise the entry-point names to load (empty: none)."""
    value: frozenset[str] | None = read(VLLM_IR_PROVIDERS)
    return value


def logging_level() -> str | None:
    value: str | None = read(VLLM_LOGGING_LEVEL)
    return value


def platform_override() -> str | None:
    value: str | None = read(VLLM_IR_PLATFORM)
    return value


def provider_load_warn_s() -> float:
    """Seconds before a slow provider is named (``0``: never)."""
    return float(read(VLLM_IR_PROVIDER_LOAD_WARN_S))


def cache_dir() -> str | None:
    value: str | None = read(VLLM_IR_CACHE_DIR)
    return value


def accept_stale() -> bool:
    """Whether tuning-file entries stamped with another environment still apply."""
    return bool(read(VLLM_IR_ACCEPT_STALE))


def tuning_file() -> str | None:
    value: str | None = read(VLLM_IR_TUNING_FILE)
    return value


def dump_graphs_dir() -> str | None:
    value: str | None = read(VLLM_IR_DUMP_GRAPHS)
    return value


def torch_wrap() -> bool:
    """Whether IR ops keep their ``torch.ops`` wrapper off the fast path (default on)."""
    return bool(read(VLLM_IR_TORCH_WRAP))


def triton_direct_launch() -> bool:
    return bool(read(VLLM_IR_TRITON_DIRECT_LAUNCH))


_TOOLING = frozenset(
    {
        "VLLM_IR_CI_LANES",
        "VLLM_IR_NOVA_PRESENT",
        "VLLM_IR_TEST_WORKERS",
        "VLLM_IR_VLLM_WHEEL",
        "VLLM_IR_WHEEL_DIR",
    }
)
"""Read by the repository's CI, tests and benchmarks (and ``VLLM_IR_FUZZ_*``), not by
the library: never reported unknown."""


def unknown_variables(
    environ: Mapping[str, str], also_known: Iterable[str] = ()
) -> list[tuple[str, str | None]]:
    """The ``VLLM_IR_*`` variables of ``environ`` that nothing reads: neither one of
    :data:`ENV_VARS` nor ``also_known`` (what a component such as the vLLM plugin
    reads), each with the nearest known name (None if nothing is near), sorted.

    >>> unknown_variables({"VLLM_IR_PLATFROM": "cpu", "VLLM_IR_PLATFORM": "cpu"})
    [('VLLM_IR_PLATFROM', 'VLLM_IR_PLATFORM')]
    """
    known = {v.name for v in ENV_VARS} | set(also_known)
    unknown = []
    for name in sorted(environ):
        if not name.startswith("VLLM_IR_") or name in known or name in _TOOLING:
            continue
        if name.startswith("VLLM_IR_FUZZ_"):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        unknown.append((name, near[0] if near else None))
    return unknown


def markdown_table() -> str:
    """The docs table of every variable: accepted values, default, effect, what a bad value does."""
    rows = [
        "| Variable | Accepted values | Default | Effect | Other values |",
        "|---|---|---|---|---|",
    ]
    for v in ENV_VARS:
        bad = "warning, default used" if v.invalid == "warn" else "`ValueError` where read"
        rows.append(f"| `{v.name}` | {v.accepted} | {v.default} | {v.effect} | {bad} |")
    return "\n".join(rows)
