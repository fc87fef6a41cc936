"""vLLM's norm, activation and RoPE layers, run through vllm-ir ops (imports vLLM).

vLLM builds a layer through ``CustomOp.__new__``, which looks the class name up
in its out-of-tree registry (``op_registry_oot``). For each layer of
:data:`TARGETS` that the installed vLLM has, the plugin registers a subclass
under that name with ``CustomOp.register_oot``, so vLLM builds the subclass
wherever it builds the layer; ``__init__``, weights and ``forward_native`` stay
vLLM's own. The targets are the in-tree layers that vLLM's default model
implementation builds (``vllm.model_executor.layers``), the hardware-agnostic
layers (``vllm.model_executor.hw_agnostic.layers``, which the Transformers
backend builds under ``VLLM_USE_HW_AGNOSTIC=1``) and the Transformers backend's
``TPAwareRMSNorm`` (its fused RMSNorm). vLLM 0.34 requires the subclassing: its
``CustomOp.__new__`` raises ``TypeError`` for an override that does not derive
from the layer it replaces.

``RMSNorm`` runs ``vllm_rms_norm`` and ``vllm_fused_add_rms_norm``, the ops with
vLLM's numerics (the weight multiplied in its own dtype, the fp32 sum
normalized), so tokens do not change; ``SiluAndMul`` runs ``silu_and_mul`` (the
same expression in both); ``RotaryEmbedding`` and its cache-only subclasses run
``rotary_embedding`` or ``rotary_embedding_fp32``, whichever rounds as vLLM's
kernel does (:class:`RotaryEmbeddingRoute`).

vLLM calls ``forward_oot`` only on out-of-tree *platforms*; these classes run it
on every platform whenever vLLM enables the op (``custom_ops``: ``all``, the
default without Inductor, or ``+rms_norm``, ``+silu_and_mul``), and vLLM's
``forward_native`` when it disables it (``none``, the default under Inductor
compilation, or ``-rms_norm``), so Inductor still sees vLLM's code to fuse. The
class keeps the in-tree ``name`` so those switches keep their meaning.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import vllm_ir as ir
from vllm_ir.ops.rotary import cos_sin_from_cache
from vllm_ir.provider import get_logger

__all__ = [
    "LEFT_ALONE",
    "TARGETS",
    "LayerTarget",
    "register_layers",
    "replacement",
    "replacements",
    "unregister_layers",
]

logger = get_logger("vllm_ir.vllm")


_declined: set[str] = set()


def _decline(reason: str) -> None:
    """Log once per reason that a layer runs vLLM's own forward instead of an IR op."""
    # not while Dynamo traces: logging would break the graph (the first eager
    # call logs it; the numbers are vLLM's either way)
    if reason not in _declined and not torch.compiler.is_compiling():
        _declined.add(reason)
        logger.warning("vLLM's own forward runs instead of vllm-ir: %s", reason)


class _Routed:
    """Runs ``forward_oot`` whenever vLLM enables the op, on every platform."""

    _enforce_enable: bool
    _forward_method: Any
    _vllm_forward: Callable[..., Any]
    """What vLLM itself dispatches to (its platform kernel or native): for declines."""
    forward_oot: Callable[..., Any]

    def dispatch_forward(self, compile_native: bool) -> Any:
        from vllm_ir_vllm import on_first_layer

        on_first_layer()  # this process builds a model: its rank, group, threads are known
        forward = super().dispatch_forward(compile_native)  # type: ignore[misc]  # records enabled
        self._vllm_forward = forward
        if self._enforce_enable or self.enabled():  # type: ignore[attr-defined]
            return self.forward_oot
        return forward

    def routes_to_ir(self) -> bool:
        """Whether vLLM enabled this op, so calls go to vllm-ir (else vLLM's native)."""
        return bool(self._forward_method == self.forward_oot)


class RMSNormRoute(_Routed):
    """vLLM's ``RMSNorm``: ``vllm_rms_norm``, or ``vllm_fused_add_rms_norm.maybe_inplace``.

    The residual form donates ``x`` and ``residual``, as vLLM's own layer does:
    callers rebind both.
    """

    has_weight: bool
    weight: torch.Tensor
    variance_epsilon: float
    variance_size_override: int | None

    def _arguments(self) -> tuple[torch.Tensor | None, float, int | None]:
        weight = self.weight if self.has_weight else None
        return weight, self.variance_epsilon, self.variance_size_override

    def forward_oot(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        weight, eps, size = self._arguments()
        if residual is None:
            return ir.ops.vllm_rms_norm(x, weight, eps, size)  # type: ignore[no-any-return]
        out, new_residual = ir.ops.vllm_fused_add_rms_norm.maybe_inplace(
            x, residual, weight, eps, size
        )
        return out, new_residual

    def ir_provider(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> str:
        """Which kernel a call with these arguments runs: a provider, or vLLM's native."""
        if not self.routes_to_ir():
            return "vllm native (custom op rms_norm disabled)"
        weight, eps, size = self._arguments()
        if residual is None:
            return ir.ops.vllm_rms_norm.selected_impl(x, weight, eps, size).provider
        op = ir.ops.vllm_fused_add_rms_norm
        return op.selected_impl(x, residual, weight, eps, size).provider

    def ir_example(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """One token's arguments of ``dtype``, for reports."""
        x = torch.zeros(1, self.weight.shape[-1], dtype=dtype, device=self.weight.device)
        return (x,)


class SiluAndMulRoute(_Routed):
    """vLLM's ``SiluAndMul``: ``silu_and_mul`` (the same expression in both)."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.silu_and_mul(x)  # type: ignore[no-any-return]

    def ir_provider(self, x: torch.Tensor) -> str:
        """Which kernel a call with ``x`` runs: a provider, or vLLM's native."""
        if not self.routes_to_ir():
            return "vllm native (custom op silu_and_mul disabled)"
        return ir.ops.silu_and_mul.selected_impl(x).provider

    def ir_example(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(1, 64, dtype=dtype),)


class RotaryEmbeddingRoute(_Routed):
    """vLLM's ``RotaryEmbedding``: RoPE on the cos/sin its cache holds, with vLLM's rounding.

    With the op enabled vLLM runs its platform kernel. For fp32 queries that is
    ``rotary_embedding`` (vLLM's ``forward_native`` numerics). In bf16 and fp16,
    vLLM's CPU kernel computes in fp32 and rounds once: ``rotary_embedding_fp32``.
    A 16-bit call on another device (whose kernel's rounding no vllm-ir op
    declares) and a call without ``key`` run what vLLM would run, with the
    reason logged once. ``maybe_inplace``: an in-place impl writes ``query`` and
    ``key``, as vLLM's own kernels do (its callers use the returned tensors).
    """

    head_size: int
    is_neox_style: bool

    @staticmethod
    def _op(query: torch.Tensor, key: torch.Tensor | None) -> tuple[ir.IrOp | None, str]:
        """The op with the numerics vLLM's own forward has here, or None and why not."""
        if key is None:
            return None, "rotary_embedding: a call without key"
        if query.dtype == torch.float32:
            return ir.ops.rotary_embedding, ""
        if query.device.type == "cpu":
            return ir.ops.rotary_embedding_fp32, ""
        return None, (
            f"rotary_embedding: query is {query.dtype} on {query.device.type}; no vllm-ir op "
            "declares the rounding of vLLM's kernel for this layer there"
        )

    def forward_oot(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        op, reason = self._op(query, key)
        if op is None:
            _decline(reason)
            return self._vllm_forward(positions, query, key)  # type: ignore[no-any-return]
        assert key is not None
        q, k, cos, sin = self._arguments(positions, query, key)
        q, k = op.maybe_inplace(q, k, cos, sin, self.is_neox_style)
        return q.reshape(query.shape), k.reshape(key.shape)

    def _arguments(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        cache = self._match_cos_sin_cache_dtype(query)  # type: ignore[attr-defined]
        positions = positions.flatten()
        if torch.compiler.is_compiling():  # Inductor fuses the gather and the halves
            cos, sin = cos_sin_from_cache(cache, positions, self.is_neox_style)
        else:  # one gather of both tables, (tokens, 2, rotary_dim); cos and sin are views
            cos, sin = self._table(cache).index_select(0, positions).unbind(1)
        tokens = positions.shape[0]
        q = query.view(tokens, -1, self.head_size)
        return q, key.view(tokens, -1, self.head_size), cos, sin

    _ir_table: tuple[torch.Tensor, torch.Tensor] | None = None

    def _table(self, cache: torch.Tensor) -> torch.Tensor:
        """``cache``'s cos and sin at every position, ``(positions, 2, rotary_dim)``:
        halves laid out as the op takes them.

        Built once per cache tensor (twice the cache's memory): gathering rows of
        one table is one call, where splitting and duplicating the gathered cache
        on every call cost 3 to 5 times vLLM's own kernel at decode sizes.
        """
        if self._ir_table is None or self._ir_table[0] is not cache:
            every = torch.arange(cache.shape[0], device=cache.device)
            cos, sin = cos_sin_from_cache(cache, every, self.is_neox_style)
            self._ir_table = (cache, torch.stack((cos, sin), dim=1))
        return self._ir_table[1]

    def ir_provider(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None
    ) -> str:
        """Which kernel a call with these arguments runs: a provider, or vLLM's native."""
        if not self.routes_to_ir():
            return "vllm native (custom op rotary_embedding disabled)"
        op, reason = self._op(query, key)
        if op is None:
            return f"vllm ({reason})"
        assert key is not None
        q, k, cos, sin = self._arguments(positions, query, key)
        return op.selected_impl(q, k, cos, sin, self.is_neox_style).provider

    def ir_example(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        device = self.cos_sin_cache.device  # type: ignore[attr-defined]
        query = torch.zeros(1, self.head_size, dtype=dtype, device=device)
        return torch.zeros(1, dtype=torch.long, device=device), query, query.clone()


@dataclass(frozen=True)
class LayerTarget:
    """A vLLM layer class the plugin replaces, where the installed vLLM has it."""

    module: str
    """Where vLLM defines it."""
    name: str
    """The class name: the key ``CustomOp.__new__`` looks up."""
    route: type[_Routed]
    """What the replacement adds to vLLM's class."""
    subclasses: bool = False
    """Also every subclass vLLM defines that keeps the class's forward methods
    (RoPE variants that differ only in how they fill the cache)."""

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


TARGETS = (
    LayerTarget("vllm.model_executor.layers.layernorm", "RMSNorm", RMSNormRoute),
    LayerTarget("vllm.model_executor.layers.activation", "SiluAndMul", SiluAndMulRoute),
    LayerTarget("vllm.model_executor.hw_agnostic.layers.layernorm", "RMSNorm", RMSNormRoute),
    LayerTarget("vllm.model_executor.hw_agnostic.layers.activation", "SiluAndMul", SiluAndMulRoute),
    LayerTarget(
        "vllm.model_executor.models.transformers.fusers.rms_norm", "TPAwareRMSNorm", RMSNormRoute
    ),
    LayerTarget(
        "vllm.model_executor.layers.rotary_embedding",
        "RotaryEmbedding",
        RotaryEmbeddingRoute,
        subclasses=True,
    ),
)
"""Every layer the plugin replaces: vLLM's default model implementation builds the
in-tree ones, the Transformers backend the hardware-agnostic ones and its fused
``TPAwareRMSNorm``."""

LEFT_ALONE: dict[str, str] = {
    "GemmaRMSNorm": "it scales by (1 + weight) in fp32, which no vllm-ir op computes",
    "RMSNormGated": "gated and grouped RMSNorm has no vllm-ir op",
    "LayerNorm": "mean-centred LayerNorm has no vllm-ir op",
    "MRotaryEmbedding": "multimodal RoPE (sections of positions) has no vllm-ir op",
    "ApplyRotaryEmb": (
        "the helper of vLLM's native RoPE forward: a replaced RotaryEmbedding does not call it"
    ),
    "GeluAndMul": "not replaced yet (gelu_and_mul has the op; no model the plugin covers uses it)",
}
"""vLLM's norm, activation and rotary layers the plugin leaves to vLLM, and why: named
once in the log when the plugin registers."""

_replacements: dict[str, type] = {}
"""``module.Name`` of a vLLM class -> its replacement, built once per process."""

_FORWARDS = ("forward", "forward_native", "forward_cpu", "forward_cuda", "forward_static")


def _registry_of(cls: type) -> tuple[Any, dict[str, type]]:
    """``(CustomOp, op_registry_oot)`` of the CustomOp family ``cls`` belongs to."""
    for base in cls.__mro__:
        if base.__name__ == "CustomOp":
            module = importlib.import_module(base.__module__)
            return base, module.op_registry_oot
    raise TypeError(f"{cls.__qualname__} is not a vLLM CustomOp")


def _vllm_classes(target: LayerTarget) -> list[type]:
    """vLLM's classes ``target`` names, in this vLLM: none, the class, or with its subclasses."""
    try:
        base = getattr(importlib.import_module(target.module), target.name)
    except (ImportError, AttributeError) as e:
        logger.debug("vLLM has no %s (%s)", target.qualified, e)
        return []
    found, todo = [base], list(base.__subclasses__()) if target.subclasses else []
    while todo:
        cls = todo.pop()
        same = all(getattr(cls, f, None) is getattr(base, f, None) for f in _FORWARDS)
        if same and cls.__module__.startswith("vllm.") and not issubclass(cls, _Routed):
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def replacement(vllm_class: type, route: type[_Routed]) -> type:
    """The replacement of ``vllm_class``: vLLM's class with ``route`` first, built once."""
    key = _qualified(vllm_class)
    if key not in _replacements:
        _replacements[key] = type(
            f"Ir{vllm_class.__name__}",
            (route, vllm_class),
            {"__module__": __name__, "__doc__": f"vLLM's {key}, run through vllm-ir."},
        )
    return _replacements[key]


def replacements() -> dict[str, type]:
    """``module.Name`` of each vLLM class this vLLM has that the plugin replaces -> replacement."""
    return {
        _qualified(cls): replacement(cls, target.route)
        for target in TARGETS
        for cls in _vllm_classes(target)
    }


def register_layers() -> list[str]:
    """Register the replacements; returns the layers registered now.

    Idempotent (vLLM loads plugins in every process, maybe twice). A layer
    another plugin already replaced is left to that plugin, with a warning.
    """
    done = []
    for vllm_name, cls in replacements().items():
        name = cls.__bases__[1].__name__  # vLLM's class: the key CustomOp.__new__ looks up
        custom_op, registry = _registry_of(cls)
        existing = registry.get(name)
        if existing is cls:
            continue
        if existing is not None:
            logger.warning(
                "vLLM's %s is already replaced by %s.%s (another plugin); vllm-ir leaves it",
                vllm_name,
                existing.__module__,
                existing.__qualname__,
            )
            continue
        custom_op.register_oot(name=name)(cls)
        # register_oot names the class after the key; the in-tree name keeps
        # custom_ops=["+rms_norm"] / ["-silu_and_mul"] meaning what they mean
        if "name" in vars(cls):
            delattr(cls, "name")
        done.append(vllm_name)
    _forget_shared_ropes(done)
    if done:
        for name, reason in LEFT_ALONE.items():
            logger.info("vllm-ir leaves vLLM's %s to vLLM: %s", name, reason)
    return done


def unregister_layers() -> list[str]:
    """Remove the replacements this module registered; returns their layers."""
    removed = []
    for vllm_name, cls in _replacements.items():
        name = cls.__bases__[1].__name__
        _, registry = _registry_of(cls)
        if registry.get(name) is cls:
            del registry[name]
            removed.append(vllm_name)
    _forget_shared_ropes(removed)
    return removed


def _forget_shared_ropes(changed: list[str]) -> None:
    """Empty vLLM's cache of built RoPE modules when their class changed.

    ``get_rope`` hands every model built later the module it cached for the same
    arguments: without this, a model built after ``register`` (or ``unregister``)
    would share a RoPE module of the class before it. Models built already keep
    theirs.
    """
    if not any(".rotary_embedding." in name for name in changed):
        return
    try:
        from vllm.model_executor.layers import rotary_embedding
    except ImportError:
        return
    cache = getattr(rotary_embedding, "_ROPE_DICT", None)
    if isinstance(cache, dict):
        cache.clear()
