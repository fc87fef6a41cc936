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


class NativeGradient:
    """``setup_context`` and ``backward`` for an op whose semantics are ``native``."""

    def __init__(self, native: Callable[..., Any]) -> None:
        self.native = native

    def setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        tensor_idx = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        ctx.tensor_idx = tensor_idx
        ctx.others = tuple(None if i in tensor_idx else a for i, a in enumerate(inputs))
        ctx.save_for_backward(*(inputs[i] for i in tensor_idx))

    def backward(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
        inputs = list(ctx.others)
        wanted = []
        with torch.enable_grad():
            for i, saved in zip(ctx.tensor_idx, ctx.saved_tensors, strict=True):
                inputs[i] = saved.detach().requires_grad_(ctx.needs_input_grad[i])
                if ctx.needs_input_grad[i]:
                    wanted.append(i)
            out = self.native(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            pairs = [
                (o, g)
                for o, g in zip(outs, grads, strict=True)
                if g is not None and o.requires_grad
            ]
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                [inputs[i] for i in wanted],
                [g for _, g in pairs],
                allow_unused=True,
            )
        result: list[Any] = [None] * len(inputs)
        for i, g in zip(wanted, found, strict=True):
            result[i] = g
        return tuple(result)
