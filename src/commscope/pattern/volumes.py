"""Per-axis traffic volumes of many configurations at once, in closed form (numpy arrays in, arrays out).

These are the totals of the traffic matrix (wire bytes per iteration summed over all GPUs, ring
algorithms) that :func:`commscope.pattern.traffic.traffic_of` computes op by op; the test suite checks that
both agree to the byte. With t, p, d, c, e = tp, pp, dp, cp, ep; m micro-batches; b micro-batch size;
a = b (s/c) h B the activation bytes of one micro-batch on one rank; f = 1 with full recomputation:

    TP   = d c m [2 (t-1) a ((4 + 2 f) L + 2) + 6 (t-1) b (s/c) 4]  (+ SP norm-grad all-reduce)  [megatron-sc21]
    PP   = (p v - 1) x lanes x 2 m x message,  lanes x message = t d c a  (d c a with SP: a / t each)  [seed-talk]
    CP   = t d c L m (c-1) (3 + f) kv,  kv = 2 b (s/c) (g/t) d_h B
    DP   = 2 (d c - 1) G W  (ZeRO-0);  (d c - 1)(G + B) W  (ZeRO-1/2, dist. opt.);
           m (d c - 1)(2 B + G) W  (ZeRO-3),  W = parameters summed over one rank of every (pp, tp) position
    EMB  = 2 d c (V' h) G  when embeddings are tied and p > 1
    EP   = (t d c / e) L_moe m 4 (e-1) T k h B  (balanced routing; T tokens per rank)
         + t d c L_moe m (e-1) E 8            (the dispatcher's all-gather of E int64 token counts per rank)
"""

from __future__ import annotations

import numpy as np

from commscope.spec.model import ModelSpec
from commscope.spec.params import layer_params
from commscope.units import dtype_bytes


def axis_volumes(
    model: ModelSpec,
    *,
    tp, pp, dp, cp=1, ep=1, micro_batch_size=1, global_batch_size, virtual_pipeline_size=1,
    sequence_parallel=False, recompute_full=False, zero_stage=0, distributed_optimizer=False,
    grad_reduce_dtype: str | None = None,
) -> dict[str, np.ndarray]:
    """Wire bytes per iteration per axis (tp, pp, dp, emb, cp, ep) for each configuration.

    Every argument may be a scalar or an array; they broadcast. Configurations must be valid
    (see :func:`commscope.pattern.workload.dense.check_job`); this function does not check them.
    """
    t, p, d, c, e = (np.asarray(x, dtype=np.int64) for x in (tp, pp, dp, cp, ep))
    b = np.asarray(micro_batch_size, dtype=np.int64)
    gb = np.asarray(global_batch_size, dtype=np.int64)
    v = np.asarray(virtual_pipeline_size, dtype=np.int64)
    sp = np.asarray(sequence_parallel, dtype=bool) & (t > 1)
    full = np.asarray(recompute_full, dtype=np.int64)
    zero = np.asarray(zero_stage, dtype=np.int64)
    shard = (zero >= 1) | np.asarray(distributed_optimizer, dtype=bool)
    B = model.dtype_bytes
    G = dtype_bytes(grad_reduce_dtype or ("fp32" if model.dtype == "bf16" else model.dtype))
    h, L, s = model.hidden_size, model.num_layers, model.seq_len
    m = gb // (b * d)
    tokens = b * s // c
    act = tokens * h * B
    dc = d * c

    # ---- per-layer parameter sums (independent of the configuration except through t) ----
    sharded = sum(layer_params(model, i, tp=1, ep=1).tp_sharded for i in range(L))
    replicated = sum(layer_params(model, i, tp=1, ep=1).replicated for i in range(L))
    expert = sum(layer_params(model, i, tp=1, ep=1).expert for i in range(L))
    norm = 2 * h if model.normalization == "layernorm" else h
    positions = s * h if model.position_embedding == "learned" else 0
    mult = model.make_vocab_size_divisible_by * t
    vocab = -(-model.vocab_size // mult) * mult
    second_copy = (~np.asarray(model.tied_embeddings)) | (p > 1)
    W = sharded + t * replicated + vocab * h + t * (positions + norm) + np.where(second_copy, vocab * h, 0)

    tp_bytes = dc * m * (2 * (t - 1) * act * ((4 + 2 * full) * L + 2) + 6 * (t - 1) * tokens * 4)
    tp_bytes = tp_bytes + np.where(sp, dc * 2 * (t - 1) * G * (replicated + norm), 0)
    tp_bytes = np.where(t > 1, tp_bytes, 0)

    pp_bytes = np.where(p > 1, (p * v - 1) * t * dc * 2 * m * np.where(sp, act // t, act), 0)

    kv = 2 * tokens * np.maximum(1, model.kv_heads // t) * model.head_size * B
    cp_bytes = np.where(c > 1, t * dc * L * m * (c - 1) * (3 + full) * kv, 0)

    dp_dense = np.where(zero == 3, m * (dc - 1) * (2 * B + G) * W,
                        np.where(shard, (dc - 1) * (G + B) * W, 2 * (dc - 1) * G * W))
    edp = dc // e
    dp_expert = np.where(zero == 3, m * (edp - 1) * (2 * B + G) * expert,
                         np.where(shard, (edp - 1) * (G + B) * expert, 2 * (edp - 1) * G * expert))
    dp_bytes = dp_dense + np.where(model.is_moe, dp_expert, 0)

    emb_bytes = np.where(model.tied_embeddings & (p > 1), 2 * dc * vocab * h * G, 0)

    if model.is_moe:
        moe_tokens = np.where(sp, tokens // t, tokens)
        ep_bytes = np.where(e > 1, (t * dc // e) * model.num_moe_layers * m * 4 * (e - 1) * moe_tokens * model.top_k * h * B
                            + t * dc * model.num_moe_layers * m * (e - 1) * model.num_experts * 8, 0)
    else:
        ep_bytes = np.zeros_like(tp_bytes)
    shape = np.broadcast_shapes(*(np.shape(x) for x in (t, p, d, c, e, b, gb, v, sp, full, zero)))
    return {k: np.broadcast_to(np.asarray(val, dtype=np.int64), shape) for k, val in
            (("tp", tp_bytes), ("pp", pp_bytes), ("dp", dp_bytes), ("emb", emb_bytes), ("cp", cp_bytes), ("ep", ep_bytes))}
