"""A tiny decoder model and :func:`compile_agrees`, shared by the packages' tests.

:class:`TinyDecoder` is the smallest model with the pattern the compile
pipeline cares about: an ``rms_norm``, then per layer a linear layer and an
in-place ``fused_add_rms_norm`` whose activations are donated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vllm_ir import ops
from vllm_ir.config import IrOpPriorityConfig
from vllm_ir.testing.isolation import inductor_caches_off

if TYPE_CHECKING:
    from vllm_ir.compilation._backend import VllmIRBackend

__all__ = ["TinyDecoder", "compile_agrees"]


def _native_fused(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> Any:
    return ops.fused_add_rms_norm.native(x, r, w, eps)


class TinyDecoder(torch.nn.Module):
    """``rms_norm``, then per layer a linear and ``fused_add_rms_norm.maybe_inplace``.

    Parameters come from ``torch.manual_seed(seed)``, so two instances are
    equal. ``use_ir=False`` calls the native functions directly (no IR ops);
    ``dtype`` is the parameters' (default: torch's default dtype).

    >>> import torch
    >>> TinyDecoder(hidden=8, layers=2)(torch.randn(3, 8)).shape
    torch.Size([3, 8])
    """

    def __init__(
        self,
        hidden: int = 32,
        layers: int = 3,
        *,
        use_ir: bool = True,
        seed: int = 0,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = hidden
        self.use_ir = use_ir
        self.linears = torch.nn.ModuleList(
            torch.nn.Linear(hidden, hidden, dtype=dtype) for _ in range(layers)
        )
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = ops.rms_norm if self.use_ir else ops.rms_norm.native
        fused = ops.fused_add_rms_norm.maybe_inplace if self.use_ir else _native_fused
        residual = x
        h = norm(x, self.weight, 1e-6)
        for linear in self.linears:
            h, residual = fused(linear(h), residual, self.weight, 1e-6)
        return h


def compile_agrees(
    model: torch.nn.Module,
    priority: Mapping[str, Sequence[str]],
    *inputs: torch.Tensor,
    dynamic: bool | None = False,
    **assert_close: Any,
) -> VllmIRBackend:
    """Compile ``model`` with ``VllmIRBackend(priority=priority)``; assert it agrees with eager.

    Eager runs under the same priorities. Inputs are cloned for each run (the
    model may donate them); Inductor's caches are off, so the passes run and
    their records (``backend.pass_contexts``) are this compile's. Returns the
    backend for further checks; ``assert_close`` goes to
    ``torch.testing.assert_close``.
    """
    from vllm_ir.compilation._backend import VllmIRBackend

    backend = VllmIRBackend(priority=priority)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        with IrOpPriorityConfig.from_dict(priority).scope():
            want = model(*(t.clone() for t in inputs))
        with inductor_caches_off():
            got = compiled(*(t.clone() for t in inputs))
    torch.testing.assert_close(got, want, **assert_close)
    return backend
