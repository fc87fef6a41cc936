"""A digest of the code a traced impl may run, for Inductor's FX graph cache key.

The lowering inlines whatever an impl's trace executes and reads: the impl
function, the helpers it calls, the objects, dicts and tensors it reaches. A
cached graph may be served only while all of that is unchanged, so the key
hashes, from the impl on:

* each function's bytecode and constants, and the values it reaches: the
  globals its code names, its closure cells and defaults;
* a module or class by the content of its source file, and the attributes
  the code names on it (``helper.K`` by value, ``helper.scale`` as code);
* an object by its class, its state (``__dict__``, ``__slots__``) and the
  attributes the code names on it (``SCALER.apply`` and what ``apply`` reads);
* containers item by item (sets in an order independent of the hash seed),
  tensors and arrays by their bytes;
* Triton kernels (objects wrapping a Python function in ``fn``) by that function.

A module's globals named in its ``__vllm_ir_caches__`` (a tuple of names), and
an object's attributes named in its class's, are left out: they cache a build
or a loaded library (``_library = None`` until the first call builds it), or
compiled launches, not a choice of what to compute, and hashing them
would give one impl two fingerprints — before and after its first call — so
an autotune record or a cached graph of the first process would never be
found by the next one.

torch, Triton, the standard library and built-ins are left out: their versions
are in Inductor's own key, and the standard library does not change under a process.
Their objects, vllm-ir's and Triton's are hashed by type and named
attributes, not state (a logger, a lock, an ``IrOp`` hold handles and
caches), except tensors and ``nn.Module`` objects. What cannot be hashed
soundly (state Python cannot see, a FakeTensor, too much of it) gives
``None``: the graph is then compiled without the cache, never served stale.

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

import collections
import enum
import functools
import hashlib
import inspect
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

import torch

from vllm_ir._base.logger import get_logger

__all__ = ["code_fingerprint"]

logger = get_logger(__name__)

_SKIPPED_ROOTS = frozenset(
    {"torch", "triton", "builtins", "numpy", "sympy", "typing", "__future__"}
)
# triton: its version is in the stamps and in Inductor's key; by name, its functions
# stay one value when its interpreter patches them in at the first kernel call
# Instances of these packages' types (a logger, a lock, an IrOp) are hashed by
# type and by the attributes the code names, not by their whole state: they
# hold caches and handles, not values a trace depends on. Tensors, arrays and
# nn.Modules are the exceptions: their values are read (and become constants).
_OPAQUE_ROOTS = _SKIPPED_ROOTS | {"vllm_ir"}
_LEAVES = (int, float, complex, bool, str, bytes, range, slice, enum.Enum, type(None))
_TORCH_LEAVES = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)
_MAX_VALUES = 100_000
_MAX_TENSOR_BYTES = 64 << 20


class _Unfingerprintable(Exception):
    """The code reaches state that cannot be hashed soundly."""


def code_fingerprint(*objects: object) -> str | None:
    """A hash of the code ``objects`` run and the values it reaches (see the
    module doc); ``None`` when some of it cannot be hashed soundly, and the
    caller must not cache what depends on it."""
    hasher = _Hasher()
    try:
        for obj in objects:
            hasher.value(obj, frozenset())
    except (_Unfingerprintable, RecursionError) as e:
        logger.debug("cannot fingerprint %r: %s", objects, e)
        return None
    return hasher.digest()


class _Hasher:
    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._seen: set[int] = set()
        self._alive: list[object] = []  # keeps what ``_seen`` names alive: ids stay unique
        self._values = 0
        self._tensor_bytes = 0

    def digest(self) -> str:
        return self._h.hexdigest()

    def _put(self, *parts: object) -> None:
        self._h.update(repr(parts).encode())

    def value(self, v: object, names: frozenset[str]) -> None:
        """Hash ``v``; ``names``: the names the code that reached it uses, whose
        attributes of modules, classes and objects are followed too."""
        if isinstance(v, _LEAVES + _TORCH_LEAVES) or v is Ellipsis:
            self._put(type(v).__qualname__, v)
            return
        if id(v) in self._seen:
            self._put("seen")
            return
        self._seen.add(id(v))
        self._alive.append(v)
        self._values += 1
        if self._values > _MAX_VALUES:
            raise _Unfingerprintable(f"reaches more than {_MAX_VALUES} objects")
        if isinstance(v, torch.Tensor):
            self._tensor(v)
        elif isinstance(v, (tuple, list, collections.deque)):
            self._put(type(v).__qualname__, len(v))
            for item in v:
                self.value(item, names)
        elif isinstance(v, Mapping):  # dicts, OrderedDicts, os.environ ...
            self._put(type(v).__qualname__, len(v))
            for key, item in list(v.items()):
                self.value(key, names)
                self.value(item, names)
        elif isinstance(v, (set, frozenset)):
            self._put(type(v).__qualname__, sorted(_alone(item, names) for item in v))
        elif isinstance(v, functools.partial):
            self.value(v.func, names)
            self.value((v.args, v.keywords), names)
        elif isinstance(v, types.MethodType):  # the function and the object it is bound to
            self.value(v.__func__, names)
            self.value(v.__self__, names)
        elif isinstance(v, (staticmethod, classmethod)):
            self.value(v.__func__, names)
        elif isinstance(v, property):
            self.value((v.fget, v.fset, v.fdel), names)
        elif isinstance(v, types.FunctionType):
            self._function(v, names)
        elif isinstance(v, types.ModuleType):
            self._put("module", v.__name__)
            if not _skipped(v.__name__):
                self._put(_file_digest(getattr(v, "__file__", None)))
                self._attributes(v, names)
        elif isinstance(v, type):
            self._put("class", v.__module__, v.__qualname__)
            if not _skipped(v.__module__):
                module = sys.modules.get(v.__module__)
                self._put(_file_digest(getattr(module, "__file__", None)))
                self._attributes(v, names)
        elif _kernel_function(v) is not None:
            self.value(_kernel_function(v), names)  # e.g. a triton.jit kernel: its Python function
        else:
            self._instance(v, names)

    def _function(self, f: types.FunctionType, reached_by: frozenset[str]) -> None:
        self._put("function", f.__module__, f.__qualname__)
        if _skipped(f.__module__):
            return
        # what it returns may be read by its caller's names (``get_config().scale``)
        names = reached_by | _code_names(f.__code__)
        self._code(f.__code__)
        caches = _caches(f.__globals__)
        for name in sorted(names):
            if name in f.__globals__ and name not in caches:
                self._put(name)
                self.value(f.__globals__[name], names)
        for cell in f.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value(contents, names)
        self.value((f.__defaults__, f.__kwdefaults__), names)

    def _code(self, code: types.CodeType) -> None:
        self._h.update(code.co_code)
        self._put(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._code(const)
            elif isinstance(const, frozenset):  # ``x in {"a", "b"}``: no stable order
                self._put(sorted(map(repr, const)))
            else:
                self._put(const)

    def _attributes(self, obj: object, names: frozenset[str]) -> None:
        """The attributes of ``obj`` the code names (``SCALER.apply``, ``helper.K``)."""
        if isinstance(obj, types.ModuleType):
            caches = _caches(vars(obj))
        else:
            caches = frozenset().union(*(_caches(vars(c)) for c in type(obj).__mro__))
        for name in sorted(names - caches):
            try:
                attribute = inspect.getattr_static(obj, name)
            except AttributeError:
                continue
            self._put("attribute", name)
            self.value(attribute, names)

    def _instance(self, obj: object, names: frozenset[str]) -> None:
        cls = type(obj)
        if _opaque(cls.__module__) and not isinstance(obj, torch.nn.Module):
            self._put("object", cls.__module__, cls.__qualname__)
            if _root(cls.__module__) == "numpy" and hasattr(obj, "tobytes"):
                self._array(obj)
            self._attributes(obj, names)
            return
        self.value(cls, names)  # its code: the class's file, and the attributes named
        state = _state(obj)
        caches = frozenset().union(*(_caches(vars(c)) for c in cls.__mro__))
        if state is not None:
            state = {k: v for k, v in state.items() if k not in caches}
        if state is None:
            raise _Unfingerprintable(
                f"a {cls.__module__}.{cls.__qualname__} object, whose state is not visible "
                "from Python (no __dict__ or __slots__)"
            )
        self.value(state, names)
        self._attributes(obj, names)
        call = inspect.getattr_static(cls, "__call__", None)
        if isinstance(call, types.FunctionType):
            self.value(call, names)

    def _tensor(self, t: torch.Tensor) -> None:
        from torch._subclasses.fake_tensor import is_fake

        self._put("tensor", t.dtype, t.shape, t.stride(), t.device.type, t.layout)
        if t.device.type == "meta":
            return  # no values
        if is_fake(t):
            raise _Unfingerprintable("a FakeTensor, whose values are unknown")
        self._budget(t.numel() * t.element_size())
        try:
            data = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            self._h.update(data.numpy().tobytes())
        except Exception as e:  # quantized, sparse or subclass tensors
            raise _Unfingerprintable(f"a tensor whose bytes cannot be read ({e})") from e

    def _array(self, array: Any) -> None:
        self._budget(int(getattr(array, "nbytes", 0)))
        self._put(str(getattr(array, "dtype", "")), getattr(array, "shape", ()))
        self._h.update(array.tobytes())

    def _budget(self, nbytes: int) -> None:
        self._tensor_bytes += nbytes
        if self._tensor_bytes > _MAX_TENSOR_BYTES:
            raise _Unfingerprintable(f"reaches more than {_MAX_TENSOR_BYTES >> 20} MiB of tensors")


def _caches(namespace: Mapping[str, Any]) -> frozenset[str]:
    """The globals a module declares as caches (``__vllm_ir_caches__``): not hashed."""
    declared = namespace.get("__vllm_ir_caches__", ())
    return frozenset(declared) if isinstance(declared, (tuple, list, frozenset)) else frozenset()


def _alone(item: object, names: frozenset[str]) -> str:
    """A set element's own digest: sets iterate in an order that varies between processes."""
    hasher = _Hasher()
    hasher.value(item, names)
    return hasher.digest()


def _code_names(code: types.CodeType) -> set[str]:
    """The global and attribute names ``code`` and the code nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _state(obj: object) -> dict[str, Any] | None:
    """An object's attributes: its ``__dict__`` and ``__slots__`` (None: neither)."""
    state: dict[str, Any] | None = None
    if hasattr(obj, "__dict__"):
        state = dict(vars(obj))
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            state = {} if state is None else state
            try:
                state[f"slot:{slot}"] = object.__getattribute__(obj, slot)
            except AttributeError:
                continue
    return state


def _kernel_function(obj: object) -> types.FunctionType | None:
    """The Python function a Triton kernel wraps in ``fn`` (``triton.jit``, its autotuner)."""
    if _root(type(obj).__module__) != "triton":
        return None
    for _ in range(4):
        fn = getattr(obj, "fn", None) if not isinstance(obj, types.ModuleType) else None
        if isinstance(fn, types.FunctionType):
            return fn
        if fn is None:
            return None
        obj = fn
    return None


def _root(module: str | None) -> str:
    return (module or "").partition(".")[0]


def _opaque(module: str | None) -> bool:
    root = _root(module)
    return root in _OPAQUE_ROOTS or root in sys.stdlib_module_names


def _skipped(module: str | None) -> bool:
    root = _root(module)
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
