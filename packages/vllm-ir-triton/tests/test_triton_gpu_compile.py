"""The kernels compile for real GPU targets, ahead of time, without a GPU.

The interpreter accepts code the GPU compilers reject (it runs numpy), so
each kernel (with the compile-time flags that change its code most: FP8
quantization, the loop over blocks) is compiled here by Triton itself for an
NVIDIA (sm_90 -> cubin) and an AMD (gfx942 -> hsaco) target, in a fresh
process without ``TRITON_INTERPRET``. This checks compilation only; numerics
on a GPU are checked by the other tests when they run on one.
"""

from __future__ import annotations

import json

import pytest
from triton_helpers import run_python

CODE = """
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vllm_ir_triton import kernels

ROWS = {"x_ptr": "*{dt}", "x_row_stride": "i64", "x_col_stride": "i32"}
NORM = {"w_ptr": "*{dt}", "w_stride": "i32", "scale_ptr": "*fp32", "n_cols": "i32",
        "epsilon": "fp32"}
FP8_OUT = {"q_ptr": "*u8", "q_row_stride": "i64", "q_col_stride": "i32"}
TYPES = {
    "rms_norm_kernel": {**ROWS, **NORM, "out_ptr": "*{out}", "out_row_stride": "i64",
                        "out_col_stride": "i32"},
    "fused_add_rms_norm_kernel": {**ROWS, **NORM, **FP8_OUT, "r_ptr": "*{dt}",
                                  "r_row_stride": "i64", "r_col_stride": "i32"},
    "silu_and_mul_kernel": {**ROWS, "out_ptr": "*{dt}", "out_row_stride": "i64",
                            "out_col_stride": "i32", "d": "i32"},
    "static_scaled_fp8_quant_kernel": {**ROWS, **FP8_OUT, "scale_ptr": "*fp32", "n_cols": "i32"},
    "dynamic_per_token_fp8_quant_kernel": {**ROWS, **FP8_OUT, "scales_ptr": "*fp32",
                                           "ub_ptr": "*fp32", "n_cols": "i32",
                                           "min_scale": "fp32", "inv_fp8_max": "fp32"},
}
# bfloat16 exercises the rounding helper; both loop shapes, with and without weight,
# FP8 quantization on and off
VARIANTS = {
    "rms_norm_kernel": [
        ("bf16", {"HAS_WEIGHT": True, "QUANT": False, "SINGLE_PASS": False}),
        ("fp16", {"HAS_WEIGHT": False, "QUANT": True, "SINGLE_PASS": True}),
    ],
    "fused_add_rms_norm_kernel": [
        ("bf16", {"HAS_WEIGHT": True, "QUANT": False, "SINGLE_PASS": False}),
        ("bf16", {"HAS_WEIGHT": True, "QUANT": True, "SINGLE_PASS": True}),
    ],
    "silu_and_mul_kernel": [("bf16", {})],
    "static_scaled_fp8_quant_kernel": [("fp16", {})],
    "dynamic_per_token_fp8_quant_kernel": [
        ("bf16", {"HAS_UB": True, "RECIPROCAL_SCALE": True, "SINGLE_PASS": True}),
        ("fp32", {"HAS_UB": False, "RECIPROCAL_SCALE": False, "SINGLE_PASS": False}),
    ],
}
TARGETS = {"nvidia": GPUTarget("cuda", 90, 32), "amd": GPUTarget("hip", "gfx942", 64)}
results = {}
for backend, target in TARGETS.items():
    if backend not in triton.backends.backends:
        results[backend] = "backend not installed"
        continue
    for name, variants in VARIANTS.items():
        fn = getattr(kernels, name)
        for dt, flags in variants:
            constexprs = {**flags, "BLOCK": 1024}
            out = "u8" if flags.get("QUANT") else dt
            types = {p: t.format(dt=dt, out=out) for p, t in TYPES[name].items()}
            sig = {p: "constexpr" if p in constexprs else types[p] for p in fn.arg_names}
            src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
            key = f"{backend}:{name}:{dt}:{sorted(flags.items())}"
            try:
                binary = triton.compile(src, target=target, options={"num_warps": 4})
                results[key] = sorted(binary.asm)
            except Exception as e:
                results[key] = f"{type(e).__name__}: {e}"
print(json.dumps(results))
"""


def test_kernels_compile_for_gpu_targets() -> None:
    proc = run_python(CODE, TRITON_INTERPRET=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    failures = {k: v for k, v in results.items() if isinstance(v, str)}
    compiled = {k: v for k, v in results.items() if not isinstance(v, str)}
    if not compiled:
        pytest.skip(f"no GPU backend in this Triton: {failures}")
    assert not {k: v for k, v in failures.items() if ":" in k}, failures
    for key, artifacts in compiled.items():
        assert ("cubin" if key.startswith("nvidia") else "hsaco") in artifacts, key
