"""RoPE through the attention forward: style detection, the op really runs, undo, pickling."""

from __future__ import annotations

import copy
import inspect
import pickle
import sys

import pytest
import torch
from conftest import LLAMA
from test_models import _RecordOps
from torch import nn
from vllm_ir_transformers import kernelize


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
    """GPT-J style (interleaved pairs), Hugging Face's calling convention."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_every_two(q) * sin, k * cos + rotate_every_two(k) * sin


class GptjAttention(nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask=None):  # type: ignore[no-untyped-def]
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        return (q + k).transpose(1, 2).flatten(-2), None


def _as_module(fn):  # type: ignore[no-untyped-def]
    """``fn`` as transformers >= 5.25 (``kernels``' ``use_kernel_forward_from_hub``) makes
    it: an ``nn.Module`` instance whose ``forward`` takes ``*args`` and carries the
    function's signature (with ``self``) in ``__signature__``."""

    class Func(nn.Module):
        def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return fn(*args, **kwargs)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += inspect.signature(fn).parameters.values()
    Func.forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return Func()


@pytest.mark.parametrize("as_module", [False, True], ids=["function", "module"])
def test_gptj_style_is_detected_and_runs_the_op(as_module: bool) -> None:
    module = sys.modules[__name__]
    installed = _as_module(apply_rotary_pos_emb) if as_module else apply_rotary_pos_emb
    module.apply_rotary_pos_emb = installed  # type: ignore[assignment]
    try:
        torch.manual_seed(0)
        attn = GptjAttention()
        x = torch.randn(1, 5, 32)
        cos, sin = torch.randn(2, 1, 5, 16).unbind(0)
        want = attn(x, (cos, sin))[0]
        report = kernelize(attn)
        assert report.by_op() == {"rotary_embedding": 1}, str(report)
        assert "rotary_embedding (gptj)" in report.replaced[0].how
        with torch.no_grad(), _RecordOps() as rec:
            got = attn(x, (cos, sin))[0]
        assert rec.ops.count("vllm_ir.rotary_embedding.maybe_inplace") == 1
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        report.undo()
        assert "forward" not in attn.__dict__
        # this module's own function was never replaced
        assert module.apply_rotary_pos_emb is installed
    finally:
        module.apply_rotary_pos_emb = apply_rotary_pos_emb  # type: ignore[assignment]


def test_other_signatures_are_left_alone() -> None:
    module = sys.modules[__name__]
    saved = module.apply_rotary_pos_emb

    def with_position_ids(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
        return saved(q, k, cos, sin, unsqueeze_dim)

    module.apply_rotary_pos_emb = with_position_ids  # type: ignore[assignment]
    try:
        report = kernelize(GptjAttention())
    finally:
        module.apply_rotary_pos_emb = saved  # type: ignore[assignment]
    assert report.replaced == []
    assert "is not (q, k, cos, sin[, unsqueeze_dim])" in report.skipped[0].reason


def test_llama_rope_goes_through_the_op_and_undo_restores() -> None:
    import transformers.models.llama.modeling_llama as modeling

    before = modeling.apply_rotary_pos_emb
    model = LLAMA.build()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = model(ids).logits
    report = kernelize(model, ops=["rotary_embedding"])
    assert report.by_op() == {"rotary_embedding": 2}
    with torch.no_grad(), _RecordOps() as rec:
        got = model(ids).logits
    assert rec.ops.count("vllm_ir.rotary_embedding.maybe_inplace") == 2
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # a deep copy and a pickle round trip keep a working replacement
    clone = pickle.loads(pickle.dumps(copy.deepcopy(model)))
    with torch.no_grad():
        torch.testing.assert_close(clone(ids).logits, want, atol=1e-5, rtol=1e-5)
    report.undo()
    attns = [m for n, m in model.named_modules() if n.endswith("self_attn")]
    assert all("forward" not in m.__dict__ for m in attns)
    assert modeling.apply_rotary_pos_emb is before
