"""Random sequences of what users do after kernelize, applied to a plain HF model and
to its kernelized twin: logits, gradients and parameters after optimizer steps must
agree after every step. Eager here; the compiled sequence is in test_compile.py (it
reuses that file's compiled model: a cold Inductor compile costs ~20 s)."""

from __future__ import annotations

import copy
import random

import operations as user
import pytest
import torch
from conftest import Arch, operation_arch_params
from vllm_ir_transformers import is_kernelized, kernelize, undo
from vllm_ir_transformers.kernelize import REPORT_ATTR

pytestmark = pytest.mark.usefixtures("one_thread")

OPERATIONS = (
    "to_bf16",
    "half",
    "float",
    "load_state_dict",
    "load_state_dict_assign",
    "inference_mode_forward",
    "no_grad_forward",
    "train_step",
    "deepcopy",
    "pickle",
    "torch_save",
    "safetensors",
    "undo_and_kernelize",
)
SEQUENCES = 8
LENGTH = 8


def _apply(op: str, plain, model, arch: Arch, step: int, tmp_path):
    """Apply ``op`` to both models (the kernelize-only steps to the twin); return them."""
    dtype = next(plain.parameters()).dtype
    if op in ("to_bf16", "half", "float"):
        for m in (plain, model):
            m.to(torch.bfloat16) if op == "to_bf16" else getattr(m, op)()
    elif op.startswith("load_state_dict"):
        assign = op.endswith("assign")
        for m in (plain, model):
            m.load_state_dict(user.other_state(arch, 100 + step, dtype), assign=assign)
    elif op in ("inference_mode_forward", "no_grad_forward"):
        user.assert_same_logits(plain, model, user.ids(step), op.removesuffix("_forward"))
    elif op == "train_step":
        user.train_step(plain, model, user.ids(step))
    elif op == "deepcopy":
        plain, model = copy.deepcopy(plain), copy.deepcopy(model)
    elif op == "pickle":
        plain, model = user.pickled(plain), user.pickled(model)
    elif op == "torch_save":
        plain, model = user.torch_saved(plain), user.torch_saved(model)
    elif op == "safetensors":
        user.safetensors_roundtrip(plain, tmp_path / f"plain{step}.safetensors")
        user.safetensors_roundtrip(model, tmp_path / f"model{step}.safetensors")
    elif op == "undo_and_kernelize":
        undo(model)
        kernelize(model)
    else:
        raise AssertionError(op)
    return plain, model


def _check(plain, model, step: int) -> None:
    assert is_kernelized(model)
    off = [s for s in model.__dict__[REPORT_ATTR].current() if s.impl is None]
    assert not off, [f"{s.name}: {s.runs}" for s in off]
    user.assert_same_logits(plain, model, user.ids(1000 + step), "no_grad")


@pytest.mark.parametrize("arch", operation_arch_params())
def test_random_operation_sequences(arch: Arch, tmp_path) -> None:
    pytest.importorskip("safetensors")
    for seq in range(SEQUENCES):
        rng = random.Random(f"{arch.name}-{seq}")
        ops = [rng.choice(OPERATIONS) for _ in range(LENGTH)] + ["train_step"]
        plain, model = user.pair(arch, seed=seq)
        for step, op in enumerate(ops):
            try:
                plain, model = _apply(op, plain, model, arch, step, tmp_path)
                _check(plain, model, step)
            except Exception as e:
                raise AssertionError(f"sequence {seq} {ops}, step {step} ({op}): {e}") from e
