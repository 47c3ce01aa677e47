"""Memory per GPU of Megatron-style training: model states (ZeRO) and activations (Korthikanti et al.).

Model states, mixed-precision Adam [zero-2020] section 3.1: with Psi parameters on a rank, training keeps
16-bit weights (2 Psi bytes), gradients (2 Psi) and K Psi bytes of optimizer states, K = 12: an fp32 master copy
of the weights, Adam's momentum and variance. Megatron accumulates the gradients of bf16 models in fp32
``main_grad`` buffers [megatron-core], so there a gradient costs 4 bytes: 2 + 4 + 12 = 18 bytes per
parameter, the figure of Megatron's ``theoretical_memory_usage.py``. Sharding over the data-parallel group
N_d (dp x cp for dense parameters; the expert-data-parallel group dp x cp / ep for expert parameters):

    ZeRO-0                            (B + G + K) Psi
    ZeRO-1 / distributed optimizer    (B + G) Psi + K Psi / N_d
    ZeRO-2                            B Psi + (G + K) Psi / N_d
    ZeRO-3                            (B + G + K) Psi / N_d

with B the model dtype's bytes and G the gradient dtype's (``grad_dtype``). Psi per rank comes from
:func:`commscope.spec.params.stage_params` (already split by tp, and expert weights by ep x tp). Worked example,
[zero-2020] Figure 1: Psi = 7.5e9, N_d = 64, K = 12, G = 2: 120 GB (ZeRO-0), 31.4 GB (ZeRO-1), 16.6 GB (ZeRO-2),
1.88 GB (ZeRO-3).

Activations of one transformer layer for one micro-batch, [korthikanti-2022] section 4 and Table 2, in bytes
with s sequence, b micro-batch, h hidden, a heads, t tp (16-bit activations, 1-byte dropout masks):

    no parallelism                          s b h (34 + 5 a s / h)
    tensor parallel                         s b h (10 + 24/t + 5 a s / (h t))
    tensor + sequence parallel              s b h (34/t + 5 a s / (h t))
    tensor parallel + selective recompute   s b h (10 + 24/t)
    tensor + sequence + selective           s b h 34/t
    full recomputation                      s b h 2       (the layer input; / t with sequence parallelism)

Of the 34: 10 s b h are replicated across TP ranks unless sequence parallelism splits them (the two norm inputs
4, the inputs of the QKV and first MLP projections 2 + 2, two dropout masks 1 + 1); 24 are always split over t
(Q, K, V and the output-projection input 2 + 2 + 2 + 2; the MLP's GeLU input and output 8 + 8); 5 a s / h is
the attention score matrix, its dropout mask and output (2 + 1 + 2), which selective recomputation drops.
This module counts those tensors for the model's actual shape, so that it equals the table for a GPT shape
(multi-head attention, f = 4 h, B = 2) and generalises it: per token

    replicated (split by SP only)   h (4 B + 2)
    split over t                    (2 a d_h + 2 g' d_h) B + (2 + gated) f B,   g' = max(g, t) (K/V heads)
    attention scores (split by t)   a s (2 B + 1)   unfused attention (``ParallelSpec.attention="unfused"``)
                                    4 a             flash attention: no s x s scores, an fp32 log-sum-exp per head

with g query groups, d_h head size, f the FFN width; a gated (SwiGLU) MLP saves its 2f-wide input and its
f-wide output. This is Megatron's generalisation ``18 + 4 f / h`` of the 34 (``theoretical_memory_usage.py``)
extended to grouped-query attention and gated MLPs. Context parallelism splits the sequence: s becomes s / c
in every term (the score term included, as the paper's formula with s / c; Megatron runs context parallelism
with flash attention, which stores no score matrix at all). A flash-attention run (the default, as Megatron-core,
NeMo and PyTorch's scaled_dot_product_attention run) keeps only the kernel's softmax statistics, so for memory its
``recompute="none"`` is within 4 a bytes per token of ``"selective"``; the paper's 5 a s / h is for unfused attention.

MoE layers (assumption, balanced routing, no token padding): the attention part and the replicated part are
those of a dense layer; each token's top_k copies are dispatched to experts, and every copy stores the
expert's input (h B, gathered over TP by Megatron's token dispatcher, so never split by t) and the expert
MLP's intermediate tensors ((2 + gated) f_moe B, split over t); shared experts add their own intermediates.
So the expert activations scale with top_k. Router logits (E fp32 values per token) are neglected.

Worked example, GPT-3 175B (h = 12288, a = 96, s = 2048) with t = 8, b = 1, sequence parallelism and selective
recomputation: 34 s b h / t = 34 x 2048 x 12288 / 8 = 106,954,752 B = 102 MiB per layer per micro-batch; with
p = 8 the first stage holds 8 micro-batches of its 12 layers, 9.6 GiB (computed here, to set beside the
paper's Figure 1 and Table 4 for the 175B model; not a number read off the paper).
Without SP or recomputation the same layer takes s b h (10 + 24/8 + 5 x 96 x 2048 / (12288 x 8)) = 23 s b h
= 578,813,952 B = 0.54 GiB, 5.4 times as much.

Pipeline schedules ([megatron-sc21], [korthikanti-2022] section 4.2.3): at the peak, just before its first
backward pass, pipeline stage i of p holds the activations of

    1F1B               min(p - i, m) micro-batches of its layers
    interleaved 1F1B   min(2 (p - i - 1) + (v - 1) p + 1, m v) forward passes of model chunks (Megatron's
                       warm-up count + 1); for the first stage p v + p - 1 chunk passes, i.e. p micro-batches
                       of its L / p layers times the paper's factor 1 + (p - 1) / (p v)
    GPipe              all m micro-batches

so the first stage holds the most, unless large output layers make the last one heavier. Embedding and
output ([korthikanti-2022] section 4.3): the first stage also stores the embedding dropout mask, s b h bytes
(/ t with SP) per micro-batch in flight; the last stage stores the final norm's and output layer's inputs,
2 s b h B (/ t with SP), and the fp32 logits for the cross-entropy, 4 s b V / t, i.e. the paper's
4 s b h / t (1 + V / h). Token ids, pipeline receive buffers, temporary buffers, ZeRO-3's gathered layers,
full recomputation's one rematerialised layer and the allocator's fragmentation are not counted: real peaks
are a few GiB higher.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from commscope.estimate.compute.kernels import fused_softmax_available, softmax_fallback_saved_bytes
from commscope.errors import check
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.spec.params import LayerParams, embedding_params, layer_params, stage_params
from commscope.units import dtype_bytes
from commscope.pattern.workload.dense import check_job
from commscope.pattern.workload.framework import grad_dtype
from commscope.pattern.workload.stages import pipeline_split, stage_layers

__all__ = [
    "OPTIMIZER_STATES",
    "RECOMPUTE_CODES",
    "SCHEDULE_CODES",
    "MemoryBreakdown",
    "layer_activation_bytes",
    "memory_per_gpu",
    "memory_per_stage",
    "optimizer_bytes_per_param",
    "total_memory_bytes",
]

#: fp32 state tensors per parameter that each optimizer keeps besides the fp32 master weights.
OPTIMIZER_STATES: dict[str, int] = {"adam": 2, "adamw": 2, "sgd": 1}

#: Codes of the recomputation modes in :func:`total_memory_bytes` arrays.
RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}

#: Codes of the pipeline schedules in :func:`total_memory_bytes` arrays.
SCHEDULE_CODES: dict[str, int] = {"1f1b": 0, "gpipe": 1}

_FP32_BYTES = 4
_MASK_BYTES = 1  # a dropout mask stores one byte per element [korthikanti-2022]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes held by one GPU at its peak, by kind."""

    weights_bytes: float
    """Model weights in the model dtype (sharded over the data-parallel group with ZeRO-3)."""
    grads_bytes: float
    """Gradient buffers in the gradient dtype (sharded with ZeRO-2 and 3)."""
    optimizer_bytes: float
    """Optimizer states: fp32 master weights and moments (sharded with ZeRO >= 1 or the distributed optimizer)."""
    activations_bytes: float
    """Activations saved for the backward pass, all micro-batches in flight at the peak."""
    stage: int
    """The pipeline stage this GPU belongs to (for :func:`memory_per_gpu`, the most loaded one)."""

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes

    def to_dict(self) -> dict[str, float | int]:
        """Fields and ``total_bytes`` as a plain dict (for JSON and tables)."""
        return {**asdict(self), "total_bytes": self.total_bytes}


def optimizer_bytes_per_param(model: ModelSpec, optimizer: str = "adam") -> int:
    """Bytes of optimizer state per parameter, unsharded: K = 12 for Adam on a 16-bit model [zero-2020].

    fp32 moments (2 for Adam, 1 for SGD's momentum) plus an fp32 master copy unless the model is fp32 already.
    """
    check(optimizer in OPTIMIZER_STATES, "optimizer", optimizer, f"valid: {', '.join(OPTIMIZER_STATES)}")
    master = _FP32_BYTES if model.dtype_bytes < _FP32_BYTES else 0
    return OPTIMIZER_STATES[optimizer] * _FP32_BYTES + master


# ----- activations -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TokenActivations:
    """Activation bytes per token of one layer, split by how tensor parallelism divides them (internal)."""

    replicated: float  # divided by t only with sequence parallelism
    split: float  # always divided by t
    scores: float  # attention scores (unfused) or the softmax statistics (flash), divided by t; dropped by selective
    unsplit: float  # never divided by t (MoE dispatched tokens)
    layer_input: float  # what full recomputation keeps; divided by t with sequence parallelism


def _token_activations(model: ModelSpec, *, moe: bool, tp: int, seq: float, flash: bool = False) -> _TokenActivations:
    """Per-token activation bytes of a dense or MoE layer, for ``seq`` keys per query (s / c); ``flash``: a fused
    attention kernel, which keeps no s x s scores, only one fp32 log-sum-exp per head and query."""
    h, B = model.hidden_size, model.dtype_bytes
    a_dh = model.num_heads * model.head_size
    g_dh = max(model.kv_heads, tp) * model.head_size  # K/V heads are copied when tp > g
    mlp_tensors = 3 if model.gated_mlp else 2  # GeLU in + out; SwiGLU 2f in + f out
    replicated = 2 * h * B + h * B + h * B + 2 * h * _MASK_BYTES  # 2 norm inputs, QKV input, MLP input, 2 masks
    attention = (2 * a_dh + 2 * g_dh) * B  # Q, K, V, output-projection input
    if moe:
        ffn = model.moe_ffn * (model.top_k + model.num_shared_experts)
        unsplit = model.top_k * h * B
    else:
        ffn = model.ffn
        unsplit = 0
    return _TokenActivations(
        replicated=float(replicated),
        split=float(attention + mlp_tensors * ffn * B),
        scores=float(model.num_heads * (_FP32_BYTES if flash else seq * (2 * B + _MASK_BYTES))),
        unsplit=float(unsplit),
        layer_input=float(h * B),
    )


def layer_activation_bytes(model: ModelSpec, parallel: ParallelSpec, layer: int) -> float:
    """Bytes one rank saves for global layer ``layer`` and ONE micro-batch [korthikanti-2022] Table 2.

    GPT-3 175B, tp 8, sequence parallelism, selective recomputation, b = 1: 34 s b h / t = 106,954,752 B.
    """
    t = parallel.tp
    sp = parallel.sequence_parallel and t > 1
    seq = model.seq_len / parallel.cp
    tokens = parallel.micro_batch_size * seq
    ta = _token_activations(model, moe=model.is_moe_layer(layer), tp=t, seq=seq, flash=parallel.attention == "flash")
    sp_div = t if sp else 1
    if parallel.recompute == "full":
        return tokens * ta.layer_input / sp_div
    per_token = ta.replicated / sp_div + ta.split / t + ta.unsplit
    if parallel.recompute == "none":
        per_token += ta.scores / t
        if parallel.attention == "unfused" and not fused_softmax_available(
                model, micro_batch_size=parallel.micro_batch_size, tp=t, cp=parallel.cp):
            per_token += model.num_heads * seq * softmax_fallback_saved_bytes(model) / t  # PyTorch's fp32 softmax
    return tokens * per_token


def _embedding_activation_bytes(model: ModelSpec, parallel: ParallelSpec) -> float:
    """First stage, per micro-batch: the embedding dropout mask, s b h (/ t with SP) [korthikanti-2022] 4.3."""
    t = parallel.tp
    sp_div = t if parallel.sequence_parallel and t > 1 else 1
    return parallel.micro_batch_size * model.seq_len / parallel.cp * model.hidden_size * _MASK_BYTES / sp_div


def _output_activation_bytes(model: ModelSpec, parallel: ParallelSpec) -> float:
    """Last stage, per micro-batch: final-norm and output-layer inputs, fp32 logits [korthikanti-2022] 4.3."""
    t = parallel.tp
    sp_div = t if parallel.sequence_parallel and t > 1 else 1
    tokens = parallel.micro_batch_size * model.seq_len / parallel.cp
    inputs = 2 * model.hidden_size * model.dtype_bytes / sp_div
    logits = _FP32_BYTES * model.padded_vocab_size(t) / t
    return tokens * (inputs + logits)


def _chunk_passes_in_flight(parallel: ParallelSpec, stage: int) -> list[int]:
    """Forward passes of each model chunk of ``stage`` whose activations are alive at the peak.

    Megatron's interleaved schedule runs forward passes in groups of p micro-batches per chunk (chunk of the
    k-th forward: (k // p) mod v), and does warm-up = 2 (p - i - 1) + (v - 1) p of them before the first
    backward pass; 1F1B warms up p - i - 1; GPipe runs all m forwards first.
    """
    p, v, m = parallel.pp, parallel.virtual_pipeline_size, parallel.num_micro_batches
    if parallel.schedule == "gpipe":
        return [m]
    if v == 1:
        return [min(p - stage, m)]
    passes = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    counts = [0] * v
    for k in range(passes):
        counts[(k // p) % v] += 1
    return counts


# ----- scalar, per stage -----------------------------------------------------------------------------------------


def memory_per_stage(
    model: ModelSpec, parallel: ParallelSpec, *, optimizer: str = "adam"
) -> tuple[MemoryBreakdown, ...]:
    """Peak memory of one GPU of each pipeline stage (index = stage). See the module docstring for the formulas."""
    K = optimizer_bytes_per_param(model, optimizer)
    check_job(model, parallel)
    p, v = parallel.pp, parallel.virtual_pipeline_size
    B = model.dtype_bytes
    G = dtype_bytes(grad_dtype(model, parallel))
    dense_group = parallel.dp * parallel.cp
    expert_group = parallel.expert_dp
    z = parallel.zero_stage
    w_div = (dense_group, expert_group) if z == 3 else (1, 1)
    g_div = (dense_group, expert_group) if z >= 2 else (1, 1)
    o_div = (dense_group, expert_group) if parallel.shards_optimizer else (1, 1)
    emb_act = _embedding_activation_bytes(model, parallel)
    out_act = _output_activation_bytes(model, parallel)

    out: list[MemoryBreakdown] = []
    for stage in range(p):
        chunks = stage_layers(model, parallel, stage)
        in_flight = _chunk_passes_in_flight(parallel, stage)
        dense = expert = 0
        activations = 0.0
        for chunk, (layers, passes) in enumerate(zip(chunks, in_flight, strict=True)):
            first = stage == 0 and chunk == 0
            last = stage == p - 1 and chunk == v - 1
            sp = stage_params(model, layers, tp=parallel.tp, ep=parallel.ep, first=first, last=last)
            dense += sp.dense
            expert += sp.expert
            chunk_act = sum(layer_activation_bytes(model, parallel, layer) for layer in layers)
            chunk_act += (emb_act if first else 0.0) + (out_act if last else 0.0)
            activations += passes * chunk_act
        out.append(MemoryBreakdown(
            weights_bytes=B * (dense / w_div[0] + expert / w_div[1]),
            grads_bytes=G * (dense / g_div[0] + expert / g_div[1]),
            optimizer_bytes=K * (dense / o_div[0] + expert / o_div[1]),
            activations_bytes=activations,
            stage=stage,
        ))
    return tuple(out)


#: Fraction of a GPU's memory a configuration may plan to use (the rest: CUDA context, allocator fragmentation,
#: NCCL buffers); ``plan`` keeps configurations under it and ``estimate`` says when one is over it.
USABLE_MEMORY_FRACTION = 0.9


def memory_per_gpu(model: ModelSpec, parallel: ParallelSpec, *, optimizer: str = "adam") -> MemoryBreakdown:
    """Peak memory of the most loaded GPU: every pipeline stage checked, the largest total taken.

    ``optimizer``: ``adam`` / ``adamw`` (12 bytes of state per parameter for a 16-bit model) or ``sgd``
    (momentum, 8). Worked example, a Llama-3-70B shape on tp 8, pp 8, dp 8, b 1, s 8192, sequence parallelism,
    selective recomputation, distributed optimizer, gb 512: stage 0 holds 1.2e9 parameters (9.0 GB of model
    states at 2 + 4 + 12/8 bytes each) and 8 micro-batches of 10 layers of 298 MB of activations (23.9 GB):
    32.9 GB = 30.6 GiB in all.
    """
    stages = memory_per_stage(model, parallel, optimizer=optimizer)
    return max(stages, key=lambda mb: mb.total_bytes)


# ----- vectorised ------------------------------------------------------------------------------------------------


def _codes(value: ArrayLike, codes: dict[str, int], name: str) -> np.ndarray:
    """Names or integer codes -> an int64 array of codes; unknown names raise ConfigError."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "UO":
        return arr.astype(np.int64)
    out = np.full(arr.shape, -1, dtype=np.int64)
    for label, code in codes.items():
        out[arr == label] = code  # one vectorised comparison per name, no Python loop over the elements
    unknown = out < 0
    check(not unknown.any(), name, str(arr[unknown].flat[0]) if unknown.any() else None,
          f"valid: {', '.join(codes)} (or their codes {list(codes.values())})")
    return out


def _layer_kind_params(model: ModelSpec, moe: bool) -> LayerParams:
    """LayerParams of a dense or an MoE layer (all layers of one kind have the same counts)."""
    for layer in range(model.num_layers):
        if model.is_moe_layer(layer) == moe:
            return layer_params(model, layer, tp=1, ep=1)
    return LayerParams(tp_sharded=0, replicated=0, expert=0)


def _split(model: ModelSpec, pp: int, v: int) -> list[int]:
    """Layers of each virtual stage (chunk x pp + stage) as the workload splits them for (pp, v)."""
    return pipeline_split(model, ParallelSpec(pp=pp, virtual_pipeline_size=v, global_batch_size=pp))


def _chunk_count(passes: np.ndarray, p: np.ndarray, v: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """How many of the first ``passes`` forward passes (grouped p per chunk, cyclically) run ``chunk``."""
    cycle = p * v
    return (passes // cycle) * p + np.clip(passes % cycle - chunk * p, 0, p)


def _chunk_split(model: ModelSpec, p: np.ndarray,
                 v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool, np.ndarray]:
    """The layers of each chunk of many configurations, as the workload splits them (even, or balanced when pp x v
    does not divide the layers), computed once per (pp, v) pair among them: each configuration's index into the
    pairs, the layers of each pair's virtual stages (chunk x pp + stage) and the layer each starts at, whether every
    split is even, and (under an uneven split) the first middle stage of each run of stages that hold alike."""
    L = model.num_layers
    p_b, v_b = np.broadcast_arrays(p, v)
    present = np.zeros((int(p_b.max()) + 1, int(v_b.max()) + 1), dtype=bool)
    present[p_b, v_b] = True
    pairs = np.argwhere(present)  # the few (pp, v) pairs among the configurations
    ids = np.zeros(present.shape, dtype=np.int64)
    ids[pairs[:, 0], pairs[:, 1]] = np.arange(len(pairs))
    pair_index = ids[p_b, v_b]
    width = int((pairs[:, 0] * pairs[:, 1]).max())
    sizes = np.zeros((len(pairs), width), dtype=np.int64)
    for u, (pu, vu) in enumerate(pairs):
        if 1 <= pu * vu <= L:  # else no split exists: an invalid configuration, left with no layers
            split = _split(model, int(pu), int(vu))
            sizes[u, :len(split)] = split
    starts = np.cumsum(sizes, axis=1) - sizes
    even = bool(np.all(L % (pairs[:, 0] * pairs[:, 1]) == 0))
    # under an uneven split, the first middle stage of each run of stages whose chunks hold alike (stage 1, and
    # where the heavier stages begin): later stages of a run hold its layers with fewer micro-batches in flight
    runs = [[s for s in range(1, max(int(pu) - 1, 2)) if s == 1 or any(
        sizes[u, c * pu + s] != sizes[u, c * pu + s - 1] for c in range(int(vu)))] for u, (pu, vu) in enumerate(pairs)]
    run_starts = np.ones((len(pairs), max(len(r) for r in runs)), dtype=np.int64)
    for u, r in enumerate(runs):
        run_starts[u, :len(r)] = r
    return pair_index, sizes, starts, even, run_starts


def _activation_bytes(model: ModelSpec, attention: str, *, t: np.ndarray, tf: np.ndarray, c: np.ndarray,
                      b: np.ndarray, sp: np.ndarray, rc: np.ndarray,
                      vocab: np.ndarray) -> tuple[np.ndarray, np.ndarray | float, np.ndarray, np.ndarray]:
    """Activation bytes one micro-batch leaves on a GPU, per configuration: of a dense layer, of an MoE layer (0 for a
    dense model), of the embedding and of the output layer ([korthikanti-2022] Table 2, generalised; see the module
    docstring)."""
    B, h = model.dtype_bytes, model.hidden_size
    seq = model.seq_len / c
    tokens = b * seq
    sp_div = np.where(sp, tf, 1.0)

    def layer_act(moe: bool) -> np.ndarray:
        flash = attention == "flash"
        ta = _token_activations(model, moe=moe, tp=1, seq=1.0, flash=flash)
        # K/V heads are copied when tp > g: the split term counts max(g, t) of them
        kv_extra = 2 * (np.maximum(model.kv_heads, t) - model.kv_heads) * model.head_size * B
        scores = ta.scores * (1.0 if flash else seq) / tf
        if not flash:  # where Megatron's fused softmax does not run, PyTorch's keeps its output in fp32
            fallback = ~fused_softmax_available(model, micro_batch_size=b, tp=t, cp=c)
            scores = scores + np.where(fallback, model.num_heads * seq * softmax_fallback_saved_bytes(model) / tf, 0.0)
        kept = (ta.replicated / sp_div + (ta.split + kv_extra) / tf + ta.unsplit
                + np.where(rc == RECOMPUTE_CODES["none"], scores, 0.0))
        return tokens * np.where(rc == RECOMPUTE_CODES["full"], ta.layer_input / sp_div, kept)

    act_dense = layer_act(False)
    act_moe = layer_act(True) if model.is_moe else 0.0
    emb_act = tokens * h * _MASK_BYTES / sp_div
    out_act = tokens * (2 * h * B / sp_div + _FP32_BYTES * vocab / tf)
    return act_dense, act_moe, emb_act, out_act


def total_memory_bytes(
    model: ModelSpec,
    *,
    tp: ArrayLike, pp: ArrayLike, dp: ArrayLike, cp: ArrayLike = 1, ep: ArrayLike = 1,
    micro_batch_size: ArrayLike, global_batch_size: ArrayLike, virtual_pipeline_size: ArrayLike = 1,
    sequence_parallel: ArrayLike = False, recompute: ArrayLike = "none", zero_stage: ArrayLike = 0,
    distributed_optimizer: ArrayLike = False, schedule: ArrayLike = "1f1b", optimizer: str = "adam",
    grad_reduce_dtype: str | None = None, attention: str = "flash",
) -> np.ndarray:
    """Peak bytes per GPU of many configurations at once: :func:`memory_per_gpu` in closed form over arrays.

    Every argument except ``model``, ``optimizer``, ``grad_reduce_dtype`` and ``attention`` (one of
    :data:`~commscope.spec.parallel.ATTENTION_KINDS`, as ``ParallelSpec.attention``) may be a scalar or an array; they
    broadcast. ``recompute`` takes names or :data:`RECOMPUTE_CODES` (0 none, 1 selective, 2 full), ``schedule``
    names or :data:`SCHEDULE_CODES`. Configurations must be valid (:func:`commscope.pattern.workload.dense.check_job`);
    this function does not check them. The layers are split as the workload splits them (evenly, or the balanced
    uneven split of :func:`commscope.pattern.workload.stages.pipeline_split`).

    When all layers are of one kind (dense, or all MoE) only the first, the last, and the first middle stage of each
    run of middle stages that hold alike are evaluated (later stages of a run hold its layers with fewer micro-batches
    in flight); when dense and MoE layers mix, every stage; the result is the largest. Parameters are divided exactly
    by t where Megatron's integer shards round down (its shapes divide evenly, so both agree). Returns float64 bytes.
    """
    K = optimizer_bytes_per_param(model, optimizer)
    t, p, d, c, e, b, gb, v = (np.asarray(x, dtype=np.int64) for x in
                               (tp, pp, dp, cp, ep, micro_batch_size, global_batch_size, virtual_pipeline_size))
    sp = np.asarray(sequence_parallel, dtype=bool) & (t > 1)
    rc = _codes(recompute, RECOMPUTE_CODES, "recompute")
    shape = np.broadcast_shapes(t.shape, p.shape, d.shape, c.shape, e.shape, b.shape, gb.shape, v.shape, sp.shape,
                                rc.shape, np.shape(zero_stage), np.shape(distributed_optimizer), np.shape(schedule))
    if 0 in shape:  # no configurations (the reductions below over them have no identity)
        return np.zeros(shape, dtype=np.float64)
    gpipe = _codes(schedule, SCHEDULE_CODES, "schedule") == SCHEDULE_CODES["gpipe"]
    zero = np.asarray(zero_stage, dtype=np.int64)
    shard_opt = (zero >= 1) | np.asarray(distributed_optimizer, dtype=bool)
    B = model.dtype_bytes
    G = dtype_bytes(grad_reduce_dtype or ("fp32" if model.dtype == "bf16" else model.dtype))
    L, h = model.num_layers, model.hidden_size
    m = gb // (b * d)
    tf = t.astype(np.float64)

    # ---- layers of each chunk (the split the workload uses: even, or balanced when pp x v does not divide the
    # layers), looked up per configuration; MoE layers of a chunk counted by prefix sums ----
    pair_index, sizes, starts, even, run_starts = _chunk_split(model, p, v)
    n_even = L // (p * v)
    cum_moe = np.concatenate(([0], np.cumsum([model.is_moe_layer(i) for i in range(L)]))).astype(np.int64)
    v_max = int(np.max(v))

    def chunks(stage: np.ndarray, passes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Of ``stage``: (layers, MoE layers, sum over its chunks of layers x forward passes in flight, the same of
        MoE layers)."""
        layers = n_moe = weighted = moe_weighted = np.zeros((), dtype=np.int64)
        if even and not model.is_moe:  # every chunk alike: closed form
            return n_even * v, n_moe, n_even * passes, moe_weighted
        for j in range(v_max):
            active = j < v
            k = np.where(active, j * p + stage, 0)
            n_j = np.where(active, sizes[pair_index, k], 0)
            count = _chunk_count(passes, p, v, np.asarray(j))
            layers, weighted = layers + n_j, weighted + n_j * count
            if model.is_moe:
                start = starts[pair_index, k]
                moe_j = np.where(active, cum_moe[np.minimum(start + n_j, L)] - cum_moe[np.minimum(start, L)], 0)
                n_moe, moe_weighted = n_moe + moe_j, moe_weighted + moe_j * count
        return layers, n_moe, weighted, moe_weighted

    # ---- parameters per rank (dense part split over dp x cp by ZeRO, expert part over dp x cp / ep) ----
    dl, ml = _layer_kind_params(model, False), _layer_kind_params(model, True)
    emb = embedding_params(model, tp=1, padded_vocab=False)
    mult = model.make_vocab_size_divisible_by * t
    vocab = -(-model.vocab_size // mult) * mult
    word = vocab * h / tf
    dc = (d * c).astype(np.float64)
    edp = dc / e

    def states(n_stage: np.ndarray, n_moe: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        dense = (n_stage - n_moe) * (dl.tp_sharded / tf + dl.replicated) + n_moe * (ml.tp_sharded / tf + ml.replicated)
        dense = dense + np.where(first, word + emb.position_embedding, 0.0)
        output = np.where(first & model.tied_embeddings, 0.0, word)
        dense = dense + np.where(last, emb.final_norm + output, 0.0)
        expert = n_moe * ml.expert / (e * tf)
        w = B * np.where(zero == 3, dense / dc + expert / edp, dense + expert)
        g = G * np.where(zero >= 2, dense / dc + expert / edp, dense + expert)
        o = K * np.where(shard_opt, dense / dc + expert / edp, dense + expert)
        return w + g + o

    # ---- activations per micro-batch ([korthikanti-2022] Table 2, generalised; see the module docstring) ----
    act_dense, act_moe, emb_act, out_act = _activation_bytes(model, attention, t=t, tf=tf, c=c, b=b, sp=sp, rc=rc,
                                                             vocab=vocab)

    def stage_total(stage: np.ndarray) -> np.ndarray:
        """Peak bytes of pipeline ``stage`` (an array broadcasting with the configurations)."""
        first, last = stage == 0, stage == p - 1
        passes = np.where(gpipe, m, np.where(v == 1, np.minimum(p - stage, m),
                                             np.minimum(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)))
        n_stage, n_moe, layer_passes, moe_passes = chunks(stage, passes)
        # forward passes in flight x layers of their chunk: layer_passes in all, moe_passes of them MoE layers
        act = (layer_passes - moe_passes) * act_dense + moe_passes * act_moe
        act = act + np.where(first, _chunk_count(passes, p, v, np.zeros((), dtype=np.int64)) * emb_act, 0.0)
        act = act + np.where(last, _chunk_count(passes, p, v, v - 1) * out_act, 0.0)
        return states(n_stage, n_moe, first, last) + act

    # Middle stages of a run hold alike (an even split; the balanced split's lighter, then heavier middle stages)
    # with fewer micro-batches in flight the later they are: with layers all of one kind only the first, the first of
    # each run of middle stages (under an uneven split they hold more layers than the first), and the last stage can
    # be the most loaded. With dense and MoE layers mixed (first_k_dense_layers, moe_layer_freq) a middle stage may
    # hold more experts: every stage.
    result = np.maximum(stage_total(np.zeros((), dtype=np.int64)), stage_total(p - 1))
    if not even:
        for j in range(run_starts.shape[1]):
            result = np.maximum(result, stage_total(np.minimum(run_starts[pair_index, j], p - 1)))
    if 0 < cum_moe[-1] < L:
        for stage in range(1, int(np.max(p)) - 1):
            result = np.where(stage < p - 1, np.maximum(result, stage_total(np.asarray(stage))), result)
    return result.astype(np.float64)
