"""The ``vllm_ir`` logger, whose level follows ``VLLM_LOGGING_LEVEL``."""

from __future__ import annotations

import logging

from vllm_ir import envs

__all__ = ["get_logger"]

_ROOT = "vllm_ir"
_configured = False

# Logger names are what users filter on: the modules that got private names
# log under the names they had.
_TOP = {
    # old public name -> the folder (layer) and name it lives under now
    "arguments": "_schema.arguments",
    "autograd": "_schema.autograd",
    "buckets": "_selection.buckets",
    "build_cache": "_discovery.build_cache",
    "cache": "_base.cache",
    "callsite": "_op.callsite",
    "compiled_eager": "_selection.compiled_eager",
    "dispatch_key": "_selection.key",
    "eager": "_selection.eager",
    "extension": "_discovery.extension",
    "impl": "_schema.impl",
    "layout": "_schema.layout",
    "logger": "_base.logger",
    "namespace": "_base.namespace",
    "norms": "kits.norms",
    "op": "_op.op",
    "planning": "_tools.planning",
    "platform": "_base.platform",
    "providers": "_discovery.providers",
    "registration": "_base.registration",
    "runtime": "_base.runtime",
    "samples": "_schema.samples",
    "selector": "_selection.selector",
    "signature": "_schema.signature",
    "timing": "_base.timing",
    "tolerances": "_schema.tolerances",
    "torch_wrap": "_base.torch_wrap",
    "vendor": "kits.vendor",
}
_COMPILATION = [
    "absolute_views",
    "aliasing",
    "autotune",
    "backend",
    "bucket_branches",
    "bucket_switch",
    "clone_elimination",
    "context",
    "functionalize",
    "fusion",
    "lowering",
    "pass_base",
    "sequence_parallel",
    "tuning_cache",
    "upstream_hazards",
]

_RENAMED: dict[str, str] = {
    **{f"vllm_ir.{old}": f"vllm_ir.{new}" for old, new in _TOP.items()},
    **{f"vllm_ir.compilation.{name}": f"vllm_ir.compilation._{name}" for name in _COMPILATION},
    "vllm_ir.compilation.fingerprint": "vllm_ir._base.fingerprint",  # below config, for stamps
    "vllm_ir.cli": "vllm_ir._cli",  # a package: its submodules move with it
}
"""The internal modules given private names: old name -> module name."""

_PUBLIC_NAMES = {new: old for old, new in _RENAMED.items()}


def _translated(name: str, table: dict[str, str]) -> str | None:
    """``name`` through ``table``, by its longest dotted prefix found there (a moved
    package's submodules move with it), or ``None``."""
    head, rest = name, ""
    while head not in table:
        head, dot, tail = head.rpartition(".")
        if not dot:
            return None
        rest = f".{tail}{rest}"
    return table[head] + rest


def public_name(name: str) -> str:
    """A renamed module's name as it was, for what users see and filter on (logger
    names); any other name unchanged.

    >>> public_name("vllm_ir.compilation._lowering"), public_name("my_kernels._impls")
    ('vllm_ir.compilation.lowering', 'my_kernels._impls')
    """
    return _translated(name, _PUBLIC_NAMES) or name


def _configure() -> None:
    global _configured
    _configured = True
    root = logging.getLogger(_ROOT)
    # a bad value warns and reads as unset: a typo in an environment variable
    # must not make the library unimportable
    level = envs.logging_level()
    if level is None:
        return
    root.setLevel(level)
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


def get_logger(name: str) -> logging.Logger:
    """Return the logger for module ``name`` (configured on first use).

    A module that got a private name logs under its old one, so logger names
    stay what users filter on; other names are kept as given:

    >>> get_logger("vllm_ir.compilation._lowering").name, get_logger("my_kernels._impls").name
    ('vllm_ir.compilation.lowering', 'my_kernels._impls')
    """
    if not _configured:
        _configure()
    return logging.getLogger(public_name(name))
