"""Every supported architecture, tiny and random: same logits, tokens, KV-cache decode
and gradients after kernelize; undo restores the model exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import CACHE, LLAMA, Arch, arch_params
from torch.utils._python_dispatch import TorchDispatchMode
from vllm_ir_transformers import is_kernelized, kernelize, undo

# float32 models; kernels (cpu_c when installed) differ from torch in summation order only
ATOL = RTOL = 2e-5


def _ids(batch: int = 2, length: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", arch_params())
def test_logits_generate_and_undo(arch: Arch) -> None:
    model = arch.build()
    ids = _ids()
    params_before = dict(model.named_parameters())
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        want = model(ids).logits
        want_tokens = model.generate(ids, max_new_tokens=5, do_sample=False)

    report = kernelize(model)
    assert report.by_op() == arch.expected, str(report)
    assert is_kernelized(model)
    with torch.no_grad():
        got = model(ids).logits
        got_tokens = model.generate(ids, max_new_tokens=5, do_sample=False)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert torch.equal(got_tokens, want_tokens)
    # the parameters are the same objects with the same values while kernelized
    assert dict(model.named_parameters()) == params_before
    assert model.state_dict().keys() == state_before.keys()

    undo(model)
    assert not is_kernelized(model)
    assert all(p is params_before[n] for n, p in model.named_parameters())
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in state_before.items())
    assert not any("forward" in m.__dict__ for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_kv_cache_decode_loop() -> None:
    """Prefill, then one token at a time with the cache: every step's logits match."""
    reference = LLAMA.build()
    model = copy.deepcopy(reference)
    kernelize(model)
    ids = _ids(batch=1, length=5)
    with torch.no_grad():
        out_ref = reference(ids, use_cache=True)
        out = model(ids, use_cache=True)
        cache_ref, cache = getattr(out_ref, CACHE), getattr(out, CACHE)
        token = out_ref.logits[:, -1:].argmax(-1)
        for _ in range(4):
            out_ref = reference(token, **{CACHE: cache_ref}, use_cache=True)
            out = model(token, **{CACHE: cache}, use_cache=True)
            torch.testing.assert_close(out.logits, out_ref.logits, atol=ATOL, rtol=RTOL)
            cache_ref, cache = getattr(out_ref, CACHE), getattr(out, CACHE)
            token = out_ref.logits[:, -1:].argmax(-1)
    assert cache.get_seq_length() == 9


@pytest.mark.parametrize("arch", [LLAMA, arch_params()[4].values[0]], ids=["llama", "phi3"])
def test_gradients_flow(arch: Arch) -> None:
    reference = arch.build().train()
    model = copy.deepcopy(reference)
    report = kernelize(model)
    assert report.by_op()["fused_add_rms_norm"] == 2
    ids = _ids()
    for m in (reference, model):
        m(ids, labels=ids).loss.backward()
    ref_grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, ref_grads[name].grad, atol=1e-5, rtol=1e-4, msg=name)


class _RecordOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_calls_go_through_ir_ops() -> None:
    model = LLAMA.build()
    ids = _ids(batch=1, length=3)
    for kernelized in (False, True):
        if kernelized:
            kernelize(model)
        with torch.no_grad(), _RecordOps() as rec:
            model(ids)
        ir_calls = sorted({o for o in rec.ops if o.startswith("vllm_ir.")})
        if not kernelized:
            assert ir_calls == []
        else:
            # eager decoder layers donate: maybe_inplace
            assert ir_calls == [
                "vllm_ir.fused_add_rms_norm.maybe_inplace",
                "vllm_ir.rms_norm.default",
                "vllm_ir.rotary_embedding.maybe_inplace",
                "vllm_ir.silu_and_mul.default",
            ]
            counts = {o: rec.ops.count(o) for o in ir_calls}
            assert counts == {
                "vllm_ir.fused_add_rms_norm.maybe_inplace": 2,
                "vllm_ir.rms_norm.default": 3,  # input_layernorm x2 + final norm
                # q and k of each layer's projections, donated
                "vllm_ir.rotary_embedding.maybe_inplace": 2,
                "vllm_ir.silu_and_mul.default": 2,
            }


def test_output_hidden_states_are_not_clobbered() -> None:
    """The layer input (recorded by output_hidden_states) is never donated."""
    reference = LLAMA.build()
    model = copy.deepcopy(reference)
    kernelize(model)
    ids = _ids()
    with torch.no_grad():
        want = reference(ids, output_hidden_states=True).hidden_states
        got = model(ids, output_hidden_states=True).hidden_states
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL)


def test_debug_log_shows_selections(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    import logging

    import vllm_ir as ir

    model = LLAMA.build()
    kernelize(model)
    ir.invalidate_caches()
    with caplog.at_level(logging.DEBUG, logger="vllm_ir"), torch.no_grad():
        model(_ids(batch=1, length=2))
    text = caplog.text
    for op in ("rms_norm", "silu_and_mul", "fused_add_rms_norm"):
        assert op in text, text
