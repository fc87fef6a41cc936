"""Old import paths of core's internal modules, served for one release.

Core's internal modules carry private names (``vllm_ir._op.op``,
``vllm_ir.compilation._lowering``, ``vllm_ir._cli``); their public names are
``vllm_ir``, ``vllm_ir.ops``, ``vllm_ir.provider``, ``vllm_ir.testing``,
``vllm_ir.compilation`` (with ``ir_nodes``), ``vllm_ir.priority``,
``vllm_ir.selection``, ``vllm_ir.config`` and ``vllm_ir.envs``. Code that still
imports an old path gets the very module object of the new one (so a patch
applied through either name is seen through both) and a ``DeprecationWarning``
(:class:`~vllm_ir._base.deprecation.VllmIRDeprecationWarning`).

>>> import warnings
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     import vllm_ir.build_cache as old
>>> import vllm_ir._discovery.build_cache as new
>>> old is new, caught[0].category.__name__
(True, 'VllmIRDeprecationWarning')
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

from vllm_ir._base.deprecation import warn_deprecated

__all__ = ["MOVED", "RENAMED", "install", "message", "new_name", "public_name"]

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

RENAMED: dict[str, str] = {
    **{f"vllm_ir.{old}": f"vllm_ir.{new}" for old, new in _TOP.items()},
    **{f"vllm_ir.compilation.{name}": f"vllm_ir.compilation._{name}" for name in _COMPILATION},
    "vllm_ir.compilation.fingerprint": "vllm_ir._base.fingerprint",  # below config, for stamps
    "vllm_ir.cli": "vllm_ir._cli",  # a package: its submodules move with it
}
"""The internal modules given private names: old path -> new path."""

MOVED: dict[str, str] = {
    **RENAMED,
    "vllm_ir.dispatch": "vllm_ir.selection",  # it always held selection
}
"""Old module path -> where it lives now."""

_PUBLIC_NAMES = {new: old for old, new in RENAMED.items()}


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


def new_name(old: str) -> str | None:
    """Where the module ``old`` lives now, or ``None`` if it did not move.

    >>> new_name("vllm_ir.cli.args"), new_name("vllm_ir.ops")
    ('vllm_ir._cli.args', None)
    """
    # every import in the process asks: anything outside vllm_ir leaves at once
    return _translated(old, MOVED) if old.startswith("vllm_ir.") else None


def public_name(name: str) -> str:
    """A renamed module's name as it was, for what users see and filter on (logger
    names); any other name unchanged.

    >>> public_name("vllm_ir.compilation._lowering"), public_name("my_kernels._impls")
    ('vllm_ir.compilation.lowering', 'my_kernels._impls')
    """
    return _translated(name, _PUBLIC_NAMES) or name


def message(old: str) -> str:
    """The deprecation message for an import of the old path ``old``."""
    return (
        f"{old} is deprecated: import {new_name(old)} (internal) or a public module "
        "(the old path goes in the next release)"
    )


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self.real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # the import system's own frames are skipped: the warning points at the importer
        warn_deprecated(message(self.old), stacklevel=1)
        module = importlib.import_module(self.new)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the module ran under its new name; the import system has just set this
        # alias's spec on it, which would make importlib.reload() rename the
        # module and run nothing: its own spec goes back
        module.__spec__ = self.real_spec


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(fullname, new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder,
    which would otherwise load a moved package's submodules a second time."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
