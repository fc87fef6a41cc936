"""What users do after kernelize: casts, loads, inference mode, training, copies,
pickling, safetensors. Each operation runs on a plain HF model and its kernelized
twin (Llama, Qwen3, OLMo-2) and both must keep computing the same thing."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from conftest import Arch, arch, operation_arch_params
from operations import (
    assert_same_logits,
    ids,
    other_state,
    pair,
    pickled,
    safetensors_roundtrip,
    torch_saved,
    train_step,
)
from vllm_ir_transformers import is_kernelized, kernelize, undo
from vllm_ir_transformers.kernelize import REPORT_ATTR

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = operation_arch_params()


def _report(model):
    return model.__dict__[REPORT_ATTR]


def _assert_ops_run(model) -> None:
    """Every replacement runs its op for the model's current dtype (none silently off)."""
    report = _report(model)
    off = [s for s in report.current() if s.impl is None]
    assert not off, "\n".join(f"{s.name}: {s.runs}" for s in off)


@pytest.mark.parametrize("arch", ARCHS)
def test_casts_keep_the_replacements_running(arch: Arch) -> None:
    plain, model = pair(arch)
    for cast in ("bfloat16", "half", "float", "to_bf16"):
        for m in (plain, model):
            m.to(torch.bfloat16) if cast == "to_bf16" else getattr(m, cast)()
        dtype = next(model.parameters()).dtype
        assert_same_logits(plain, model, ids(1), "no_grad")
        _assert_ops_run(model)
        assert f"now ({str(dtype).removeprefix('torch.')}, cpu)" in str(_report(model))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("assign", [False, True], ids=["in-place", "assign"])
def test_load_state_dict(arch: Arch, assign: bool) -> None:
    plain, model = pair(arch)
    for dtype in (torch.float32, torch.bfloat16):
        for m in (plain, model):
            m.to(dtype)
            m.load_state_dict(other_state(arch, 7, dtype), assign=assign)
        assert all(p.dtype == dtype for p in model.parameters())
        assert_same_logits(plain, model, ids(2), "inference_mode")
        _assert_ops_run(model)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_inference_mode_then_training(arch: Arch, dtype: torch.dtype) -> None:
    """k02: a forward under inference_mode (after a cast) must not freeze any weight."""
    plain, model = pair(arch)
    for m in (plain, model):
        m.to(dtype)
    assert_same_logits(plain, model, ids(3), "inference_mode")
    assert_same_logits(plain, model, ids(3), "no_grad")
    train_step(plain, model, ids(4))
    assert all(p.grad is not None for p in model.parameters())
    assert not any(p.is_inference() for p in model.parameters())
    train_step(plain, model, ids(5))
    assert_same_logits(plain, model, ids(6), "inference_mode")


@pytest.mark.parametrize("arch", ARCHS)
def test_deepcopy_and_undo_of_the_copy(arch: Arch) -> None:
    """k03: undo(copy) restores the copy only; each model undoes once, on its own."""
    plain, model = pair(arch)
    clone = copy.deepcopy(model)
    assert_same_logits(plain, clone, ids(7), "no_grad")
    undo(clone)
    assert not is_kernelized(clone)
    assert is_kernelized(model)
    assert not any("forward" in m.__dict__ for m in clone.modules())
    assert_same_logits(plain, clone, ids(7), "no_grad")
    with pytest.raises(ValueError, match="was not kernelized"):
        undo(clone)
    # the original is untouched and still runs its replacements
    _assert_ops_run(model)
    assert_same_logits(plain, model, ids(7), "no_grad")
    undo(model)
    assert not is_kernelized(model)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("how", [pickled, torch_saved], ids=["pickle", "torch.save"])
def test_pickle_and_torch_save(arch: Arch, how) -> None:
    """k04: the model pickles, loads, runs the same and is still kernelized (and undoable)."""
    plain, model = pair(arch)
    model.to(torch.bfloat16)
    plain.to(torch.bfloat16)
    loaded = how(model)
    assert is_kernelized(loaded)
    _assert_ops_run(loaded)
    assert_same_logits(plain, loaded, ids(8), "inference_mode")
    train_step(plain, loaded, ids(9))
    undo(loaded)
    assert not is_kernelized(loaded)
    assert is_kernelized(model)


@pytest.mark.parametrize("arch", ARCHS)
def test_safetensors_save_model(arch: Arch, tmp_path) -> None:
    pytest.importorskip("safetensors")
    plain, model = pair(arch)
    safetensors_roundtrip(model, tmp_path / "model.safetensors")
    assert_same_logits(plain, model, ids(10), "no_grad")
    # the file holds the model's weights, loadable into the plain model
    fresh = arch.build(seed=3)
    from safetensors.torch import load_model

    load_model(fresh, str(tmp_path / "model.safetensors"))
    assert_same_logits(plain, fresh, ids(10), "no_grad")


def test_kernelized_submodule_then_the_model() -> None:
    """kernelize / undo on the model agree after a submodule was kernelized on its own."""
    plain, _ = pair(arch("llama"))
    model = copy.deepcopy(plain)
    kernelize(model.model.layers[0])
    with pytest.raises(ValueError, match=r"contains kernelized modules \(model\.layers\.0\)"):
        kernelize(model)
    undo(model)  # what the message says: restores the submodule
    assert not is_kernelized(model)
    kernelize(model)
    with pytest.raises(ValueError, match="part of a larger model"):
        kernelize(model.model.layers[1])
    with pytest.raises(ValueError, match="part of a kernelized model; call undo"):
        undo(model.model.layers[1])
    undo(model)
    assert not is_kernelized(model)


def test_report_is_recomputed_and_says_what_runs() -> None:
    gemma = arch("gemma")
    if not gemma.available():
        pytest.skip("transformers lacks Gemma")
    model = gemma.build()
    report = kernelize(model)
    assert all(s.impl is not None for s in report.current())
    text_fp32 = str(report)
    model.to(torch.bfloat16)
    # Gemma's (1 + weight) norms are exact only in float32: after the cast they run their own
    # forward, and the report says so instead of listing them as replaced and running
    now = {s.name: s for s in report.current()}
    assert now["model.norm"].impl is None
    assert "own forward" in now["model.norm"].runs
    assert "bfloat16" in now["model.norm"].runs
    assert str(report) != text_fp32
    assert "now (bfloat16, cpu)" in str(report)
    assert report.as_dict()["now"][0]["dtype"] == "bfloat16"
    model.float()
    assert all(s.impl is not None for s in report.current())
    # post-attention norms are computed by the fused layer, not by their own forward
    llama = arch("llama").build()
    text = str(kernelize(llama))
    assert "not called: model.layers.0 computes it inside fused_add_rms_norm" in text
    undo(llama)


MOE_SHARED = {"rms_norm": 5, "silu_and_mul": 2, "rotary_embedding": 2, "fused_add_rms_norm": 2}


@pytest.mark.parametrize(
    ("config", "model_cls", "extra", "expected"),
    [
        (
            "MixtralConfig",
            "MixtralForCausalLM",
            {"num_local_experts": 4},
            {"rms_norm": 5, "rotary_embedding": 2, "fused_add_rms_norm": 2},
        ),
        (
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            {"num_experts": 4, "moe_intermediate_size": 32},
            {"rms_norm": 9, "rotary_embedding": 2, "fused_add_rms_norm": 2},
        ),
        (
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            {"num_experts": 4, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64},
            MOE_SHARED,  # the shared experts are dense MLPs
        ),
    ],
    ids=["mixtral", "qwen3-moe", "qwen2-moe"],
)
def test_moe_experts_are_listed_as_left_alone(config, model_cls, extra, expected) -> None:
    moe = Arch("moe", config, model_cls, {"num_experts_per_tok": 2, **extra}, expected)
    if not moe.available():
        pytest.skip(f"transformers lacks {model_cls}")
    plain = moe.build()
    model = copy.deepcopy(plain)
    report = kernelize(model)
    assert report.by_op() == expected, str(report)
    experts = [s for s in report.skipped if s.name.endswith("mlp.experts")]
    assert len(experts) == 2, str(report)
    assert all("MoE experts" in s.reason for s in experts)
    assert "mlp.experts" in str(report)
    assert_same_logits(plain, model, ids(11), "no_grad")


def test_debug_logs_name_the_module(caplog: pytest.LogCaptureFixture) -> None:
    _, model = pair(arch("llama"))
    model.to(torch.bfloat16)
    with caplog.at_level(logging.DEBUG, logger="vllm_ir"):
        logits = model(ids(12)).logits
    assert logits.dtype == torch.bfloat16
    text = caplog.text
    for line in (
        "model.layers.0.mlp (LlamaMLP): silu_and_mul, bfloat16: impl",
        "model.layers.1 (LlamaDecoderLayer): fused_add_rms_norm, bfloat16: impl",
        "model.norm (LlamaRMSNorm): rms_norm, bfloat16: impl",
    ):
        assert line in text, text
