"""A digest of the code a traced impl may run, for Inductor's FX graph cache key.

The lowering inlines whatever an impl's trace executes: the impl function,
the helpers it calls, the modules it reaches through attributes. A cached
graph may be served only while all of that is unchanged, so the key hashes:

* each function's bytecode, constants and closure values, and, transitively,
  every function, class or module its code names through its globals;
* a module or class by the content of its source file (a helper module that
  changed between two processes changes the key);
* Triton kernels (objects wrapping a Python function in ``fn``) by that function.

torch, the standard library and built-ins are left out: torch's version is in
Inductor's own key, and the standard library does not change under a process.

    >>> def helper(x):
    ...     return x * 2
    >>> def impl(x):
    ...     return helper(x) + 1
    >>> before = code_fingerprint(impl)
    >>> def helper(x):
    ...     return x * 3
    >>> code_fingerprint(impl) != before
    True
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import types
from typing import Any

__all__ = ["code_fingerprint"]

_SKIPPED_ROOTS = frozenset({"torch", "builtins", "numpy", "sympy", "typing", "__future__"})


def code_fingerprint(*objects: object) -> str:
    """A hash of the code ``objects`` run (see the module doc)."""
    h = hashlib.sha256()
    seen: set[int] = set()
    for obj in objects:
        _update(h, obj, seen)
    return h.hexdigest()


def _update(h: Any, obj: object, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, functools.partial):
        _update(h, obj.func, seen)
        _update_value(h, (*obj.args, *sorted(obj.keywords.items())), seen)
    elif isinstance(obj, types.MethodType):
        _update(h, obj.__func__, seen)
    elif isinstance(obj, types.FunctionType):
        if _skipped(obj.__module__):
            h.update(f"{obj.__module__}.{obj.__qualname__}".encode())
            return
        _update_code(h, obj.__code__, obj.__globals__, seen)
        for cell in obj.__closure__ or ():
            try:
                _update_value(h, cell.cell_contents, seen)
            except ValueError:  # an empty cell
                continue
        _update_value(h, obj.__defaults__, seen)
    elif isinstance(obj, types.ModuleType):
        if not _skipped(obj.__name__):
            h.update(_file_digest(getattr(obj, "__file__", None)).encode())
    elif isinstance(obj, type):
        if not _skipped(obj.__module__):
            module = sys.modules.get(obj.__module__)
            h.update(_file_digest(getattr(module, "__file__", None)).encode())
    elif isinstance(getattr(obj, "fn", None), types.FunctionType):
        _update(h, obj.fn, seen)  # type: ignore[attr-defined]  # e.g. a triton.jit kernel
    elif callable(obj):
        h.update(type(obj).__qualname__.encode())
        call = vars(type(obj)).get("__call__")
        if isinstance(call, types.FunctionType):
            _update(h, call, seen)


def _update_code(h: Any, code: types.CodeType, globals_: dict[str, Any], seen: set[int]) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _update_code(h, const, globals_, seen)
        else:
            h.update(repr(const).encode())
    for name in code.co_names:
        if name in globals_:
            _update_value(h, globals_[name], seen)


def _update_value(h: Any, value: object, seen: set[int]) -> None:
    """Code is followed; plain values are hashed by repr (a closure's settings)."""
    if isinstance(value, (types.FunctionType, types.ModuleType, type, functools.partial)):
        _update(h, value, seen)
    elif isinstance(value, (int, float, bool, str, bytes, type(None))):
        h.update(repr(value).encode())
    elif isinstance(value, tuple):
        for item in value:
            _update_value(h, item, seen)
    elif callable(value):
        _update(h, value, seen)


def _skipped(module: str | None) -> bool:
    root = (module or "").partition(".")[0]
    return root in _SKIPPED_ROOTS or root in sys.stdlib_module_names


@functools.lru_cache(maxsize=1024)
def _file_digest_at(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _file_digest(path: str | None) -> str:
    if not path:
        return "no-file"
    try:
        stat = os.stat(path)
        return _file_digest_at(path, stat.st_mtime_ns, stat.st_size)
    except OSError:
        return f"unreadable:{path}"
