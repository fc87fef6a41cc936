"""User configuration of kernel selection, from Python or the command line.

>>> import vllm_ir as ir
>>> config = ir.IrOpPriorityConfig.from_cli_args(["--ir-op-priority.rms_norm=native"])
>>> config
IrOpPriorityConfig(rms_norm=['native'])
>>> with config.scope():
...     ir.ops.rms_norm.get_priority()[0]
'native'
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import select
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, TypeVar

from vllm_ir_cli.flags import (
    AUTOTUNE_FLAG,
    BUILTIN_PASSES,
    DEFAULT_AUTOTUNE_BUCKETS,
    DEFAULT_AUTOTUNE_MARGIN,
    PASS_FLAG,
    PRIORITY_FLAG,
    split_flag_values,
)

from vllm_ir import envs
from vllm_ir._base.cache import on_before_selection
from vllm_ir._base.logger import get_logger
from vllm_ir._base.rank import process_rank
from vllm_ir._base.registration import RegistrationHandle
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._base.text import json_nesting_depth, short_repr
from vllm_ir._discovery.providers import ensure_loaded
from vllm_ir._discovery.stamps import drop_stale
from vllm_ir._op.op import IrOp, get_op
from vllm_ir._selection.buckets import BucketedPriority, parse_bucket_text, spec_to_json
from vllm_ir.priority import (
    add_tuned_table,
    apply_process_priority,
    scoped_priority,
    set_process_priority,
)

__all__ = [
    "AUTOTUNE_FLAG",
    "CLI_FLAG",
    "DEFAULT_AUTOTUNE_MARGIN",
    "IrPassConfig",
    "parse_ir_pass_args",
    "clear_process_priority",
    "load_tuning_file",
    "tuning_cache_path",
    "IrOpPriorityConfig",
    "KernelConfig",
    "parse_ir_autotune_args",
    "parse_ir_op_priority_args",
    "rank_path",
]

CLI_FLAG = PRIORITY_FLAG
# DEFAULT_AUTOTUNE_MARGIN (imported): a kernel must beat Inductor-compiled native
# by 10 % (it cannot fuse)

_MAX_JSON_DEPTH = 32  # a priority map nests two levels; deeper input is not a priority map


PriorityValue = Sequence[str] | Sequence[Mapping[str, Any]] | BucketedPriority
"""One op's entry as given: provider names, or size buckets (:mod:`vllm_ir._selection.buckets`)."""


_Config = TypeVar("_Config")


def _only_flags(config: _Config, rest: list[str]) -> _Config:
    """``config`` when its parser left nothing over: ``from_cli_args`` takes flags only."""
    if rest:
        raise ValueError(f"unrecognized arguments: {' '.join(rest)}")
    return config


class IrOpPriorityConfig:
    """Per-op priority lists, e.g. ``IrOpPriorityConfig(rms_norm=["vllm_c", "native"])``.

    An entry may instead be size buckets, ascending ``max_tokens``, the last a
    catch-all: ``rms_norm=[{"max_tokens": 64, "priority": ["cpu_c"]},
    {"priority": ["native"]}]``. Op and provider names and bucket tables are
    checked on construction (installed providers are discovered first); an
    unknown name or a malformed table raises ``ValueError`` / ``TypeError``
    naming what is wrong.

    >>> IrOpPriorityConfig(rms_norm=[{"max_tokens": 64, "priority": ["native"]},
    ...                              {"priority": []}]).to_dict()
    {'rms_norm': [{'max_tokens': 64, 'priority': ['native']}, {'priority': []}]}
    """

    def __init__(self, **priorities: PriorityValue) -> None:
        checked: dict[str, list[str] | BucketedPriority] = {}
        for op_name, providers in priorities.items():
            try:
                op: IrOp = get_op(op_name)
            except KeyError as e:
                raise ValueError(e.args[0]) from None
            checked[op_name] = op.check_priority(providers)
        self._priorities = checked

    @classmethod
    def from_dict(cls, priorities: Mapping[str, PriorityValue]) -> IrOpPriorityConfig:
        if not isinstance(priorities, Mapping):
            raise TypeError(
                f"ir_op_priority must map op names to provider lists, got {short_repr(priorities)}"
            )
        for op_name in priorities:
            if not isinstance(op_name, str):
                raise TypeError(f"ir_op_priority keys must be op names, got {short_repr(op_name)}")
        return cls(**priorities)

    @classmethod
    def from_cli_args(cls, argv: Sequence[str]) -> IrOpPriorityConfig:
        """Parse ``--ir-op-priority`` flags; any other argument is an error."""
        return _only_flags(*parse_ir_op_priority_args(argv))

    @classmethod
    def from_json(
        cls, source: str | Path, *, accept_stale: bool | None = None
    ) -> IrOpPriorityConfig:
        """From a JSON file (a path) or text: ``{"OP": ["a", "b"]}``, or a document
        holding that map under ``"ir_op_priority"`` (what ``vllm-ir tune`` writes).

        A tuning file's entries stamped with another environment are skipped
        with a warning (:mod:`vllm_ir._discovery.stamps`) unless ``accept_stale``
        (default: ``VLLM_IR_ACCEPT_STALE``).
        """
        return cls.from_dict(_parse_json(*_read_json_source(source), accept_stale=accept_stale))

    def to_dict(self) -> dict[str, list[Any]]:
        """The JSON form (``from_dict`` inverts it): lists of names, or of bucket objects."""
        return {op: spec_to_json(_spec(p)) for op, p in self._priorities.items()}

    def merged(self, other: IrOpPriorityConfig) -> IrOpPriorityConfig:
        """A config with ``other``'s lists overriding this one's, op by op."""
        return IrOpPriorityConfig(**{**self._priorities, **other._priorities})

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Apply within a ``with`` block, for this thread / task only."""
        with scoped_priority(self._priorities):
            yield

    def apply(self, *, replace: bool = False) -> RegistrationHandle:
        """Apply process-wide: to every thread, for the ops its scopes do not name.

        Lists of ops this config does not name are kept, unless ``replace``.
        The handle's ``remove()`` takes back this setting alone, in any order
        with other handles: the lists in force are then those of the settings
        still applied, in the order they were (a plugin that applies its
        settings can take them back):

        >>> import vllm_ir as ir
        >>> handle = ir.IrOpPriorityConfig(rms_norm=["native"]).apply()
        >>> handle.remove()
        """
        return RegistrationHandle(
            f"process-wide priorities {sorted(self._priorities)}",
            apply_process_priority(self._priorities, replace=replace),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IrOpPriorityConfig) and self._priorities == other._priorities

    def __hash__(self) -> int:
        return hash(tuple((k, _spec(v)) for k, v in sorted(self._priorities.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{op}={p!r}" for op, p in self._priorities.items())
        return f"IrOpPriorityConfig({inner})"


def _spec(value: list[str] | BucketedPriority) -> tuple[str, ...] | BucketedPriority:
    return value if isinstance(value, BucketedPriority) else tuple(value)


_ON = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


class IrPassConfig:
    """Which built-in IR passes run: ``IrPassConfig(fuse_norm_quant=False)``.

    >>> IrPassConfig(sequence_parallel=True).enabled()
    ['fuse_norm_quant', 'sequence_parallel']
    >>> IrPassConfig.from_cli_args(["--ir-pass.fuse_norm_quant=off"]).enabled()
    []
    """

    def __init__(self, **flags: bool) -> None:
        unknown = [name for name in flags if name not in BUILTIN_PASSES]
        if unknown:
            raise ValueError(
                f"unknown IR pass(es) {', '.join(map(repr, unknown))}; known passes: "
                f"{', '.join(sorted(BUILTIN_PASSES))}"
            )
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(f"IR pass {name!r} must be switched with a bool, got {value!r}")
        self._flags = {**BUILTIN_PASSES, **flags}

    @classmethod
    def from_cli_args(cls, argv: Sequence[str]) -> IrPassConfig:
        """Parse ``--ir-pass.NAME=on|off`` flags; any other argument is an error."""
        return _only_flags(*parse_ir_pass_args(argv))

    def enabled(self) -> list[str]:
        return [name for name, on in self._flags.items() if on]

    def to_dict(self) -> dict[str, bool]:
        return dict(self._flags)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IrPassConfig) and self._flags == other._flags

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._flags.items())))

    def __repr__(self) -> str:
        return f"IrPassConfig({', '.join(f'{k}={v}' for k, v in self._flags.items())})"


def parse_ir_pass_args(argv: Sequence[str]) -> tuple[IrPassConfig, list[str]]:
    """Split ``--ir-pass.NAME=on|off`` flags out of ``argv``.

    >>> config, rest = parse_ir_pass_args(["--ir-pass.fuse_norm_quant", "off", "-v"])
    >>> config.enabled(), rest
    ([], ['-v'])
    """
    flags: dict[str, bool] = {}
    found, rest = split_flag_values(argv, PASS_FLAG + ".", "on or off")
    for flag, value in found:
        name = flag[len(PASS_FLAG) + 1 :].replace("-", "_")
        if value.strip().lower() not in _ON:
            raise ValueError(f"{flag}={value!r}: expected on or off")
        flags[name] = _ON[value.strip().lower()]
    return IrPassConfig(**flags), rest


@dataclass
class KernelConfig:
    """Kernel selection settings of a deployment.

    >>> import vllm_ir as ir
    >>> ir.KernelConfig(ir_op_priority={"rms_norm": ["native"]}).ir_op_priority
    IrOpPriorityConfig(rms_norm=['native'])
    """

    ir_op_priority: IrOpPriorityConfig | Mapping[str, Sequence[str]] = field(
        default_factory=IrOpPriorityConfig
    )
    ir_passes: IrPassConfig | Mapping[str, bool] = field(default_factory=IrPassConfig)
    autotune: bool = False
    """Compiled mode: choose each IR node's impl by measurement (docs/compile.md, Autotuning)."""
    autotune_margin: float = DEFAULT_AUTOTUNE_MARGIN
    """How much faster than Inductor-compiled native a kernel must be to be chosen."""
    autotune_buckets: tuple[int, ...] = DEFAULT_AUTOTUNE_BUCKETS
    """Token buckets autotuning measures a dynamic token count in (``--ir-autotune.buckets``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.autotune, bool):
            raise TypeError(f"autotune must be a bool, got {short_repr(self.autotune)}")
        if not isinstance(self.autotune_margin, (int, float)) or not (
            0.0 <= self.autotune_margin < 1.0
        ):
            raise ValueError(
                f"autotune_margin must be a fraction in [0, 1), e.g. 0.1, "
                f"got {short_repr(self.autotune_margin)}"
            )
        self.autotune_buckets = _autotune_buckets(self.autotune_buckets)
        if not isinstance(self.ir_op_priority, IrOpPriorityConfig):
            self.ir_op_priority = IrOpPriorityConfig.from_dict(self.ir_op_priority)
        if not isinstance(self.ir_passes, IrPassConfig):
            if not isinstance(self.ir_passes, Mapping) or not all(
                isinstance(k, str) for k in self.ir_passes
            ):
                raise TypeError(
                    "ir_passes must map IR pass names to bools, e.g. "
                    f"{{'fuse_norm_quant': False}}, got {short_repr(self.ir_passes)}"
                )
            self.ir_passes = IrPassConfig(**self.ir_passes)

    @property
    def priority(self) -> IrOpPriorityConfig:
        assert isinstance(self.ir_op_priority, IrOpPriorityConfig)
        return self.ir_op_priority

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with self.priority.scope():
            yield

    def apply(self, *, replace: bool = False) -> RegistrationHandle:
        return self.priority.apply(replace=replace)

    @classmethod
    def from_cli_args(cls, argv: Sequence[str]) -> KernelConfig:
        """``--ir-op-priority...``, ``--ir-pass.NAME=...`` and ``--ir-autotune[=...]``."""
        priority, rest = parse_ir_op_priority_args(argv)
        passes, rest = parse_ir_pass_args(rest)
        buckets, rest = _split_autotune_buckets(rest)
        autotune, margin, rest = parse_ir_autotune_args(rest)
        if rest:
            raise ValueError(f"unrecognized arguments: {' '.join(rest)}")
        return cls(priority, passes, autotune, margin, buckets)

    backend: ClassVar[Callable[..., Any]]
    """Deprecated: ``VllmIRBackend.from_config(config, **kwargs)``. Set by the
    package (``vllm_ir/__init__.py``), which sits above the compile integration,
    for one release."""


def parse_ir_autotune_args(argv: Sequence[str]) -> tuple[bool, float, list[str]]:
    """Split ``--ir-autotune`` (on), ``--ir-autotune=on|off`` and
    ``--ir-autotune.margin=0.05`` out of ``argv``.

    >>> parse_ir_autotune_args(["--ir-autotune", "--ir-autotune.margin=0.05", "-v"])
    (True, 0.05, ['-v'])
    """
    on, margin, rest = False, DEFAULT_AUTOTUNE_MARGIN, []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag == AUTOTUNE_FLAG:
            if eq and value.strip().lower() not in _ON:
                raise ValueError(f"{arg!r}: expected {AUTOTUNE_FLAG}, or ={{on,off}}")
            on = _ON[value.strip().lower()] if eq else True
        elif flag == AUTOTUNE_FLAG + ".margin":
            try:
                margin = float(value)
            except ValueError:
                raise ValueError(
                    f"{arg!r}: the margin is a fraction, e.g. {AUTOTUNE_FLAG}.margin=0.1"
                ) from None
            if not 0.0 <= margin < 1.0:
                raise ValueError(f"{arg!r}: the margin must be in [0, 1)")
        else:
            rest.append(arg)
    return on, margin, rest


def _autotune_buckets(value: object) -> tuple[int, ...]:
    """Token bounds: positive ints, strictly ascending, at least one."""
    bounds = tuple(value) if isinstance(value, (list, tuple)) else None
    if (
        not bounds
        or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in bounds)
        or any(b <= a for a, b in itertools.pairwise(bounds))
    ):
        raise ValueError(
            "autotune_buckets must be ascending positive token bounds, e.g. (16, 256), "
            f"got {short_repr(value)}"
        )
    return bounds


def _split_autotune_buckets(argv: Sequence[str]) -> tuple[tuple[int, ...], list[str]]:
    """``--ir-autotune.buckets=16,256`` out of ``argv`` (default: the default buckets)."""
    flag = AUTOTUNE_FLAG + ".buckets"
    buckets: tuple[int, ...] = DEFAULT_AUTOTUNE_BUCKETS
    rest = []
    for arg in argv:
        name, _eq, value = arg.partition("=")
        if name != flag:
            rest.append(arg)
            continue
        try:
            buckets = _autotune_buckets([int(v) for v in value.split(",") if v.strip()])
        except ValueError:
            raise ValueError(
                f"{arg!r}: expected ascending positive token bounds, e.g. {flag}=16,256"
            ) from None
    return buckets, rest


def clear_process_priority() -> None:
    """Forget every process-wide priority set with ``apply()``."""
    set_process_priority({}, replace=True)


def _parse_providers(op_name: str, value: str) -> list[Any]:
    """``a,b`` (every size) or ``<=64:a,b;c`` (size buckets, the last covers the rest)."""
    return parse_bucket_text(value, f"{CLI_FLAG}.{op_name}")


def _parse_json(
    value: str, where: str | None = None, *, accept_stale: bool | None = None
) -> dict[str, Any]:
    """The priority map in JSON ``value``: ``{"OP": ["a", "b"]}``, or a document
    holding that map under ``"ir_op_priority"`` (what ``vllm-ir tune`` writes).

    One parse for text and files alike: duplicate keys are refused at every
    level, and the document is unwrapped the same way. ``where`` names the
    source in errors (default: the flag and the text, cut short).
    """
    where = where or f"{CLI_FLAG} {short_repr(value)}"
    example = 'expected e.g. \'{"rms_norm": ["vllm_c", "native"]}\''
    if json_nesting_depth(value, _MAX_JSON_DEPTH) > _MAX_JSON_DEPTH:  # json.loads recurses
        raise ValueError(f"{where} nests deeper than {_MAX_JSON_DEPTH} levels; {example}")
    try:
        parsed = json.loads(value, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{where} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {example}"
        ) from None
    except _DuplicateKey as e:
        raise ValueError(f"{where}: JSON names op {e.args[0]!r} twice; give each op once") from None
    stamps, stamped = None, False
    if isinstance(parsed, dict) and "ir_op_priority" in parsed:  # a `vllm-ir tune` document
        fmt = parsed.get("format", 1)
        # a format this vllm-ir does not know may mean anything: read as format 1 it
        # would apply unchecked what a newer writer meant to be checked
        if type(fmt) is not int or fmt not in TUNING_FORMATS:
            raise ValueError(
                f'{where}: "format": {short_repr(fmt)} is not a tuning-file format this vllm-ir '
                f"reads ({', '.join(map(str, TUNING_FORMATS))}); tune again with this vllm-ir, "
                "or upgrade vllm-ir to read it"
            )
        # format 2 stamps every entry: one without a (well-formed) stamp is refused
        stamped = "stamps" in parsed or fmt == 2
        stamps = parsed.get("stamps")
        parsed = parsed["ir_op_priority"]
        where = f"{where}: its ir_op_priority"
    if not isinstance(parsed, dict) or not all(isinstance(v, list) for v in parsed.values()):
        raise ValueError(
            f"{where}: JSON must map op names to lists of provider names (or of size "
            f"buckets); {example}"
        )
    if not stamped:
        return parsed
    if accept_stale is None:
        accept_stale = envs.accept_stale()
    return drop_stale(parsed, stamps, where.removesuffix(": its ir_op_priority"), accept_stale)


TUNING_FORMATS = (1, 2)
"""The tuning-file formats read: 1 (no ``"format"``, no stamps) and 2 (stamped)."""

MAX_PRIORITY_FILE_BYTES = 16 * 2**20
"""The largest priority file read (a tuned table of every op and bucket is kilobytes)."""


logger = get_logger(__name__)

TUNING_CACHE_NAME = "tuned.json"
"""The local tuning cache: ``$VLLM_IR_CACHE_DIR/tuned.json`` (``vllm-ir tune --cache``)."""


def tuning_cache_path() -> Path:
    """Where ``vllm-ir tune --cache`` writes and every process reads the local tuning cache."""
    # imported here: importing vllm_ir loads no kernel-build machinery
    from vllm_ir._discovery.extension import cache_root

    return cache_root() / TUNING_CACHE_NAME


def load_tuning_file(
    path: str | Path, *, layer: str = "tuning file", accept_stale: bool | None = None
) -> RegistrationHandle:
    """Apply a tuning file (what ``vllm-ir tune --out`` writes) as a tuned layer
    (:data:`vllm_ir.priority.TUNED_LAYERS`): below explicit settings, above the
    platform defaults, in eager mode. Entries stamped with another environment
    are skipped with a warning (:mod:`vllm_ir._discovery.stamps`); ``{rank}`` in
    ``path`` is this process's rank. The handle removes the layer's table.

    >>> import json, tempfile, vllm_ir as ir
    >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    ...     json.dump({"ir_op_priority": {"rms_norm": ["native"]}}, f)
    >>> handle = ir.load_tuning_file(f.name)
    >>> ir.ops.rms_norm.get_priority_entries("eager")[0].source.startswith("tuning file ")
    True
    >>> handle.remove()
    """
    return _load_tuning_file(path, layer, accept_stale)


def _load_tuning_file(
    path: str | Path, layer: str, accept_stale: bool | None, *, yours: bool = False
) -> RegistrationHandle:
    """:func:`load_tuning_file`; ``yours``: the file must pass the build cache's rule
    (the current user's, writable by nobody else), as a file found in a cache
    directory, not named by the user, must."""
    path = Path(rank_path(path))
    check = functools.partial(_check_tuning_file, path=path, where=f"{layer} {path}", yours=yours)
    text, where = _read_json_source(path, where=f"{layer} {path}", check=check)
    table = {}
    # per entry: an op or provider unknown here (a package not installed) drops
    # that entry, with a warning, not the file
    entries = _parse_json(text, where, accept_stale=accept_stale)
    for op_name, entry in entries.items():
        try:
            table.update(IrOpPriorityConfig(**{op_name: entry}).to_dict())
        except (ValueError, TypeError) as e:
            logger.warning("%s %s: %s not applied: %s", layer, path, op_name, e)
    return add_tuned_table(layer, str(path), table)


def _load_tuned_files_once() -> None:
    """Before the first selection: ``VLLM_IR_TUNING_FILE`` and the local tuning cache.
    A file that cannot be read is named in a warning; selection goes on without it."""
    store = RUNTIME.priorities
    if store.tuned_files_loaded:
        return
    ensure_loaded()  # the files name providers, and their stamps the providers' code
    with store.tuned_files_lock:  # other threads wait for the tables; this one re-enters
        if store.tuned_files_loaded or store.tuned_files_loading:
            return
        store.tuned_files_loading = True
        try:
            # a load a fork cut short in the parent: its tables go, this load redoes them
            while store.tuned_files_applied:
                store.tuned_files_applied.pop().remove()
            for layer, path in (("tuning file", envs.tuning_file), ("tuning cache", _cache)):
                handle = _load_quietly(layer, path)
                if handle is not None:
                    store.tuned_files_applied.append(handle)
        finally:
            store.tuned_files_loading = False
            store.tuned_files_loaded = True


def _cache() -> str | None:
    path = tuning_cache_path()
    # not is_file(): a FIFO or another user's file there is refused with a warning
    return str(path) if os.path.lexists(path) else None


def _load_quietly(layer: str, path_of: Callable[[], str | None]) -> RegistrationHandle | None:
    """Load one tuning file at the first selection; what goes wrong is one warning line.
    Returns the handle of what it applied."""
    try:
        path = path_of()
        if path is not None:
            return _load_tuning_file(path, layer, None, yours=layer == "tuning cache")
    except Exception as e:
        logger.warning("%s not applied: %s", layer, e)
    return None


def _check_tuning_file(st: os.stat_result, *, path: Path, where: str, yours: bool) -> None:
    """Refuse a tuning file that is not a regular file (a FIFO would block the first
    selection, with the tuned-files lock held, until some writer came), or, if
    ``yours``, one another user could have written."""
    # a FIFO the user names (``<(...)`` in a shell) is read for FIFO_WAIT_S at most
    if not stat.S_ISREG(st.st_mode) and not (stat.S_ISFIFO(st.st_mode) and not yours):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise ValueError(
            f"{where}: {kind}, so it is not read (it could block or never end); give the "
            "JSON file `vllm-ir tune --out` writes"
        )
    if yours:
        # imported here: importing vllm_ir loads no kernel-build machinery
        from vllm_ir._discovery.build_cache import refuse_unless_private

        try:
            refuse_unless_private(
                st,
                path,
                what="tuning cache",
                harm="applying it would let them choose your kernels",
                planted="anyone could choose your kernels",
            )
        except RuntimeError as e:  # UnsafeCacheError: a bad file, as any other
            raise ValueError(str(e)) from None


on_before_selection(_load_tuned_files_once)


def rank_path(path: str | Path) -> str:
    """``path`` with ``{rank}`` replaced by this process's rank (:func:`process_rank`:
    ``RANK``, ``LOCAL_RANK`` or torch.distributed's; one tuning file per rank).

    >>> import os; os.environ["RANK"] = "3"
    >>> rank_path("tuned-{rank}.json")
    'tuned-3.json'
    >>> del os.environ["RANK"]

    A rank is a non-negative decimal integer: any other value (``-1``, ``' 3'``,
    ``../x``) would name a file outside the per-rank set, so it is a ``ValueError``;
    so is a path with ``{rank}`` where no rank is known (never a silent rank 0).
    """
    path = str(path)
    if "{rank}" not in path:
        return path  # RANK matters only where it is used
    known = process_rank()
    if known is None:
        raise ValueError(
            f"{path}: {{rank}} needs this process's rank and none is known (RANK and "
            "LOCAL_RANK are unset, torch.distributed is not initialized); set RANK, or "
            "give a path without {rank}"
        )
    name, rank = known
    if not _RANK.fullmatch(rank):
        raise ValueError(
            f"{path}: {name}={short_repr(rank)} is not a rank (a non-negative integer such as "
            f"0 or 3), so {{rank}} cannot be expanded; set {name} to the rank, or give a path "
            "without {rank}"
        )
    return path.replace("{rank}", rank)


_RANK = re.compile(r"[0-9]+")
"""ASCII digits only (``str.isdigit`` takes ``'³'``): no sign, space or separator."""


def _read_json_source(
    source: str | Path,
    where: str | None = None,
    check: Callable[[os.stat_result], None] | None = None,
) -> tuple[str, str | None]:
    """JSON text from ``source`` (a ``Path``, or text not starting with ``{`` or
    starting with ``{rank}``, is a file, ``{rank}`` in its name expanded:
    :func:`rank_path`), and how errors name it (``where``; default the flag;
    ``None``: by the text itself). ``check`` sees the opened file's status before
    it is read (opened without blocking: a FIFO's open waits for a writer)."""
    if isinstance(source, str):
        text = source.lstrip()
        if text.startswith("{") and not text.startswith("{rank}"):
            return source, None
    path = Path(rank_path(source))
    where = where or f"{CLI_FLAG}=@{path}"
    try:
        # bounded: /dev/zero or a stray huge file must not fill the memory
        with _opened(path, check) as f:
            if check is not None and stat.S_ISFIFO(os.fstat(f.fileno()).st_mode):
                data = _read_fifo(f.fileno(), MAX_PRIORITY_FILE_BYTES + 1, where)
            else:
                data = f.read(MAX_PRIORITY_FILE_BYTES + 1)
        if len(data) > MAX_PRIORITY_FILE_BYTES:
            raise ValueError(
                f"{where}: the file is larger than {MAX_PRIORITY_FILE_BYTES // 2**20} MiB; "
                "give a priority file such as `vllm-ir tune --out` writes"
            )
        return data.decode("utf-8"), where
    except OSError as e:
        raise ValueError(f"{where}: cannot read the file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{where}: the file is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
            f"{e.start}); give a JSON file such as `vllm-ir tune --out` writes"
        ) from None


class _DuplicateKey(Exception):
    """A JSON object gave this key twice (raised through ``json.loads``)."""


def _opened(path: Path, check: Callable[[os.stat_result], None] | None) -> BinaryIO:
    """``path`` opened for reading; with ``check``, without blocking, then checked."""
    if check is None:
        return path.open("rb")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        check(os.fstat(fd))  # the opened file: no swap after the check
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


FIFO_WAIT_S = 5.0
"""How long a tuning file that is a FIFO may take to give its whole text: its
reader holds the tuned-files lock, so every thread's first selection waits."""


def _read_fifo(fd: int, limit: int, where: str) -> bytes:
    """Up to ``limit`` bytes of the FIFO ``fd`` (opened without blocking), until its
    writer closes it; a ``ValueError`` when that takes over :data:`FIFO_WAIT_S`."""
    deadline = time.monotonic() + FIFO_WAIT_S
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise ValueError(
                f"{where}: a FIFO whose writer gave no whole file within {FIFO_WAIT_S:g} s, "
                "so it is not applied; give the JSON file `vllm-ir tune --out` writes"
            )
        try:
            chunk = os.read(fd, min(2**16, limit - size))
        except BlockingIOError:  # woken without data: wait again
            continue
        if not chunk:  # the writer closed it
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A key given twice is a mistake; silently keeping the last one hides it."""
    result: dict[str, Any] = {}
    for key, item in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = item
    return result


def parse_ir_op_priority_args(
    argv: Sequence[str],
) -> tuple[IrOpPriorityConfig, list[str]]:
    """Split ``--ir-op-priority`` flags out of ``argv``.

    Accepts ``--ir-op-priority.OP=a,b`` / ``--ir-op-priority.OP a,b`` (repeatable,
    later flags win per op) and ``--ir-op-priority '{"OP": ["a", "b"]}'`` /
    ``--ir-op-priority={...}``, or ``--ir-op-priority=@FILE`` (a JSON file, e.g.
    the output of ``vllm-ir tune``). Returns the config and the other arguments.
    Malformed flags, unknown ops and unknown providers raise ``ValueError``.

    >>> config, rest = parse_ir_op_priority_args(
    ...     ["--ir-op-priority.rms_norm=native", "--verbose"])
    >>> config.to_dict(), rest
    ({'rms_norm': ['native']}, ['--verbose'])
    """
    priorities: dict[str, list[str]] = {}
    found, rest = split_flag_values(argv, CLI_FLAG, "a value")
    for flag, value in found:
        if flag == CLI_FLAG and value.startswith("@"):  # @file: a JSON file
            priorities.update(_parse_json(*_read_json_source(Path(value[1:]))))
        elif flag == CLI_FLAG:
            priorities.update(_parse_json(value))
        elif flag.startswith(CLI_FLAG + "."):
            op_name = flag[len(CLI_FLAG) + 1 :].replace("-", "_")
            if not op_name:
                raise ValueError(f"{flag}: missing op name, e.g. {CLI_FLAG}.rms_norm=vllm_c")
            priorities[op_name] = _parse_providers(op_name, value)
        else:
            raise ValueError(
                f"unrecognized flag {flag!r}; use {CLI_FLAG}.OP=a,b or {CLI_FLAG} '{{json}}'"
            )
    return IrOpPriorityConfig(**priorities), rest
