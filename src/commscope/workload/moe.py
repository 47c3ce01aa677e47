"""Expert-parallel all-to-all of MoE layers.

Per MoE layer and micro-batch, Megatron's all-to-all token dispatcher runs a dispatch and a combine
all-to-all forward and both again backward (their gradients), over the EP group. Each rank routes its
T = b s / c tokens (/ t with sequence parallelism) to top_k experts; a token to an expert on EP rank j
sends h B bytes to j. Balanced routing sends T top_k / ep tokens to every EP rank; a routing matrix
(tokens from EP position i to EP position j) replaces that assumption.
"""

from __future__ import annotations

import numpy as np

from commscope.workload.base import OpSet


def balanced_routing(tokens: int, top_k: int, ep: int) -> np.ndarray:
    """(ep, ep) token counts when every rank spreads tokens x top_k evenly over the EP ranks."""
    total = tokens * top_k
    base, rest = divmod(total, ep)
    row = np.array([base + (1 if j < rest else 0) for j in range(ep)], dtype=np.int64)
    return np.tile(row, (ep, 1))


def ep_ops(ctx, routing: np.ndarray | None = None) -> list[OpSet]:
    """All-to-all op sets of every MoE layer; ``routing`` is an (ep, ep) token matrix or None (balanced)."""
    p, model = ctx.parallel, ctx.model
    if p.ep == 1:
        return []
    tokens = ctx.tokens // p.tp if ctx.sp else ctx.tokens
    token_bytes = model.hidden_size * ctx.B
    if routing is None:
        routing = balanced_routing(tokens, model.top_k, p.ep)
    routing = np.asarray(routing, dtype=np.int64)
    splits = routing * token_bytes  # bytes from EP position i to position j
    size = int(splits.sum(axis=1).max())  # send buffer of the busiest rank
    out: list[OpSet] = []
    for stage in range(p.pp):
        groups = ctx.groups_of_stage("ep", stage)
        layers = tuple(layer for chunk in ctx.chunk_layers(stage) for layer in chunk if model.is_moe_layer(layer))
        if not layers:
            continue
        for phase, names in (("fwd", ("dispatch", "combine")), ("bwd", ("combine_grad", "dispatch_grad"))):
            for name in names:
                mat = splits if name.startswith("dispatch") else splits.T
                out.append(OpSet(op="all_to_all", axis="ep", name=name, size_bytes=size, dtype=ctx.act_dtype,
                                 phase=phase, groups=groups, layers=layers, micro_batches=ctx.m, splits=mat.copy()))
    return out
