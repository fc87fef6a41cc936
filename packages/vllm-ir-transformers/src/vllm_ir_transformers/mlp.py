"""Gated SiLU and GELU MLPs onto ``ir.ops.silu_and_mul`` / ``ir.ops.gelu_and_mul``;
MoE experts are reported, not changed.

Two shapes are recognized, by attribute names and then by a probe:

* split: ``down_proj(act(gate_proj(x)) * up_proj(x))`` (Llama, Mistral, Qwen2/3,
  OLMo-2). The replacement runs ``gate_proj`` and ``up_proj`` as they are,
  concatenates their *outputs* (``[..., 2I]``, a copy of ``2I`` values per
  token) and calls ``silu_and_mul`` on that, then ``down_proj``.
* fused: ``down_proj(up * act(gate))`` with ``gate, up = gate_up_proj(x).chunk(2)``
  (Phi-3): only the activation changes.

No fused weight is kept: the projections are the model's own modules and
parameters on every call, so ``.to()``, ``load_state_dict`` (also with
``assign=True``), optimizer steps, ``inference_mode``, copies, pickling and
``torch.compile`` see ordinary parameters. (A concatenated ``[2I, H]`` weight
saved one GEMM launch per layer but had to be kept in sync with the
parameters; measured on CPU it was no faster: docs/transformers.md.)

The activation must be SiLU, or GELU exact or tanh-approximated (Gemma's
``gelu_pytorch_tanh``; ``gelu_and_mul`` with ``approximate="none"|"tanh"``),
checked on values against ``torch.nn.functional``, not by class; the
projections plain ``nn.Linear`` with plain floating-point weights on one
device and dtype, and gate and up must both have a bias or neither. The probe
compares the replacement with the layer's own forward in the weights' dtype;
the op against the layer's activation is checked in every dtype of
:data:`FLOAT_DTYPES`, and an activation in another dtype runs the layer's own
forward.

MoE experts stored as 3-D parameters (``gate_up_proj`` ``[E, 2I, H]``, Mixtral
and Qwen3-MoE in transformers 5) route tokens per expert inside one forward;
no IR op covers that, so they are reported as left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import vllm_ir as ir
from torch import Tensor, nn

from vllm_ir_transformers import _forward as fwd
from vllm_ir_transformers._checks import (
    FLOAT_DTYPES,
    NotApplicable,
    Probed,
    active_problem,
    compare,
    dtype_name,
    probe_input,
    weight_problem,
)

__all__ = ["GATED_OPS", "MlpSpec", "analyze_mlp", "is_mlp_candidate", "moe_experts_reason"]

ACT_ATTRS = ("act_fn", "activation_fn", "act")
STATE_ATTR = "_vllm_ir_mlp"


GATED_OPS = ("silu_and_mul", "gelu_and_mul")
"""The ops a gated MLP maps to, by its activation."""


@dataclass(frozen=True)
class MlpSpec(Probed):
    split: bool
    act_attr: str
    op: str = "silu_and_mul"
    """``silu_and_mul`` or ``gelu_and_mul``."""
    approximate: str = "none"
    """``gelu_and_mul``'s ``approximate`` (unused for SiLU)."""

    def args(self, gate_up: Tensor) -> tuple[Any, ...]:
        """The op's arguments for ``gate_up``."""
        return (gate_up,) if self.op == "silu_and_mul" else (gate_up, self.approximate)


_ACTIVATIONS: tuple[tuple[str, str, Any], ...] = (
    ("silu_and_mul", "none", F.silu),
    ("gelu_and_mul", "none", F.gelu),
    ("gelu_and_mul", "tanh", lambda a: F.gelu(a, approximate="tanh")),
)
"""(op, approximate, reference activation), tried in order."""


def _which_activation(act: Any, act_attr: str, like: Tensor) -> tuple[str, str]:
    """The (op, approximate) whose activation ``act`` computes, bit for bit, on a probe."""
    a = probe_input((4, 64), like.detach(), seed=3)
    try:
        out = act(a)
    except Exception as e:
        raise NotApplicable(f"{act_attr} raised {type(e).__name__} on a probe: {e}") from e
    for op, approximate, ref in _ACTIVATIONS:
        if isinstance(out, Tensor) and torch.equal(out, ref(a)):
            return op, approximate
    raise NotApplicable(
        f"{act_attr} ({type(act).__name__}) is neither SiLU nor GELU (exact or tanh); "
        "no IR op computes it"
    )


def _act_attr(module: Any) -> str | None:
    return next((a for a in ACT_ATTRS if callable(getattr(module, a, None))), None)


def is_mlp_candidate(module: Any) -> bool:
    if not isinstance(getattr(module, "down_proj", None), nn.Module):
        return False
    split = all(isinstance(getattr(module, a, None), nn.Module) for a in ("gate_proj", "up_proj"))
    fused = isinstance(getattr(module, "gate_up_proj", None), nn.Module)
    return split or fused


def moe_experts_reason(module: Any) -> str | None:
    """Why a module holding MoE expert weights as 3-D tensors is left alone (None: it is not
    one)."""
    if _act_attr(module) is None:
        return None
    weights = [getattr(module, a, None) for a in ("gate_up_proj", "gate_proj", "up_proj")]
    stacked = [w for w in weights if isinstance(w, Tensor) and w.dim() == 3]
    if not stacked:
        return None
    experts = stacked[0].shape[0]
    return (
        f"MoE experts: {experts} experts' weights stacked in 3-D tensors "
        f"({'x'.join(map(str, stacked[0].shape))}), tokens routed to each expert inside one "
        "forward; no IR op covers routed expert MLPs, so the experts run their own forward "
        "(norms, attention and shared dense MLPs around them are still replaced)"
    )


def _check_linear(name: str, linear: object) -> nn.Linear:
    if not isinstance(linear, nn.Linear) or type(linear).forward is not nn.Linear.forward:
        raise NotApplicable(f"{name} is a {type(linear).__name__}, not a plain nn.Linear")
    for pname, p in (("weight", linear.weight), ("bias", linear.bias)):
        if p is None:
            continue
        problem = weight_problem(f"{name}.{pname}", p)
        if problem:
            raise NotApplicable(problem)
    return linear


def analyze_mlp(module: Any) -> MlpSpec:
    act_attr = _act_attr(module)
    if act_attr is None:
        raise NotApplicable(f"no activation attribute ({', '.join(ACT_ATTRS)})")
    down = _check_linear("down_proj", module.down_proj)
    split = hasattr(module, "gate_proj")
    if split:
        gate = _check_linear("gate_proj", module.gate_proj)
        up = _check_linear("up_proj", module.up_proj)
        linears: tuple[nn.Linear, ...] = (gate, up, down)
        if gate.weight.shape != up.weight.shape:
            raise NotApplicable(
                f"gate_proj {tuple(gate.weight.shape)} and up_proj {tuple(up.weight.shape)} differ"
            )
        if (gate.bias is None) != (up.bias is None):
            raise NotApplicable("only one of gate_proj and up_proj has a bias")
    else:
        linears = (_check_linear("gate_up_proj", module.gate_up_proj), down)
    ref = linears[0].weight
    for lin in linears:
        tensors = [lin.weight] + ([lin.bias] if lin.bias is not None else [])
        for t in tensors:
            if t.dtype != ref.dtype or t.device != ref.device:
                raise NotApplicable(
                    f"projections mix dtypes/devices ({t.dtype} on {t.device} vs "
                    f"{ref.dtype} on {ref.device})"
                )
    act = getattr(module, act_attr)
    op, approximate = _which_activation(act, act_attr, ref)
    spec = MlpSpec(
        split, act_attr, dtypes=(ref.dtype,), rejected=(), how="", op=op, approximate=approximate
    )
    with torch.no_grad():
        verified, rejected = [], []
        for dtype in FLOAT_DTYPES:
            problem = _activation_problem(act, act_attr, ref, dtype, spec)
            if problem is None:
                verified.append(dtype)
            elif dtype == ref.dtype:
                raise NotApplicable(problem)
            else:
                rejected.append((dtype, problem))
        x = probe_input((2, 3, linears[0].in_features), ref, seed=4)
        want = type(module).forward(module, x)
        got = _compute(module, spec, x)
        ok, how = compare(got, want, ir.get_op(op).tolerance(ref.dtype))
    if not ok:
        raise NotApplicable(f"fused forward differs from the layer's: {how}")
    kind = "gate_proj, up_proj outputs concatenated" if split else "gate_up_proj"
    called = op if op == "silu_and_mul" else f"{op}(approximate={approximate!r})"
    return MlpSpec(
        split,
        act_attr,
        dtypes=tuple(verified),
        rejected=tuple(rejected),
        how=f"{kind} + {called}, {how}",
        op=op,
        approximate=approximate,
    )


def _activation_problem(
    act: Any, act_attr: str, like: Tensor, dtype: torch.dtype, spec: MlpSpec
) -> str | None:
    """Why the op differs from ``act(gate) * up`` in ``dtype`` (None: it agrees)."""
    a = probe_input((4, 64), like.detach().to(dtype), seed=3)
    try:
        act_out = act(a)
    except Exception as e:
        return f"{act_attr} raised {type(e).__name__} on a {dtype_name(dtype)} probe: {e}"
    ref = next(r for o, ap, r in _ACTIVATIONS if (o, ap) == (spec.op, spec.approximate))
    if not isinstance(act_out, Tensor) or not torch.equal(act_out, ref(a)):
        return f"{act_attr} ({type(act).__name__}) does not compute {spec.op}'s activation"
    gate_up = probe_input((4, 128), a, seed=7)
    gate, up = gate_up.chunk(2, dim=-1)
    op = ir.get_op(spec.op)
    ok, how = compare(op.native(*spec.args(gate_up)), act(gate) * up, op.tolerance(dtype))
    return None if ok else f"{spec.op} differs from {act_attr}(gate) * up: {how}"


def _gate_up(module: Any, spec: MlpSpec, x: Tensor) -> Tensor:
    if spec.split:
        return torch.cat([module.gate_proj(x), module.up_proj(x)], dim=-1)
    return module.gate_up_proj(x)


def _compute(module: Any, spec: MlpSpec, x: Tensor) -> Tensor:
    return module.down_proj(ir.get_op(spec.op)(*spec.args(_gate_up(module, spec, x))))


def _weight(module: Any, spec: MlpSpec) -> Tensor:
    return (module.gate_proj if spec.split else module.gate_up_proj).weight


def inactive_reason(module: Any, spec: MlpSpec, dtype: torch.dtype) -> str | None:
    """Why an activation in ``dtype`` runs the layer's own forward (None: the op)."""
    return active_problem(spec.dtypes, spec.rejected, dtype)


def probe_call(module: Any, spec: MlpSpec) -> tuple[Any, ...]:
    """Arguments of a one-token op call in the layer's dtype and device."""
    weight = _weight(module, spec)
    width = weight.shape[0] * (2 if spec.split else 1)
    return spec.args(weight.new_zeros((1, width)))


def _forward(self: Any, x: Tensor) -> Tensor:
    spec: MlpSpec = self.__dict__[STATE_ATTR]
    gate_up = _gate_up(self, spec, x)
    dtype = gate_up.dtype
    if dtype not in spec.dtypes:
        if fwd.debug_enabled():
            reason = inactive_reason(self, spec, dtype) or ""
            fwd.log_use(self, spec.name, spec.op, dtype, f"own forward ({reason})")
        return type(self).forward(self, x)
    op = _GATED[spec.op]
    args = spec.args(gate_up)
    if fwd.debug_enabled():
        impl = op.selected_impl(*args).provider
        fwd.log_use(self, spec.name, spec.op, dtype, f"impl {impl}")
    return self.down_proj(op(*args))


_GATED = {"silu_and_mul": ir.ops.silu_and_mul, "gelu_and_mul": ir.ops.gelu_and_mul}


def apply_mlp(module: Any, spec: MlpSpec) -> None:
    fwd.attach(module, STATE_ATTR, spec, _forward)


def revert_mlp(module: Any) -> None:
    fwd.detach(module, STATE_ATTR)
