"""Gated SiLU MLPs onto one projection and ``ir.ops.silu_and_mul``.

Two shapes are recognized, by attribute names and then by a probe:

* split: ``down_proj(act(gate_proj(x)) * up_proj(x))`` (Llama, Mistral, Qwen2/3,
  OLMo-2). The gate and up weights are concatenated into one ``[2I, H]`` tensor
  and the parameters ``gate_proj.weight`` / ``up_proj.weight`` become views of
  its halves: same parameter objects, same ``state_dict``, no extra memory, and
  in-place updates (optimizer steps, ``load_state_dict``) reach the fused
  weight. Each output element is the same dot product either way; the probe
  checks the replacement against the original forward and the layer is skipped
  unless they agree.
* fused: ``down_proj(up * act(gate))`` with ``gate, up = gate_up_proj(x).chunk(2)``
  (Phi-3): only the activation changes.

The activation must be SiLU (checked on values, not by class), the
projections plain ``nn.Linear`` with plain floating-point weights on one
device and dtype, and gate and up must both have a bias or neither.

When autograd needs the weights, the split form concatenates the parameters
on each call (so gradients reach them); otherwise it uses the fused weight. In
eager mode a fused weight that no longer backs the parameters (after
``model.to(...)`` or a parameter reassignment) is rebuilt before use.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
import vllm_ir as ir
from torch import Tensor, nn

from vllm_ir_transformers._checks import NotApplicable, compare, probe_input, weight_problem

__all__ = ["MlpSpec", "analyze_mlp", "is_mlp_candidate"]

ACT_ATTRS = ("act_fn", "activation_fn", "act")
STATE_ATTR = "_vllm_ir_mlp"
WEIGHT_BUFFER = "_vllm_ir_gate_up_weight"
BIAS_BUFFER = "_vllm_ir_gate_up_bias"


@dataclass(frozen=True)
class MlpSpec:
    split: bool
    act_attr: str
    how: str


def _act_attr(module: Any) -> str | None:
    return next((a for a in ACT_ATTRS if callable(getattr(module, a, None))), None)


def is_mlp_candidate(module: Any) -> bool:
    if not isinstance(getattr(module, "down_proj", None), nn.Module):
        return False
    split = all(isinstance(getattr(module, a, None), nn.Module) for a in ("gate_proj", "up_proj"))
    fused = isinstance(getattr(module, "gate_up_proj", None), nn.Module)
    return split or fused


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
        if gate.weight.data.is_shared() or up.weight.data.is_shared():
            raise NotApplicable("gate/up weights are in shared memory")
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
    hidden = (linears[0].in_features,)
    with torch.no_grad():
        a = probe_input((4, 64), ref, seed=3)
        try:
            act_out = act(a)
        except Exception as e:
            raise NotApplicable(f"{act_attr} raised {type(e).__name__} on a probe: {e}") from None
        if not isinstance(act_out, Tensor) or not torch.equal(act_out, F.silu(a)):
            raise NotApplicable(f"{act_attr} ({type(act).__name__}) is not SiLU")
        x = probe_input((2, 3, *hidden), ref, seed=4)
        want = type(module).forward(module, x)
        spec = MlpSpec(split, act_attr, "")
        weight, bias = _fused_weight(module) if split else (None, None)
        got = _compute(module, spec, x, weight, bias)
        ok, how = compare(got, want, ir.ops.silu_and_mul.tolerance(ref.dtype))
    if not ok:
        raise NotApplicable(f"fused forward differs from the layer's: {how}")
    kind = "gate_proj + up_proj -> one projection" if split else "gate_up_proj"
    return MlpSpec(split, act_attr, f"{kind} + silu_and_mul, {how}")


def _fused_weight(module: Any) -> tuple[Tensor, Tensor | None]:
    gate, up = module.gate_proj, module.up_proj
    weight = torch.cat([gate.weight.detach(), up.weight.detach()])
    bias = None if gate.bias is None else torch.cat([gate.bias.detach(), up.bias.detach()])
    return weight, bias


def _compute(
    module: Any, spec: MlpSpec, x: Tensor, weight: Tensor | None, bias: Tensor | None
) -> Tensor:
    if spec.split:
        assert weight is not None
        gate_up = F.linear(x, weight, bias)
    else:
        gate_up = module.gate_up_proj(x)
    return module.down_proj(ir.ops.silu_and_mul(gate_up))


def _backs(param: Tensor, fused: Tensor, offset: int) -> bool:
    return (
        param.device == fused.device
        and param.dtype == fused.dtype
        and param.data_ptr() == fused.data_ptr() + offset * fused.element_size()
    )


def _share(module: Any) -> None:
    """(Re)build the fused weight and make the gate/up parameters views of it."""
    weight, bias = _fused_weight(module)
    gate, up = module.gate_proj, module.up_proj
    n = gate.weight.shape[0]
    module.register_buffer(WEIGHT_BUFFER, weight, persistent=False)
    module.register_buffer(BIAS_BUFFER, bias, persistent=False)
    gate.weight.data = weight[:n]
    up.weight.data = weight[n:]
    if bias is not None:
        gate.bias.data = bias[:n]
        up.bias.data = bias[n:]


def _in_sync(module: Any) -> bool:
    weight = module._buffers[WEIGHT_BUFFER]
    gate, up = module.gate_proj, module.up_proj
    if weight is None:
        return False
    if not (_backs(gate.weight, weight, 0) and _backs(up.weight, weight, gate.weight.numel())):
        return False
    bias = module._buffers[BIAS_BUFFER]
    if bias is None:
        return gate.bias is None
    return _backs(gate.bias, bias, 0) and _backs(up.bias, bias, gate.bias.numel())


def _forward(self: Any, x: Tensor) -> Tensor:
    spec: MlpSpec = self.__dict__[STATE_ATTR]
    if not spec.split:
        return _compute(self, spec, x, None, None)
    gate, up = self.gate_proj, self.up_proj
    if torch.is_grad_enabled() and (gate.weight.requires_grad or up.weight.requires_grad):
        weight, bias = torch.cat([gate.weight, up.weight]), None
        if gate.bias is not None:
            bias = torch.cat([gate.bias, up.bias])
        return _compute(self, spec, x, weight, bias)
    if not torch.compiler.is_compiling() and not _in_sync(self):
        _share(self)
    return _compute(self, spec, x, self._buffers[WEIGHT_BUFFER], self._buffers[BIAS_BUFFER])


def apply_mlp(module: Any, spec: MlpSpec) -> None:
    module.__dict__[STATE_ATTR] = spec
    if spec.split:
        with torch.no_grad():
            _share(module)
    module.forward = MethodType(_forward, module)  # type: ignore[method-assign]


def revert_mlp(module: Any) -> None:
    module.__dict__.pop("forward", None)
    spec = module.__dict__.pop(STATE_ATTR, None)
    if spec is None or not spec.split:
        return
    with torch.no_grad():
        for lin in (module.gate_proj, module.up_proj):
            lin.weight.data = lin.weight.data.clone()
            if lin.bias is not None:
                lin.bias.data = lin.bias.data.clone()
    module._buffers.pop(WEIGHT_BUFFER, None)
    module._buffers.pop(BIAS_BUFFER, None)
