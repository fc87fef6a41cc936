"""Trace-through mode: IR ops without their ``torch.ops`` wrapper.

By default a call the eager fast path does not serve (Dynamo tracing, a
dispatch mode such as ``make_fx``, a ``__torch_function__`` argument) goes
through ``torch.ops.<NAMESPACE>.<op>``, so tracers record one opaque node
that the ``vllm_ir`` backend's passes match and lower. With the wrap off
(``enable_torch_wrap(False)``, ``VLLM_IR_TORCH_WRAP=0`` or ``--ir-torch-wrap
off``) such calls run the impl that ``select()`` returns directly instead:

* under Dynamo, the selection is made outside Dynamo's tracer (a
  ``torch._dynamo.nonstrict_trace`` function, run on the graph's FakeTensors)
  and AOTAutograd traces the selected impl, so ``backend="inductor"`` or
  ``"aot_eager"`` compiles the program with no vllm-ir pass and no
  ``torch.ops.<NAMESPACE>`` node;
* under ``make_fx`` or another dispatch mode, the tracer records the impl's ops.

What stays: calls that need gradients keep the op's autograd wrapper (an
impl kernel may have no backward; the wrapper's gradient is the native
function's), and torch.func transforms, forward AD and nested tensors still
run the native function. Plain eager calls take the same fast path in both
modes.

The setting is process-wide, like ``torch._dynamo.config``: Dynamo guards on
it, so a function compiled in one mode is traced again in the other. A graph
traced through has its impls baked in: a later priority change applies to it
after ``torch._dynamo.reset()`` (or a new ``torch.compile``).
"""

from __future__ import annotations

from typing import Any

from vllm_ir import envs
from vllm_ir._base.runtime import RUNTIME

__all__ = ["enable_torch_wrap", "torch_wrap_enabled"]

# Read by the eager call path, and by Dynamo while it traces it (so it guards
# on the value): a module attribute, not a context variable Dynamo cannot read.
enabled: bool = bool(envs.torch_wrap())
_hooks: list[Any] = RUNTIME.torch_wrap_hooks  # called with the new value (data: the runtime)


def torch_wrap_enabled() -> bool:
    """Whether IR op calls off the fast path go through their ``torch.ops`` op."""
    return enabled


def on_change(hook: Any) -> None:
    """Call ``hook(enabled)`` now and whenever the setting changes."""
    _hooks.append(hook)
    hook(enabled)


def _set(value: bool) -> None:
    global enabled
    enabled = value
    for hook in list(_hooks):
        hook(value)


class enable_torch_wrap:  # lower case: used like a function (as torch.set_grad_enabled)
    """Turn the ``torch.ops`` wrapper of IR ops on or off, process-wide.

    Like ``torch.set_grad_enabled``: a plain call sets it; used as a context
    manager it also restores the previous value on exit, exceptions included.

    >>> import vllm_ir as ir
    >>> with ir.enable_torch_wrap(False):
    ...     ir.torch_wrap_enabled()
    False
    >>> ir.torch_wrap_enabled()
    True
    """

    def __init__(self, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(
                f"enable_torch_wrap takes True (calls go through torch.ops) or False "
                f"(trace the selected impl directly), got {type(enabled).__name__} {enabled!r:.60}"
            )
        self.previous = torch_wrap_enabled()
        _set(enabled)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        _set(self.previous)

    def __repr__(self) -> str:
        return f"enable_torch_wrap({torch_wrap_enabled()})"


class _Absent:
    """``None`` as a ``nonstrict_trace`` argument (which refuses ``None`` itself)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Absent)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()
_registered = [False]


def nonstrict(fn: Any) -> Any:
    """``fn(*args)`` as a ``nonstrict_trace`` function taking ``None`` as :data:`ABSENT`.

    Imports Dynamo: called when trace-through is first turned on, never at import.
    """
    import torch._dynamo
    import torch.utils._pytree as pytree

    if not _registered[0]:
        pytree.register_constant(_Absent)
        _registered[0] = True

    def run(*args: Any) -> Any:
        return fn(*(None if a is ABSENT else a for a in args))

    run.__name__ = run.__qualname__ = f"trace_through_{getattr(fn, '__name__', 'op')}"
    return torch._dynamo.nonstrict_trace(run)


def absent_for_none(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(ABSENT if a is None else a for a in args)
