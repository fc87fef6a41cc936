"""What the quantization ops' impls share: the FP8 tolerances.

An FP8 result may differ from the native one by one FP8 step where a
rounding boundary falls between two ways of computing the same value
(:data:`FP8_ONE_STEP`, measured with :func:`fp8_steps_apart`); the dynamic
scale's two spellings are :data:`FP8_DYNAMIC_SCALE`.

>>> import torch
>>> from vllm_ir.kits.quant import fp8_steps_apart
>>> a = torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)
>>> fp8_steps_apart(a, a).tolist()
[0, 0]
"""

from vllm_ir._schema.tolerances import FP8_DYNAMIC_SCALE, FP8_ONE_STEP, fp8_steps_apart

__all__ = ["FP8_DYNAMIC_SCALE", "FP8_ONE_STEP", "fp8_steps_apart"]
