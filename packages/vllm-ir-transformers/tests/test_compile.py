"""A kernelized Llama under torch.compile(backend="vllm_ir"): one compile, shared."""

from __future__ import annotations

import pytest
import torch
import vllm_ir as ir
from conftest import LLAMA
from vllm_ir.testing import inductor_caches_off
from vllm_ir_transformers import kernelize


@pytest.fixture(scope="module")
def compiled_llama():
    model = LLAMA.build()
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    kernelize(model)
    backend = ir.VllmIRBackend()
    compiled = torch.compile(model, backend=backend)
    # caches off: the passes run (and record their selections) on every run of the tests
    with torch.no_grad(), inductor_caches_off():
        got = compiled(ids).logits
    return want, got, backend


def test_compiled_logits_match(compiled_llama) -> None:
    want, got, _ = compiled_llama
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_every_ir_op_is_lowered(compiled_llama) -> None:
    _, _, backend = compiled_llama
    selected = backend.lowering_pass.selected_impls
    assert {op: len(nodes) for op, nodes in selected.items()} == {
        "rms_norm": 3,
        "fused_add_rms_norm": 2,
        "silu_and_mul": 2,
    }
    providers = {p for nodes in selected.values() for p in nodes.values()}
    assert providers <= set(ir.ops.rms_norm.impls) | set(ir.ops.silu_and_mul.impls)
