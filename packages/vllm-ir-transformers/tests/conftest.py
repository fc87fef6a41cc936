"""Tiny randomly initialised transformers models, built from configs (no downloads)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import transformers
from vllm_ir_transformers.tiny import tiny_config

SMALL = tiny_config()
"""The sizes of every test model (2 layers of width 64)."""
CACHE = (
    "cache"
    if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    else "past_key_values"
)
"""The KV cache's argument and output field: transformers 5.25 renamed
``past_key_values`` (the old name warns until 5.40)."""


@dataclass(frozen=True)
class Arch:
    name: str
    config: str
    model: str
    extra: dict[str, Any]
    expected: dict[str, int]
    """Replacements per op in the 2-layer model."""

    def available(self) -> bool:
        return hasattr(transformers, self.config) and hasattr(transformers, self.model)

    def build(self, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        torch.manual_seed(seed)
        config = getattr(transformers, self.config)(**SMALL, **self.extra)
        model = getattr(transformers, self.model)(config).to(dtype).eval()
        # Gemma initialises norm weights to zero; random weights make the test meaningful
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1 and "norm" in name:
                    p.copy_(0.2 * torch.randn_like(p) + (0.0 if "gemma" in self.name else 1.0))
        return model


LLAMA_LIKE = {"rms_norm": 5, "silu_and_mul": 2, "rotary_embedding": 2, "fused_add_rms_norm": 2}
GEMMA_SANDWICH = {"rms_norm": 9, "gelu_and_mul": 2, "rotary_embedding": 2}
ARCHS = [
    Arch("llama", "LlamaConfig", "LlamaForCausalLM", {}, LLAMA_LIKE),
    Arch("mistral", "MistralConfig", "MistralForCausalLM", {}, LLAMA_LIKE),
    Arch("qwen2", "Qwen2Config", "Qwen2ForCausalLM", {}, LLAMA_LIKE),
    # q_norm and k_norm per layer too
    Arch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", {}, {**LLAMA_LIKE, "rms_norm": 9}),
    Arch("phi3", "Phi3Config", "Phi3ForCausalLM", {}, LLAMA_LIKE),
    # post-norm layers: norms and MLPs, no fused residual add
    Arch(
        "olmo2",
        "Olmo2Config",
        "Olmo2ForCausalLM",
        {},
        {"rms_norm": 9, "silu_and_mul": 2, "rotary_embedding": 2},
    ),
    # (1 + weight) norms mapped in float32; tanh-GELU MLPs onto gelu_and_mul
    Arch(
        "gemma",
        "GemmaConfig",
        "GemmaForCausalLM",
        {"head_dim": 16},
        {"rms_norm": 5, "gelu_and_mul": 2, "rotary_embedding": 2, "fused_add_rms_norm": 2},
    ),
    # sandwich norms: no fused residual add
    Arch("gemma2", "Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16}, GEMMA_SANDWICH),
    Arch(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"head_dim": 16},
        {**GEMMA_SANDWICH, "rms_norm": 13},
    ),
]


def arch_params() -> list[Any]:
    return [
        pytest.param(a, id=a.name)
        if a.available()
        else pytest.param(
            a, id=a.name, marks=pytest.mark.skip(reason=f"transformers lacks {a.model}")
        )
        for a in ARCHS
    ]


LLAMA = ARCHS[0]


def arch(name: str) -> Arch:
    return next(a for a in ARCHS if a.name == name)


OPERATION_ARCHS = ("llama", "qwen3", "olmo2")
"""The architectures every post-kernelize operation is tested on (tests/test_operations.py)."""


def operation_arch_params() -> list[Any]:
    return [p for p in arch_params() if p.id in OPERATION_ARCHS]


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread; with more, on a loaded CI machine the
    intra-op threads oversubscribe the cores and the many small ops slow down ~10x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
