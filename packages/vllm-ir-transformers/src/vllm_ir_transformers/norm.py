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
not match and is skipped with the difference measured. The replacement forward
only runs the op for the dtype the probe verified; another input dtype (autocast,
a model cast after ``kernelize``) takes the layer's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
import vllm_ir as ir
from torch import Tensor

from vllm_ir_transformers._checks import NotApplicable, compare, probe_input, weight_problem

__all__ = ["EPS_ATTRS", "NormSpec", "analyze_norm", "is_norm_candidate"]

EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")

STATE_ATTR = "_vllm_ir_norm"


@dataclass(frozen=True)
class NormSpec:
    """How a verified norm maps onto ``rms_norm``: ``weight + offset`` scales it."""

    eps: float
    offset: float
    dtype: torch.dtype
    how: str


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
    dtype = weight.dtype
    x = probe_input((2, 3, weight.shape[0]), weight, seed=1)
    probe_w = probe_input((weight.shape[0],), weight, seed=2) * 0.25 + 0.5
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
            return NormSpec(eps, 0.0, dtype, f"x_normed * weight, {plain_how}")
        offset_ok, offset_how = compare(got, native(x, 1.0 + probe_w, eps), tol)
    if offset_ok:
        if dtype != torch.float32:
            raise NotApplicable(
                f"(1 + weight) scaling computed in float32 (Gemma style) with {dtype} "
                "activations: rms_norm rounds before scaling, so results would change"
            )
        return NormSpec(eps, 1.0, dtype, f"x_normed * (1 + weight), {offset_how}")
    raise NotApplicable(
        f"forward does not compute RMSNorm: against x_normed * weight, {plain_how}; "
        f"against x_normed * (1 + weight), {offset_how}"
    )


def _forward(self: Any, hidden_states: Tensor) -> Tensor:
    spec: NormSpec = getattr(self, STATE_ATTR)
    if hidden_states.dtype != spec.dtype:
        return type(self).forward(self, hidden_states)  # not what the probe verified
    return ir.ops.rms_norm(hidden_states, self.weight, spec.eps)


def _forward_offset(self: Any, hidden_states: Tensor) -> Tensor:
    spec: NormSpec = getattr(self, STATE_ATTR)
    if hidden_states.dtype != spec.dtype:
        return type(self).forward(self, hidden_states)
    # computed on every call so the layer follows changes of its weight
    return ir.ops.rms_norm(hidden_states, self.weight + spec.offset, spec.eps)


def apply_norm(module: Any, spec: NormSpec) -> None:
    setattr(module, STATE_ATTR, spec)
    fn = _forward if spec.offset == 0.0 else _forward_offset
    module.forward = MethodType(fn, module)  # type: ignore[method-assign]


def revert_norm(module: Any) -> None:
    module.__dict__.pop("forward", None)
    module.__dict__.pop(STATE_ATTR, None)


def norm_weight(module: Any, spec: NormSpec) -> Tensor:
    """The weight ``rms_norm`` receives for this layer, as of now."""
    weight = module.weight
    assert isinstance(weight, Tensor)
    return weight if spec.offset == 0.0 else weight + spec.offset
