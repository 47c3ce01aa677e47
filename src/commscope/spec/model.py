"""The model: a GPT-style decoder-only transformer, dense or MoE.

Field names follow Megatron-LM (``num_layers``, ``hidden_size``, ``ffn_hidden_size``, ``num_query_groups``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from commscope.errors import check
from commscope.units import dtype_among, dtype_bytes

#: The dtypes a model's parameters and activations can train in (canonical names).
TRAINING_DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8", "fp64")

#: Shapes beyond any model trained or planned, with a wide margin (the largest: ~200 layers, hidden 25,600-53,248,
#: 256K-token vocabularies, 10M-token contexts, PEER's million experts; DeepNet trained 1,000 layers). A value above
#: is a typo (an extra zero or three), never computed: it would overflow or exhaust memory.
MAX_SHAPE = {"num_layers": 10_000, "hidden_size": 1 << 20, "num_heads": 1 << 16, "head_dim": 1 << 16,
             "ffn_hidden_size": 1 << 22, "moe_ffn_hidden_size": 1 << 22, "num_query_groups": 1 << 16,
             "vocab_size": 1 << 24, "seq_len": 1 << 27, "make_vocab_size_divisible_by": 1 << 16,
             "num_experts": 1 << 20}

Normalization = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer."""

    name: str = "custom"
    """A label for reports."""
    num_layers: int
    """Transformer blocks (l)."""
    hidden_size: int
    """Model width (h)."""
    num_heads: int
    """Attention heads."""
    ffn_hidden_size: int | None = None
    """Width of the MLP; default 4 h."""
    num_query_groups: int | None = None
    """Key/value heads for grouped-query attention; default ``num_heads`` (multi-head attention)."""
    head_dim: int | None = None
    """Width of one head (Megatron ``kv_channels``); default ``hidden_size / num_heads``."""
    vocab_size: int = 50257
    """Vocabulary (V) before padding."""
    make_vocab_size_divisible_by: int = 128
    """Megatron pads V to a multiple of this times tp."""
    seq_len: int = 2048
    """Sequence length (s)."""
    tied_embeddings: bool = True
    """Input embedding and output layer share weights (GPT-2); False for LLaMA."""
    position_embedding: PositionEmbedding = "learned"
    """``learned`` adds an s x h table on the first stage; ``rope`` has no parameters."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with two up projections (LLaMA, Mixtral)."""
    bias: bool = True
    """Linear layers have biases (GPT-2: yes, LLaMA: no)."""
    normalization: Normalization = "layernorm"
    """``layernorm`` has weight and bias; ``rmsnorm`` weight only."""
    dtype: str = "bf16"
    """Parameter and activation dtype during training."""
    # --- MoE (used by the MoE workload; dense when num_experts is 0) ---
    num_experts: int = 0
    """Routed experts per MoE layer; 0 means a dense model."""
    top_k: int = 2
    """Experts each token is routed to."""
    moe_layer_freq: int = 1
    """Every ``moe_layer_freq``-th layer is an MoE layer (1: all layers)."""
    moe_ffn_hidden_size: int | None = None
    """Width of one expert's MLP; default ``ffn_hidden_size``."""
    num_shared_experts: int = 0
    """Always-active shared experts (DeepSeek-MoE), computed like a dense MLP of that many experts' width."""
    first_k_dense_layers: int = 0
    """Leading layers that stay dense (DeepSeek-MoE: 1)."""
    capacity_factor: float | None = None
    """Expert capacity factor; ``None`` means no token dropping."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "vocab_size", "seq_len", "make_vocab_size_divisible_by"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value, "must be a positive integer")
        for name in ("ffn_hidden_size", "num_query_groups", "head_dim", "moe_ffn_hidden_size"):
            value = getattr(self, name)
            check(value is None or (isinstance(value, int) and value >= 1), name, value, "must be a positive integer or unset")
        for name, most in MAX_SHAPE.items():
            value = getattr(self, name)
            check(value is None or value <= most, name, value, f"is beyond any real model: at most {most:,}")
        check(self.head_dim is not None or self.hidden_size % self.num_heads == 0, "num_heads", self.num_heads,
              f"must divide hidden_size={self.hidden_size} (or give head_dim)")
        check(self.num_heads % self.kv_heads == 0, "num_query_groups", self.num_query_groups,
              f"must divide num_heads={self.num_heads}")
        check(self.position_embedding in ("learned", "rope", "none"), "position_embedding", self.position_embedding,
              "valid: learned, rope, none")
        check(self.normalization in ("layernorm", "rmsnorm"), "normalization", self.normalization, "valid: layernorm, rmsnorm")
        # integer types are what ops may carry, never what a model trains in
        object.__setattr__(self, "dtype", dtype_among("dtype", self.dtype, TRAINING_DTYPES, "valid training dtypes"))
        check(self.num_experts >= 0, "num_experts", self.num_experts, "must be >= 0")
        if self.num_experts:
            check(1 <= self.top_k <= self.num_experts, "top_k", self.top_k, f"must be in 1..num_experts={self.num_experts}")
            check(self.moe_layer_freq >= 1, "moe_layer_freq", self.moe_layer_freq, "must be >= 1")
            check(0 <= self.first_k_dense_layers < self.num_layers, "first_k_dense_layers", self.first_k_dense_layers,
                  f"must be in 0..{self.num_layers - 1}")
            check(self.capacity_factor is None or (math.isfinite(self.capacity_factor) and self.capacity_factor > 0),
                  "capacity_factor", self.capacity_factor, "must be a finite number > 0, or unset (no capacity)")
        else:
            check(self.capacity_factor is None, "capacity_factor", self.capacity_factor,
                  f"applies to MoE models only; {self.name} is dense (num_experts = 0)")

    # ----- derived shapes -----
    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size if self.ffn_hidden_size is not None else 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups if self.num_query_groups is not None else self.num_heads

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def moe_ffn(self) -> int:
        return self.moe_ffn_hidden_size if self.moe_ffn_hidden_size is not None else self.ffn

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether global layer ``layer`` (0-based) has routed experts (Megatron's moe_layer_freq pattern)."""
        if not self.is_moe or layer < self.first_k_dense_layers:
            return False
        return (layer - self.first_k_dense_layers) % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with routed experts: every ``moe_layer_freq``-th from ``first_k_dense_layers`` on (the layers
        :meth:`is_moe_layer` names, counted in closed form: 32 layers, k = 1, freq 2 -> 1, 3, ..., 31: 16)."""
        if not self.is_moe or self.num_layers <= self.first_k_dense_layers:
            return 0
        return -(-(self.num_layers - self.first_k_dense_layers) // self.moe_layer_freq)

    def padded_vocab_size(self, tp: int = 1) -> int:
        """V padded to a multiple of ``make_vocab_size_divisible_by * tp`` (Megatron's _vocab_size_with_padding)."""
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def num_parameters(self, *, padded_vocab: bool = False) -> int:
        """Total parameters N (one copy of everything; the tied output layer counted once). Every layer of one kind
        (dense, MoE) has the same parameters: one of each is counted and multiplied (shape searches count thousands
        of candidates, and a job check counts every model)."""
        from commscope.spec.params import embedding_params, layer_params

        num_moe = self.num_moe_layers
        num_dense = self.num_layers - num_moe
        total = 0
        if num_moe:
            total += num_moe * layer_params(self, self.first_k_dense_layers, tp=1, ep=1).total
        if num_dense:  # layer 0, or layer 1 when experts start at layer 0 (then moe_layer_freq > 1)
            dense = 0 if not self.is_moe or self.first_k_dense_layers else 1
            total += num_dense * layer_params(self, dense, tp=1, ep=1).total
        emb = embedding_params(self, tp=1, padded_vocab=padded_vocab)
        return total + emb.input_embedding + emb.position_embedding + emb.final_norm + (0 if self.tied_embeddings else emb.output_layer)
