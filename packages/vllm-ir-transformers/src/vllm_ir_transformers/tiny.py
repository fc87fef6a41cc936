"""The sizes of the tiny random-weight models that the demo, the tests and the
benchmarks build (no downloads): one place, so they all describe the same model.

>>> tiny_config()["num_attention_heads"], tiny_config(hidden=128)["intermediate_size"]
(4, 256)
"""

from __future__ import annotations

from typing import Any

__all__ = ["tiny_config"]


def tiny_config(
    hidden: int = 64,
    layers: int = 2,
    *,
    vocab: int = 128,
    token_ids: bool = True,
) -> dict[str, Any]:
    """Keyword arguments for a decoder config of the Llama family (``LlamaConfig``,
    ``Qwen2Config``, ...): ``hidden`` wide, an MLP twice as wide, ``layers`` layers,
    4 attention heads over 2 KV heads, ``vocab`` tokens; with ``token_ids`` the pad,
    BOS and EOS ids are 0, 1 and 2 (``generate`` needs them; a pad id also zeroes
    that embedding row)."""
    config: dict[str, Any] = {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
    }
    if token_ids:
        config.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return config
