"""The kernels compile for real GPU targets, ahead of time, without a GPU.

The interpreter accepts code the GPU compilers reject (it runs numpy), so
each kernel is compiled here by Triton itself for an NVIDIA (sm_90 -> cubin)
and an AMD (gfx942 -> hsaco) target, in a fresh process without
``TRITON_INTERPRET``. This checks compilation only; numerics on a GPU are
checked by the other tests when they run on one.
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

COMMON = {"w_ptr": "*{dt}", "w_stride": "i32", "n_cols": "i32", "epsilon": "fp32",
          "HAS_WEIGHT": "constexpr", "BLOCK": "constexpr", "SINGLE_PASS": "constexpr"}
SIGNATURES = {
    "rms_norm_kernel": {"x_ptr": "*{dt}", "x_row_stride": "i64", "x_col_stride": "i32",
                        "out_ptr": "*{dt}", "out_row_stride": "i64", "out_col_stride": "i32"},
    "fused_add_rms_norm_kernel": {"x_ptr": "*{dt}", "x_row_stride": "i64",
                                  "x_col_stride": "i32", "r_ptr": "*{dt}",
                                  "r_row_stride": "i64", "r_col_stride": "i32"},
}
TARGETS = {"nvidia": GPUTarget("cuda", 90, 32), "amd": GPUTarget("hip", "gfx942", 64)}
results = {}
for backend, target in TARGETS.items():
    if backend not in triton.backends.backends:
        results[backend] = "backend not installed"
        continue
    for name, own in SIGNATURES.items():
        params = list(getattr(kernels, name).arg_names)
        # bfloat16 exercises the rounding helper; both loop shapes, with and without weight
        for dt, single, has_w in (("bf16", False, True), ("fp16", True, False)):
            types = {**own, **COMMON}
            sig = {p: types[p].format(dt=dt) for p in params}
            src = ASTSource(fn=getattr(kernels, name), signature=sig,
                            constexprs={"HAS_WEIGHT": has_w, "BLOCK": 1024, "SINGLE_PASS": single})
            key = f"{backend}:{name}:{dt}:{single}:{has_w}"
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
