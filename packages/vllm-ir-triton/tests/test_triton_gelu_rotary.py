"""gelu_and_mul and rotary_embedding on ``triton``: exactness, the in-place contract, declines.

The conformance kit covers them too (tests/test_triton_conformance.py); these
check what it does not: bit-exact RoPE in 16-bit dtypes, writes through Hugging
Face's transposed views, and what falls back to native.
"""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from triton_helpers import DEVICE, run_python
from vllm_ir_triton import PROVIDER, launch

ROPE = ir.ops.rotary_embedding
GELU = ir.ops.gelu_and_mul


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rotary_is_bit_exact_in_16_bit_dtypes(dtype: torch.dtype) -> None:
    # each product and the sum rounded as native's separate kernels round them
    for sample in ROPE.sample_inputs(dtype, DEVICE):
        want = ROPE.native(*sample.clone().args)
        with ROPE.set_priority([PROVIDER]):
            assert ROPE.selected_impl(*sample.args).provider == PROVIDER
            got = ROPE.maybe_inplace(*sample.clone().args)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w), sample.name


# Compiles the RoPE kernel for an sm_90 target (no GPU needed: Triton's LLVM and its
# bundled ptxas) with the launcher's options, and with FP fusion on as Triton's default,
# and prints the floating-point instructions of the PTX per dtype.
_ROPE_PTX = """
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vllm_ir_triton.kernels import rotary_embedding_kernel
from vllm_ir_triton.launch import _rotary_embedding
out = {}
for dtype in ("fp16", "bf16", "fp32"):
    sig = {"x_ptr": "*" + dtype, "x_token_stride": "i32", "x_head_stride": "i32",
           "cos_ptr": "*" + dtype, "sin_ptr": "*" + dtype, "cs_token_stride": "i32",
           "heads": "i32", "half": "i32", "IS_NEOX": "constexpr", "BLOCK": "constexpr"}
    for name, options in (("launch", _rotary_embedding.options), ("default", {})):
        src = ASTSource(rotary_embedding_kernel, sig, {"IS_NEOX": True, "BLOCK": 32})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        ops = re.findall(r"\\b(fma|mul|add|sub)\\.(?:rn\\.)?(f16|bf16|f32)\\b", k.asm["ptx"])
        out[dtype + "-" + name] = sorted({op + "." + t for op, t in ops})
print(json.dumps(out))
"""


def test_rotary_is_compiled_without_fma_contraction() -> None:
    """The cause of the one-ulp float16 difference the H200 run saw: with Triton's default
    ``enable_fp_fusion=True`` the float16 RoPE compiles to ``fma.rn.f16`` (LLVM narrows the
    rounded float32 products and their sum to half operations, then fuses them), skipping
    the rounding of a product. The launcher turns fusion off: no FMA in any dtype."""
    import json

    pytest.importorskip("triton.backends.nvidia.compiler")
    result = run_python(_ROPE_PTX, TRITON_INTERPRET=None)
    assert result.returncode == 0, result.stderr[-3000:]
    ops = json.loads(result.stdout.strip().splitlines()[-1])
    assert "fma.f16" in ops["fp16-default"], ops  # what the H200 ran
    for dtype in ("fp16", "bf16", "fp32"):
        assert not any(op.startswith("fma") for op in ops[f"{dtype}-launch"]), (dtype, ops)
    assert {"mul.f16", "sub.f16", "add.f16"} <= set(ops["fp16-launch"]), ops


def test_rotary_writes_through_hf_transposed_views() -> None:
    q_hf = torch.randn(2, 4, 3, 16, device=DEVICE)
    k_hf = torch.randn(2, 2, 3, 16, device=DEVICE)
    cos, sin = torch.randn(2, 1, 3, 8, device=DEVICE).unbind(0)  # partial: 8 of 16
    q, k = q_hf.transpose(1, 2), k_hf.transpose(1, 2)
    want = ROPE.native(q.clone(), k.clone(), cos, sin, False)
    tail = q_hf[..., 8:].clone()
    launch.rotary_embedding_(q, k, cos, sin, False)
    torch.testing.assert_close(q, want[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k, want[1], atol=1e-6, rtol=1e-6)
    assert torch.equal(q_hf[..., 8:], tail)


def test_odd_rotary_dim_and_unknown_approximate_go_to_native() -> None:
    q, k = torch.randn(3, 2, 8, device=DEVICE), torch.randn(3, 1, 8, device=DEVICE)
    cos = torch.randn(3, 7, device=DEVICE)  # odd: native (neox) computes it, the kernel cannot
    with ROPE.set_priority([PROVIDER]):
        got = ROPE(q, k, cos, cos, True)
    for g, w in zip(got, ROPE.native(q, k, cos, cos, True), strict=True):
        assert torch.equal(g, w)
    x = torch.randn(2, 8, device=DEVICE)
    with GELU.set_priority([PROVIDER]):
        assert GELU.selected_impl(x, "fast").provider == "native"
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        launch.gelu_and_mul(x, "fast")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_within_tolerance_on_a_wide_range(approximate: str) -> None:
    x = torch.linspace(-12, 12, 2 * 515, device=DEVICE).reshape(1, -1)
    want = GELU.native(x, approximate)
    tol = GELU.tolerance(torch.float32)
    torch.testing.assert_close(launch.gelu_and_mul(x, approximate), want, **vars(tol))
