"""The GEMMs of a layer: shapes under tp/cp/ep, the backward permutations, and FLOPs that match flops.py."""

from __future__ import annotations

import dataclasses

import pytest

from commscope.errors import ConfigError
from commscope.estimate.flops import token_flops
from commscope.presets import model_preset
from commscope.estimate.shapes import PASSES, layer_dims, layer_gemms, model_gemms
from commscope.spec.parallel import ParallelSpec


def fwd(gemms):
    return {g.name: g for g in gemms if g.pass_ == "fwd"}


def test_gpt3_2p7b_shapes_tp1():
    model = model_preset("gpt3-2.7b")  # h 2560, 32 heads of 80, f 10240, s 2048
    g = fwd(layer_gemms(model, ParallelSpec(micro_batch_size=1)))
    assert (g["qkv"].m, g["qkv"].n, g["qkv"].k) == (2048, 3 * 2560, 2560)
    assert (g["attn_scores"].batch, g["attn_scores"].m, g["attn_scores"].n, g["attn_scores"].k) == (32, 2048, 2048, 80)
    assert (g["attn_values"].batch, g["attn_values"].m, g["attn_values"].n, g["attn_values"].k) == (32, 2048, 80, 2048)
    assert (g["attn_proj"].m, g["attn_proj"].n, g["attn_proj"].k) == (2048, 2560, 2560)
    assert (g["mlp_up"].m, g["mlp_up"].n, g["mlp_up"].k) == (2048, 10240, 2560)
    assert (g["mlp_down"].m, g["mlp_down"].n, g["mlp_down"].k) == (2048, 2560, 10240)


def test_tensor_parallel_splits_and_micro_batch():
    model = model_preset("gpt-3b")  # h 3072, 32 heads of 96, f 12288, s 1024
    par = ParallelSpec(tp=2, pp=4, dp=4, micro_batch_size=4, global_batch_size=512)
    g = fwd(layer_gemms(model, par))
    assert g["qkv"].m == 4 * 1024 and g["qkv"].n == 3 * 3072 // 2
    assert g["attn_scores"].batch == 4 * 32 // 2
    assert g["attn_proj"].k == 3072 // 2
    assert g["mlp_up"].n == 12288 // 2 and g["mlp_down"].k == 12288 // 2
    logits = fwd(layer_gemms(model, par, logits=True))["logits"]
    assert logits.n == model.padded_vocab_size(2) // 2 == 25216


def test_backward_gemms_permute_m_n_k():
    model = model_preset("llama3-8b")
    gemms = layer_gemms(model, ParallelSpec(tp=4, dp=2, micro_batch_size=1, global_batch_size=8))
    for name in {g.name for g in gemms}:
        by = {g.pass_: g for g in gemms if g.name == name}
        assert set(by) == set(PASSES)
        f = by["fwd"]
        assert (by["dgrad"].m, by["dgrad"].n, by["dgrad"].k) == (f.m, f.k, f.n)
        assert (by["wgrad"].m, by["wgrad"].n, by["wgrad"].k) == (f.k, f.n, f.m)
        assert by["dgrad"].flop == by["wgrad"].flop == f.flop


def test_gqa_and_gated_mlp():
    model = model_preset("llama3-8b")  # 32 heads, 8 groups of 128, f 14336 gated
    g = fwd(layer_gemms(model, ParallelSpec(tp=4, dp=2, micro_batch_size=1, global_batch_size=8)))
    assert g["qkv"].n == (32 // 4 + 2 * 8 // 4) * 128
    assert g["mlp_up"].n == 2 * 14336 // 4
    assert g["mlp_up"].dim_text(1) == "2*f/t"
    # tp larger than the groups: every rank keeps one replicated key/value head
    g16 = fwd(layer_gemms(model, ParallelSpec(tp=16, dp=1, micro_batch_size=1, global_batch_size=8)))
    assert g16["qkv"].n == (32 // 16 + 2) * 128


@pytest.mark.parametrize("name", ["gpt3-2.7b", "llama3-8b", "gpt-3b", "mixtral-8x7b"])
def test_forward_flops_match_token_flops(name):
    """The forward GEMMs of a layer per token are exactly flops.token_flops's layer term (tp = 1, b = 1)."""
    model = model_preset(name)
    par = ParallelSpec(micro_batch_size=1)
    tokens = model.seq_len
    tf = token_flops(model)
    layer = sum(g.flop for g in layer_gemms(model, par) if g.pass_ == "fwd")
    assert layer / tokens == pytest.approx(tf.layers[-1])
    logits = sum(g.flop for g in layer_gemms(model, par, logits=True) if g.pass_ == "fwd")
    assert logits / tokens == pytest.approx(tf.logits)


def test_tensor_parallel_divides_the_flops():
    model = model_preset("gpt-3b")
    one = sum(g.flop for g in layer_gemms(model, ParallelSpec(micro_batch_size=2)))
    four = sum(g.flop for g in layer_gemms(model, ParallelSpec(tp=4, micro_batch_size=2)))
    assert four * 4 == pytest.approx(one)


def test_context_parallel_splits_the_queries():
    model = model_preset("llama3-8b")
    g = fwd(layer_gemms(model, ParallelSpec(cp=2, dp=1, micro_batch_size=1, global_batch_size=8)))
    assert g["qkv"].m == model.seq_len // 2
    assert (g["attn_scores"].m, g["attn_scores"].n) == (model.seq_len // 2, model.seq_len)


def test_moe_layer_expert_gemms():
    model = model_preset("mixtral-8x7b")  # 8 experts, top-2
    par = ParallelSpec(tp=2, dp=8, ep=8, micro_batch_size=1, global_batch_size=64)
    g = fwd(layer_gemms(model, par))
    tokens = model.seq_len
    assert g["router"].n == 8
    assert g["expert_up"].count == 8 // 8
    assert g["expert_up"].m == tokens * 2 * 8 // 8
    assert g["expert_up"].n == 2 * model.moe_ffn // 2
    assert "mlp_up" not in g
    # every routed token is processed once per chosen expert: count x M = tokens x top_k
    assert g["expert_up"].count * g["expert_up"].m == tokens * model.top_k
    dense = fwd(layer_gemms(model, par, layer_kind="dense"))
    assert "mlp_up" in dense and "expert_up" not in dense


def test_model_gemms_multiplicities():
    model = model_preset("gpt-3b")
    pairs = model_gemms(model, ParallelSpec())
    assert {layers for g, layers in pairs if g.layer_kind == "dense"} == {model.num_layers}
    assert {layers for g, layers in pairs if g.name == "logits"} == {1}


def test_flash_attention_keeps_scores_on_chip():
    model = model_preset("gpt-3b")
    flash = fwd(layer_gemms(model, attention="flash"))["attn_scores"]
    unfused = fwd(layer_gemms(model, attention="unfused"))["attn_scores"]
    s, d = model.seq_len, model.head_size
    assert unfused.io_elements == 2 * s * d + s * s
    assert flash.io_elements == 2 * s * d
    assert fwd(layer_gemms(model, attention="flash"))["qkv"].io_elements == fwd(layer_gemms(model, attention="unfused"))["qkv"].io_elements


def test_invalid_splits_raise_config_errors():
    model = model_preset("gpt-3b")
    with pytest.raises(ConfigError, match="num_heads"):
        layer_dims(model, tp=3)
    with pytest.raises(ConfigError, match="seq_length"):
        layer_dims(model, cp=3)
    with pytest.raises(ConfigError, match="attention"):
        layer_gemms(model, attention="fast")
    with pytest.raises(ConfigError, match="layer_kind"):
        layer_gemms(model, layer_kind="moe")
    moe = dataclasses.replace(model_preset("mixtral-8x7b"))
    with pytest.raises(ConfigError, match="num_experts"):
        layer_dims(moe, ep=3)
