"""The kernel launches as torch ops: ``torch.ops.vllm_ir_triton.*``.

Defined with :func:`torch.library.custom_op`, so Dynamo, ``make_fx`` and the
vllm-ir lowering see one opaque node per launch, with a fake impl for
FakeTensors (tracing never launches a kernel):

* ``rms_norm(Tensor x, Tensor? weight, float epsilon, bool batch_invariant) -> Tensor``:
  a new contiguous tensor; functional, so the lowering inlines it before
  Inductor's own passes.
* ``fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight,
  float epsilon, bool batch_invariant) -> ()``: in place, the rounded sum into
  ``x_residual``, its normalization into ``x``. The schema says which
  arguments it writes, which is what clone elimination reads.

Why opaque ops rather than ``torch.library.triton_op`` / ``wrap_triton``: see
the package README ("torch.compile").
"""

from __future__ import annotations

import torch
from torch import Tensor

from vllm_ir_triton import launch

__all__ = ["NAMESPACE", "fused_add_rms_norm_", "rms_norm"]

NAMESPACE = "vllm_ir_triton"


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool) -> Tensor:
    """RMSNorm of ``x`` (any leading shape) into a new contiguous tensor."""
    return launch.rms_norm(x, weight, epsilon, batch_invariant=batch_invariant)


@rms_norm.register_fake
def _rms_norm_fake(
    x: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{NAMESPACE}::fused_add_rms_norm_", mutates_args=("x", "x_residual"))
def fused_add_rms_norm_(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> None:
    """In place: ``x_residual += x`` (rounded), then ``x = rms_norm(x_residual)``."""
    launch.fused_add_rms_norm_(x, x_residual, weight, epsilon, batch_invariant=batch_invariant)


@fused_add_rms_norm_.register_fake
def _fused_add_rms_norm_fake(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, batch_invariant: bool
) -> None:
    return None
