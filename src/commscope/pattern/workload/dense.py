"""The communication of one iteration of Megatron-LM GPT training.

Sources (keys in docs/references.md):
- [megatron-sc21] Narayanan et al. 2021: TP is 2 all-reduces forward and 2 backward per layer; 1F1B and
  interleaved pipeline schedules; the scatter/gather optimisation of PP messages.
- [korthikanti-2022] sequence parallelism turns each TP all-reduce into all-gather + reduce-scatter;
  selective recomputation recomputes attention without communication; full recomputation replays the forward.
- [seed-talk] TP/DP form all-reduce patterns, PP p2p lines between adjacent stages, tied embeddings an
  all-reduce between first and last stage (EmbTableSync).
- [megatron-core] distributed optimizer: reduce-scatter of gradients and all-gather of parameters; gradients
  of bf16 models reduced in fp32; expert parallelism folded inside data x context parallelism.

Message sizes, with b micro-batch, s sequence, c cp, t tp, h hidden, B bytes per activation element:
    TP all-reduce (and SP all-gather output / reduce-scatter input)   b (s/c) h B
    PP activation (gradient)                                          b (s/c) h B   (/t with sequence parallelism)
    CP ring step (K and V of one chunk)                               2 b (s/c) g d_h / t B
    DP gradients                                                      local parameters x gradient bytes
Worked example, gpt-1.5b (h=1600) with b=4, s=1024, bf16: one TP all-reduce is 4*1024*1600*2 = 13,107,200 B.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from commscope.errors import check
from commscope.commop import MAX_MESSAGE_BYTES
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.spec.params import layer_params, stage_params
from commscope.units import dtype_bytes
from commscope.pattern.workload.base import OpSet, Workload, p2p_pair
from commscope.pattern.workload.framework import FrameworkRules, JobContext, build, pipeline_p2p
from commscope.pattern.workload.pytorch import TorchRules
from commscope.pattern.workload.stages import pipeline_split_note, stage_layers, virtual_stage_layers

if TYPE_CHECKING:
    from commscope.moe.trace import RoutingTrace


#: More parameters than this is no model (the largest trained hold ~2e12): a typo, never computed.
MAX_PARAMETERS = 10**15


def check_job(model: ModelSpec, parallel: ParallelSpec) -> None:
    """Raise ConfigError for a model/parallelism combination Megatron would refuse, or no GPU could hold."""
    t, c = parallel.tp, parallel.cp
    h = model.hidden_size
    activation = parallel.micro_batch_size * model.seq_len // c * h * model.dtype_bytes  # one layer's, per GPU
    check(activation <= MAX_MESSAGE_BYTES, "micro_batch_size x seq_length / cp x hidden_size",
          f"{parallel.micro_batch_size} x {model.seq_len} / {c} x {h}",
          f"one micro-batch's activations are {activation / 2**40:,.1f} TiB per GPU: beyond any GPU (at most 1 TiB)")
    n = model.num_parameters()
    check(n <= MAX_PARAMETERS, "model", model.name, f"has {n:.3g} parameters: beyond any real model (at most 1e15)")
    check(model.num_heads % t == 0, "tp", t, f"must divide num_heads={model.num_heads}")
    check(model.kv_heads % t == 0 or t % model.kv_heads == 0, "tp", t,
          f"must divide num_query_groups={model.kv_heads} (or be a multiple of it)")
    check(model.ffn % t == 0, "tp", t, f"must divide ffn_hidden_size={model.ffn}")
    check(model.seq_len % c == 0, "cp", c, f"must divide seq_length={model.seq_len}")
    # Megatron's context parallelism cuts the sequence into 2 x cp chunks (rank i holds chunks i and 2cp-1-i, so
    # that causal attention is balanced) and refuses a sequence those chunks do not divide.
    check(c == 1 or model.seq_len % (2 * c) == 0, "cp", c,
          f"needs seq_length={model.seq_len} divisible by 2 x cp = {2 * c} (Megatron splits the sequence into 2 x cp "
          "chunks to balance causal attention)")
    if parallel.sequence_parallel and t > 1:
        check(model.seq_len % (c * t) == 0, "sequence_parallel", True,
              f"needs seq_length={model.seq_len} divisible by cp x tp = {c * t}")
    if parallel.pipeline_layers is not None:
        check(sum(parallel.pipeline_layers) == model.num_layers, "pipeline_layers", parallel.pipeline_layers,
              f"sums to {sum(parallel.pipeline_layers)}; must sum to num_layers={model.num_layers}")
    else:
        virtual_stage_layers(model, parallel)  # raises ConfigError for a split that cannot be made
    if model.is_moe:
        check(model.moe_ffn % t == 0, "tp", t, f"must divide moe_ffn_hidden_size={model.moe_ffn}")
        check(model.num_experts % parallel.ep == 0, "ep", parallel.ep, f"must divide num_experts={model.num_experts}")
    else:
        check(parallel.ep == 1, "ep", parallel.ep, f"needs an MoE model (num_experts > 0); {model.name} is dense")


def build_workload(model: ModelSpec, parallel: ParallelSpec, *, routing: np.ndarray | RoutingTrace | None = None,
                   routing_iteration: int = 0) -> Workload:
    """Every CommOp of one training iteration of ``model`` under ``parallel``, by the rules of
    ``parallel.framework`` (:data:`FRAMEWORK_RULES`; Megatron-LM's are this module's).

    ``routing`` (MoE only) gives per-pair all-to-all bytes: ``None`` (balanced), an (ep, ep) token matrix, or a
    :class:`~commscope.moe.trace.RoutingTrace` whose iteration ``routing_iteration`` is used
    (see :mod:`commscope.pattern.workload.moe`).
    """
    if parallel.framework == "megatron":
        return build(MegatronRules(routing=routing, routing_iteration=routing_iteration), model, parallel)
    check_job(model, parallel)  # what Megatron refuses the other frameworks refuse too; their rules check the rest
    return build(FRAMEWORK_RULES[parallel.framework](), model, parallel)


class MegatronRules:
    """Megatron-LM's communication rules (:class:`~commscope.pattern.workload.framework.FrameworkRules`; module docstring)."""

    def __init__(self, *, routing: np.ndarray | RoutingTrace | None = None, routing_iteration: int = 0) -> None:
        self.routing, self.routing_iteration = routing, routing_iteration

    def check(self, model: ModelSpec, parallel: ParallelSpec) -> None:
        check_job(model, parallel)

    def per_layer(self, ctx: JobContext) -> list[OpSet]:
        out = _tp_ops(ctx) + _cp_ops(ctx)
        if ctx.model.is_moe:
            from commscope.pattern.workload.moe import ep_ops

            out += ep_ops(ctx, self.routing, routing_iteration=self.routing_iteration)
        return out

    def per_stage(self, ctx: JobContext) -> list[OpSet]:
        return pipeline_p2p(ctx)

    def per_step(self, ctx: JobContext) -> list[OpSet]:
        return _dp_ops(ctx) + _emb_ops(ctx)

    def notes(self, ctx: JobContext) -> list[str]:
        split_note = pipeline_split_note(ctx.model, ctx.parallel)
        return [split_note] if split_note else []


#: The rules of each ``ParallelSpec.framework`` (a class of :class:`~commscope.pattern.workload.framework.FrameworkRules`).
FRAMEWORK_RULES: dict[str, Callable[[], FrameworkRules]] = {"megatron": MegatronRules, "torch-ddp": TorchRules, "torch-fsdp2": TorchRules}


def _tp_ops(ctx: JobContext) -> list[OpSet]:
    """Tensor-parallel collectives: per layer per micro-batch, plus embedding, logits and cross-entropy."""
    p, model = ctx.parallel, ctx.model
    if p.tp == 1:
        return []
    out: list[OpSet] = []
    act, dt, m = ctx.act_bytes, ctx.act_dtype, ctx.m
    full_recompute = p.recompute == "full"
    for stage in range(p.pp):
        groups = ctx.groups_of_stage("tp", stage)
        layers = tuple(layer for chunk in ctx.chunk_layers(stage) for layer in chunk)

        def add(op: str, name: str, phase: str, size: int, lays: tuple[int, ...], per_mb: bool = True,
                dtype: str = dt, repeat: int = 1, groups: np.ndarray = groups) -> None:
            out.append(OpSet(op=op, axis="tp", name=name, size_bytes=size, dtype=dtype, phase=phase, groups=groups,
                             layers=lays, micro_batches=m if per_mb else None, repeat=repeat))

        if layers:
            # Each block: attention (column QKV -> row proj) then MLP (column up -> row down).
            for block in ("attn", "mlp"):
                if ctx.sp:
                    add("all_gather", f"{block}_in", "fwd", act, layers)
                    add("reduce_scatter", f"{block}_out", "fwd", act, layers)
                    add("all_gather", f"{block}_out_grad", "bwd", act, layers)
                    add("reduce_scatter", f"{block}_in_grad", "bwd", act, layers)
                    if full_recompute:
                        add("all_gather", f"{block}_in_recompute", "bwd", act, layers)
                        add("reduce_scatter", f"{block}_out_recompute", "bwd", act, layers)
                else:
                    add("all_reduce", f"{block}_out", "fwd", act, layers)
                    add("all_reduce", f"{block}_in_grad", "bwd", act, layers)
                    if full_recompute:
                        add("all_reduce", f"{block}_out_recompute", "bwd", act, layers)
        if stage == 0:
            # Vocab-parallel embedding: partial lookups are summed over TP.
            if ctx.sp:
                add("reduce_scatter", "embedding", "fwd", act, ())
                add("all_gather", "embedding_grad", "bwd", act, ())
            else:
                add("all_reduce", "embedding", "fwd", act, ())
        if stage == p.pp - 1:
            # Output layer input: copy_to_tensor_model_parallel_region (all-reduce of its gradient), or
            # with SP an all-gather of the final norm's output; then vocab-parallel cross-entropy's three
            # fp32 all-reduces of (b, s/c): max logit, target logit, sum of exponentials.
            if ctx.sp:
                add("all_gather", "logits_in", "fwd", act, ())
                add("reduce_scatter", "logits_in_grad", "bwd", act, ())
            else:
                add("all_reduce", "logits_in_grad", "bwd", act, ())
            add("all_reduce", "cross_entropy", "fwd", ctx.tokens * dtype_bytes("fp32"), (), dtype="fp32", repeat=3)
        if ctx.sp:
            # Sequence-parallel parameters (norms, row-parallel biases) are replicated over TP and their
            # gradients all-reduced over TP once per iteration (Megatron's _allreduce_layernorm_grads).
            replicated = sum(layer_params(model, layer, tp=p.tp, ep=p.ep).replicated for layer in layers)
            if stage == p.pp - 1:
                replicated += model.hidden_size * (2 if model.normalization == "layernorm" else 1)
            if replicated:
                add("all_reduce", "sequence_parallel_grads", "optim", replicated * ctx.G, (), per_mb=False,
                    dtype=ctx.grad_dtype)
    return out


def _cp_ops(ctx: JobContext) -> list[OpSet]:
    """Context parallelism: ring attention passes K and V around the CP ring (c - 1 steps per layer forward,
    K/V and their gradients backward)."""
    p, model = ctx.parallel, ctx.model
    c = p.cp
    if c == 1:
        return []
    kv_width = max(1, model.kv_heads // p.tp) * model.head_size
    kv_bytes = 2 * ctx.tokens * kv_width * ctx.B
    steps_bwd = 2 * (c - 1) + ((c - 1) if p.recompute == "full" else 0)
    out: list[OpSet] = []
    for stage in range(p.pp):
        groups = ctx.groups_of_stage("cp", stage)
        layers = tuple(layer for chunk in ctx.chunk_layers(stage) for layer in chunk)
        if not layers:
            continue
        src = groups.reshape(-1)
        dst = np.roll(groups, -1, axis=1).reshape(-1)
        for phase, steps, name in (("fwd", c - 1, "kv"), ("bwd", steps_bwd, "kv_and_grad")):
            out += p2p_pair(axis="cp", name=name, size_bytes=kv_bytes, dtype=ctx.act_dtype, phase=phase,
                            src=src, dst=dst, layers=layers, micro_batches=ctx.m, repeat=steps)
    return out


def _buckets(total_elements: int, bucket: int | None) -> list[int]:
    if total_elements == 0:
        return []
    if bucket is None or bucket >= total_elements:
        return [total_elements]
    full, rest = divmod(total_elements, bucket)
    return [bucket] * full + ([rest] if rest else [])


def _dp_ops(ctx: JobContext) -> list[OpSet]:
    """Data parallelism over the dp x cp group (dense parameters) and the expert-dp group (expert parameters)."""
    p, model = ctx.parallel, ctx.model
    out: list[OpSet] = []
    for stage in range(p.pp):
        chunks = stage_layers(model, p, stage)
        sp = [stage_params(model, chunk, tp=p.tp, ep=p.ep, first=(stage == 0 and i == 0),
                           last=(stage == p.pp - 1 and i == len(chunks) - 1)) for i, chunk in enumerate(chunks)]
        dense = sum(s.dense for s in sp)
        expert = sum(s.expert for s in sp)
        for kind, elements, label in (("dp-cp", dense, "grads"), ("expert-dp", expert, "expert_grads")):
            groups = ctx.groups_of_stage(kind, stage)
            if groups.shape[1] == 1 or elements == 0:
                continue
            if p.zero_stage == 3:
                out += _zero3_ops(ctx, groups, chunks, stage, expert=(kind == "expert-dp"))
                continue
            for i, n in enumerate(_buckets(elements, p.grad_bucket_elements)):
                tag = f"{label}_bucket{i}"
                if p.shards_optimizer:
                    out.append(OpSet(op="reduce_scatter", axis="dp", name=tag, size_bytes=n * ctx.G,
                                     dtype=ctx.grad_dtype, phase="optim", groups=groups))
                    out.append(OpSet(op="all_gather", axis="dp", name=tag.replace("grads", "params"),
                                     size_bytes=n * ctx.B, dtype=ctx.act_dtype, phase="optim", groups=groups))
                else:
                    out.append(OpSet(op="all_reduce", axis="dp", name=tag, size_bytes=n * ctx.G,
                                     dtype=ctx.grad_dtype, phase="optim", groups=groups))
    return out


def _zero3_ops(ctx: JobContext, groups: np.ndarray, chunks: list[range], stage: int, *, expert: bool) -> list[OpSet]:
    """ZeRO-3: every micro-batch gathers each layer's parameters forward and again backward, and
    reduce-scatters its gradients backward; non-layer parameters (embeddings, final norm) likewise."""
    p, model = ctx.parallel, ctx.model
    out: list[OpSet] = []
    by_size: dict[int, list[int]] = {}
    for chunk in chunks:
        for layer in chunk:
            lp = layer_params(model, layer, tp=p.tp, ep=p.ep)
            n = lp.expert // (p.ep * p.tp) if expert else lp.tp_sharded // p.tp + lp.replicated
            if n:
                by_size.setdefault(n, []).append(layer)
    if not expert:
        first, last = stage == 0, stage == p.pp - 1
        whole = stage_params(model, range(0), tp=p.tp, ep=p.ep, first=first, last=last).dense
        if whole:
            by_size.setdefault(whole, []).append(-1)
    label = "expert_" if expert else ""
    for n, layers in by_size.items():
        lays = tuple(x for x in layers if x >= 0)
        extra = len(layers) - len(lays)  # the non-layer module, once per micro-batch
        variants = ([(lays, 1)] if lays else []) + ([((), extra)] if extra else [])
        for lay, rep in variants:
            common: dict[str, Any] = dict(axis="dp", groups=groups, layers=lay, micro_batches=ctx.m, repeat=rep)
            out.append(OpSet(op="all_gather", name=f"{label}params_fwd", size_bytes=n * ctx.B, dtype=ctx.act_dtype,
                             phase="fwd", **common))
            out.append(OpSet(op="all_gather", name=f"{label}params_bwd", size_bytes=n * ctx.B, dtype=ctx.act_dtype,
                             phase="bwd", **common))
            out.append(OpSet(op="reduce_scatter", name=f"{label}grads", size_bytes=n * ctx.G, dtype=ctx.grad_dtype,
                             phase="bwd", **common))
    return out


def _emb_ops(ctx: JobContext) -> list[OpSet]:
    """Tied embeddings with pp > 1: the first and last stage all-reduce the word-embedding gradients."""
    p, model = ctx.parallel, ctx.model
    if p.pp == 1 or not model.tied_embeddings:
        return []
    elements = model.padded_vocab_size(p.tp) * model.hidden_size // p.tp
    groups = ctx.layout.groups("emb")
    return [OpSet(op="all_reduce", axis="emb", name="embedding_grads", size_bytes=elements * ctx.G,
                  dtype=ctx.grad_dtype, phase="optim", groups=groups)]
