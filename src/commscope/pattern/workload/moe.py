"""Expert-parallel all-to-all of MoE layers.

Per MoE layer and micro-batch, Megatron's all-to-all token dispatcher runs a dispatch and a combine
all-to-all forward and both again backward (their gradients), over the EP group [megatron-core]. Each rank
routes its T = b s / c tokens (/ t with sequence parallelism) to top_k experts; a token to an expert on EP
rank j sends h B bytes to j, and the combine sends it back (the transposed matrix).

The routing decides the per-pair sizes (:mod:`commscope.moe`):

- ``None``: balanced, T top_k / ep tokens from every EP rank to every EP rank (the assumption of every other
  tool), one op set per phase for all layers and micro-batches;
- an (ep, ep) token matrix: the same matrix in every layer and micro-batch;
- a :class:`~commscope.moe.trace.RoutingTrace` (iteration ``routing_iteration``) or one iteration's counts of
  shape (micro_batches, layers, ep, experts): expert counts per source rank, turned into rank-to-rank tokens
  by the trace's expert placement after each source rank's capacity (the model's ``capacity_factor``; dropped
  tokens are not sent). Trace layer i is the model's i-th MoE layer (a one-layer trace serves every layer);
  trace micro-batch k serves micro-batch k (cycled when the trace has fewer, one trace micro-batch serves all).
  All EP groups of a stage use the same matrices: a trace describes one EP group.

Worked example: Mixtral 8x7B (h = 4096, top-2, bf16) with b = 1, s = 4096, ep = 8, balanced: every rank sends
4096 x 2 / 8 = 1024 tokens x 4096 x 2 B = 8 MiB to each EP rank, a 64 MiB send buffer per all-to-all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.moe.routing import (
    apply_capacity,
    balanced_counts,
    balanced_routing,
    rank_tokens,
    routed_tokens_per_rank,
)
from commscope.moe.trace import RoutingTrace, checked_counts, contiguous_placement
from commscope.commop import CommOp
from commscope.pattern.workload.base import Detail, OpSet
from commscope.pattern.workload.framework import JobContext

#: (phase, op names) of the four all-to-alls of an MoE layer; ``dispatch*`` send the routing matrix,
#: ``combine*`` its transpose.
_PHASES = (("fwd", ("dispatch", "combine")), ("bwd", ("combine_grad", "dispatch_grad")))


@dataclass(frozen=True, slots=True, kw_only=True)
class MicroBatchOpSet(OpSet):
    """An op set that runs in one micro-batch only (``micro_batch``), for routing that differs per
    micro-batch; ``micro_batches`` stays None so that it counts once per layer."""

    micro_batch: int = 0

    def row_ops(self, row: int, detail: Detail = "full") -> Iterator[CommOp]:
        for op in OpSet.row_ops(self, row, detail):
            yield op.with_(micro_batch=self.micro_batch)


def ep_ops(ctx: JobContext, routing: np.ndarray | RoutingTrace | None = None, *,
           routing_iteration: int = 0) -> list[OpSet]:
    """All-to-all op sets of every MoE layer; ``routing`` as in the module docstring (None: balanced)."""
    p, model = ctx.parallel, ctx.model
    if p.ep == 1:
        return []
    if routing is None and model.capacity_factor is not None:
        routing = _balanced_trace(routed_tokens_per_rank(model, p), model.top_k, p.ep, model.num_experts)
    if isinstance(routing, RoutingTrace) or (routing is not None and np.ndim(routing) == 4):
        return _traced_ops(ctx, routing, routing_iteration)
    if routing is None:
        routing = balanced_routing(routed_tokens_per_rank(model, p), model.top_k, p.ep)
    routing = np.asarray(routing)
    if routing.shape != (p.ep, p.ep):
        raise ConfigError("routing", routing.shape, f"must be an (ep, ep) = ({p.ep}, {p.ep}) token matrix, one "
                          "iteration's counts (micro_batches, layers, ep, experts), or a RoutingTrace")
    splits = checked_counts(routing, ("rank", "to rank"), "routing matrix", field="routing")
    splits = splits * model.hidden_size * ctx.B  # bytes from EP position i to position j
    out: list[OpSet] = []
    for stage in range(p.pp):
        layers = _moe_layers_of_stage(ctx, stage)
        if layers:
            # as before routing traces: every op's size_bytes is the dispatch's busiest send buffer
            out += _all_to_alls(ctx, ctx.groups_of_stage("ep", stage), splits, layers=layers, micro_batches=ctx.m,
                                size_bytes=int(splits.sum(axis=1).max()))
    return out


def _moe_layers_of_stage(ctx: JobContext, stage: int) -> tuple[int, ...]:
    return tuple(layer for chunk in ctx.chunk_layers(stage) for layer in chunk if ctx.model.is_moe_layer(layer))


def _all_to_alls(ctx: JobContext, groups: np.ndarray, splits: np.ndarray, *, layers: tuple[int, ...], micro_batches: int | None,
                 micro_batch: int | None = None, size_bytes: int | None = None) -> list[OpSet]:
    """The dispatch, combine and their gradients for one (ep, ep) byte matrix ``splits[i, j]`` (i sends to j);
    ``size_bytes`` (default: each op's busiest send buffer) is what the estimate times."""
    out: list[OpSet] = []
    # before the dispatch every EP rank learns how many tokens each rank sends to each expert (Megatron-core's
    # all-to-all dispatcher gathers num_local_tokens_per_expert; so does commscope workload moe): int64 x E
    ep, experts = groups.shape[1], ctx.model.num_experts
    counts: dict[str, Any] = dict(op="all_gather", axis="ep", name="dispatch_counts", size_bytes=ep * experts * 8, dtype="int64",
                  phase="fwd", groups=groups, layers=layers)
    out.append(OpSet(micro_batches=micro_batches, **counts) if micro_batch is None
               else MicroBatchOpSet(micro_batch=micro_batch, **counts))
    for phase, names in _PHASES:
        for name in names:
            mat = splits if name.startswith("dispatch") else splits.T
            size = size_bytes if size_bytes is not None else int(mat.sum(axis=1).max())
            common: dict[str, Any] = dict(op="all_to_all", axis="ep", name=name, size_bytes=size, dtype=ctx.act_dtype, phase=phase,
                          groups=groups, layers=layers, splits=mat.copy())
            if micro_batch is None:
                out.append(OpSet(micro_batches=micro_batches, **common))
            else:
                out.append(MicroBatchOpSet(micro_batch=micro_batch, **common))
    return out


def _balanced_trace(tokens: int, top_k: int, ep: int, num_experts: int) -> RoutingTrace:
    """One iteration of the exact even split over experts (for capacity with balanced routing)."""
    return RoutingTrace(counts=balanced_counts((1, 1, 1), ep, num_experts, tokens, top_k), top_k=top_k,
                        tokens_per_rank=tokens, source="balanced, seed 0")


def _traced_ops(ctx: JobContext, routing: np.ndarray | RoutingTrace, iteration: int) -> list[OpSet]:
    """Op sets from expert counts: one set per MoE layer (and per micro-batch when the routing differs)."""
    p, model = ctx.parallel, ctx.model
    if isinstance(routing, RoutingTrace):
        trace = routing
        if trace.ep != p.ep:
            raise ConfigError("ep", p.ep, f"the routing trace has {trace.ep} EP ranks", source=trace.source)
        if trace.num_experts != model.num_experts:
            raise ConfigError("num_experts", model.num_experts, f"the routing trace has {trace.num_experts} experts",
                              source=trace.source)
        if not 0 <= iteration < trace.iterations:
            raise ConfigError("routing_iteration", iteration, f"must be in 0..{trace.iterations - 1}",
                              source=trace.source)
        counts, placement = trace.counts[iteration], trace.placement
        if placement is None:  # the trace's default
            placement = contiguous_placement(model.num_experts, p.ep)
        source = f"{trace.source}, iteration {trace.first_iteration + iteration}"
        tokens_known = trace.tokens_per_rank
    else:
        counts = checked_counts(routing, ("micro-batch", "layer", "rank", "expert"), "routing counts")
        if counts.shape[2:] != (p.ep, model.num_experts):
            raise ConfigError("routing", counts.shape, f"counts must have shape (micro_batches, layers, ep={p.ep}, "
                              f"experts={model.num_experts})")
        placement, source, tokens_known = contiguous_placement(model.num_experts, p.ep), "routing counts", None
    moe_layers = [layer for layer in range(model.num_layers) if model.is_moe_layer(layer)]
    num_mb, num_layers = counts.shape[0], counts.shape[1]
    if num_layers not in (1, len(moe_layers)):
        raise ConfigError("routing", source, f"has {num_layers} MoE layers; {model.name} has {len(moe_layers)}: "
                          f"give 1 (shared by every layer) or {len(moe_layers)}")
    trace_layer = {layer: (i if num_layers > 1 else 0) for i, layer in enumerate(moe_layers)}
    kept, dropped = apply_capacity(counts, model.capacity_factor)
    splits_all = rank_tokens(kept, placement, p.ep) * (model.hidden_size * ctx.B)  # (mb, layer, ep, ep) bytes

    ctx.notes.append(f"EP all-to-all sizes follow the routing of {source} (top-{model.top_k} over "
                     f"{model.num_experts} experts), not balanced routing; every EP group of a stage uses the "
                     "same matrices")
    if num_mb not in (1, ctx.m):
        ctx.notes.append(f"the routing has {num_mb} micro-batches, the iteration {ctx.m}: micro-batch k uses the "
                         f"routing's micro-batch k mod {num_mb}")
    if model.capacity_factor is not None:
        total = int(counts.sum())
        ctx.notes.append(f"capacity factor {model.capacity_factor:g} (per expert, per source rank): "
                         f"{int(dropped.sum()):,} of {total:,} token assignments dropped "
                         f"({int(dropped.sum()) / max(total, 1):.1%}) and not sent")
    routed = routed_tokens_per_rank(model, p)
    if tokens_known is not None and tokens_known != routed:
        ctx.notes.append(f"the routing has {tokens_known:,} tokens per rank, this job {routed:,}: sizes follow "
                         "the routing")

    out: list[OpSet] = []
    for stage in range(p.pp):
        layers = _moe_layers_of_stage(ctx, stage)
        if not layers:
            continue
        groups = ctx.groups_of_stage("ep", stage)
        by_trace_layer: dict[int, list[int]] = {}
        for layer in layers:
            by_trace_layer.setdefault(trace_layer[layer], []).append(layer)
        for t, lays in by_trace_layer.items():
            if num_mb == 1:
                out += _all_to_alls(ctx, groups, splits_all[0, t], layers=tuple(lays), micro_batches=ctx.m)
                continue
            for layer in lays:
                for mb in range(ctx.m):
                    out += _all_to_alls(ctx, groups, splits_all[mb % num_mb, t], layers=(layer,), micro_batches=None,
                                        micro_batch=mb)
    return out
