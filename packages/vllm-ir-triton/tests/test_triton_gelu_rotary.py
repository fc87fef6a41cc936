"""gelu_and_mul and rotary_embedding on ``triton``: exactness, the in-place contract, declines.

The conformance kit covers them too (tests/test_triton_conformance.py); these
check what it does not: bit-exact RoPE in 16-bit dtypes, writes through Hugging
Face's transposed views, and what falls back to native.
"""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from triton_helpers import DEVICE
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
