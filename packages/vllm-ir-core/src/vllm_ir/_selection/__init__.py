"""The selection layer: which impl runs for a call.

Size buckets, the selection key, the per-op :class:`~vllm_ir._selection.selector.Selector`
(its one rule and one miss path), the eager fast path and the compiled-eager
wrappers. The public faces are :mod:`vllm_ir.priority` and :mod:`vllm_ir.selection`.
"""
