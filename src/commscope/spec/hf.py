"""A :class:`ModelSpec` from a Hugging Face ``config.json``, read as a plain dict (no ``transformers``).

Supported families and the keys read (names as in ``transformers``' configuration classes):

- GPT-2 (``model_type`` ``gpt2``): ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (default 4 ``n_embd``),
  ``n_positions`` (or ``n_ctx``), ``vocab_size``, ``tie_word_embeddings`` (default true). Learned positions,
  LayerNorm, biases, GELU MLP.
- LLaMA, Mistral, Qwen2, Qwen3 (``llama``, ``mistral``, ``qwen2``, ``qwen3``): ``num_hidden_layers``,
  ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads`` (default: no grouping),
  ``intermediate_size``, ``max_position_embeddings``, ``vocab_size``, ``tie_word_embeddings`` (default false,
  as in ``LlamaConfig``), ``head_dim``. RoPE, RMSNorm, SwiGLU MLP, no biases. Qwen2 has biases on the
  Q, K and V projections only and Qwen3 a per-head RMSNorm on Q and K; ModelSpec has one ``bias`` switch and
  no Q/K norm, so both are modelled without them (under 0.01% of the parameters).
- Mixtral (``mixtral``): as LLaMA plus ``num_local_experts``, ``num_experts_per_tok``; every layer is MoE
  with experts of width ``intermediate_size``.
- Qwen2-MoE, Qwen3-MoE (``qwen2_moe``, ``qwen3_moe``): ``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``shared_expert_intermediate_size`` (Qwen2-MoE: one shared expert, modelled as
  ``shared / moe_intermediate_size`` shared experts; its 1-wide sigmoid gate is left out),
  ``decoder_sparse_step`` (layer i is MoE when (i + 1) % step == 0).
- DeepSeek-MoE (``deepseek``): ``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``,
  ``first_k_dense_replace``, ``moe_layer_freq`` (layer i is MoE when i >= first_k_dense_replace and
  i % moe_layer_freq == 0, as in DeepSeek's ``modeling_deepseek.py``), ``num_experts_per_tok``.

DeepSeek-V2/V3 use multi-head latent attention (``kv_lora_rank``), which ModelSpec does not describe; such
configs raise :class:`ConfigError` rather than give wrong attention sizes.

``torch_dtype`` is the checkpoint's storage dtype, not the training precision; the ``dtype`` argument
(default ``bf16``) sets the latter. ``max_position_embeddings`` is the longest context the model supports
(131072 for Llama 3.1), often longer than training sequences: pass ``seq_len`` to choose.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from commscope.errors import ConfigError
from commscope.spec.model import ModelSpec

__all__ = ["HF_FAMILIES", "hf_family", "model_from_hf_config"]

#: ``model_type`` values this reader understands, by family.
HF_FAMILIES: dict[str, str] = {
    "gpt2": "gpt2",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen_moe",
    "qwen3_moe": "qwen_moe",
    "deepseek": "deepseek",
    # Read only to say that their multi-head latent attention is not modelled (kv_lora_rank).
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
}

#: ``architectures`` entries that identify a family when ``model_type`` is absent.
_ARCHITECTURES = {
    "GPT2LMHeadModel": "gpt2",
    "GPT2Model": "gpt2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekForCausalLM": "deepseek",
}


def hf_family(d: Mapping[str, Any], *, source: str | None = None) -> str:
    """The ``model_type`` of a config: its own key, else from ``architectures``, else guessed from keys."""
    model_type = d.get("model_type")
    if model_type is None:
        for arch in d.get("architectures") or ():
            if arch in _ARCHITECTURES:
                model_type = _ARCHITECTURES[arch]
                break
    if model_type is None:
        if "n_embd" in d or "n_layer" in d:
            model_type = "gpt2"
        elif "n_routed_experts" in d:
            model_type = "deepseek"
        elif "num_local_experts" in d:
            model_type = "mixtral"
        elif "moe_intermediate_size" in d and "num_experts" in d:
            model_type = "qwen2_moe"
        elif "num_hidden_layers" in d:
            model_type = "llama"
    if model_type not in HF_FAMILIES:
        raise ConfigError("model_type", model_type,
                          f"not a supported Hugging Face model type; supported: {', '.join(HF_FAMILIES)}", source=source)
    return str(model_type)


class _Reader:
    """Typed access to config keys, with errors that name the Hugging Face key."""

    def __init__(self, d: Mapping[str, Any], model_type: str, source: str | None) -> None:
        self.d = d
        self.model_type = model_type
        self.source = source

    def integer(self, key: str, default: Any = ..., *, alt: tuple[str, ...] = ()) -> Any:
        for k in (key, *alt):
            value = self.d.get(k)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(k, value, "expected a non-negative integer", source=self.source)
                return value
        if default is ...:
            also = f" (or {', '.join(alt)})" if alt else ""
            raise ConfigError(key, None, f"required in a Hugging Face {self.model_type} config.json{also}", source=self.source)
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.d.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(key, value, "expected true or false", source=self.source)
        return value


def model_from_hf_config(
    d: Mapping[str, Any],
    *,
    name: str | None = None,
    seq_len: int | None = None,
    dtype: str = "bf16",
    source: str | None = None,
) -> ModelSpec:
    """A :class:`ModelSpec` from the dict of a Hugging Face ``config.json``.

    ``seq_len`` overrides ``max_position_embeddings`` / ``n_positions``; ``dtype`` is the training
    precision; ``source`` names the file in errors. Worked example: Meta-Llama-3-8B's config gives
    32 layers, h=4096, 32 heads in 8 KV groups, FFN 14336, V=128256 and 8,030,261,248 parameters, the
    count the model card states as 8B.
    """
    if not isinstance(d, Mapping):
        raise ConfigError("config", d, "expected the mapping of a Hugging Face config.json", source=source)
    model_type = hf_family(d, source=source)
    family = HF_FAMILIES[model_type]
    r = _Reader(d, model_type, source)
    label = name or (d.get("_name_or_path") if isinstance(d.get("_name_or_path"), str) and d.get("_name_or_path") else model_type)

    if family == "gpt2":
        hidden = r.integer("n_embd")
        fields: dict[str, Any] = dict(
            num_layers=r.integer("n_layer"),
            hidden_size=hidden,
            num_heads=r.integer("n_head"),
            ffn_hidden_size=r.integer("n_inner", 4 * hidden),
            vocab_size=r.integer("vocab_size"),
            seq_len=seq_len if seq_len is not None else r.integer("n_positions", alt=("n_ctx",)),
            tied_embeddings=r.flag("tie_word_embeddings", True),
            position_embedding="learned",
            gated_mlp=False,
            bias=True,
            normalization="layernorm",
        )
    else:
        if d.get("kv_lora_rank") is not None or d.get("q_lora_rank") is not None:
            raise ConfigError("kv_lora_rank", d.get("kv_lora_rank"),
                              "multi-head latent attention (DeepSeek-V2/V3) is not described by ModelSpec, "
                              "which models multi-head and grouped-query attention", source=source)
        heads = r.integer("num_attention_heads")
        head_dim = r.integer("head_dim", None)
        hidden = r.integer("hidden_size")
        fields = dict(
            num_layers=r.integer("num_hidden_layers"),
            hidden_size=hidden,
            num_heads=heads,
            num_query_groups=r.integer("num_key_value_heads", heads),
            head_dim=head_dim if head_dim is not None and head_dim * heads != hidden else None,
            ffn_hidden_size=r.integer("intermediate_size"),
            vocab_size=r.integer("vocab_size"),
            seq_len=seq_len if seq_len is not None else r.integer("max_position_embeddings"),
            tied_embeddings=r.flag("tie_word_embeddings", False),
            position_embedding="rope",
            gated_mlp=True,
            # One switch for all linear biases: on only when both attention and MLP have them.
            bias=r.flag("attention_bias", False) and r.flag("mlp_bias", False),
            normalization="rmsnorm",
        )
        if family == "mixtral":
            fields.update(
                num_experts=r.integer("num_local_experts"),
                top_k=r.integer("num_experts_per_tok"),
                moe_ffn_hidden_size=fields["ffn_hidden_size"],
            )
        elif family == "qwen_moe":
            moe_ffn = r.integer("moe_intermediate_size")
            shared = r.integer("shared_expert_intermediate_size", 0)
            if shared % moe_ffn:
                raise ConfigError("shared_expert_intermediate_size", shared,
                                  f"must be a multiple of moe_intermediate_size={moe_ffn} to be modelled as shared experts",
                                  source=source)
            step = r.integer("decoder_sparse_step", 1)
            if step < 1:
                raise ConfigError("decoder_sparse_step", step, "must be >= 1", source=source)
            mlp_only = d.get("mlp_only_layers") or []
            if mlp_only:
                raise ConfigError("mlp_only_layers", mlp_only,
                                  "dense layers at arbitrary positions are not described by ModelSpec; "
                                  "use an empty list (ModelSpec supports first_k_dense_layers and moe_layer_freq)",
                                  source=source)
            fields.update(
                num_experts=r.integer("num_experts"),
                top_k=r.integer("num_experts_per_tok"),
                moe_ffn_hidden_size=moe_ffn,
                num_shared_experts=shared // moe_ffn,
                # Layer i is MoE when (i + 1) % step == 0: the first is step - 1, then every step-th.
                first_k_dense_layers=step - 1,
                moe_layer_freq=step,
            )
        elif family == "deepseek":
            routed = r.integer("n_routed_experts", None)
            if routed:
                freq = r.integer("moe_layer_freq", 1)
                if freq < 1:
                    raise ConfigError("moe_layer_freq", freq, "must be >= 1", source=source)
                first_k = r.integer("first_k_dense_replace", 0)
                # DeepSeek: MoE when i >= first_k and i % freq == 0. ModelSpec: i >= k' and (i - k') % freq == 0;
                # the two agree when k' is the first multiple of freq at or after first_k.
                first_moe = -(-first_k // freq) * freq
                fields.update(
                    num_experts=routed,
                    top_k=r.integer("num_experts_per_tok"),
                    moe_ffn_hidden_size=r.integer("moe_intermediate_size"),
                    num_shared_experts=r.integer("n_shared_experts", 0),
                    first_k_dense_layers=first_moe,
                    moe_layer_freq=freq,
                )
    try:
        return ModelSpec(name=str(label), dtype=dtype, **fields)
    except ConfigError as exc:
        if exc.source is not None or source is None:
            raise
        raise ConfigError(exc.field, exc.value, exc.expected, source=source) from None
