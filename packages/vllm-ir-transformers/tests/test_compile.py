"""A kernelized Llama under torch.compile(backend="vllm_ir"): one compile, shared."""

from __future__ import annotations

import copy

import pytest
import torch
import vllm_ir as ir
from conftest import LLAMA
from operations import logits, other_state, tolerance, train_step
from vllm_ir.testing import inductor_caches_off
from vllm_ir_transformers import kernelize


@pytest.fixture(scope="module")
def compiled_llama():
    model = LLAMA.build()
    plain = copy.deepcopy(model)
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    kernelize(model)
    backend = ir.VllmIRBackend()
    compiled = torch.compile(model, backend=backend)
    # caches off: the passes run (and record their selections) on every run of the tests
    with torch.no_grad(), inductor_caches_off():
        got = compiled(ids).logits
    return want, got, backend, (plain, model, compiled, ids)


def test_compiled_logits_match(compiled_llama) -> None:
    want, got, _, _ = compiled_llama
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_every_ir_op_is_lowered(compiled_llama) -> None:
    _, _, backend, _ = compiled_llama
    selected = backend.lowering_pass.selected_impls
    assert {op: len(nodes) for op, nodes in selected.items()} == {
        "rms_norm": 3,
        "fused_add_rms_norm": 2,
        "silu_and_mul": 2,
        "rotary_embedding": 2,
    }
    for op, nodes in selected.items():
        assert set(nodes.values()) <= set(ir.get_op(op).impls), op


def test_compiled_after_loads_steps_and_a_cast(compiled_llama) -> None:
    """k01: the compiled model after in-place loads, optimizer steps, ``assign=True`` loads
    and a cast computes with the current weights (a guard recompiles, or the graph reads the
    parameters), never stale ones. Runs last: it changes the shared model."""
    _, _, _, (plain, model, compiled, ids) = compiled_llama

    def check(what: str) -> None:
        tol = tolerance(next(plain.parameters()).dtype)
        want, got = logits(plain, ids, "inference_mode"), logits(compiled, ids, "inference_mode")
        torch.testing.assert_close(got, want, **tol, msg=lambda m: f"compiled after {what}: {m}")

    for m in (plain, model):
        m.load_state_dict(other_state(LLAMA, 1, torch.float32))
    check("an in-place load_state_dict")
    train_step(plain, model, ids)
    check("an optimizer step")
    for m in (plain, model):
        m.load_state_dict(other_state(LLAMA, 2, torch.float32), assign=True)
    check("load_state_dict(assign=True)")
    for m in (plain, model):
        m.to(torch.bfloat16)
        m.load_state_dict(other_state(LLAMA, 3, torch.bfloat16))
    check(".to(bfloat16) and an in-place load")
