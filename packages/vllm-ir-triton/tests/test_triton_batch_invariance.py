"""``triton_batch_invariant``: a row's result does not depend on the batch around it.

Each row is computed alone and inside a large batch, at several positions,
and compared bit for bit. Hidden sizes cover one block (96) and the loop over
fixed 1024-column blocks (1500).

``triton``'s ``silu_and_mul``, ``static_scaled_fp8_quant`` and
``dynamic_per_token_fp8_quant`` are registered batch invariant too
(elementwise, or reducing with an exact maximum): checked the same way.
"""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from triton_helpers import DEVICE, DTYPES
from vllm_ir_triton import BATCH_INVARIANT_PROVIDER, PROVIDER

BATCH = 32
ROWS = (0, 17, BATCH - 1)


def _batch(dtype: torch.dtype, hidden: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, hidden, generator=g).to(dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("hidden", [96, 1500])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_row_alone_equals_row_in_batch(dtype: torch.dtype, hidden: int) -> None:
    op = ir.ops.rms_norm
    x = _batch(dtype, hidden, 0)
    w = (1 + 0.1 * torch.randn(hidden)).to(dtype=dtype, device=DEVICE)
    with op.set_priority([BATCH_INVARIANT_PROVIDER]):
        assert op.selected_impl(x, w, 1e-6).provider == BATCH_INVARIANT_PROVIDER
        batched = op(x, w, 1e-6)
        for i in ROWS:
            alone = op(x[i : i + 1].clone(), w, 1e-6)
            assert torch.equal(alone[0], batched[i]), f"row {i}"
            assert torch.equal(op(x[i].clone(), w, 1e-6), batched[i]), f"row {i}, 1-D"


@pytest.mark.parametrize("hidden", [96, 1500])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rms_norm_row_alone_equals_row_in_batch(dtype: torch.dtype, hidden: int) -> None:
    op = ir.ops.fused_add_rms_norm
    x, r = _batch(dtype, hidden, 1), _batch(dtype, hidden, 2)
    with op.set_priority([BATCH_INVARIANT_PROVIDER]):
        out, residual = op(x, r, None, 1e-6)
        for i in ROWS:
            alone_out, alone_residual = op.maybe_inplace(
                x[i : i + 1].clone(), r[i : i + 1].clone(), None, 1e-6
            )
            assert torch.equal(alone_out[0], out[i]), f"row {i}"
            assert torch.equal(alone_residual[0], residual[i]), f"row {i}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_elementwise_and_quant_ops_row_alone_equals_row_in_batch(dtype: torch.dtype) -> None:
    x = _batch(dtype, 96, 3)
    scale = torch.tensor([0.02], device=DEVICE)
    others: dict[ir.IrOp, tuple[torch.Tensor, ...]] = {
        ir.ops.silu_and_mul: (),
        ir.ops.static_scaled_fp8_quant: (scale,),
        ir.ops.dynamic_per_token_fp8_quant: (),
    }
    for op, rest in others.items():
        assert op.impls[PROVIDER].batch_invariant
        with op.set_priority([PROVIDER]):
            assert op.selected_impl(x, *rest).provider == PROVIDER
            batched = _outputs(op(x, *rest))
            for i in ROWS:
                alone = _outputs(op(x[i : i + 1].clone(), *rest))
                for got, want in zip(alone, batched, strict=True):
                    assert torch.equal(got[0], want[i]), f"{op.name} row {i}"


def _outputs(out: torch.Tensor | tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Every output, FP8 ones as their bits."""
    outs = out if isinstance(out, tuple) else (out,)
    return [o.view(torch.uint8) if o.dtype == torch.float8_e4m3fn else o for o in outs]
