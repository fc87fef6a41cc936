"""Which of a built vLLM model's layers run through vllm-ir, and on which impl.

:func:`layer_report` walks a model vLLM built (``LLM.apply_model(layer_report)``
hands it the model) and returns one row per layer class and impl: every vLLM
``CustomOp`` layer, the ones the plugin replaced with the provider each call form
selects, the others with why they stay vLLM's. :func:`format_report` prints the
rows as a table. On an engine whose workers run in other processes (vLLM's
default), ``apply_model`` must ship a function to them, which vLLM refuses
unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``; build the engine with
``worker_extension_cls="vllm_ir_vllm.report.LayerReportExtension"`` instead
and call ``llm.collective_rpc("ir_layer_report")``: one list of rows per
worker (per rank under tensor parallelism), by method name.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vllm_ir_vllm.layers import LEFT_ALONE, RMSNormRoute, _Routed, replacements

__all__ = ["LayerReportExtension", "LayerRow", "format_report", "layer_report"]


@dataclass(frozen=True)
class LayerRow:
    """Layers of one class that run the same impl."""

    layer: str
    """vLLM's class, qualified (the class the plugin replaced, for replaced layers)."""
    count: int
    impl: str
    """The provider each call form selects, or ``vllm (...)`` and why."""


def _is_custom_op(module: nn.Module) -> bool:
    return any(
        c.__name__ == "CustomOp" and c.__module__.startswith("vllm.") for c in type(module).__mro__
    )


def _vllm_class(module: nn.Module) -> type:
    cls = type(module)
    return cls.__bases__[1] if isinstance(module, _Routed) else cls  # (route, vLLM's class)


def _impl(module: nn.Module, dtype: torch.dtype, replaced: set[type]) -> str:
    if not isinstance(module, _Routed):
        if type(module) in replaced:
            return "vllm (built while the vllm-ir plugin was not registered)"
        name = type(module).__name__
        reason = LEFT_ALONE.get(name, "not a layer vllm-ir replaces")
        return f"vllm ({reason})"
    routed: Any = module  # a route's methods, which nn.Module's typing hides
    example = routed.ir_example(dtype)
    if isinstance(module, RMSNormRoute):
        plain = routed.ir_provider(*example)
        fused = routed.ir_provider(*example, example[0].clone())
        return str(plain) if fused == plain else f"{plain} (with residual: {fused})"
    return str(routed.ir_provider(*example))


def layer_report(model: nn.Module, dtype: torch.dtype | None = None) -> list[LayerRow]:
    """One row per vLLM layer class and impl in ``model``, most numerous first.

    ``dtype`` is the activations' (default: the model's first floating parameter's).
    Selection follows the current priorities and vLLM's current config (whether
    it enables each custom op): call it where the model runs, under its
    ``VllmConfig`` (``LLM.apply_model`` does both).
    """
    if dtype is None:
        floats = (p.dtype for p in model.parameters() if p.is_floating_point())
        dtype = next(floats, torch.get_default_dtype())
    replaced = {cls.__bases__[1] for cls in replacements().values()}
    counts: Counter[tuple[str, str]] = Counter()
    for module in model.modules():
        if _is_custom_op(module):
            cls = _vllm_class(module)
            counts[f"{cls.__module__}.{cls.__qualname__}", _impl(module, dtype, replaced)] += 1
    rows = [LayerRow(layer, n, impl) for (layer, impl), n in counts.items()]
    return sorted(rows, key=lambda r: (-r.count, r.layer))


def format_report(rows: list[LayerRow]) -> str:
    """The rows as a Markdown table (layer class, count, impl).

    >>> print(format_report([LayerRow("vllm.x.RMSNorm", 5, "cpu_c")]))
    | layer class | count | impl |
    |---|---|---|
    | `vllm.x.RMSNorm` | 5 | cpu_c |
    """
    lines = ["| layer class | count | impl |", "|---|---|---|"]
    lines += [f"| `{r.layer}` | {r.count} | {r.impl} |" for r in rows]
    return "\n".join(lines)


class LayerReportExtension:
    """A vLLM worker extension: ``LLM(..., worker_extension_cls=
    "vllm_ir_vllm.report.LayerReportExtension")`` gives each worker
    :meth:`ir_layer_report`, which ``llm.collective_rpc("ir_layer_report")`` calls
    by name (no function is serialized: vLLM's default settings suffice)."""

    def ir_layer_report(self) -> list[list[Any]]:
        """This worker's :func:`layer_report`, as ``[layer, count, impl]`` lists."""
        model = self.get_model()  # type: ignore[attr-defined]  # vLLM's worker
        return [[r.layer, r.count, r.impl] for r in layer_report(model)]
