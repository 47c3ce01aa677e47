"""Communication of one iteration as PyTorch's own parallelism implements it (``framework = torch-ddp|torch-fsdp2``).

The model is the reference GPT of :mod:`commscope.trainings.gpt` (what ``commscope workload gpt`` trains),
parallelised the way torchtitan does it. Where PyTorch differs from Megatron-LM, these rules follow PyTorch
2.13, each checked against a recorded run in ``tests/trainings``:

DTensor tensor parallelism (per micro-batch, on every rank of a stage's TP group; ``A`` = b s h B):
  - per layer without SP: forward all-reduce of ``A`` after ``wo`` and after ``w2``; backward all-reduce of
    ``A`` where the replicated attention and MLP inputs meet their column-parallel projections
    (one PrepareModuleInput each, so q/k/v share one);
  - per layer with SP: forward all-gather of ``A`` into attention and MLP, reduce-scatter of ``A`` after
    ``wo`` and ``w2``; backward the conjugates (two all-gathers, two reduce-scatters);
  - embedding (row-parallel): forward all-reduce (SP: reduce-scatter; backward all-gather);
  - output layer (column-parallel, replicated logits): forward all-gather of the logits ``b s V B``
    (SP: and of ``A`` before it), backward all-reduce of ``A`` (SP: reduce-scatter);
  - SP only: the replicated norm weights' partial gradients are all-reduced, ``h B`` each, once per
    iteration (FSDP2 or no data parallelism) or once per micro-batch (DDP's 2-D recipe converts them per
    backward pass).
Pipelining (torch.distributed.pipelining): the stage output of every micro-batch is sent forward and its
gradient back, ``A`` (SP: ``A / t``), from each TP rank to the same TP rank of the next stage.
DDP: gradients of the stage's local parameters (TP shards) in buckets built as DDP rebuilds them after the
first iteration (gradient-ready order, taken as reverse registration order; a bucket closes once it holds
1 MiB for the first and 25 MiB after, or ``grad_bucket_size`` x B each when set), all-reduced once per iteration.
FSDP2 (``fully_shard`` on every block and on the stage): every unit all-gathers its parameters
(each padded to a multiple of d along dim 0) before forward and backward unless still unsharded;
blocks reshard after forward, the stage root does not; pipelining keeps units unsharded after every
backward but the last micro-batch's. Each unit reduce-scatters its gradients once per iteration.
Setup traffic (parameter broadcast, DTensor's distribution of shards, pipelining's stage vote, DDP's bucket
rebuild) is not part of an iteration.
"""

from __future__ import annotations

import numpy as np

from commscope.errors import check
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.workload.base import OpSet
from commscope.pattern.workload.framework import JobContext, pipeline_p2p
from commscope.pattern.workload.stages import stage_layers

_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
_DEFAULT_BUCKET_BYTES = 25 << 20  # DDP's bucket_cap_mb=25


def stage_units(model: ModelSpec, parallel: ParallelSpec, stage: int) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Parameters of pipeline ``stage`` as (unit, local shapes) in registration order.

    Units are FSDP2's: one per transformer block, and ``root`` for the embedding, final norm and output
    layer of the stage (an empty list on middle stages). Shapes are the local TP shards.
    """
    t, h = parallel.tp, model.hidden_size
    vocab = model.padded_vocab_size(t)
    q_out, kv_out = model.num_heads * model.head_size, model.kv_heads * model.head_size
    first, last = stage == 0, stage == parallel.pp - 1
    layers = stage_layers(model, parallel, stage)[0] if parallel.pp > 1 else range(model.num_layers)
    norm: list[tuple[int, ...]] = [(h,)]  # RMSNorm weight; LayerNorm without bias has the same one weight
    block = norm + [(q_out // t, h), (kv_out // t, h), (kv_out // t, h), (h, q_out // t)] + norm
    block += [(model.ffn // t, h)] + ([(model.ffn // t, h)] if model.gated_mlp else []) + [(h, model.ffn // t)]
    units: list[tuple[str, list[tuple[int, ...]]]] = [(f"layer{i}", list(block)) for i in layers]
    root_before: list[tuple[int, ...]] = [(vocab // t, h)] if first else []
    root_after = (norm + [(vocab // t, h)]) if last else []
    return [("root", root_before + root_after)] + units


def registration_order(model: ModelSpec, parallel: ParallelSpec, stage: int) -> list[int]:
    """Element counts of the stage's parameters in the order the module registers them."""
    units = stage_units(model, parallel, stage)
    root = units[0][1]
    first = stage == 0
    head = root[:1] if first else []
    tail = root[1:] if first else root
    shapes = head + [s for _, block in units[1:] for s in block] + tail
    return [int(np.prod(s)) for s in shapes]


def ddp_buckets(numels: list[int], elem_bytes: int, cap_bytes: int | None) -> list[int]:
    """Bucket sizes in bytes: DDP's greedy assignment over gradients in ready order (reverse registration).

    ``cap_bytes`` None: DDP's defaults (1 MiB first bucket, then 25 MiB); a given cap applies to every bucket.
    """
    limits = [_FIRST_BUCKET_BYTES, _DEFAULT_BUCKET_BYTES] if cap_bytes is None else [cap_bytes, cap_bytes]
    out, size, k = [], 0, 0
    for n in reversed(numels):
        size += n * elem_bytes
        if size >= limits[k]:
            out.append(size)
            size, k = 0, 1
    if size:
        out.append(size)
    return out


def fsdp_unit_bytes(shapes: list[tuple[int, ...]], dp: int, elem_bytes: int) -> int:
    """All-gather output (= reduce-scatter input) bytes of one FSDP2 unit: dim 0 of each parameter padded to d."""
    total = 0
    for shape in shapes:
        rows = -(-shape[0] // dp)
        total += rows * int(np.prod(shape[1:], dtype=np.int64)) * dp
    return total * elem_bytes


def schedule_order(schedule: str, m: int, pp: int, stage: int) -> list[tuple[str, int]]:
    """(``F``|``B``, micro-batch) in the order torch.distributed.pipelining runs them on ``stage``."""
    if pp == 1:
        return [x for i in range(m) for x in (("F", i), ("B", i))]
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(m, pp - stage)  # Schedule1F1B: stage k runs pp - k forwards first
    order = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        order += [("B", b), ("F", f)]
        b, f = b + 1, f + 1
    order += [("B", i) for i in range(b, m)]
    return order


def fsdp_gathers(order: list[tuple[str, int]], m: int, *, root: bool, pipelined: bool) -> int:
    """All-gathers one FSDP2 unit issues in an iteration, by simulating its sharded/unsharded state."""
    sharded, count = True, 0
    for kind, mb in order:
        if sharded:
            count += 1
            sharded = False
        if kind == "F":
            sharded = not root  # blocks reshard after forward; the root keeps its parameters for backward
        else:
            # pipelining keeps parameters unsharded after every backward but the last micro-batch's
            sharded = (mb == m - 1) or not pipelined
    return count


def check_torch_job(model: ModelSpec, parallel: ParallelSpec) -> None:
    """Refuse what the reference GPT under PyTorch's parallelism does not cover, naming the field."""
    m, p = model, parallel
    check(not m.is_moe, "model", m.name, f"is an MoE model; framework {p.framework} covers dense models")
    check(not m.bias, "model.bias", m.bias, f"framework {p.framework} models the reference GPT, which has no biases")
    check(not m.tied_embeddings, "model.tied_embeddings", m.tied_embeddings,
          f"framework {p.framework} models the reference GPT, whose input and output embeddings are separate")
    check(m.position_embedding in ("rope", "none"), "model.position_embedding", m.position_embedding,
          f"valid with framework {p.framework}: rope, none")
    check(p.cp == 1, "cp", p.cp, f"context parallelism is not modelled for framework {p.framework} (cp = 1)")
    check(p.virtual_pipeline_size == 1, "virtual_pipeline_size", p.virtual_pipeline_size,
          f"framework {p.framework} runs one model chunk per pipeline stage")
    check(p.recompute == "none", "recompute", p.recompute, f"valid with framework {p.framework}: none")
    check(p.zero_stage == 0 and not p.distributed_optimizer, "zero_stage", p.zero_stage,
          "ZeRO stages and the distributed optimizer are Megatron's; use --framework torch-fsdp2 for sharding")
    check(p.order == ParallelSpec().order, "order", p.order,
          f"framework {p.framework} uses PyTorch's (pp, dp, tp) device mesh: order {ParallelSpec().order}")
    check(m.num_heads % p.tp == 0 and m.kv_heads % p.tp == 0, "tp", p.tp,
          f"must divide num_heads={m.num_heads} and the kv heads={m.kv_heads}")
    check(m.ffn % p.tp == 0, "tp", p.tp, f"must divide ffn_hidden_size={m.ffn}")
    check(not (p.sequence_parallel and p.tp > 1) or m.seq_len % p.tp == 0, "seq_len", m.seq_len,
          f"must be divisible by tp={p.tp} with sequence parallelism")
    check(all(len(stage_layers(m, p, s)[0]) >= 1 for s in range(p.pp)), "pp", p.pp,
          f"every pipeline stage needs at least one layer (num_layers={m.num_layers})")


class TorchRules:
    """PyTorch's own parallelism on the reference GPT (:class:`~commscope.pattern.workload.framework.FrameworkRules`;
    module docstring): DTensor TP per layer, pipelining's p2p per stage, DDP or FSDP2 per step."""

    def check(self, model: ModelSpec, parallel: ParallelSpec) -> None:
        check_torch_job(model, parallel)

    def per_layer(self, ctx: JobContext) -> list[OpSet]:
        return _tp_ops(ctx)

    def per_stage(self, ctx: JobContext) -> list[OpSet]:
        return pipeline_p2p(ctx)  # Megatron's p2p pattern is pipelining's too (one model chunk per stage)

    def per_step(self, ctx: JobContext) -> list[OpSet]:
        return _dp_ops(ctx)

    def notes(self, ctx: JobContext) -> list[str]:
        p = ctx.parallel
        return [(f"{p.framework}: PyTorch 2.13's DTensor TP, torch.distributed.pipelining and "
                f"{'DDP' if p.framework == 'torch-ddp' else 'FSDP2'} on commscope's reference GPT")]


def _tp_ops(ctx: JobContext) -> list[OpSet]:
    p, model = ctx.parallel, ctx.model
    if p.tp == 1:
        return []
    A, dt, m, h = ctx.act_bytes, ctx.act_dtype, ctx.m, model.hidden_size
    logits = ctx.tokens * model.padded_vocab_size(p.tp) * ctx.B
    out: list[OpSet] = []
    for stage in range(p.pp):
        groups = ctx.groups_of_stage("tp", stage)
        layers = ctx.chunk_layers(stage)[0]
        first, last = stage == 0, stage == p.pp - 1

        def add(op: str, name: str, phase: str, size: int = A, layers_: tuple[int, ...] = layers, mbs: int | None = m,
                repeat: int = 1, groups: np.ndarray = groups) -> None:
            out.append(OpSet(op=op, axis="tp", name=name, size_bytes=size, dtype=dt, phase=phase, groups=groups,
                             layers=layers_, micro_batches=mbs, repeat=repeat))

        if ctx.sp:
            add("all_gather", "attention_mlp_input", "fwd", repeat=2)
            add("reduce_scatter", "attention_mlp_output", "fwd", repeat=2)
            add("all_gather", "attention_mlp_output_grad", "bwd", repeat=2)
            add("reduce_scatter", "attention_mlp_input_grad", "bwd", repeat=2)
            norms = 2 * len(layers) + (1 if last else 0)
            per_micro_batch = p.framework == "torch-ddp" and p.dp > 1
            out.append(OpSet(op="all_reduce", axis="tp", name="norm_weight_grad", size_bytes=h * ctx.B, dtype=dt,
                             phase="bwd", groups=groups, micro_batches=m if per_micro_batch else None,
                             repeat=norms))
        else:
            add("all_reduce", "attention_mlp_output", "fwd", repeat=2)
            add("all_reduce", "attention_mlp_input_grad", "bwd", repeat=2)
        if first:
            if ctx.sp:
                add("reduce_scatter", "embedding", "fwd", layers_=())
                add("all_gather", "embedding_grad", "bwd", layers_=())
            else:
                add("all_reduce", "embedding", "fwd", layers_=())
        if last:
            if ctx.sp:
                add("all_gather", "output_input", "fwd", layers_=())
                add("reduce_scatter", "output_input_grad", "bwd", layers_=())
            else:
                add("all_reduce", "output_input_grad", "bwd", layers_=())
            add("all_gather", "logits", "fwd", size=logits, layers_=())
    return out


def _dp_ops(ctx: JobContext) -> list[OpSet]:
    p, model = ctx.parallel, ctx.model
    if p.dp == 1:
        return []
    B, out = ctx.B, []
    for stage in range(p.pp):
        groups = ctx.groups_of_stage("dp", stage)
        if p.framework == "torch-ddp":
            cap = None if p.grad_bucket_size is None else p.grad_bucket_size * B
            for i, size in enumerate(ddp_buckets(registration_order(model, p, stage), B, cap)):
                out.append(OpSet(op="all_reduce", axis="dp", name=f"grad_bucket{i}", size_bytes=size, dtype=model.dtype,
                                 phase="bwd", groups=groups))
            continue
        order = schedule_order(p.schedule, ctx.m, p.pp, stage)
        for unit, shapes in stage_units(model, p, stage):
            if not shapes:
                continue
            size = fsdp_unit_bytes(shapes, p.dp, B)
            gathers = fsdp_gathers(order, ctx.m, root=(unit == "root"), pipelined=p.pp > 1)
            out.append(OpSet(op="all_gather", axis="dp", name=f"{unit}_params", size_bytes=size, dtype=model.dtype,
                             phase="fwd", groups=groups, repeat=gathers))
            out.append(OpSet(op="reduce_scatter", axis="dp", name=f"{unit}_grads", size_bytes=size, dtype=model.dtype,
                             phase="bwd", groups=groups))
    return out

