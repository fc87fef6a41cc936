"""RMSNorm layers onto ``ir.ops.rms_norm``, recognized by what they compute.

A candidate is any module with a 1-D ``weight`` and an epsilon attribute
(``variance_epsilon``, ``eps`` or ``epsilon``) and no submodules. Its forward is
run on a probe input with a random probe weight (through
``torch.func.functional_call``, so the module is not touched) and compared with
``rms_norm``'s native function for two scalings:

* ``x_normed * weight`` (Llama, Mistral, Qwen2/3, Phi-3, OLMo-2, ...);
* ``x_normed * (1 + weight)`` in float32 (Gemma, Gemma 2/3). ``rms_norm`` rounds
  ``x_normed`` to the input dtype before scaling, Gemma rounds once after, so the
  two agree only for float32; in other dtypes the layer is left alone.

Anything else (LayerNorm, a norm with a bias, a different epsilon placement) does
not match and is skipped with the difference measured.

The probe runs in every dtype of :data:`FLOAT_DTYPES`; a norm is replaced when
it passes for its weight's dtype at ``kernelize`` time, and the replacement
forward runs ``rms_norm`` only when the input and the weight share a dtype that
passed. Anything else (autocast, a model cast to a dtype that failed, float64)
runs the layer's own forward, and the report says which applies now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import vllm_ir as ir
from torch import Tensor

from vllm_ir_transformers import _forward as fwd
from vllm_ir_transformers._checks import (
    FLOAT_DTYPES,
    NotApplicable,
    Probed,
    compare,
    probe_input,
    weight_problem,
    weighted_problem,
)

__all__ = ["EPS_ATTRS", "NormSpec", "analyze_norm", "is_norm_candidate"]

EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")

STATE_ATTR = "_vllm_ir_norm"


@dataclass(frozen=True)
class NormSpec(Probed):
    """How a verified norm maps onto ``rms_norm``: ``weight + offset`` scales it."""

    eps: float
    offset: float


def _eps_of(module: Any) -> float | None:
    for attr in EPS_ATTRS:
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def is_norm_candidate(module: Any) -> bool:
    """A leaf module with a 1-D ``weight`` and an epsilon attribute."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 1:
        return False
    if next(module.children(), None) is not None:
        return False
    return any(hasattr(module, attr) for attr in EPS_ATTRS)


def analyze_norm(module: Any) -> NormSpec:
    """The mapping of ``module`` onto ``rms_norm``; raises :class:`NotApplicable`."""
    weight = module.weight
    assert isinstance(weight, Tensor)
    problem = weight_problem("weight", weight)
    if problem:
        raise NotApplicable(problem)
    eps = _eps_of(module)
    if eps is None:
        values = {a: getattr(module, a) for a in EPS_ATTRS if hasattr(module, a)}
        raise NotApplicable(f"epsilon is not a number: {values}")
    if getattr(module, "bias", None) is not None:
        raise NotApplicable("has a bias; rms_norm has none")
    # the mapping (offset) is decided in the weight's own dtype and then
    # confirmed, or rejected, in every other one
    offset, how = _probe(module, eps, weight, weight.dtype)
    verified, rejected = [weight.dtype], []
    for dtype in FLOAT_DTYPES:
        if dtype == weight.dtype:
            continue
        try:
            other, _ = _probe(module, eps, weight, dtype)
        except NotApplicable as e:
            rejected.append((dtype, str(e)))
            continue
        if other != offset:
            rejected.append((dtype, "computes another scaling"))
        else:
            verified.append(dtype)
    return NormSpec(eps, offset, dtypes=tuple(verified), rejected=tuple(rejected), how=how)


def _probe(module: Any, eps: float, weight: Tensor, dtype: torch.dtype) -> tuple[float, str]:
    """``(offset, how)`` of the mapping that holds in ``dtype``; raises :class:`NotApplicable`."""
    like = weight.detach().to(dtype)
    x = probe_input((2, 3, weight.shape[0]), like, seed=1)
    probe_w = probe_input((weight.shape[0],), like, seed=2) * 0.25 + 0.5
    native = ir.ops.rms_norm.native
    tol = ir.ops.rms_norm.tolerance(dtype)
    with torch.no_grad():
        try:
            got = torch.func.functional_call(module, {"weight": probe_w}, (x,))
        except Exception as e:
            raise NotApplicable(f"probe forward raised {type(e).__name__}: {e}") from None
        if not isinstance(got, Tensor):
            raise NotApplicable(f"forward returns {type(got).__name__}, not a tensor")
        plain_ok, plain_how = compare(got, native(x, probe_w, eps), tol)
        if plain_ok:
            return 0.0, f"x_normed * weight, {plain_how}"
        offset_ok, offset_how = compare(got, native(x, 1.0 + probe_w, eps), tol)
    if offset_ok:
        if dtype != torch.float32:
            raise NotApplicable(
                f"(1 + weight) scaling computed in float32 (Gemma style) with {dtype} "
                "activations: rms_norm rounds before scaling, so results would change"
            )
        return 1.0, f"x_normed * (1 + weight), {offset_how}"
    raise NotApplicable(
        f"forward does not compute RMSNorm: against x_normed * weight, {plain_how}; "
        f"against x_normed * (1 + weight), {offset_how}"
    )


def inactive_reason(module: Any, spec: NormSpec, dtype: torch.dtype) -> str | None:
    """Why the replaced forward runs the layer's own code for ``dtype`` inputs (None: it runs
    ``rms_norm``)."""
    return weighted_problem("weight", module.weight, dtype, spec.dtypes, spec.rejected)


def probe_call(module: Any, spec: NormSpec) -> tuple[Any, ...]:
    """Arguments of a one-token call in the layer's current dtype and device (for the report)."""
    weight = norm_weight(module, spec)
    x = weight.new_zeros((1, weight.shape[0]))
    return (x, weight, spec.eps)


def _forward(self: Any, hidden_states: Tensor) -> Tensor:
    spec: NormSpec = self.__dict__[STATE_ATTR]
    weight = self.weight
    dtype = hidden_states.dtype
    if dtype != weight.dtype or dtype not in spec.dtypes:
        if fwd.debug_enabled():
            reason = inactive_reason(self, spec, dtype) or ""
            fwd.log_use(self, spec.name, "rms_norm", dtype, f"own forward ({reason})")
        return type(self).forward(self, hidden_states)
    if spec.offset != 0.0:
        # computed on every call so the layer follows changes of its weight
        weight = weight + spec.offset
    if fwd.debug_enabled():
        impl = ir.ops.rms_norm.selected_impl(hidden_states, weight, spec.eps).provider
        fwd.log_use(self, spec.name, "rms_norm", dtype, f"impl {impl}")
    return ir.ops.rms_norm(hidden_states, weight, spec.eps)


def apply_norm(module: Any, spec: NormSpec) -> None:
    fwd.attach(module, STATE_ATTR, spec, _forward)


def revert_norm(module: Any) -> None:
    fwd.detach(module, STATE_ATTR)


def norm_weight(module: Any, spec: NormSpec) -> Tensor:
    """The weight ``rms_norm`` receives for this layer, as of now."""
    weight = module.weight
    assert isinstance(weight, Tensor)
    return weight if spec.offset == 0.0 else weight + spec.offset
