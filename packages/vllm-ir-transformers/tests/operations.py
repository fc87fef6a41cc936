"""Helpers for the post-kernelize operation tests: a plain HF model and its kernelized
twin, the operations users apply to both, and the comparisons."""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path

import torch
from conftest import Arch
from torch import nn
from vllm_ir_transformers import kernelize

VOCAB = 128


def pair(arch: Arch, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """``(plain, kernelized)``: the same weights, the second kernelized."""
    plain = arch.build(seed)
    model = copy.deepcopy(plain)
    kernelize(model)
    return plain, model


def ids(seed: int, batch: int = 2, length: int = 6) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def dtype_of(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Kernels differ from torch in summation order (float32) or a rounding (16-bit)."""
    if dtype == torch.float32:
        return {"atol": 3e-5, "rtol": 3e-5}
    return {"atol": 6e-2, "rtol": 6e-2}


def grad_tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        return {"atol": 2e-5, "rtol": 2e-4}
    return {"atol": 1e-1, "rtol": 1e-1}


def _msg(what: str):
    """An ``assert_close`` message that keeps torch's own (the measured difference)."""
    return lambda m: f"{what}: {m}"


def logits(model: nn.Module, x: torch.Tensor, mode: str = "no_grad") -> torch.Tensor:
    ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with ctx:
        return model(x).logits.float().clone()


def assert_same_logits(plain: nn.Module, model: nn.Module, x: torch.Tensor, mode: str) -> None:
    want, got = logits(plain, x, mode), logits(model, x, mode)
    torch.testing.assert_close(
        got, want, **tolerance(dtype_of(plain)), msg=_msg(f"logits ({mode})")
    )


def train_step(plain: nn.Module, model: nn.Module, x: torch.Tensor, lr: float = 0.05) -> None:
    """Backward and one SGD step on both; gradients and new parameters must agree."""
    for m in (plain, model):
        m.train()
        m.zero_grad(set_to_none=True)
        m(x, labels=x).loss.backward()
    want = dict(plain.named_parameters())
    tol = grad_tolerance(dtype_of(plain))
    for name, p in model.named_parameters():
        ref = want[name]
        assert (p.grad is None) == (ref.grad is None), f"{name}: grad {p.grad is None}"
        if ref.grad is not None:
            torch.testing.assert_close(p.grad, ref.grad, **tol, msg=_msg(f"grad of {name}"))
    for m in (plain, model):
        torch.optim.SGD(m.parameters(), lr=lr).step()
        m.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            torch.testing.assert_close(p, want[name], **tol, msg=_msg(f"{name} after the step"))
            # the step left the weights equal up to summation order; make them equal, so a
            # later cast to 16 bits cannot round the two models' weights apart
            p.copy_(want[name])


def other_state(arch: Arch, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Another model's weights (fresh tensors on every call)."""
    return {k: v.to(dtype).clone() for k, v in arch.build(seed).state_dict().items()}


def pickled(model: nn.Module) -> nn.Module:
    return pickle.loads(pickle.dumps(model))


def torch_saved(model: nn.Module) -> nn.Module:
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def safetensors_roundtrip(model: nn.Module, path: Path) -> None:
    """``save_model`` then ``load_model`` into the same model."""
    from safetensors.torch import load_model, save_model

    save_model(model, str(path))
    _, unexpected = load_model(model, str(path))
    assert not unexpected, unexpected
