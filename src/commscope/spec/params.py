"""Parameter counts per layer and per rank, as Megatron-LM shards them.

A transformer layer (Megatron GPTModel, Shoeybi et al. 2019 "Megatron-LM", section 3) holds

- attention: QKV weight  h x (a + 2 g) d_h   column-parallel (split by tp), bias likewise
             output proj (a d_h) x h          row-parallel (split by tp), bias h replicated
- MLP:       up h x f (x2 when gated)         column-parallel, bias likewise
             down f x h                       row-parallel, bias h replicated
- two norms, h weight (+ h bias for LayerNorm), replicated across tp

with a heads, g query groups, d_h head size, f FFN width. Worked example, GPT-2 1.5B
(h=1600, a=25, f=6400, layernorm, biases): 4h^2+4h + 8h^2+5h + 4h = 12*1600^2 + 13*1600 = 30,740,800
parameters per layer; 48 layers give 1.4755e9, plus 50257 x 1600 embedding and 1024 x 1600 positions.

Replicated parameters keep a full copy on every TP rank; their gradients are still all-reduced across DP
on each of them, which is why the DP volume counts them t times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations only: ModelSpec.num_parameters() calls this module, so no import back
    from commscope.spec.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerParams:
    """Parameters of one transformer layer, split by how they are sharded."""

    tp_sharded: int
    """Split over tp (column/row-parallel weights, column-parallel biases): each TP rank holds tp_sharded / tp."""
    replicated: int
    """Copied on every TP rank (norms, row-parallel biases, router)."""
    expert: int
    """Routed-expert parameters of the whole layer (all experts), split over ep and then tp."""

    @property
    def total(self) -> int:
        return self.tp_sharded + self.replicated + self.expert


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddingParams:
    input_embedding: int
    """V x h word embeddings (vocab-parallel: split over tp)."""
    position_embedding: int
    """s x h learned positions (replicated across tp, first stage)."""
    final_norm: int
    """Final norm before the output layer (replicated, last stage)."""
    output_layer: int
    """V x h logits weight (vocab-parallel); the same tensor as the input embedding when tied."""


def _mlp_params(model: ModelSpec, ffn: int) -> tuple[int, int]:
    """(tp_sharded, replicated) parameters of one MLP of width ``ffn``."""
    h = model.hidden_size
    up = h * ffn * (2 if model.gated_mlp else 1)
    down = ffn * h
    sharded = up + down + (ffn * (2 if model.gated_mlp else 1) if model.bias else 0)
    replicated = h if model.bias else 0
    return sharded, replicated


def layer_params(model: ModelSpec, layer: int, *, tp: int, ep: int) -> LayerParams:
    """Parameters of global layer ``layer`` (the tp/ep arguments are accepted for symmetry; counts are global)."""
    del tp, ep
    h = model.hidden_size
    q_width = model.num_heads * model.head_size
    kv_width = model.kv_heads * model.head_size
    qkv = h * (q_width + 2 * kv_width) + ((q_width + 2 * kv_width) if model.bias else 0)
    proj = q_width * h
    attn_sharded = qkv + proj
    attn_replicated = h if model.bias else 0
    norms = 2 * (2 * h if model.normalization == "layernorm" else h)
    if model.is_moe_layer(layer):
        expert_sharded, expert_replicated = _mlp_params(model, model.moe_ffn)
        expert = model.num_experts * (expert_sharded + expert_replicated)
        router = h * model.num_experts
        shared_sharded, shared_replicated = (
            _mlp_params(model, model.moe_ffn * model.num_shared_experts) if model.num_shared_experts else (0, 0)
        )
        return LayerParams(
            tp_sharded=attn_sharded + shared_sharded,
            replicated=attn_replicated + norms + router + shared_replicated,
            expert=expert,
        )
    mlp_sharded, mlp_replicated = _mlp_params(model, model.ffn)
    return LayerParams(
        tp_sharded=attn_sharded + mlp_sharded,
        replicated=attn_replicated + mlp_replicated + norms,
        expert=0,
    )


def embedding_params(model: ModelSpec, *, tp: int, padded_vocab: bool = True) -> EmbeddingParams:
    """Embedding-side parameters (global counts; vocab padded for ``tp`` when ``padded_vocab``)."""
    h = model.hidden_size
    vocab = model.padded_vocab_size(tp) if padded_vocab else model.vocab_size
    return EmbeddingParams(
        input_embedding=vocab * h,
        position_embedding=model.seq_len * h if model.position_embedding == "learned" else 0,
        final_norm=2 * h if model.normalization == "layernorm" else h,
        output_layer=vocab * h,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters held by ONE rank of a pipeline stage (after tp and ep sharding)."""

    dense: int
    """Non-expert parameters on this rank (gradients reduced over the dp x cp group)."""
    expert: int
    """Expert parameters on this rank (gradients reduced over the expert-data-parallel group)."""
    embedding: int
    """Of ``dense``, the word-embedding / output-layer weights that a tied model syncs between first and last stage."""

    @property
    def total(self) -> int:
        return self.dense + self.expert


def stage_params(model: ModelSpec, layers: range, *, tp: int, ep: int, first: bool, last: bool) -> StageParams:
    """Parameters on one rank of the stage owning ``layers`` (global layer indices)."""
    dense = 0
    expert = 0
    for layer in layers:
        lp = layer_params(model, layer, tp=tp, ep=ep)
        dense += lp.tp_sharded // tp + lp.replicated
        expert += lp.expert // (ep * tp)
    emb = embedding_params(model, tp=tp)
    dense += end_params(model, emb, tp=tp, first=first, last=last)
    embedding = emb.input_embedding // tp if model.tied_embeddings and (first or last) else 0
    return StageParams(dense=dense, expert=expert, embedding=embedding)


def end_params(model: ModelSpec, emb: EmbeddingParams, *, tp: int, first: bool, last: bool) -> int:
    """The embedding-side parameters on one rank of a stage that is the first and/or the last (``emb``:
    :func:`embedding_params` of ``model`` at ``tp``, which a caller asking for several ends works out once): the word
    embeddings and positions on the first, the final norm and the output layer on the last."""
    dense = 0
    if first:
        dense += emb.input_embedding // tp + emb.position_embedding
    if last:
        dense += emb.final_norm
        if not (first and model.tied_embeddings):
            # Untied: the output layer; tied with pp > 1: the last stage's copy of the word embeddings.
            dense += emb.output_layer // tp
    return dense
