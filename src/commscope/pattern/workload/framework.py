"""What a training framework sends in one iteration: one small interface, and the pieces its implementations share.

A framework's communication rules (:class:`FrameworkRules`) answer four questions about one job:

    check(model, parallel)   refuse, naming the field, a job the framework cannot run
    per_layer(ctx)           what the layers of each pipeline stage send: TP and CP collectives (and their
                             embedding / output-layer relatives), MoE all-to-alls
    per_stage(ctx)           what crosses between pipeline stages: activations and their gradients
    per_step(ctx)            what is sent once per optimizer step: gradient reduction, parameter gathers,
                             tied-embedding sync

Megatron-LM's rules (:mod:`commscope.pattern.workload.dense`) and PyTorch's own parallelism
(:mod:`commscope.pattern.workload.pytorch`) are sibling implementations; neither imports the other's rules. What both
need lives here, below them: :class:`JobContext` (the sizes and groups of one job), :func:`pipeline_p2p` (the
send/recv pattern of pipelining, the same in both) and :func:`build` (a workload from a set of rules). A new
framework is one more module with a class of these four methods, and one entry in
:data:`commscope.pattern.workload.dense.FRAMEWORK_RULES`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from commscope.pattern.layout import Layout
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.units import dtype_bytes
from commscope.pattern.workload.base import OpSet, Workload, p2p_pair
from commscope.pattern.workload.stages import stage_layers

__all__ = ["FrameworkRules", "JobContext", "build", "grad_dtype", "pipeline_p2p"]


def grad_dtype(model: ModelSpec, parallel: ParallelSpec) -> str:
    """dtype of gradient reduction: Megatron accumulates and reduces bf16 models' gradients in fp32."""
    if parallel.grad_reduce_dtype is not None:
        return parallel.grad_reduce_dtype
    return "fp32" if model.dtype == "bf16" else model.dtype


class JobContext:
    """Quantities of one job that every framework's rules use; ``notes`` collects what the rules assumed."""

    def __init__(self, model: ModelSpec, parallel: ParallelSpec, layout: Layout) -> None:
        self.model, self.parallel, self.layout = model, parallel, layout
        self.m: int = parallel.num_micro_batches
        self.B: int = model.dtype_bytes
        self.act_dtype: str = model.dtype
        self.grad_dtype: str = grad_dtype(model, parallel)
        self.G: int = dtype_bytes(self.grad_dtype)
        self.tokens: int = parallel.micro_batch_size * model.seq_len // parallel.cp  # b s / c per rank per micro-batch
        self.act_bytes: int = self.tokens * model.hidden_size * self.B  # b (s/c) h B
        self.sp: bool = parallel.sequence_parallel and parallel.tp > 1
        self.stage: np.ndarray = layout.stage_of()
        self.notes: list[str] = []

    def groups_of_stage(self, kind: str, stage: int) -> np.ndarray:
        groups = self.layout.groups(kind)
        out: np.ndarray = groups[self.stage[groups[:, 0]] == stage]
        return out

    def chunk_layers(self, stage: int) -> list[tuple[int, ...]]:
        return [tuple(r) for r in stage_layers(self.model, self.parallel, stage)]


class FrameworkRules(Protocol):
    """The communication rules of one training framework (see the module docstring)."""

    def check(self, model: ModelSpec, parallel: ParallelSpec) -> None: ...

    def per_layer(self, ctx: JobContext) -> list[OpSet]: ...

    def per_stage(self, ctx: JobContext) -> list[OpSet]: ...

    def per_step(self, ctx: JobContext) -> list[OpSet]: ...

    def notes(self, ctx: JobContext) -> list[str]:
        """Lines for reports saying what the rules assumed (before those the ops added to ``ctx.notes``)."""
        ...


def build(rules: FrameworkRules, model: ModelSpec, parallel: ParallelSpec) -> Workload:
    """Every CommOp of one iteration of ``model`` under ``parallel``, by ``rules``."""
    rules.check(model, parallel)
    layout = Layout(parallel)
    ctx = JobContext(model, parallel, layout)
    opsets = rules.per_layer(ctx) + rules.per_stage(ctx) + rules.per_step(ctx)
    notes = rules.notes(ctx) + ctx.notes
    return Workload(model=model, parallel=parallel, layout=layout, opsets=tuple(opsets), framework=parallel.framework,
                    notes=tuple(notes))


def pipeline_p2p(ctx: JobContext) -> list[OpSet]:
    """Pipeline p2p: activations forward and their gradients backward across every (virtual) stage boundary.

    With v model chunks per rank a micro-batch crosses p v - 1 boundaries, the last stage handing chunk k
    to the first stage's chunk k + 1 ([megatron-sc21] interleaved schedule). torch.distributed.pipelining
    (one chunk per stage) sends the same.
    """
    p = ctx.parallel
    if p.pp == 1:
        return []
    # sequence parallelism leaves each TP rank 1/t of the activation; so does Megatron-LM's scatter/gather,
    # whose receiver then all-gathers the pieces over its TP group (megatron only: ParallelSpec checks it)
    gather = p.scatter_gather_tensors_in_pipeline and p.tp > 1 and not ctx.sp
    size = ctx.act_bytes // p.tp if ctx.sp or gather else ctx.act_bytes
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
        if gather:
            out += [OpSet(op="all_gather", axis="pp", name=f"activation_gather_vstage{k + 1}", size_bytes=ctx.act_bytes,
                          dtype=ctx.act_dtype, phase="fwd", groups=ctx.groups_of_stage("tp", s_dst), micro_batches=ctx.m),
                    OpSet(op="all_gather", axis="pp", name=f"activation_grad_gather_vstage{k}", size_bytes=ctx.act_bytes,
                          dtype=ctx.act_dtype, phase="bwd", groups=ctx.groups_of_stage("tp", s_src), micro_batches=ctx.m)]
    return out
