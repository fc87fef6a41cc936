"""kernelize on hand-written modules: recognition by behaviour, skips with reasons,
bad input, dry runs, rollback and undo."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import ARCHS, LLAMA
from torch import nn
from vllm_ir_transformers import SUPPORTED_OPS, is_kernelized, kernelize, undo
from vllm_ir_transformers import decoder as decoder_module


class UnseenNorm(nn.Module):
    """An RMSNorm no class list knows, with its epsilon under another name."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.epsilon = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.epsilon)).to(x.dtype)


class ShiftedNorm(UnseenNorm):
    """Looks like an RMSNorm (weight, epsilon) but adds a constant: must be skipped."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 0.01


class Mlp(nn.Module):
    def __init__(self, hidden: int = 32, inter: int = 48, act=F.silu, bias=(False, False)) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias[0])
        self.up_proj = nn.Linear(hidden, inter, bias=bias[1])
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class SwappedMlp(Mlp):
    """SiLU on the up projection instead of the gate: must be skipped."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.norm = UnseenNorm(hidden)
        self.mlp = Mlp(hidden)
        self.other = ShiftedNorm(hidden)
        self.ln = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.other(self.mlp(self.norm(x))))


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_recognizes_by_behaviour_and_reports_skips() -> None:
    torch.manual_seed(0)
    block = Block()
    x = _x(3, 32)
    with torch.no_grad():
        want = block(x)
        report = kernelize(block)
        got = block(x)
    assert [(r.name, r.op) for r in report.replaced] == [
        ("norm", "rms_norm"),
        ("mlp", "silu_and_mul"),
    ]
    skipped = {s.name: s.reason for s in report.skipped}
    assert skipped.keys() == {"other", "ln"}
    assert "does not compute RMSNorm" in skipped["other"]
    assert "has a bias" in skipped["ln"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert "mlp (Mlp) -> silu_and_mul" in str(report)
    assert report.as_dict()["replaced"][0]["op"] == "rms_norm"


@pytest.mark.parametrize(
    ("mlp", "reason"),
    [
        (Mlp(act=F.gelu), "maps to gelu_and_mul, not chosen"),
        (Mlp(act=F.relu), "neither SiLU nor GELU"),
        (Mlp(bias=(True, False)), "only one of gate_proj and up_proj has a bias"),
        (SwappedMlp(), "fused forward differs"),
    ],
    ids=["gelu-not-chosen", "relu", "one-bias", "swapped"],
)
def test_mlps_that_cannot_fuse_are_skipped(mlp: nn.Module, reason: str) -> None:
    report = kernelize(mlp, ops=["silu_and_mul"])
    assert report.replaced == []
    assert len(report.skipped) == 1
    assert reason in report.skipped[0].reason


def test_mlp_with_biases_fuses_and_follows_weight_updates() -> None:
    torch.manual_seed(0)
    mlp = Mlp(bias=(True, True))
    reference = copy.deepcopy(mlp)
    kernelize(mlp)
    x = _x(4, 32)
    with torch.no_grad():
        # an in-place update (an optimizer step, load_state_dict) reaches the fused weight
        for m in (mlp, reference):
            m.gate_proj.weight.mul_(1.5)
            m.up_proj.bias.add_(0.25)
        torch.testing.assert_close(mlp(x), reference(x), atol=1e-6, rtol=1e-6)
        # a reassigned parameter is picked up in eager mode
        new = nn.Parameter(torch.randn_like(mlp.up_proj.weight))
        mlp.up_proj.weight = new
        reference.up_proj.weight = nn.Parameter(new.detach().clone())
        torch.testing.assert_close(mlp(x), reference(x), atol=1e-6, rtol=1e-6)
        # a model cast after kernelize
        mlp.double()
        reference.double()
        torch.testing.assert_close(mlp(x.double()), reference(x.double()))


def test_bad_input() -> None:
    with pytest.raises(TypeError, match=r"expects a torch\.nn\.Module, got dict"):
        kernelize({"weight": torch.ones(4)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown op\(s\) 'layer_norm'.*supported: rms_norm"):
        kernelize(Block(), ops=["rms_norm", "layer_norm"])
    with pytest.raises(TypeError, match="list of op names"):
        kernelize(Block(), ops="rms_norm")
    block = Block()
    kernelize(block)
    with pytest.raises(ValueError, match="already kernelized; call undo"):
        kernelize(block)
    with pytest.raises(ValueError, match="already kernelized"):
        kernelize(block.mlp)  # a submodule of a kernelized model
    undo(block)
    with pytest.raises(ValueError, match="was not kernelized"):
        undo(block)
    assert set(SUPPORTED_OPS) == {
        "rms_norm",
        "silu_and_mul",
        "gelu_and_mul",
        "rotary_embedding",
        "fused_add_rms_norm",
    }


def test_meta_quantized_and_subclassed_weights_are_skipped() -> None:
    with torch.device("meta"):
        meta_block = Block()
    report = kernelize(meta_block)
    assert report.replaced == []
    assert all("meta device" in s.reason for s in report.skipped if s.name in ("norm", "mlp"))

    quantized = Mlp()
    quantized.up_proj.weight = nn.Parameter(
        torch.zeros(48, 32, dtype=torch.int8), requires_grad=False
    )
    report = kernelize(quantized)
    assert "dtype torch.int8 (quantized?)" in report.skipped[0].reason

    class Sharded(torch.Tensor):
        pass

    norm = UnseenNorm(16)
    norm.weight = nn.Parameter(torch.ones(16).as_subclass(Sharded))
    report = kernelize(norm)
    assert "is a Sharded, not a plain tensor" in report.skipped[0].reason


def test_gemma_bf16_norms_are_left_alone_gelu_and_rope_are_not() -> None:
    gemma = next(a for a in ARCHS if a.name == "gemma")
    if not gemma.available():
        pytest.skip("transformers lacks Gemma")
    model = gemma.build(dtype=torch.bfloat16)
    report = kernelize(model)
    # the tanh-GELU MLPs and RoPE are exact in bf16; the (1 + weight) norms are not
    assert report.by_op() == {"gelu_and_mul": 2, "rotary_embedding": 2}
    assert "gelu_and_mul(approximate='tanh')" in str(report)
    norm_skips = [s for s in report.skipped if s.op == "rms_norm"]
    assert len(norm_skips) == 5
    assert all("(1 + weight)" in s.reason for s in norm_skips)
    norms = [m for n, m in model.named_modules() if n.endswith("layernorm") or n == "model.norm"]
    assert all("forward" not in m.__dict__ for m in norms)


def test_dry_run_changes_nothing() -> None:
    model = LLAMA.build()
    report = kernelize(model, dry_run=True)
    assert report.dry_run
    assert report.by_op() == {
        "rms_norm": 5,
        "silu_and_mul": 2,
        "rotary_embedding": 2,
        "fused_add_rms_norm": 2,
    }
    assert not is_kernelized(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert "would replace 11 modules" in str(report)
    with pytest.raises(RuntimeError, match="dry run"):
        report.undo()
    kernelize(model).undo()  # a dry run leaves the model free to kernelize


def test_ops_selects_what_is_replaced() -> None:
    model = LLAMA.build()
    report = kernelize(model, ops=["fused_add_rms_norm"])
    assert report.by_op() == {"fused_add_rms_norm": 2}
    # the norms were verified for the fused op but their own forwards are untouched
    assert "forward" not in model.model.norm.__dict__


def test_failure_while_applying_rolls_everything_back(monkeypatch) -> None:
    model = LLAMA.build()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    real = decoder_module.apply_decoder

    def failing(module, spec):
        raise RuntimeError("boom")

    monkeypatch.setattr(decoder_module, "apply_decoder", failing)
    with pytest.raises(RuntimeError, match="boom"):
        kernelize(model)
    assert not is_kernelized(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert not any(n.startswith("_vllm_ir") for n, _ in model.named_buffers())
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    # the gate/up weights no longer share storage with a fused weight
    mlp = model.model.layers[0].mlp
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() != (
        mlp.up_proj.weight.untyped_storage().data_ptr()
    )
    monkeypatch.setattr(decoder_module, "apply_decoder", real)
    kernelize(model)


def test_post_norm_decoder_layer_is_skipped() -> None:
    """A layer with the Llama attribute names but a post-norm data flow."""

    class PostNormLayer(nn.Module):
        def __init__(self, hidden: int = 32) -> None:
            super().__init__()
            self.input_layernorm = UnseenNorm(hidden)
            self.post_attention_layernorm = UnseenNorm(hidden)
            self.self_attn = nn.Linear(hidden, hidden)
            self.mlp = Mlp(hidden)

        def forward(self, hidden_states, attention_mask=None, **kwargs):
            residual = hidden_states
            h = self.self_attn(
                hidden_states=hidden_states, attention_mask=attention_mask, **kwargs
            )[0]
            h = self.post_attention_layernorm(h) + residual
            return h + self.mlp(h)

    report = kernelize(PostNormLayer())
    [skip] = [s for s in report.skipped if s.op == "fused_add_rms_norm"]
    assert "does not compute residual + attention" in skip.reason


def test_modules_whose_forward_is_already_patched_are_left_alone() -> None:
    """An instance-level forward (accelerate's hooks do this) would be dropped by ours."""
    import functools

    block = Block()
    calls = []

    def hooked(module, x):
        calls.append(1)
        return type(module).forward(module, x)

    block.mlp.forward = functools.partial(hooked, block.mlp)
    report = kernelize(block)
    assert [r.name for r in report.replaced] == ["norm"]
    [skip] = [s for s in report.skipped if s.name == "mlp"]
    assert "already replaced on the instance" in skip.reason
    block(_x(2, 32))
    assert calls == [1]
    undo(block)
    assert "forward" in block.mlp.__dict__  # not ours: undo leaves it
