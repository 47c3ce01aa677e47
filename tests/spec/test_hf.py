"""Hugging Face config.json -> ModelSpec, for the families commscope reads. Configs are written as real files.

The key values are those of the public config.json files on the Hugging Face Hub (cited per test).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from commscope.errors import ConfigError
from commscope.presets import model_preset
from commscope.spec import ModelSpec, load_model, model_from_hf_config

# https://huggingface.co/openai-community/gpt2-xl/blob/main/config.json (abridged to the keys read)
GPT2_XL = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_ctx": 1024, "n_embd": 1600, "n_head": 25,
    "n_inner": None, "n_layer": 48, "n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new",
}

# https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}

# https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "rope_theta": 1e6,
    "tie_word_embeddings": False, "vocab_size": 32000,
}

# https://huggingface.co/deepseek-ai/deepseek-moe-16b-base/blob/main/config.json
DEEPSEEK_MOE_16B = {
    "architectures": ["DeepseekForCausalLM"], "first_k_dense_replace": 1, "hidden_size": 2048,
    "intermediate_size": 10944, "max_position_embeddings": 4096, "model_type": "deepseek", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_routed_experts": 64, "n_shared_experts": 2, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 28, "num_key_value_heads": 16, "tie_word_embeddings": False,
    "vocab_size": 102400,
}

# https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "decoder_sparse_step": 1, "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "shared_expert_intermediate_size": 5632, "tie_word_embeddings": False, "vocab_size": 151936,
}

# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 1, "head_dim": 128, "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 151936,
}


def from_file(tmp_path, config, **kwargs) -> ModelSpec:
    """Write ``config`` as config.json in a folder and read it back the way users do."""
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return load_model(path, **kwargs)


def test_gpt2_xl(tmp_path):
    model = from_file(tmp_path, GPT2_XL)
    assert model == ModelSpec(name="model", num_layers=48, hidden_size=1600, num_heads=25, ffn_hidden_size=6400,
                              vocab_size=50257, seq_len=1024, tied_embeddings=True, position_embedding="learned",
                              gated_mlp=False, bias=True, normalization="layernorm")
    # 1,557,611,200: the parameter count of GPT-2 XL (params.py docstring works it out).
    assert model.num_parameters() == 1_557_611_200


def test_llama3_8b_matches_the_preset(tmp_path):
    model = from_file(tmp_path, LLAMA3_8B)
    assert dataclasses.replace(model, name="llama3-8b") == model_preset("llama3-8b")
    assert model.num_parameters() == 8_030_261_248


def test_mixtral_matches_the_preset_at_its_sequence_length(tmp_path):
    model = from_file(tmp_path, MIXTRAL, seq_len=4096)
    assert dataclasses.replace(model, name="mixtral-8x7b") == model_preset("mixtral-8x7b")
    assert from_file(tmp_path, MIXTRAL).seq_len == 32768
    assert model.num_parameters() == 46_702_792_704


def test_deepseek_moe_matches_the_preset(tmp_path):
    model = from_file(tmp_path, DEEPSEEK_MOE_16B)
    assert dataclasses.replace(model, name="deepseek-moe-16b") == model_preset("deepseek-moe-16b")
    assert [model.is_moe_layer(i) for i in range(3)] == [False, True, True]


def test_deepseek_moe_layer_pattern_follows_modeling_deepseek():
    # modeling_deepseek.py: MoE when layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0.
    config = {**DEEPSEEK_MOE_16B, "first_k_dense_replace": 3, "moe_layer_freq": 2, "num_hidden_layers": 10}
    model = model_from_hf_config(config)
    expected = [i >= 3 and i % 2 == 0 for i in range(10)]
    assert [model.is_moe_layer(i) for i in range(10)] == expected


def test_qwen2_moe_shared_expert_and_total_size():
    model = model_from_hf_config(QWEN15_MOE, name="qwen1.5-moe")
    assert (model.num_experts, model.top_k, model.moe_ffn, model.num_shared_experts) == (60, 4, 1408, 4)
    # Model card: 14.3B parameters in total (the Q/K/V biases, ~0.3M, are not modelled).
    assert model.num_parameters() == pytest.approx(14.3e9, rel=0.01)


def test_qwen3_moe_head_dim_wider_than_hidden_over_heads():
    model = model_from_hf_config(QWEN3_30B_A3B, seq_len=4096)
    assert model.head_size == 128 and model.kv_heads == 4 and model.seq_len == 4096
    # Model card: 30.5B parameters in total.
    assert model.num_parameters() == pytest.approx(30.5e9, rel=0.01)


def test_qwen2_moe_sparse_step():
    model = model_from_hf_config({**QWEN15_MOE, "decoder_sparse_step": 2})
    # transformers' Qwen2MoeDecoderLayer: MoE when (layer_idx + 1) % decoder_sparse_step == 0.
    assert [model.is_moe_layer(i) for i in range(6)] == [(i + 1) % 2 == 0 for i in range(6)]


def test_model_type_from_architectures_when_absent():
    config = {k: v for k, v in LLAMA3_8B.items() if k != "model_type"}
    assert model_from_hf_config(config).num_query_groups == 8


def test_missing_key_names_the_hugging_face_key(tmp_path):
    config = {k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"}
    with pytest.raises(ConfigError) as info:
        from_file(tmp_path, config)
    assert info.value.field == "num_hidden_layers" and "llama" in str(info.value) and "config.json" in str(info.value)
    with pytest.raises(ConfigError) as info:
        model_from_hf_config({k: v for k, v in MIXTRAL.items() if k != "num_local_experts"})
    assert info.value.field == "num_local_experts"


def test_wrong_type_and_unsupported_models():
    with pytest.raises(ConfigError) as info:
        model_from_hf_config({**LLAMA3_8B, "hidden_size": "4096"})
    assert info.value.field == "hidden_size" and "integer" in str(info.value)
    with pytest.raises(ConfigError) as info:
        model_from_hf_config({"model_type": "bert", "num_hidden_layers": 12})
    assert info.value.field == "model_type" and "llama" in str(info.value)
    with pytest.raises(ConfigError) as info:
        model_from_hf_config({**DEEPSEEK_MOE_16B, "model_type": "deepseek_v3", "kv_lora_rank": 512})
    assert info.value.field == "kv_lora_rank"
    assert "latent attention" in str(info.value)
