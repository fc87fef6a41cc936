"""vLLM's hardware-agnostic layers, run through vllm-ir ops (imports vLLM).

Each class subclasses vLLM's hardware-agnostic layer and is registered with
``CustomOp.register_oot(name=<class name>)``, so ``CustomOp.__new__`` builds it
wherever vLLM builds that layer; ``__init__``, weights and ``forward_native``
stay vLLM's own. vLLM 0.34 requires the subclassing (its ``CustomOp.__new__``
raises ``TypeError`` for an override that does not derive from the layer it
replaces) and builds the Transformers backend's layers from
``hw_agnostic.resolve(module, name)``, which is that layer under
``VLLM_USE_HW_AGNOSTIC=1`` (else vLLM's in-tree layer, which the plugin leaves
alone).

vLLM calls ``forward_oot`` only on out-of-tree *platforms*; these classes run
it on every platform whenever vLLM enables the op (``custom_ops``: ``all``,
``+rms_norm``, ``+silu_and_mul``), and vLLM's ``forward_native`` when it
disables it (``none``, the default under Inductor compilation, or
``-rms_norm``), so Inductor still sees plain torch code to fuse. The class
keeps the in-tree ``name`` so those switches keep their meaning.
"""

from __future__ import annotations

from typing import Any

import torch
import vllm_ir as ir
from vllm.model_executor.hw_agnostic.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.hw_agnostic.layers.activation import SiluAndMul
from vllm.model_executor.hw_agnostic.layers.layernorm import RMSNorm
from vllm_ir.provider import get_logger

from vllm_ir_vllm.semantics import rms_norm_mismatch

__all__ = ["REPLACED", "IrRMSNorm", "IrSiluAndMul", "register_layers", "unregister_layers"]

logger = get_logger("vllm_ir.vllm")

_declined: set[str] = set()


def _decline(reason: str) -> None:
    """Log once per reason that a layer runs vLLM's native forward instead of an IR op."""
    # not while Dynamo traces: logging would break the graph (the reason is
    # logged by the first eager call; the numerics are vLLM's either way)
    if reason not in _declined and not torch.compiler.is_compiling():
        _declined.add(reason)
        logger.warning("vLLM's native forward runs instead of vllm-ir: %s", reason)


class _Routed(CustomOp):
    """Runs ``forward_oot`` whenever vLLM enables the op, on every platform."""

    def dispatch_forward(self, compile_native: bool) -> Any:
        forward = super().dispatch_forward(compile_native)  # records enabled/disabled
        if self._enforce_enable or self.enabled():
            return self.forward_oot
        return forward

    def routes_to_ir(self) -> bool:
        """Whether vLLM enabled this op, so calls go to vllm-ir (else vLLM's native)."""
        return bool(self._forward_method == self.forward_oot)


class IrRMSNorm(_Routed, RMSNorm):
    """vLLM's ``RMSNorm``: ``rms_norm``, or ``fused_add_rms_norm.maybe_inplace`` with a residual.

    The residual form donates ``x`` and ``residual``, as vLLM's own IR layer
    (``vllm.model_executor.layers.layernorm``) does: callers rebind both.
    """

    def _mismatch(self, x: torch.Tensor, residual: torch.Tensor | None) -> str | None:
        weight_dtype = self.weight.dtype if self.has_weight else None
        return rms_norm_mismatch(
            x.dtype, None if residual is None else residual.dtype, weight_dtype
        )

    def forward_oot(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        reason = self._mismatch(x, residual)
        if reason is not None:
            _decline(reason)
            return self.forward_native(x, residual)
        weight = self.weight if self.has_weight else None
        eps, size = self.variance_epsilon, self.variance_size_override
        if residual is None:
            return ir.ops.rms_norm(x, weight, eps, size)  # type: ignore[no-any-return]
        out, new_residual = ir.ops.fused_add_rms_norm.maybe_inplace(x, residual, weight, eps, size)
        return out, new_residual

    def ir_provider(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> str:
        """Which kernel a call with these arguments runs: a provider, or why vLLM's native."""
        if not self.routes_to_ir():
            return "vllm native (custom op rms_norm disabled)"
        reason = self._mismatch(x, residual)
        if reason is not None:
            return f"vllm native ({reason})"
        weight = self.weight if self.has_weight else None
        eps, size = self.variance_epsilon, self.variance_size_override
        if residual is None:
            return ir.ops.rms_norm.selected_impl(x, weight, eps, size).provider
        return ir.ops.fused_add_rms_norm.selected_impl(x, residual, weight, eps, size).provider


class IrSiluAndMul(_Routed, SiluAndMul):
    """vLLM's ``SiluAndMul``: ``silu_and_mul`` (the same expression in both)."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.silu_and_mul(x)  # type: ignore[no-any-return]

    def ir_provider(self, x: torch.Tensor) -> str:
        """Which kernel a call with ``x`` runs: a provider, or vLLM's native."""
        if not self.routes_to_ir():
            return "vllm native (custom op silu_and_mul disabled)"
        return ir.ops.silu_and_mul.selected_impl(x).provider


REPLACED: dict[str, type[CustomOp]] = {"RMSNorm": IrRMSNorm, "SiluAndMul": IrSiluAndMul}
"""In-tree class name (the key ``CustomOp.__new__`` looks up) -> replacement."""


def register_layers() -> list[str]:
    """Register the replacements; returns the names registered now.

    Idempotent (vLLM loads plugins in every process, maybe twice). A layer
    another plugin already replaced is left to that plugin, with a warning.
    """
    done = []
    for name, cls in REPLACED.items():
        existing = op_registry_oot.get(name)
        if existing is cls:
            continue
        if existing is not None:
            logger.warning(
                "vLLM's %s is already replaced by %s.%s (another plugin); vllm-ir leaves it",
                name,
                existing.__module__,
                existing.__qualname__,
            )
            continue
        CustomOp.register_oot(name=name)(cls)
        # register_oot names the class after the key; the in-tree name keeps
        # custom_ops=["+rms_norm"] / ["-silu_and_mul"] meaning what they mean
        if "name" in vars(cls):
            del cls.name
        done.append(name)
    return done


def unregister_layers() -> list[str]:
    """Remove the replacements this module registered; returns their names."""
    removed = []
    for name, cls in REPLACED.items():
        if op_registry_oot.get(name) is cls:
            del op_registry_oot[name]
            removed.append(name)
    return removed
