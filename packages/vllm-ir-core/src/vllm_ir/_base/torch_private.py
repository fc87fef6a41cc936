"""The private torch internals that undoing a registration needs, in one place.

``torch.library`` has no public way to undefine an op: a failed provider load
(:mod:`vllm_ir._base.registration`) and an op's teardown (``IrOp._unregister``)
read and edit the bookkeeping below. Written against torch 2.11 to 2.13
(``torch/library.py``: ``_defs``, ``_impls``, ``Library._op_defs``,
``Library._op_impls``, ``Library._destroy``; ``torch/_library/custom_ops.py``:
``OPDEFS``, ``OPDEF_TO_LIB``); a torch that moves them breaks only these
functions, and ``tests/test_registration.py`` says so.

torch 2.11's ``Library._destroy`` drops each definition's cached
``torch.ops.<ns>.<name>`` after undefining the ops, checking for it with
``hasattr``: for an op with two overloads (``name`` and
``name.maybe_inplace``) the second check misses the cache the first emptied,
and asks the dispatcher for the op it just removed, which reads freed memory
(a ``UnicodeDecodeError``, or worse). torch 2.13 checks the namespace's own
``vars()`` (``torch.library._clear_torch_ops_cache``); :func:`_destroy` does
so on torch 2.11 as well.

Imports torch lazily: :mod:`vllm_ir._base.registration` imports nothing at load.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

__all__ = [
    "defined_ops",
    "destroy_libraries_defining",
    "destroy_library",
    "implemented_ops",
    "size_hint",
]


def defined_ops() -> frozenset[str]:
    """Every ``namespace::name`` some ``torch.library.Library`` defined."""
    import torch.library

    return frozenset(torch.library._defs)


def implemented_ops() -> frozenset[str]:
    """Every ``namespace::name/dispatch key`` some ``Library`` registered a kernel for."""
    import torch.library

    return frozenset(torch.library._impls)


def _forget(defs: Iterable[str]) -> None:
    # Library._destroy leaves the names behind, which would block defining them again
    import torch.library
    from torch._library import custom_ops

    defs = set(defs)
    torch.library._defs.difference_update(defs)
    for qualname in defs:
        custom_ops.OPDEFS.pop(qualname, None)
        custom_ops.OPDEF_TO_LIB.pop(qualname, None)


def _destroy(lib: Any) -> None:
    """``lib._destroy()``, never looking up an op it removed (see the module doc)."""
    import torch
    import torch.library

    if hasattr(torch.library, "_clear_torch_ops_cache"):  # torch 2.13 and later
        lib._destroy()
        return
    # torch 2.11: _destroy would look each definition's packet up; it reads
    # _op_defs for nothing else, and the finalizer needs them back afterwards
    defs = set(lib._op_defs)
    lib._op_defs.clear()
    try:
        lib._destroy()
    finally:
        lib._op_defs.update(defs)
    for qualname in defs:
        ns, name = qualname.split("::")
        name = name.split(".")[0]
        namespace = vars(torch.ops).get(ns)
        if namespace is not None and name in vars(namespace):
            delattr(namespace, name)
            if name in namespace._dir:
                namespace._dir.remove(name)


def destroy_library(lib: Any) -> None:
    """Destroy ``lib`` (a ``torch.library.Library``), so its op names can be defined again."""
    defs = set(lib._op_defs)
    _destroy(lib)
    _forget(defs)


def destroy_libraries_defining(defs: set[str], impls: set[str]) -> list[str]:
    """Destroy the ``Library`` objects that made ``defs`` / ``impls``; returns what went.

    torch keeps no registry of Library objects, so they are found by a heap
    scan; this runs only when a provider failed to load.
    """
    import torch.library

    destroyed: list[str] = []
    for obj in gc.get_objects():
        # type(), not isinstance(): some objects warn when their __class__ is read
        if not issubclass(type(obj), torch.library.Library) or getattr(obj, "m", None) is None:
            continue  # not a library, or one already destroyed
        mine = (set(obj._op_defs) & defs) | (set(obj._op_impls) & impls)
        if mine:
            _destroy(obj)
            destroyed.append(f"torch.library {obj.ns} ({', '.join(sorted(mine))})")
    _forget(defs)
    return destroyed


def size_hint(value: Any, fallback: int) -> int:
    """The concrete value a backed ``torch.SymInt`` was traced with, else ``fallback``.

    torch 2.12 and later name this ``symbolic_shapes.optimization_hint``; torch
    2.11 (the GPU machine's) ``size_hint`` (its ``hint_int`` warns that it is
    deprecated in favour of that).
    """
    from torch.fx.experimental import symbolic_shapes

    older = "size_hint"  # read by name: the stubs of later torches may lack it
    hint = getattr(symbolic_shapes, "optimization_hint", None) or getattr(symbolic_shapes, older)
    return int(hint(value, fallback=fallback))
