"""Residual add + post-attention RMSNorm in decoder layers onto ``fused_add_rms_norm``.

Pre-norm decoder layers of the Llama family compute::

    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, <every other argument>)
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states

The replacement forward does the same with the add and the norm as one
``fused_add_rms_norm`` call. It is installed only on a layer that

* has ``input_layernorm``, ``post_attention_layernorm`` (a verified RMSNorm),
  ``self_attn`` and ``mlp``, and no other submodule but dropouts with ``p == 0``;
* behaves like the listing above, by a probe: ``self_attn`` and ``mlp`` are
  swapped for deterministic stand-ins for the duration of one call of the
  layer's own forward and of the replacement, with a distinct marker object as
  every other argument. Both must return the same tensor and pass the stand-in
  attention the same arguments. Post-norm layers (OLMo-2), sandwich norms
  (Gemma 2/3) and anything else fail this and stay as they are.

The probe runs in every dtype of :data:`FLOAT_DTYPES` (the norm weights cast
through ``torch.func.functional_call``); the fused forward runs for hidden
states whose dtype passed and matches the post-attention norm's weight, and
the layer's own forward otherwise.

Donation: the attention output is an intermediate of the layer that nothing
else reads, but the residual is the layer's *input*, which the caller may still
hold (``output_hidden_states`` records every layer's output, the next layer's
input). So the eager call donates the attention output and a copy of the
residual to ``fused_add_rms_norm.maybe_inplace``; under ``torch.compile`` the
default overload is used, and the compiler's clone elimination, which sees the
whole graph, decides what can be reused.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
import vllm_ir as ir
from torch import Tensor, nn

from vllm_ir_transformers import _forward as fwd
from vllm_ir_transformers._checks import (
    FLOAT_DTYPES,
    NotApplicable,
    Probed,
    compare,
    probe_input,
    weighted_problem,
)
from vllm_ir_transformers.norm import NormSpec, norm_weight

__all__ = ["DecoderSpec", "analyze_decoder", "is_decoder_candidate"]

REQUIRED = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
STATE_ATTR = "_vllm_ir_decoder"


@dataclass(frozen=True)
class DecoderSpec(Probed):
    norm: NormSpec
    hidden_name: str
    positional: tuple[str, ...]
    """Names of the parameters after the hidden states that may be passed by position."""
    defaults: dict[str, Any]
    """Default values the layer's own forward passes on to the attention."""
    varkw: str | None


def is_decoder_candidate(module: Any) -> bool:
    return all(isinstance(getattr(module, a, None), nn.Module) for a in REQUIRED)


class _StandInAttention(nn.Module):
    """Elementwise and cheap (no [H, H] weight), but unlike any identity or scaling."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    def forward(self, hidden_states: Tensor, **kwargs: Any) -> tuple[Tensor, None]:
        self.calls.append(kwargs)
        return torch.tanh(hidden_states.flip(-1) * 1.3 + 0.1) * 3.0, None


class _StandInMlp(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * x * 0.5 - 1.0


def _signature(module: Any) -> tuple[str, tuple[str, ...], dict[str, Any], str | None]:
    sig = inspect.signature(type(module).forward)
    params = list(sig.parameters.values())[1:]  # drop self
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.POSITIONAL_ONLY,
    ):
        raise NotApplicable(f"forward{sig} does not take the hidden states first")
    hidden_name = params[0].name
    positional, defaults, varkw = [], {}, None
    for p in params[1:]:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            raise NotApplicable(f"forward{sig} takes *{p.name}")
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            varkw = p.name
            continue
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            positional.append(p.name)
        defaults[p.name] = None if p.default is inspect.Parameter.empty else p.default
    return hidden_name, tuple(positional), defaults, varkw


def analyze_decoder(module: Any, norm: NormSpec | None, norm_reason: str | None) -> DecoderSpec:
    """The fused forward's spec for ``module``; raises :class:`NotApplicable`."""
    if norm is None:
        raise NotApplicable(f"post_attention_layernorm is not a verified RMSNorm ({norm_reason})")
    extra = [
        f"{name} ({type(child).__name__})"
        for name, child in module.named_children()
        if name not in REQUIRED and not (isinstance(child, nn.Dropout) and child.p == 0)
    ]
    if extra:
        raise NotApplicable(f"submodules the fused forward would not run: {', '.join(extra)}")
    hidden_name, positional, defaults, varkw = _signature(module)
    dtype = module.post_attention_layernorm.weight.dtype
    spec = DecoderSpec(
        norm, hidden_name, positional, defaults, varkw, dtypes=(), rejected=(), how=""
    )
    how = _probe(module, spec, dtype)
    verified, rejected = [dtype], []
    for other in FLOAT_DTYPES:
        if other == dtype:
            continue
        problem = next(
            (f"post_attention_layernorm: {r}" for d, r in norm.rejected if d == other), None
        )
        if problem is None:
            try:
                _probe(module, spec, other)
            except NotApplicable as e:
                problem = str(e)
        if problem is None:
            verified.append(other)
        else:
            rejected.append((other, problem))
    return DecoderSpec(
        norm,
        hidden_name,
        positional,
        defaults,
        varkw,
        dtypes=tuple(verified),
        rejected=tuple(rejected),
        how=how,
    )


def _probe(module: Any, spec: DecoderSpec, dtype: torch.dtype) -> str:
    """How the fused forward agrees with the layer's in ``dtype``; raises :class:`NotApplicable`."""
    markers = {name: _Marker(name) for name in spec.defaults}
    extra_kw = {"probe_extra_kwarg": _Marker("probe_extra_kwarg")} if spec.varkw else {}
    # the layer's own parameters outside attention and MLP: the norms' weights
    weights = {
        name: p.detach().to(dtype)
        for name, p in module.named_parameters()
        if not name.startswith(("self_attn.", "mlp."))
    }
    attn, mlp = module.self_attn, module.mlp
    stand_in = _StandInAttention()
    hidden = module.post_attention_layernorm.weight.shape[0]
    like = module.post_attention_layernorm.weight.detach().to(dtype)
    x = probe_input((2, 3, hidden), like, seed=6)
    try:
        module.self_attn, module.mlp = stand_in, _StandInMlp()
        with torch.no_grad():
            try:
                want = torch.func.functional_call(
                    module, weights, (x.clone(),), {**markers, **extra_kw}, strict=False
                )
            except Exception as e:
                raise NotApplicable(
                    f"probe of the layer's forward raised {type(e).__name__}: {e}"
                ) from None
            # the fused forward, run the same way (functional_call calls module.forward)
            module.forward = functools.partial(_fused_probe, module, spec)
            got = torch.func.functional_call(
                module, weights, (x.clone(),), {**markers, **extra_kw}, strict=False
            )
    finally:
        module.self_attn, module.mlp = attn, mlp
        fwd.remove(module)
    if not isinstance(want, Tensor):
        raise NotApplicable(f"forward returns {type(want).__name__}, not a tensor")
    if len(stand_in.calls) != 2 or stand_in.calls[0] != stand_in.calls[1]:
        raise NotApplicable("the attention would receive other arguments than the layer passes it")
    ok, how = compare(got, want, ir.ops.fused_add_rms_norm.tolerance(dtype))
    if not ok:
        raise NotApplicable(
            "the layer does not compute residual + attention -> post_attention_layernorm -> "
            f"residual + mlp (probe with stand-ins: {how})"
        )
    return how


class _Marker:
    """A distinct argument value for the probe, equal only to itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<probe {self.name}>"


def _fused(
    self: Any,
    spec: DecoderSpec,
    hidden_states: Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    inplace: bool,
) -> Tensor:
    if len(args) > len(spec.positional):
        raise TypeError(
            f"{type(self).__name__}.forward takes {len(spec.positional) + 1} positional "
            f"arguments but {len(args) + 1} were given"
        )
    attn_kwargs = dict(spec.defaults)
    attn_kwargs.update(zip(spec.positional, args, strict=False))
    attn_kwargs.update(kwargs)
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    attn_out, *_ = self.self_attn(hidden_states=hidden_states, **attn_kwargs)
    weight = norm_weight(self.post_attention_layernorm, spec.norm)
    if inplace:
        # attn_out is the layer's own intermediate; the residual is the caller's
        hidden_states, residual = ir.ops.fused_add_rms_norm.maybe_inplace(
            attn_out, residual.clone(), weight, spec.norm.eps
        )
    else:
        hidden_states, residual = ir.ops.fused_add_rms_norm(
            attn_out, residual, weight, spec.norm.eps
        )
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states


def _fused_probe(self: Any, spec: DecoderSpec, hidden_states: Tensor, **kwargs: Any) -> Tensor:
    return _fused(self, spec, hidden_states, (), kwargs, inplace=True)


def inactive_reason(module: Any, spec: DecoderSpec, dtype: torch.dtype) -> str | None:
    """Why hidden states in ``dtype`` take the layer's own forward (None: the fused one)."""
    weight = module.post_attention_layernorm.weight
    name = "post_attention_layernorm.weight"
    return weighted_problem(name, weight, dtype, spec.dtypes, spec.rejected, "hidden states")


def probe_call(module: Any, spec: DecoderSpec) -> tuple[Any, ...]:
    """Arguments of a one-token ``fused_add_rms_norm`` call in the layer's dtype and device."""
    weight = norm_weight(module.post_attention_layernorm, spec.norm)
    x = weight.new_zeros((1, weight.shape[0]))
    return (x, x.clone(), weight, spec.norm.eps)


def _forward(self: Any, hidden_states: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    spec: DecoderSpec = self.__dict__[STATE_ATTR]
    dtype = hidden_states.dtype
    if dtype != self.post_attention_layernorm.weight.dtype or dtype not in spec.dtypes:
        if fwd.debug_enabled():
            reason = inactive_reason(self, spec, dtype) or ""
            fwd.log_use(self, spec.name, "fused_add_rms_norm", dtype, f"own forward ({reason})")
        return type(self).forward(self, hidden_states, *args, **kwargs)
    if fwd.debug_enabled():
        weight = norm_weight(self.post_attention_layernorm, spec.norm)
        impl = ir.ops.fused_add_rms_norm.selected_impl(
            hidden_states, hidden_states, weight, spec.norm.eps
        ).provider
        fwd.log_use(self, spec.name, "fused_add_rms_norm", dtype, f"impl {impl}")
    inplace = not torch.compiler.is_compiling()
    return _fused(self, spec, hidden_states, args, kwargs, inplace=inplace)


def apply_decoder(module: Any, spec: DecoderSpec) -> None:
    fwd.attach(module, STATE_ATTR, spec, _forward)


def revert_decoder(module: Any) -> None:
    fwd.detach(module, STATE_ATTR)
