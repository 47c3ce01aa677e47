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

import functools

import numpy as np

from commscope.errors import check
from commscope.layout import Layout
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.spec.params import layer_params, stage_params
from commscope.units import dtype_bytes
from commscope.workload.base import OpSet, Workload, p2p_pair


def check_job(model: ModelSpec, parallel: ParallelSpec) -> None:
    """Raise ConfigError for a model/parallelism combination Megatron would refuse."""
    t, c = parallel.tp, parallel.cp
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
              f"must sum to num_layers={model.num_layers}")
    else:
        virtual_stage_layers(model, parallel)  # raises ConfigError for a split that cannot be made
    if model.is_moe:
        check(model.moe_ffn % t == 0, "tp", t, f"must divide moe_ffn_hidden_size={model.moe_ffn}")
        check(model.num_experts % parallel.ep == 0, "ep", parallel.ep, f"must divide num_experts={model.num_experts}")
    else:
        check(parallel.ep == 1, "ep", parallel.ep, f"needs an MoE model (num_experts > 0); {model.name} is dense")


def virtual_stage_layers(model: ModelSpec, parallel: ParallelSpec) -> list[range]:
    """Global layer indices of each virtual stage k = chunk * pp + stage (Megatron's interleaved assignment).

    The split, in order of precedence: ``pipeline_layers``; Megatron's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers`` (the other stages split the rest evenly); an even split when
    pp x v divides the layers; otherwise (v = 1) :func:`balanced_pipeline_layers`.
    """
    return _ranges(pipeline_split(model, parallel))


def _ranges(sizes: list[int]) -> list[range]:
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def pipeline_split(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """Layers of each virtual stage (see :func:`virtual_stage_layers`); raises ConfigError when none can be made."""
    p, v, num = parallel.pp, parallel.virtual_pipeline_size, model.num_layers
    if parallel.pipeline_layers is not None:
        return list(parallel.pipeline_layers)
    first, last = parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        check(v == 1, "virtual_pipeline_size", v, "with --decoder-first/last-pipeline-num-layers give the split of every "
              "virtual stage with --pipeline-layers instead")
        ends = (first or 0) + (last or 0)
        inner = p - (first is not None) - (last is not None)
        rest = num - ends
        check(rest >= inner and (inner == 0 and rest == 0 or inner > 0 and rest % inner == 0),
              "decoder_first_pipeline_num_layers" if first is not None else "decoder_last_pipeline_num_layers",
              first if first is not None else last,
              f"the remaining {rest} of num_layers={num} must split evenly over the other {inner} stage(s)")
        mid = [rest // inner] * inner if inner else []
        return ([first] if first is not None else []) + mid + ([last] if last is not None else [])
    if num % (p * v) == 0:
        return [num // (p * v)] * (p * v)
    check(v == 1, "virtual_pipeline_size", v,
          f"pp x virtual_pipeline_size = {p * v} must divide num_layers={num} (or give --pipeline-layers)")
    split = balanced_pipeline_layers(model, p)
    check(split is not None, "pp", p, f"is larger than num_layers={num}")
    return list(split or ())


@functools.lru_cache(maxsize=256)
def balanced_pipeline_layers(model: ModelSpec, pp: int) -> tuple[int, ...] | None:
    """An uneven split for pp stages that do not divide the layers: equal middle stages and lighter first and
    last stages, chosen to minimise the slowest stage's forward FLOPs (the last stage also computes the logits),
    as Megatron-core's ``--decoder-first/last-pipeline-num-layers`` let a user do by hand.

    Worked example: Llama 3 405B (126 layers, V = 128,256, h = 16,384) on pp = 16 gives 7, 8 x 14, 7 (the split
    Meta used [llama3-2024]): the logits cost ~0.6 layer, so a last stage of 7 layers + logits stays under 8.
    None when pp > num_layers. Cached per (model, pp): every stage of a workload and of the estimate asks for it.
    """
    from commscope.flops import token_flops

    num = model.num_layers
    if pp > num:
        return None
    if num % pp == 0:
        return (num // pp,) * pp
    tf = token_flops(model)
    layer = sum(tf.layers) / num
    best: tuple[float, int, tuple[int, ...]] | None = None
    for first in range(1, num + 1):
        for last in range(1, num - first + 1):
            rest = num - first - last
            if pp == 2:
                if rest:
                    continue
                mid: tuple[int, ...] = ()
            elif rest < pp - 2 or rest % (pp - 2):
                continue
            else:
                mid = (rest // (pp - 2),) * (pp - 2)
            cost = max([first * layer, last * layer + tf.logits] + [n * layer for n in mid])
            spread = max((first, last) + mid) - min((first, last) + mid)
            key = (cost, spread, (first,) + mid + (last,))
            if best is None or key[:2] < best[:2]:
                best = key
    return best[2] if best else None


def stage_layers(model: ModelSpec, parallel: ParallelSpec, stage: int) -> list[range]:
    """Layer ranges of each model chunk held by pipeline ``stage``."""
    vs = virtual_stage_layers(model, parallel)
    return [vs[chunk * parallel.pp + stage] for chunk in range(parallel.virtual_pipeline_size)]


def grad_dtype(model: ModelSpec, parallel: ParallelSpec) -> str:
    """dtype of gradient reduction: Megatron accumulates and reduces bf16 models' gradients in fp32."""
    if parallel.grad_reduce_dtype is not None:
        return parallel.grad_reduce_dtype
    return "fp32" if model.dtype == "bf16" else model.dtype


def build_workload(model: ModelSpec, parallel: ParallelSpec, *, routing=None, routing_iteration: int = 0) -> Workload:
    """Every CommOp of one Megatron-style training iteration of ``model`` under ``parallel``.

    ``routing`` (MoE only) gives per-pair all-to-all bytes: ``None`` (balanced), an (ep, ep) token matrix, or a
    :class:`~commscope.moe.trace.RoutingTrace` whose iteration ``routing_iteration`` is used
    (see :mod:`commscope.workload.moe`).
    """
    check_job(model, parallel)
    split_note = pipeline_split_note(model, parallel)
    if parallel.framework != "megatron":
        from commscope.workload.pytorch import build_torch_workload

        return build_torch_workload(model, parallel)
    layout = Layout(parallel)
    ctx = _Ctx(model, parallel, layout)
    opsets: list[OpSet] = []
    opsets += _tp_ops(ctx)
    opsets += _cp_ops(ctx)
    opsets += _pp_ops(ctx)
    opsets += _dp_ops(ctx)
    opsets += _emb_ops(ctx)
    if model.is_moe:
        from commscope.workload.moe import ep_ops

        opsets += ep_ops(ctx, routing, routing_iteration=routing_iteration)
    notes = ([split_note] if split_note else []) + ctx.notes
    return Workload(model=model, parallel=parallel, layout=layout, opsets=tuple(opsets), notes=tuple(notes))


def pipeline_split_note(model: ModelSpec, parallel: ParallelSpec) -> str | None:
    """A line saying which uneven pipeline split was chosen, when the user gave none and pp does not divide the layers."""
    p, v = parallel.pp, parallel.virtual_pipeline_size
    if (parallel.pipeline_layers is not None or parallel.decoder_first_pipeline_num_layers is not None
            or parallel.decoder_last_pipeline_num_layers is not None or model.num_layers % (p * v) == 0):
        return None
    split = pipeline_split(model, parallel)
    return (f"pipeline split {','.join(map(str, split))}: pp={p} does not divide num_layers={model.num_layers}, so the "
            f"first and last stages are lighter (the last also computes the logits); --pipeline-layers or "
            f"--decoder-first/last-pipeline-num-layers choose another")


class _Ctx:
    """Quantities shared by the op generators (internal)."""

    def __init__(self, model: ModelSpec, parallel: ParallelSpec, layout: Layout) -> None:
        self.model, self.parallel, self.layout = model, parallel, layout
        self.m = parallel.num_micro_batches
        self.B = model.dtype_bytes
        self.act_dtype = model.dtype
        self.grad_dtype = grad_dtype(model, parallel)
        self.G = dtype_bytes(self.grad_dtype)
        self.tokens = parallel.micro_batch_size * model.seq_len // parallel.cp  # b s / c per rank per micro-batch
        self.act_bytes = self.tokens * model.hidden_size * self.B  # b (s/c) h B
        self.sp = parallel.sequence_parallel and parallel.tp > 1
        self.stage = layout.stage_of()
        self.notes: list[str] = []

    def groups_of_stage(self, kind: str, stage: int) -> np.ndarray:
        groups = self.layout.groups(kind)
        return groups[self.stage[groups[:, 0]] == stage]

    def chunk_layers(self, stage: int) -> list[tuple[int, ...]]:
        return [tuple(r) for r in stage_layers(self.model, self.parallel, stage)]


def _tp_ops(ctx: _Ctx) -> list[OpSet]:
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
                dtype: str = dt, repeat: int = 1) -> None:
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


def _cp_ops(ctx: _Ctx) -> list[OpSet]:
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


def _pp_ops(ctx: _Ctx) -> list[OpSet]:
    """Pipeline p2p: activations forward and their gradients backward across every (virtual) stage boundary.

    With v model chunks per rank a micro-batch crosses p v - 1 boundaries, the last stage handing chunk k
    to the first stage's chunk k + 1 ([megatron-sc21] interleaved schedule).
    """
    p = ctx.parallel
    if p.pp == 1:
        return []
    size = ctx.act_bytes // p.tp if ctx.sp else ctx.act_bytes
    pp_groups = ctx.layout.groups("pp")
    num_virtual = p.pp * p.virtual_pipeline_size
    out: list[OpSet] = []
    for k in range(num_virtual - 1):
        s_src, s_dst = k % p.pp, (k + 1) % p.pp
        src, dst = pp_groups[:, s_src], pp_groups[:, s_dst]
        out += p2p_pair(axis="pp", name=f"activation_vstage{k}", size_bytes=size, dtype=ctx.act_dtype, phase="fwd",
                        src=src, dst=dst, micro_batches=ctx.m)
        out += p2p_pair(axis="pp", name=f"activation_grad_vstage{k + 1}", size_bytes=size, dtype=ctx.act_dtype,
                        phase="bwd", src=dst, dst=src, micro_batches=ctx.m)
    return out


def _buckets(total_elements: int, bucket: int | None) -> list[int]:
    if total_elements == 0:
        return []
    if bucket is None or bucket >= total_elements:
        return [total_elements]
    full, rest = divmod(total_elements, bucket)
    return [bucket] * full + ([rest] if rest else [])


def _dp_ops(ctx: _Ctx) -> list[OpSet]:
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


def _zero3_ops(ctx: _Ctx, groups: np.ndarray, chunks: list[range], stage: int, *, expert: bool) -> list[OpSet]:
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
            common = dict(axis="dp", groups=groups, layers=lay, micro_batches=ctx.m, repeat=rep)
            out.append(OpSet(op="all_gather", name=f"{label}params_fwd", size_bytes=n * ctx.B, dtype=ctx.act_dtype,
                             phase="fwd", **common))
            out.append(OpSet(op="all_gather", name=f"{label}params_bwd", size_bytes=n * ctx.B, dtype=ctx.act_dtype,
                             phase="bwd", **common))
            out.append(OpSet(op="reduce_scatter", name=f"{label}grads", size_bytes=n * ctx.G, dtype=ctx.grad_dtype,
                             phase="bwd", **common))
    return out


def _emb_ops(ctx: _Ctx) -> list[OpSet]:
    """Tied embeddings with pp > 1: the first and last stage all-reduce the word-embedding gradients."""
    p, model = ctx.parallel, ctx.model
    if p.pp == 1 or not model.tied_embeddings:
        return []
    elements = model.padded_vocab_size(p.tp) * model.hidden_size // p.tp
    groups = ctx.layout.groups("emb")
    return [OpSet(op="all_reduce", axis="emb", name="embedding_grads", size_bytes=elements * ctx.G,
                  dtype=ctx.grad_dtype, phase="optim", groups=groups)]
