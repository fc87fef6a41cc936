"""Rotary embeddings onto ``ir.ops.rotary_embedding``, inside the model's own attention forward.

Hugging Face attention layers call a module-level ``apply_rotary_pos_emb(q,
k, cos, sin)`` of their modeling file: a plain function, or (transformers 5.25
and later, which require the ``kernels`` package) an ``nn.Module`` instance
made from it by ``use_kernel_forward_from_hub``, its signature on ``forward``.
``kernelize`` leaves that file and the class alone: the attention instance
gets a forward that runs a *copy* of the class's forward function (the same
code object, and the same decorator wrappers, rebuilt) whose globals map
``apply_rotary_pos_emb`` to a function calling ``rotary_embedding``. Undo
removes the instance forward.

The copy sees the modeling module's globals as they were at ``kernelize``
time: a later monkeypatch of that module (another function, another
attention interface) reaches the kernelized layers only after undo and a new
``kernelize``.

The replacement calls ``rotary_embedding.maybe_inplace`` on ``q.transpose(1,
2)`` (token-major views of the projections, which nothing else reads) when the
call is the plain one: 4-D ``q``/``k`` of one dtype, 3-D ``cos``/``sin`` of
their dtype and full head width, ``unsqueeze_dim=1``, in a dtype the probe
verified; anything else runs the model's function. The style (neox halves or
GPT-J pairs) is the one that reproduces the model's function on a probe, in
every dtype of :data:`FLOAT_DTYPES`; then the whole attention forward is
probed against the layer's own.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
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
)

__all__ = ["ROPE_FUNCTION", "RopeSpec", "analyze_rope", "is_rope_candidate"]

ROPE_FUNCTION = "apply_rotary_pos_emb"
"""The module-level function of Hugging Face modeling files that applies RoPE."""

STATE_ATTR = "_vllm_ir_rope"


@dataclass(frozen=True)
class RopeSpec(Probed):
    module_type: type
    is_neox: bool
    head_dim: int
    forward: Any = field(default=None, compare=False, repr=False)
    """The rebound copy of ``module_type.forward``: built with the spec (so a compiled
    forward reads an attribute, never traces the rebinding), dropped when pickled
    (it has no importable name) and rebuilt when loaded."""

    def __post_init__(self) -> None:
        if self.forward is None:
            forward = self.module_type.forward  # type: ignore[attr-defined]
            rebound = _rebound_forward(forward, self.is_neox, self.dtypes)
            object.__setattr__(self, "forward", rebound)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "forward"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, forward=None)
        self.__post_init__()


def _calling(fn: Any, depth: int = 0) -> types.FunctionType | None:
    """The function in ``fn``'s wrapper chain whose code calls the global RoPE function."""
    if not isinstance(fn, types.FunctionType) or depth > 8:
        return None
    if ROPE_FUNCTION in fn.__code__.co_names and callable(fn.__globals__.get(ROPE_FUNCTION)):
        return fn
    for cell in fn.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        found = _calling(inner, depth + 1)
        if found is not None:
            return found
    return None


def is_rope_candidate(module: nn.Module) -> bool:
    return _calling(type(module).forward) is not None


def _copy(fn: types.FunctionType, globals_: dict[str, Any], closure: Any) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__dict__.update(fn.__dict__)
    return new


def _rebound_globals(globals_: dict[str, Any], replacement: Any, tag: str) -> dict[str, Any]:
    """A copy of a modeling module's globals with ``replacement`` as the RoPE function.

    The copy is the ``__dict__`` of a module registered in ``sys.modules`` under
    its own name: Dynamo finds a function's globals by importing its
    ``__name__``, and would otherwise guard on the original module's function.
    """
    name = f"vllm_ir_transformers_rope__{str(globals_['__name__']).replace('.', '_')}__{tag}"
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module.__dict__.update({k: v for k, v in globals_.items() if k != "__spec__"})
        module.__dict__["__name__"] = name
        sys.modules[name] = module
    module.__dict__[ROPE_FUNCTION] = replacement
    return module.__dict__


def _rebind(fn: Any, replacement: Any, tag: str, depth: int = 0) -> types.FunctionType | None:
    """A copy of ``fn`` (and of the wrappers down to the caller) calling ``replacement``."""
    if not isinstance(fn, types.FunctionType) or depth > 8:
        return None
    if ROPE_FUNCTION in fn.__code__.co_names and callable(fn.__globals__.get(ROPE_FUNCTION)):
        globals_ = _rebound_globals(fn.__globals__, replacement, tag)
        return _copy(fn, globals_, fn.__closure__)
    cells, changed = [], False
    for cell in fn.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:
            cells.append(cell)
            continue
        rebound = _rebind(inner, replacement, tag, depth + 1)
        if rebound is None:
            cells.append(cell)
        else:
            cells.append(types.CellType(rebound))
            changed = True
    return _copy(fn, fn.__globals__, tuple(cells)) if changed else None


def _op_rope(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, is_neox: bool
) -> tuple[Tensor, Tensor]:
    # [batch, heads, seq, head] -> token-major views; the op writes through them
    q_out, k_out = ir.ops.rotary_embedding.maybe_inplace(
        q.transpose(1, 2), k.transpose(1, 2), cos, sin, is_neox
    )
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def _plain_call(q: Any, k: Any, cos: Any, sin: Any, dtypes: tuple[torch.dtype, ...]) -> bool:
    return (
        all(isinstance(t, Tensor) for t in (q, k, cos, sin))
        and q.dim() == 4
        and k.dim() == 4
        and cos.dim() == 3
        and sin.shape == cos.shape
        and cos.shape[-1] == q.shape[-1] == k.shape[-1]
        and q.dtype in dtypes
        and q.dtype == k.dtype == cos.dtype == sin.dtype
    )


def _signature(original: Any) -> inspect.Signature:
    """The parameters a call passes: a module's are its ``forward``'s, less ``self``."""
    return inspect.signature(original.forward if isinstance(original, nn.Module) else original)


@functools.cache
def _replacement(original: Any, is_neox: bool, dtypes: tuple[torch.dtype, ...]) -> Any:
    """``apply_rotary_pos_emb`` with the model's signature, through the op where it can."""

    # a module's __dict__ (its parameters and hooks) is no function attribute: name and doc only
    @functools.wraps(
        original, updated=() if isinstance(original, nn.Module) else functools.WRAPPER_UPDATES
    )
    def apply_rotary_pos_emb(
        q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        # the analysis checked that a fifth parameter, if any, is unsqueeze_dim
        unsqueeze_dim = args[0] if len(args) == 1 else kwargs.get("unsqueeze_dim", 1)
        extra = len(args) > 1 or (args and kwargs) or set(kwargs) - {"unsqueeze_dim"}
        if (
            not extra
            and type(unsqueeze_dim) is int
            and unsqueeze_dim == 1
            and _plain_call(q, k, cos, sin, dtypes)
        ):
            return _op_rope(q, k, cos, sin, is_neox)
        return original(q, k, cos, sin, *args, **kwargs)

    return apply_rotary_pos_emb


@functools.cache
def _rebound_forward(forward: Any, is_neox: bool, dtypes: tuple[torch.dtype, ...]) -> Any:
    caller = _calling(forward)
    assert caller is not None
    original = caller.__globals__[ROPE_FUNCTION]
    tag = ("neox" if is_neox else "gptj") + "".join(f"_{dtype_name(d)}" for d in dtypes)
    rebound = _rebind(forward, _replacement(original, is_neox, dtypes), tag)
    assert rebound is not None
    return rebound


def _check_signature(original: Any) -> None:
    """``(q, k, cos, sin[, unsqueeze_dim])``: what the replacement maps onto the op."""
    try:
        signature = _signature(original)
        params = list(signature.parameters.values())
    except (TypeError, ValueError) as e:
        raise NotApplicable(f"{ROPE_FUNCTION} has no inspectable signature: {e}") from e
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    if (
        len(positional) != len(params)
        or len(params) not in (4, 5)
        or (len(params) == 5 and params[4].name != "unsqueeze_dim")
    ):
        raise NotApplicable(
            f"{ROPE_FUNCTION}{signature} is not (q, k, cos, sin[, unsqueeze_dim]) as in Llama"
        )


def _head_dim(module: Any) -> int:
    head_dim = getattr(module, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise NotApplicable(f"no even head_dim attribute (got {head_dim!r})")
    return head_dim


def _reference(module: Any) -> Tensor:
    for p in module.parameters():
        return p
    raise NotApplicable("no parameters to take a dtype and device from")


def _style_problem(original: Any, like: Tensor, head_dim: int, is_neox: bool) -> str | None:
    """Why ``rotary_embedding`` in this style differs from the model's function on a probe."""
    q = probe_input((2, 3, 5, head_dim), like, seed=11)
    k = probe_input((2, 1, 5, head_dim), like, seed=12)
    cos = probe_input((2, 5, head_dim), like, seed=13)
    sin = probe_input((2, 5, head_dim), like, seed=14)
    try:
        want = original(q.clone(), k.clone(), cos, sin)
    except Exception as e:
        return f"{ROPE_FUNCTION} raised {type(e).__name__} on a probe: {e}"
    if not (isinstance(want, tuple) and len(want) == 2):
        return f"{ROPE_FUNCTION} did not return (q, k)"
    got = _op_rope(q.clone(), k.clone(), cos, sin, is_neox)
    tol = ir.ops.rotary_embedding.tolerance(like.dtype)
    for g, w, which in zip(got, want, "qk", strict=True):
        ok, how = compare(g.contiguous(), w.contiguous(), tol)
        if not ok:
            return f"{which} differs: {how}"
    return None


def _attention_probe(module: Any, spec: RopeSpec, like: Tensor) -> str:
    hidden = getattr(getattr(module, "config", None), "hidden_size", None)
    for proj in ("q_proj", "qkv_proj"):
        if not isinstance(hidden, int):
            hidden = getattr(getattr(module, proj, None), "in_features", None)
    if not isinstance(hidden, int):
        raise NotApplicable(
            "no config.hidden_size nor q_proj/qkv_proj nn.Linear to size a probe of the "
            "attention forward"
        )
    x = probe_input((1, 4, hidden), like, seed=15)
    cos = probe_input((1, 4, spec.head_dim), like, seed=16).clamp(-1, 1)
    sin = probe_input((1, 4, spec.head_dim), like, seed=17).clamp(-1, 1)
    call = {"hidden_states": x, "position_embeddings": (cos, sin), "attention_mask": None}
    try:
        want = type(module).forward(module, **call)
        got = spec.forward(module, **call)
    except Exception as e:
        raise NotApplicable(f"probe of the attention forward raised {type(e).__name__}: {e}") from e
    want0 = want[0] if isinstance(want, tuple) else want
    got0 = got[0] if isinstance(got, tuple) else got
    ok, how = compare(got0, want0, ir.ops.rotary_embedding.tolerance(like.dtype))
    if not ok:
        raise NotApplicable(f"attention forward with rotary_embedding differs: {how}")
    return how


def analyze_rope(module: nn.Module) -> RopeSpec:
    caller = _calling(type(module).forward)
    if caller is None:
        raise NotApplicable(f"its forward calls no {ROPE_FUNCTION}")
    original = caller.__globals__[ROPE_FUNCTION]
    _check_signature(original)
    head_dim = _head_dim(module)
    ref = _reference(module)
    with torch.no_grad():
        styles = {
            neox: _style_problem(original, ref.detach(), head_dim, neox) for neox in (True, False)
        }
        matching = [neox for neox, problem in styles.items() if problem is None]
        if not matching:
            raise NotApplicable(
                f"{ROPE_FUNCTION} matches neither style: neox {styles[True]}; gptj {styles[False]}"
            )
        is_neox = matching[0]
        verified, rejected = [], []
        for dtype in FLOAT_DTYPES:
            problem = _style_problem(original, ref.detach().to(dtype), head_dim, is_neox)
            if problem is None:
                verified.append(dtype)
            else:
                rejected.append((dtype, problem))
        if ref.dtype not in verified:
            raise NotApplicable(f"not equivalent in {dtype_name(ref.dtype)}: {rejected[-1][1]}")
        spec = RopeSpec(
            type(module),
            is_neox,
            head_dim,
            dtypes=tuple(verified),
            rejected=tuple(rejected),
            how="",
        )
        how = _attention_probe(module, spec, ref)
    style = "neox" if is_neox else "gptj"
    return RopeSpec(
        type(module),
        is_neox,
        head_dim,
        dtypes=tuple(verified),
        rejected=tuple(rejected),
        how=f"{ROPE_FUNCTION} -> rotary_embedding ({style}) in its own forward, {how}",
    )


def inactive_reason(module: Any, spec: RopeSpec, dtype: torch.dtype) -> str | None:
    """Why RoPE in ``dtype`` runs the model's function (None: ``rotary_embedding``)."""
    return active_problem(spec.dtypes, spec.rejected, dtype)


def probe_call(module: Any, spec: RopeSpec) -> tuple[Any, ...]:
    """Arguments of a one-token ``rotary_embedding`` call in the layer's dtype and device."""
    like = _reference(module)
    q = like.new_zeros((1, 1, spec.head_dim))
    cos = like.new_zeros((1, spec.head_dim))
    return (q, q, cos, cos, spec.is_neox)


def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    spec: RopeSpec = self.__dict__[STATE_ATTR]
    return spec.forward(self, *args, **kwargs)


def apply_rope(module: Any, spec: RopeSpec) -> None:
    fwd.attach(module, STATE_ATTR, spec, _forward)


def revert_rope(module: Any) -> None:
    fwd.detach(module, STATE_ATTR)
