"""The columns of a file of measured runs: every spelling of each, and how its cells are read.

:data:`COLUMNS` maps each field :func:`commscope.estimate.validate.read_runs` fills to its spellings and to the
reader of its cells (a positive integer, yes/no, a recomputation, a dtype, an attention backend, ...), each reader
raising :class:`ValueError` with what would be valid; the tuples after it say which fields make the model, the
parallelism, and which take no default. The file format itself is documented in :mod:`commscope.estimate.validate`,
whose docstring the ``validate`` command prints.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from commscope.spec.parallel import (
    ATTENTION_BACKENDS,
    ATTENTION_KINDS,
    FP8_FORMATS,
    FRAMEWORKS,
)
from commscope.units import canonical_dtype


_TRUE = ("yes", "y", "true", "1")
_FALSE = ("no", "n", "false", "0")


def _text(text: str) -> str:
    return text.strip()


def _positive_int(text: str) -> int:
    t = text.strip()
    try:
        value = int(t)
    except ValueError:
        try:
            number = float(t)
        except ValueError:
            raise ValueError("expected a positive integer") from None
        if not number.is_integer():
            raise ValueError("expected a positive integer") from None
        value = int(number)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a positive number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return value


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError("expected yes, no, true, false, 1, 0 or blank")


def _recompute(text: str) -> str:
    """``yes (use_checkpoint=true)``/``full`` -> full, ``selective``, ``no``/``none`` -> none."""
    word = re.match(r"[a-z0-9]*", text.strip().lower()).group(0)  # type: ignore[union-attr]
    if word in ("yes", "full", "true", "1"):
        return "full"
    if word == "selective":
        return "selective"
    if word in ("no", "none", "false", "0"):
        return "none"
    raise ValueError("valid: full (or yes...), selective, none (or no, blank)")


def _dtype(text: str) -> str:
    try:
        return canonical_dtype(text)
    except ValueError as exc:
        raise ValueError(str(exc).split("; ", 1)[-1]) from None


def _attention(text: str) -> str:
    """Megatron-core's --attention-backend spellings to commscope's two attention kinds."""
    kinds = ATTENTION_BACKENDS
    key = text.strip().lower()
    if key not in kinds:
        raise ValueError(f"valid: {', '.join(kinds)} ({', '.join(ATTENTION_KINDS)})")
    return kinds[key]


def _fp8_format(text: str) -> str | None:
    key = text.strip().lower()
    if key in ("none", "no", "false", "0"):
        return None
    if key not in FP8_FORMATS:
        raise ValueError(f"valid: {', '.join(FP8_FORMATS)}, none or blank")
    return key


def _int_list(text: str) -> tuple[int, ...]:
    """``7 8 8 7``, ``7;8;8;7`` or a quoted ``7,8,8,7``: layers per pipeline stage."""
    parts = [p for p in re.split(r"[\s,;]+", text.strip()) if p]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError("expected whole numbers of layers per stage, e.g. 7;8;8;7") from None
    if not values or min(values) < 1:
        raise ValueError("expected positive numbers of layers per stage, e.g. 7;8;8;7")
    return values


def _stack(text: str) -> str:
    from commscope.estimate.stacks import stack_names

    key = text.strip().lower()
    if key not in stack_names():
        raise ValueError(f"valid: {', '.join(stack_names())}")
    return key


def _zero_stage(text: str) -> int:
    value = _positive_int(text) if text.strip() != "0" else 0
    if value > 3:
        raise ValueError("valid: 0, 1, 2, 3")
    return value


def _choice(valid: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        key = text.strip().lower()
        if key not in valid:
            raise ValueError(f"valid: {', '.join(valid)}")
        return key

    return parse


#: Every column :func:`read_runs` knows: the field it fills -> (its spellings, how a cell is read).
#: Spellings are lower case, with ``_`` for any run of spaces and dashes.
COLUMNS: dict[str, tuple[tuple[str, ...], Callable[[str], Any]]] = {
    "case_id": (("case_id", "name", "run"), _text),
    "model": (("model",), _text),
    "num_layers": (("layers", "num_layers"), _positive_int),
    "hidden_size": (("hidden", "hidden_size"), _positive_int),
    "num_heads": (("heads", "num_heads", "num_attention_heads"), _positive_int),
    "ffn_hidden_size": (("ffn_hidden", "ffn_hidden_size"), _positive_int),
    "num_query_groups": (("num_query_groups",), _positive_int),
    "vocab_size": (("vocab", "vocab_size"), _positive_int),
    "seq_len": (("seq_len", "seq_length"), _positive_int),
    "dtype": (("dtype",), _dtype),
    "position_embedding": (("position_embedding", "position_embedding_type"), _choice(("learned", "rope", "none"))),
    "tied_embeddings": (("tied_embeddings",), _bool),
    "gated_mlp": (("gated_mlp",), _bool),
    "normalization": (("normalization",), _choice(("layernorm", "rmsnorm"))),
    "tp": (("t", "tp", "tensor_model_parallel_size"), _positive_int),
    "pp": (("p", "pp", "pipeline_model_parallel_size"), _positive_int),
    "dp": (("d", "dp", "data_parallel_size"), _positive_int),
    "cp": (("cp", "context_parallel_size"), _positive_int),
    "ep": (("ep", "expert_model_parallel_size"), _positive_int),
    "gpus": (("gpus", "num_gpus"), _positive_int),
    "global_batch_size": (("global_batch", "global_batch_size"), _positive_int),
    "micro_batch_size": (("microbatch", "micro_batch_size"), _positive_int),
    "virtual_pipeline_size": (("virtual_pp", "virtual_pipeline_size"), _positive_int),
    "recompute": (("recompute", "recompute_granularity"), _recompute),
    "sequence_parallel": (("seq_parallel", "sequence_parallel"), _bool),
    "distributed_optimizer": (("dist_optimizer", "distributed_optimizer", "use_distributed_optimizer"), _bool),
    "attention": (("attention", "attention_backend"), _attention),
    "fp8_format": (("fp8_format",), _fp8_format),
    "tp_comm_overlap": (("tp_comm_overlap",), _bool),
    "overlap_grad_reduce": (("overlap_grad_reduce",), _bool),
    "overlap_param_gather": (("overlap_param_gather",), _bool),
    "overlap_p2p_comm": (("overlap_p2p_comm", "overlap_p2p_communication"), _bool),
    "scatter_gather_tensors_in_pipeline": (("scatter_gather_tensors_in_pipeline", "scatter_gather"), _bool),
    "gradient_accumulation_fusion": (("gradient_accumulation_fusion",), _bool),
    "framework": (("framework",), _choice(FRAMEWORKS)),
    "stack": (("stack", "software_stack"), _stack),
    "grad_reduce_dtype": (("grad_reduce_dtype", "grad_reduce_in", "gradient_reduce_dtype"),
                          _choice(("fp32", "bf16", "fp16", "fp8"))),
    "zero_stage": (("zero_stage",), _zero_stage),
    "schedule": (("schedule", "pipeline_schedule"), _choice(("1f1b", "interleaved", "gpipe"))),
    "order": (("order", "rank_order"), _text),
    "grad_bucket_size": (("grad_bucket_size", "ddp_bucket_size"), _positive_int),
    "pipeline_layers": (("pipeline_layers",), _int_list),
    "decoder_first_pipeline_num_layers": (("decoder_first_pipeline_num_layers",), _positive_int),
    "decoder_last_pipeline_num_layers": (("decoder_last_pipeline_num_layers",), _positive_int),
    "head_dim": (("head_dim", "kv_channels"), _positive_int),
    "bias": (("bias", "add_bias_linear"), _bool),
    "make_vocab_size_divisible_by": (("make_vocab_size_divisible_by",), _positive_int),
    "num_experts": (("num_experts",), _positive_int),
    "top_k": (("top_k", "moe_router_topk"), _positive_int),
    "moe_layer_freq": (("moe_layer_freq",), _positive_int),
    "moe_ffn_hidden_size": (("moe_ffn_hidden_size",), _positive_int),
    "num_shared_experts": (("num_shared_experts",), _positive_int),
    "first_k_dense_layers": (("first_k_dense_layers",), _positive_int),
    "capacity_factor": (("capacity_factor", "moe_expert_capacity_factor"), _positive_float),
    "gpu": (("gpu", "gpu_type"), _text),
    "cluster": (("cluster",), _text),
    "gpus_per_node": (("gpus_per_node",), _positive_int),
    "intra_node_GBps": (("intra_node_gbps",), _positive_float),
    "inter_node_GBps": (("inter_node_gbps",), _positive_float),
    "measured_iter_time_s": (("measured_iter_time_s", "iteration_time_s"), _positive_float),
    "measured_tflops_per_gpu": (("measured_tflops_per_gpu",), _positive_float),
}
_SPELLING = {spelling: name for name, (spellings, _) in COLUMNS.items() for spelling in spellings}
_SHAPE = ("num_layers", "hidden_size", "num_heads")
_MODEL_FIELDS = ("ffn_hidden_size", "num_query_groups", "vocab_size", "seq_len", "dtype", "position_embedding",
                 "tied_embeddings", "gated_mlp", "normalization", "head_dim", "bias", "make_vocab_size_divisible_by",
                 "num_experts", "top_k", "moe_layer_freq", "moe_ffn_hidden_size", "num_shared_experts",
                 "first_k_dense_layers", "capacity_factor")
_PARALLEL_FIELDS = ("tp", "pp", "dp", "cp", "ep", "global_batch_size", "micro_batch_size", "virtual_pipeline_size",
                    "recompute", "sequence_parallel", "distributed_optimizer", "attention", "fp8_format",
                    "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm",
                    "scatter_gather_tensors_in_pipeline", "gradient_accumulation_fusion", "framework", "stack",
                    "grad_reduce_dtype", "zero_stage", "schedule", "order", "grad_bucket_size", "pipeline_layers",
                    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
_NOT_DEFAULTS = ("case_id", "measured_iter_time_s", "measured_tflops_per_gpu")


def _spelled(name: str) -> str:
    """``tp`` -> ``t|tp|tensor_model_parallel_size``: the spellings of a column, for messages."""
    return "|".join(COLUMNS[name][0])


def _normal(header: str) -> str:
    return re.sub(r"[\s\-]+", "_", header.strip().lower())
