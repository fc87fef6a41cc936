"""Gradients of an IR op: those of its native semantics, whichever impl ran forward.

Registered with ``torch.library.register_autograd`` for the default overload;
the backward re-runs the native function on the saved inputs and
differentiates it, so a provider never has to write a backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["NativeGradient"]


def _is_tensor_list(value: Any) -> bool:
    # torch's autograd for ops with Tensor[] inputs takes a list of tensors
    # apart: its needs_input_grad and our gradient are lists there
    return isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value)


class NativeGradient:
    """``setup_context`` and ``backward`` for an op whose semantics are ``native``.

    Tensor arguments and the tensors of ``list[Tensor]`` arguments get gradients.
    """

    def __init__(self, native: Callable[..., Any]) -> None:
        self.native = native

    def setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        # per tensor-holding input: its index and how many tensors (None: one tensor)
        layout: list[tuple[int, int | None]] = []
        saved: list[torch.Tensor] = []
        for i, a in enumerate(inputs):
            if isinstance(a, torch.Tensor):
                layout.append((i, None))
                saved.append(a)
            elif _is_tensor_list(a):
                layout.append((i, len(a)))
                saved.extend(a)
        ctx.layout = layout
        held = {i for i, _ in layout}
        ctx.others = tuple(None if i in held else a for i, a in enumerate(inputs))
        ctx.save_for_backward(*saved)

    def backward(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
        inputs = list(ctx.others)
        wanted: list[torch.Tensor] = []
        with torch.enable_grad():
            saved = iter(ctx.saved_tensors)
            for i, count in ctx.layout:
                needs = ctx.needs_input_grad[i]
                if count is None:
                    inputs[i] = next(saved).detach().requires_grad_(needs)
                    wanted += [inputs[i]] if needs else []
                else:
                    inputs[i] = [next(saved).detach().requires_grad_(n) for n in needs[:count]]
                    wanted += [t for t in inputs[i] if t.requires_grad]
            out = self.native(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            pairs = [
                (o, g)
                for o, g in zip(outs, grads, strict=True)
                if g is not None and o.requires_grad
            ]
            found = iter(
                torch.autograd.grad(
                    [o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True
                )
                if wanted and pairs
                else [None] * len(wanted)
            )
        result: list[Any] = [None] * len(inputs)
        for i, count in ctx.layout:
            if count is None:
                result[i] = next(found) if inputs[i].requires_grad else None
            else:
                result[i] = [next(found) if t.requires_grad else None for t in inputs[i]]
        return tuple(result)
