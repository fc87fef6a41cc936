"""Rotary position embedding (RoPE) of query and key, in Hugging Face's cos/sin form.

The signature takes the per-token ``cos`` and ``sin`` tensors that a Hugging
Face model's rotary module computes each forward (not vLLM's ``positions`` +
``cos_sin_cache``), so ``kernelize`` can route a model's own
``apply_rotary_pos_emb`` call through it unchanged; a vLLM-style caller
gathers ``cos_sin_cache[positions]`` and duplicates its halves (see
:func:`cos_sin_from_cache`).

Layout, token-major as vLLM's kernels are (a Hugging Face ``[batch, heads,
seq, head_size]`` tensor passes as its ``transpose(1, 2)`` view):

* ``query``: ``(*tokens, num_heads, head_size)``; ``key``: ``(*tokens,
  num_kv_heads, head_size)``;
* ``cos``, ``sin``: ``(*tokens, rotary_dim)``, broadcast over the heads (and
  over size-1 token dims); ``rotary_dim = cos.shape[-1]``, even and at most
  ``head_size``. Channels past ``rotary_dim`` pass through unchanged.

``is_neox=True`` rotates the two halves of the rotary channels (GPT-NeoX,
Llama, Hugging Face's ``rotate_half``); ``False`` rotates interleaved pairs
``(2i, 2i+1)`` (GPT-J). Either way ``cos[..., i]`` multiplies channel ``i``:
Hugging Face passes the frequencies duplicated (``cat(f, f)`` for neox,
``repeat_interleave(f, 2)`` for GPT-J), and the op never assumes that.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from vllm_ir._op.op import register_op
from vllm_ir._schema.samples import SampleInput

__all__ = ["cos_sin_from_cache", "rotary_embedding", "rotary_embedding_fp32"]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, is_neox: bool) -> Tensor:
    rotary_dim = cos.shape[-1]
    x_rot = x[..., :rotary_dim]
    if is_neox:
        half = rotary_dim // 2
        rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    else:
        rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
    out = x_rot * cos + rotated * sin
    if rotary_dim == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rotary_dim:]), dim=-1)


# tokens for size buckets: the dims before (heads, head_size)
@register_op(activations=["query", "key"], allow_inplace=True, feature_dims=2)
def rotary_embedding(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    """RoPE: ``x * cos + rotate(x) * sin`` on each head's first ``cos.shape[-1]`` channels.

    Returns the new ``(query, key)``. Computed as Hugging Face's
    ``apply_rotary_pos_emb``: each product and the sum rounded to the dtype
    (native promotes if ``cos`` has another dtype).
    """
    cos = cos.unsqueeze(-2)  # broadcast over the heads
    sin = sin.unsqueeze(-2)
    return _rotate(query, cos, sin, is_neox), _rotate(key, cos, sin, is_neox)


@register_op(activations=["query", "key"], allow_inplace=True, feature_dims=2)
def rotary_embedding_fp32(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    """RoPE computed in fp32 and rounded once to each input's dtype: ``rotary_embedding``'s
    arguments, the rounding of vLLM's CPU kernel for its RoPE layer.

    For fp32 inputs it equals ``rotary_embedding``; in bf16 and fp16 each output
    element is one rounding of ``x * cos + rotate(x) * sin`` computed in fp32, where
    ``rotary_embedding`` rounds each product and the sum.
    """
    q, k = rotary_embedding.native(query.float(), key.float(), cos.float(), sin.float(), is_neox)
    return q.to(query.dtype), k.to(key.dtype)


def cos_sin_from_cache(
    cos_sin_cache: Tensor, positions: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    """vLLM's ``cos_sin_cache`` (``[max_pos, rotary_dim]``: cos half, sin half) as ``(cos, sin)``.

    >>> cache = torch.arange(8.0).reshape(2, 4)  # 2 positions, rotary_dim 4
    >>> cos, sin = cos_sin_from_cache(cache, torch.tensor([1]))
    >>> cos.tolist(), sin.tolist()
    ([[4.0, 5.0, 4.0, 5.0]], [[6.0, 7.0, 6.0, 7.0]])
    """
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    if is_neox:
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)


def _cos_sin(
    gen: torch.Generator, tokens: tuple[int, ...], rotary_dim: int, is_neox: bool
) -> tuple[Tensor, Tensor]:
    """Real RoPE tables (base 10000) at random positions up to 4096."""
    positions = torch.randint(0, 4096, tokens, generator=gen)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    cache = positions.reshape(-1, 1).float() * inv_freq
    cache = torch.cat((cache.cos(), cache.sin()), dim=-1)
    flat = torch.arange(cache.shape[0])
    cos, sin = cos_sin_from_cache(cache, flat, is_neox)
    return cos.reshape(*tokens, rotary_dim), sin.reshape(*tokens, rotary_dim)


@rotary_embedding.register_input_generator
def _rotary_embedding_inputs(dtype: torch.dtype, device: torch.device) -> Iterator[SampleInput]:
    gen = torch.Generator().manual_seed(5)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    def tables(tokens: tuple[int, ...], rotary_dim: int, neox: bool) -> tuple[Tensor, Tensor]:
        cos, sin = _cos_sin(gen, tokens, rotary_dim, neox)
        return cos.to(dtype=dtype, device=device), sin.to(dtype=dtype, device=device)

    # (tokens, heads, kv heads, head_size, rotary_dim)
    cases = ((1, 4, 4, 64, 64), (7, 8, 2, 128, 128), (5, 3, 1, 80, 80), (6, 4, 2, 64, 32))
    for neox in (True, False):
        style = "neox" if neox else "gptj"
        for tokens, heads, kv_heads, head_size, rotary_dim in cases:
            partial = "" if rotary_dim == head_size else f"-rot{rotary_dim}"
            yield SampleInput(
                (
                    rand(tokens, heads, head_size),
                    rand(tokens, kv_heads, head_size),
                    *tables((tokens,), rotary_dim, neox),
                    neox,
                ),
                f"{tokens}x{heads}x{head_size}-kv{kv_heads}{partial}-{style}",
            )
    # Hugging Face's layout: [batch, heads, seq, head] passed as its transpose(1, 2)
    # view, with cos/sin [1, seq, head] broadcast over the batch
    q = rand(2, 4, 3, 64).transpose(1, 2)
    k = rand(2, 2, 3, 64).transpose(1, 2)
    yield SampleInput((q, k, *tables((1, 3), 64, True), True), "hf-2x3x4x64-transposed-neox")
    # an odd rotary half (9 pairs) under a head size no vector width divides
    yield SampleInput(
        (rand(3, 2, 22), rand(3, 1, 22), *tables((3,), 18, False), False), "3x2x22-rot18-gptj"
    )


@rotary_embedding_fp32.register_input_generator
def _rotary_embedding_fp32_inputs(
    dtype: torch.dtype, device: torch.device
) -> Iterator[SampleInput]:
    yield from _rotary_embedding_inputs(dtype, device)
