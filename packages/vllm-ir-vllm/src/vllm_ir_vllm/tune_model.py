"""A served model's vLLM layers as a step that ``vllm-ir tune --model`` sweeps (imports vLLM).

``vllm-ir tune --model vllm_ir_vllm.tune_model:layers`` builds, from the Hugging
Face config of the model named by ``VLLM_IR_VLLM_MODEL`` (a local directory),
the layers vLLM's own model implementation builds for it and the plugin routes:
per decoder layer its two ``RMSNorm`` (the second with the residual), its
``RotaryEmbedding`` on query and key, and its ``SiluAndMul``, at the model's
sizes and dtype, built by vLLM (``CustomOp.__new__``, so they are the plugin's
classes) with its custom ops enabled. A step at ``T`` tokens runs them on ``T``
random rows: exactly the ops (``vllm_rms_norm``, ``vllm_fused_add_rms_norm``,
``rotary_embedding``, ``silu_and_mul``) and shapes the engine calls, without
the matmuls and attention that are not vllm-ir's. The file ``--out`` writes is
what the plugin reads from ``VLLM_IR_PRIORITY_FILE``::

    VLLM_IR_VLLM_MODEL=./my-llama vllm-ir tune --model vllm_ir_vllm.tune_model:layers \\
        --tokens 1,16,256 --out tuned.json
    VLLM_IR_PRIORITY_FILE=tuned.json vllm serve ./my-llama
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vllm_ir_vllm.settings import MODEL_VARIABLE

__all__ = ["MODEL_VARIABLE", "VllmLayers", "layers"]


class VllmLayers(nn.Module):
    """The norm, RoPE and activation layers of each decoder layer, called as the engine does."""

    ir_priority_variable = "VLLM_IR_PRIORITY_FILE"
    """What applies a tuned file to these layers in vLLM (``tune``'s closing line says it)."""

    def __init__(self, config: dict[str, Any], dtype: torch.dtype) -> None:
        from vllm.model_executor.layers.activation import SiluAndMul
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

        super().__init__()
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        self.head_dim = int(config.get("head_dim") or hidden // heads)
        self.q_size = heads * self.head_dim
        self.kv_size = int(config.get("num_key_value_heads") or heads) * self.head_dim
        self.hidden, self.intermediate = hidden, int(config["intermediate_size"])
        eps = float(config.get("rms_norm_eps", 1e-6))
        rope = config.get("rope_parameters") or {}
        base = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
        self.norms = nn.ModuleList()
        for _ in range(int(config["num_hidden_layers"])):
            self.norms.append(RMSNorm(hidden, eps=eps, dtype=dtype))
            self.norms.append(RMSNorm(hidden, eps=eps, dtype=dtype))
        self.final_norm = RMSNorm(hidden, eps=eps, dtype=dtype)
        positions = int(config.get("max_position_embeddings", 4096))
        self.rope = RotaryEmbedding(self.head_dim, self.head_dim, positions, base, True, dtype)
        self.act = SiluAndMul()
        self.dtype = dtype

    def forward(
        self,
        hidden: torch.Tensor,
        qkv: torch.Tensor,
        gate_up: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        residual = hidden.clone()
        x = self.norms[0](hidden)
        for i in range(0, len(self.norms), 2):
            if i:
                x, residual = self.norms[i](x, residual)
            q, k, _ = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            self.rope(positions, q, k)
            x, residual = self.norms[i + 1](x, residual)
            x = self.act(gate_up)[..., : self.hidden] + x
        out, _ = self.final_norm(x, residual)
        return out  # type: ignore[no-any-return]


def _config(model: str) -> dict[str, Any]:
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        raise ValueError(
            f"{MODEL_VARIABLE}={model}: no config.json there (a local model directory)"
        )
    config: dict[str, Any] = json.loads(path.read_text())
    return config.get("text_config", config)


def layers() -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, ...]]]:
    """The factory ``vllm-ir tune --model vllm_ir_vllm.tune_model:layers`` calls.

    Returns ``(VllmLayers, example_inputs)``; ``example_inputs(tokens)`` gives a
    step's hidden states, packed q/k/v, gate/up and positions for ``tokens`` tokens.
    """
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    import vllm_ir_vllm

    model = os.environ.get(MODEL_VARIABLE, "")
    if not model:
        raise ValueError(f"{MODEL_VARIABLE} is not set: name the local model directory to size for")
    config = _config(model)
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{MODEL_VARIABLE}={model}: unknown dtype {name!r} in config.json")
    vllm_ir_vllm.register()
    vllm_config = VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))
    with set_current_vllm_config(vllm_config):
        module = VllmLayers(config, dtype)
    gen = torch.Generator().manual_seed(0)

    def example_inputs(tokens: int) -> tuple[torch.Tensor, ...]:
        def randn(width: int) -> torch.Tensor:
            return torch.randn(tokens, width, generator=gen).to(dtype)

        qkv = randn(module.q_size + 2 * module.kv_size)
        positions = torch.randint(0, 256, (tokens,), generator=gen)
        return randn(module.hidden), qkv, randn(2 * module.intermediate), positions

    return module.eval(), example_inputs
