"""The shape rules flag known-bad shapes, pass known-good ones, and price what they cost."""

from __future__ import annotations

import dataclasses

import pytest

from commscope.estimate.gpus import gpu_preset
from commscope.presets import model_preset
from commscope.estimate.shapes import shape_rules
from commscope.spec.parallel import ParallelSpec

A100 = gpu_preset("a100")


def rules_of(model, parallel=None, gpu=A100):
    return {r.rule: r for r in shape_rules(model, parallel or ParallelSpec(), gpu)}


def test_gpt3_2p7b_head_size_80_is_flagged_and_priced():
    rules = rules_of(model_preset("gpt3-2.7b"))
    head = rules["head_size"]
    assert head.status == "broken" and head.broken and head.value == 80
    assert set(head.affected) == {"attn_scores", "attn_values"}
    assert head.slowdown > 0.1  # 80 pads to 128-wide tiles and 96-deep K steps
    assert head.time_lost_s > 0 and 0 < head.share < 1
    assert "d = 64 (40 heads)" in head.fix and "d = 128 (20 heads)" in head.fix
    assert "Co-Designing" in head.source


def test_unpadded_vocab_50257_is_broken():
    model = dataclasses.replace(model_preset("gpt3-2.7b"), make_vocab_size_divisible_by=1)
    vocab = rules_of(model)["vocab"]
    assert vocab.status == "broken"
    assert vocab.affected == ("logits",)
    # 50257 is odd: no 16-byte alignment, so the unaligned factor (0.5) applies on top of the tile loss
    assert vocab.slowdown == pytest.approx(1 / A100.unaligned_factor - 1, rel=0.1)
    assert "128" in vocab.fix


def test_megatron_padding_turns_the_vocab_rule_into_a_warning():
    vocab = rules_of(model_preset("gpt3-2.7b"))["vocab"]  # padded to 50304 by make_vocab_size_divisible_by = 128
    assert vocab.status == "warn" and not vocab.broken
    assert vocab.slowdown > 0.5  # what running it unpadded (Hugging Face) would cost
    assert "50304" in vocab.fix


def test_well_shaped_model_breaks_nothing():
    rules = rules_of(model_preset("llama3-8b"), ParallelSpec(tp=4, micro_batch_size=1))
    assert [r.rule for r in rules.values() if r.status != "ok"] == []
    # at tp = 8, 128256 / 8 = 16032 is not a multiple of 64: only Megatron's padding (to 129024) keeps it aligned
    tp8 = rules_of(model_preset("llama3-8b"), ParallelSpec(tp=8, micro_batch_size=1))
    assert [r.rule for r in tp8.values() if r.status != "ok"] == ["vocab"]
    assert tp8["vocab"].status == "warn"


def test_hidden_size_not_a_multiple_of_64():
    model = model_preset("gpt-3b")
    bad = dataclasses.replace(model, hidden_size=3000, num_heads=30, ffn_hidden_size=12000)  # d = 100
    rules = rules_of(bad, ParallelSpec(tp=2))
    assert rules["hidden_size"].status == "broken"
    assert {"qkv", "attn_proj", "mlp_up", "mlp_down", "logits"} <= set(rules["hidden_size"].affected)
    assert rules["hidden_size"].slowdown >= 0
    assert rules["head_size"].status == "broken"
    assert rules["ffn_per_tp"].status == "broken"  # 6000 per rank
    assert rules["hidden_per_tp"].status == "broken"  # 1500 per rank


def test_tokens_and_sequence_rules():
    model = dataclasses.replace(model_preset("gpt-3b"), seq_len=1000)
    rules = rules_of(model, ParallelSpec(micro_batch_size=1))
    assert rules["seq_len"].status == "broken"
    assert rules["tokens"].status == "broken"
    assert rules["tokens"].slowdown > 0


def test_hard_constraints_are_invalid_not_exceptions():
    model = model_preset("gpt-3b")
    rules = rules_of(model, ParallelSpec(tp=3, dp=1))
    assert rules["heads_tp"].status == "invalid" and rules["heads_tp"].broken
    assert rules["heads_tp"].slowdown is None  # no GEMMs to price when Megatron refuses the job
    layers = rules_of(model, ParallelSpec(pp=5))["layers_pp"]
    assert layers.status == "invalid"


def test_experts_divisible_by_ep():
    model = model_preset("mixtral-8x7b")  # 8 experts
    rules = rules_of(model, ParallelSpec(dp=3, ep=3, global_batch_size=6))
    assert rules["experts_ep"].status == "invalid"
    ok = rules_of(model, ParallelSpec(dp=4, ep=4, global_batch_size=8))
    assert ok["experts_ep"].status == "ok"
    assert "expert_tokens" in ok and "expert_ffn_per_tp" in ok


def test_rules_without_a_gpu_are_unpriced():
    rules = {r.rule: r for r in shape_rules(model_preset("gpt3-2.7b"))}
    assert rules["head_size"].broken and rules["head_size"].slowdown is None
    assert rules["head_size"].affected == ("attn_scores", "attn_values")


def test_rule_dicts_are_json_ready():
    import json

    for r in shape_rules(model_preset("gpt3-2.7b"), ParallelSpec(), A100):
        d = json.loads(json.dumps(r.to_dict()))
        assert {"rule", "status", "broken", "explanation", "affected", "fix", "slowdown", "source"} <= set(d)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_vocab_rule_shows_the_padded_width_per_rank_the_logits_gemm_uses(tp):
    """gpt-3b at tp 2: V = 50257 padded to 50432, 25216 per rank, the logits GEMM's N (once shown as 50257 at every
    tp)."""
    from commscope.estimate.shapes import model_gemms

    model, parallel = model_preset("gpt-3b"), ParallelSpec(tp=tp, micro_batch_size=1)
    vocab = rules_of(model, parallel)["vocab"]
    logits = next(g for g, _ in model_gemms(model, parallel) if g.name == "logits" and g.pass_ == "fwd")
    assert vocab.value == logits.n == model.padded_vocab_size(tp) // tp
    assert vocab.value == {1: 50304, 2: 25216, 4: 12672}[tp]
