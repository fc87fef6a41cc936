"""Kits for provider authors: shared code of a family of impls, outside the
provider contract (:mod:`vllm_ir.provider`) and versioned with core.

* :mod:`vllm_ir.kits.norms`: what the norm family's impls share;
* :mod:`vllm_ir.kits.vendor`: wrapping a vendor library's norm kernels from a table;
* :mod:`vllm_ir.kits.quant`: the FP8 quantization tolerances.
"""
