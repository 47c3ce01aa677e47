"""FLOPs of a GPT-style training iteration, Megatron's way.

Narayanan et al. 2021 [megatron-sc21], eq. (3): with full recomputation one iteration costs

    F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))

i.e. per token and layer 24 h^2 + 4 s h forward (the four h x h matrices of attention and the two
h x 4h of the MLP count 2 FLOP per multiply-add; Q K^T and attention x V count 2 s h each), three times
that for forward + backward, four with the recomputed forward; plus the logits, 2 h V per token forward.
This module generalises the per-layer term to GQA, gated MLPs, arbitrary FFN width and MoE (top_k
experts per token) by counting the matrices. Worked example: GPT-3 175B (l=96, h=12288, s=2048,
V=51200), B=1536: F = 96*1536*2048*96*12288^2*(1 + 0.0278 + 0.0027) = 4.51e18 FLOP,
which token_flops reproduces exactly for that shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from commscope.spec.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenFlops:
    """Forward FLOPs per token (training multiplies these by 3, plus recomputation)."""

    layers: tuple[float, ...]
    """Per layer: dense matmuls + attention core."""
    attention_core: tuple[float, ...]
    """Per layer, the part of ``layers`` in Q K^T and attention x V (what selective recompute replays)."""
    logits: float


@functools.lru_cache(maxsize=64)
def token_flops(model: ModelSpec) -> TokenFlops:
    """Forward FLOPs per token of every layer and of the logits."""
    h, s = model.hidden_size, model.seq_len
    q = model.num_heads * model.head_size
    kv = model.kv_heads * model.head_size
    attn_matmul = 2 * h * (q + 2 * kv) + 2 * q * h
    core = 2 * 2 * s * q  # scores and weighted values, s keys per query, full (unmasked) as Megatron counts
    layers, cores = [], []
    for i in range(model.num_layers):
        if model.is_moe_layer(i):
            width = model.moe_ffn * (model.top_k + model.num_shared_experts)
            mlp = 2 * h * width * (3 if model.gated_mlp else 2) + 2 * h * model.num_experts
        else:
            mlp = 2 * h * model.ffn * (3 if model.gated_mlp else 2)
        layers.append(float(attn_matmul + core + mlp))
        cores.append(float(core))
    return TokenFlops(layers=tuple(layers), attention_core=tuple(cores), logits=float(2 * h * model.padded_vocab_size(1)))


def iteration_flops(model: ModelSpec, tokens: float, *, recompute: str = "none") -> dict[str, float]:
    """Total FLOPs of an iteration over ``tokens`` tokens: ``model`` (3 x forward) and ``hardware`` (with recomputation)."""
    tf = token_flops(model)
    fwd = sum(tf.layers) + tf.logits
    model_flops = 3 * fwd * tokens
    extra = {"none": 0.0, "selective": sum(tf.attention_core), "full": sum(tf.layers)}[recompute]
    return {"model": model_flops, "hardware": model_flops + extra * tokens}
