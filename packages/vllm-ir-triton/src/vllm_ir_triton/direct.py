"""Launching a compiled Triton kernel without Triton's per-call binding.

``kernel[grid](*args)`` (``JITFunction.run``) does, on every call: read a
handful of ``triton.knobs`` (environment-backed), build an options dict,
bind and specialize every argument, build a string cache key from the
specialization and the options, look it up, check the kernel's globals, and
only then launch the ``CompiledKernel``. At decode sizes that host work is
the whole cost of a call.

:class:`Launcher` does it once per *key*: a tuple of every fact Triton
specializes a compiled kernel on, and more — the current device, ``num_warps``,
each tensor argument's dtype and whether its address is 16-byte aligned,
the exact value of every integer and boolean argument (strides, lengths,
constexprs), and only the type of float arguments (Triton never specializes on
a float's value). Two calls with the same key therefore compile to the same
kernel, and the second one launches the cached ``CompiledKernel`` directly,
exactly as ``JITFunction.run`` ends (``launch_metadata`` then ``run`` with
the launch hooks), with the arguments in signature order (constexprs
included, as Triton 3.3 and later pass them). The number of rows is only the
grid, never part of the key.

Opt-in (``VLLM_IR_TRITON_DIRECT_LAUNCH=1``) until the GPU run
(``benchmarks/gpu/run.sh``, which turns it on) has checked it against
``kernel[grid]`` on every supported Triton version: it relies on how
``JITFunction.run`` launches, which Triton does not promise to keep. When off,
for the first call of a key, once :data:`MAX_ENTRIES` keys are cached, and
under Triton's interpreter, calls go through ``kernel[grid]`` as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor
from vllm_ir.provider import envs

__all__ = ["ENABLED", "MAX_ENTRIES", "Launcher", "specialization_key"]

ENABLED: bool = envs.triton_direct_launch()
"""Whether kernels compiled once are relaunched directly (``VLLM_IR_TRITON_DIRECT_LAUNCH``,
read at import; off by default)."""

MAX_ENTRIES = 64
"""Compiled kernels cached per JIT kernel; further keys take Triton's own path."""

_ALIGNMENT = 16
"""Triton specializes pointer arguments on this alignment (``tt.divisibility``)."""

_COMPILED_ATTRS = ("run", "function", "packed_metadata", "launch_metadata")


def specialization_key(device: int, num_warps: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The cache key of a launch: a superset of what Triton specializes a kernel on."""
    return (
        device,
        num_warps,
        *[
            (a.dtype, a.data_ptr() % _ALIGNMENT == 0)
            if isinstance(a, Tensor)
            else (float if type(a) is float else a)
            for a in args
        ],
    )


def _hooks() -> Callable[[], tuple[Any, Any]] | None:
    """A function returning Triton's (launch_enter_hook, launch_exit_hook), or None
    where this Triton has no ``knobs`` (before 3.4: launch through ``kernel[grid]``)."""
    try:
        from triton import knobs
    except ImportError:
        return None
    runtime = knobs.runtime

    def hooks() -> tuple[Any, Any]:
        return runtime.launch_enter_hook, runtime.launch_exit_hook

    return hooks


_Driver = tuple[Callable[[], int], Callable[[int], Any], Callable[[], tuple[Any, Any]]]


class Launcher:
    """Launches one JIT kernel, reusing the ``CompiledKernel`` of an earlier call of the same key.

    ``interpreted`` (Triton's interpreter) or ``enabled=False`` always take ``kernel[grid]``.
    ``options``: compile options passed to every ``kernel[grid]`` call, e.g.
    ``{"enable_fp_fusion": False}`` (the same for every call of this launcher, so
    not part of the key; Triton's interpreter ignores them).
    """

    __vllm_ir_caches__ = ("compiled", "_driver", "direct")
    """Filled (or switched off) by the first launches: not part of an impl's code fingerprint."""

    def __init__(
        self,
        kernel: Any,
        *,
        interpreted: bool,
        enabled: bool = ENABLED,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.kernel = kernel
        self.compiled: dict[tuple[Any, ...], Any] = {}
        self.direct = enabled and not interpreted
        self.options: dict[str, Any] = dict(options or {})
        self._driver: _Driver | None = None

    def _bind_driver(self) -> _Driver | None:
        """Triton's current-device, current-stream and launch-hook getters, once."""
        hooks = _hooks()
        if hooks is None:
            self.direct = False
            return None
        from triton.runtime import driver

        active = driver.active
        self._driver = (active.get_current_device, active.get_current_stream, hooks)
        return self._driver

    def __call__(self, rows: int, num_warps: int, *args: Any) -> None:
        """Launch ``rows`` programs with ``args`` (every kernel parameter, in order)."""
        bound = self._driver if self.direct else None
        if bound is None and self.direct:
            bound = self._bind_driver()
        if bound is None:
            self.kernel[(rows,)](*args, num_warps=num_warps, **self.options)
            return
        current_device, current_stream, hooks = bound
        device = current_device()
        key = specialization_key(device, num_warps, args)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[(rows,)](*args, num_warps=num_warps, **self.options)
            if (
                len(self.compiled) < MAX_ENTRIES
                and not getattr(self.kernel, "pre_run_hooks", None)
                and all(hasattr(compiled, a) for a in _COMPILED_ATTRS)
            ):
                self.compiled[key] = compiled
            return
        stream = current_stream(device)
        enter, leave = hooks()
        compiled.run(
            rows,
            1,
            1,
            stream,
            compiled.function,
            compiled.packed_metadata,
            compiled.launch_metadata((rows,), stream, *args),
            enter,
            leave,
            *args,
        )
