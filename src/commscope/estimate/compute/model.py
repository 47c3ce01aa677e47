"""Compute time of one training iteration, per pipeline stage and micro-batch, from the GPU's own model.

For each layer kind of the model (dense, MoE) on one GPU and one micro-batch:

- the linear GEMMs (QKV, attention output, MLP or experts, router) forward, dgrad and wgrad, each timed by
  the tile/wave model of :mod:`commscope.estimate.compute.gemm` (in FP8 under ``fp8_format``);
- the attention core, fused or unfused, and the memory-bound kernels of :mod:`commscope.estimate.compute.kernels`;
- without gradient accumulation fusion, the add of each micro-batch's weight gradients into the accumulated ones;
- recomputation: ``full`` repeats the layer's whole forward in backward; ``selective`` repeats the attention
  core [korthikanti-2022]: the two batched GEMMs, softmax and dropout when unfused, the fused kernel's forward
  when flash (Megatron-core checkpoints its core attention either way, so with flash attention selective costs a
  kernel forward and saves only the kernel's softmax statistics).

A stage sums the layers it holds (all its virtual chunks), the first stage adds the embedding, the last the
final norm, the logits GEMMs and the cross-entropy. The optimizer step is per iteration and per stage.

The result also says how much of each pass is linear-layer GEMM time, which is what tensor-parallel
communication can hide under with ``--tp-comm-overlap``, and how much is attention, which hides the context-
parallel ring (:mod:`commscope.estimate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

import numpy as np

from commscope.estimate.compute.attention import BACKWARD_RATIO
from commscope.estimate.compute.effects import launch_gap_s, layer_kernel_count, overlap_chunks, overlaps_tp_comm
from commscope.estimate.compute.gemm import CORE_GEMMS, GemmTimer, _gemm_flop, _GemmRow, _gemm_rows, layer_dims
from commscope.estimate.compute.kernels import (
    HALF_DTYPES,
    attention_core_s,
    attention_kernel_for,
    LayerKernels,
    fused_softmax_available,
    grad_accumulation_bytes_per_param,
    grad_accumulation_note,
    softmax_rows_per_block,
    layer_kernels,
    linear_gemm_dtype,
    optimizer_step_time_s,
    stage_extra_bytes,
    torch_softmax_extra_bytes,
)
from commscope.errors import ConfigError
from commscope.estimate.gpus import GpuSpec
from commscope.estimate.plain import frozen, plain_twin
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.estimate.stage_structure import _layer_kinds, _stage_layers

__all__ = ["StageCompute", "stage_compute", "timed_attention"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCompute:
    """Compute of one GPU of each pipeline stage (arrays of length pp; seconds per micro-batch unless noted)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    """dgrad + wgrad + attention and memory-bound backward + recomputation."""
    recompute_s: np.ndarray
    """The part of ``backward_s`` that repeats forward work."""
    gemm_s: np.ndarray
    """Linear-layer and logits GEMMs, forward and backward (recomputation apart)."""
    attention_s: np.ndarray
    """Attention core forward and backward (fused kernel, or unfused GEMMs and softmax/dropout)."""
    memory_s: np.ndarray
    """Memory-bound kernels forward and backward."""
    linear_forward_s: np.ndarray
    """Forward linear-layer GEMM time (what TP communication overlaps with, forward)."""
    linear_backward_s: np.ndarray
    """Backward linear-layer GEMM time, recomputed forward GEMMs included."""
    optimizer_s: np.ndarray
    """Optimizer step, once per iteration."""
    flop: np.ndarray
    """FLOP the kernels execute per micro-batch (causal attention at half, recomputation included)."""
    gemm_efficiency: float
    """FLOP-weighted fraction of peak of the linear GEMMs of the slowest stage."""
    gpu: str
    notes: tuple[str, ...] = ()
    clock_s: np.ndarray | None = None
    """Of the compute above, what the sustained clock adds (in-training effect 1 of :mod:`commscope.estimate.compute.effects`)."""
    chunks_s: np.ndarray | None = None
    """What cutting overlapped GEMMs into Transformer Engine's pieces adds (effect 3)."""
    gaps_s: np.ndarray | None = None
    """Host launch gaps (effect 4)."""
    stack_s: np.ndarray | None = None
    """What the stack's (and cluster's) compute efficiency adds per micro-batch (:mod:`commscope.estimate.stacks`)."""
    stack_opt_s: np.ndarray | None = None
    """The same for the optimizer step (per iteration)."""
    efficiency: float = 1.0

    def breakdown(self, stage: int, num_micro_batches: int) -> dict[str, float]:
        """Seconds per iteration of ``stage`` by kind of work, and what each in-training effect adds to them."""
        m = num_micro_batches
        out = {"gemm_s": float(self.gemm_s[stage] * m), "attention_s": float(self.attention_s[stage] * m),
               "memory_bound_s": float(self.memory_s[stage] * m), "recompute_s": float(self.recompute_s[stage] * m),
               "optimizer_s": float(self.optimizer_s[stage])}
        for key, arr in (("clock_s", self.clock_s), ("overlap_chunks_s", self.chunks_s), ("launch_gaps_s", self.gaps_s),
                         ("stack_s", self.stack_s)):
            if arr is not None:
                out[key] = float(arr[stage] * m)
        if self.stack_opt_s is not None:
            out["stack_s"] = out.get("stack_s", 0.0) + float(self.stack_opt_s[stage])
        return out



_StageComputeFields = plain_twin(StageCompute)


@dataclass(frozen=True, slots=True)
class _Kind:
    """One layer of one kind for one micro-batch (seconds), the in-training effects included."""

    lin_fwd: float
    lin_bwd: float
    att_fwd: float
    att_bwd: float
    mem_fwd: float
    mem_bwd: float
    recompute: float
    recompute_linear: float
    flop: float
    lin_flop: float
    lin_time: float
    """Linear GEMM time as calibrated (whole GEMMs, at the calibration clock): what the efficiency note reports."""
    clock: float = 0.0
    """Of the above, what the sustained clock adds to the compute-bound kernels (forward + backward + recompute)."""
    chunks: float = 0.0
    """What cutting the overlapped GEMMs into Transformer Engine's pieces adds."""
    gaps_fwd: float = 0.0
    """Host launch gaps of the forward (:func:`commscope.estimate.compute.effects.launch_gap_s`)."""
    gaps_bwd: float = 0.0

    @property
    def fwd(self) -> float:
        return self.lin_fwd + self.att_fwd + self.mem_fwd + self.gaps_fwd

    @property
    def bwd(self) -> float:
        return self.lin_bwd + self.att_bwd + self.mem_bwd + self.recompute + self.gaps_bwd

    def row(self) -> tuple[float, ...]:
        """One layer's share of each per-stage array of :data:`ROW_FIELDS`, in that order."""
        return (self.fwd, self.bwd, self.recompute, self.lin_fwd + self.lin_bwd, self.att_fwd + self.att_bwd,
                self.mem_fwd + self.mem_bwd, self.lin_fwd, self.lin_bwd + self.recompute_linear, self.flop, self.lin_flop,
                self.lin_time, self.clock, self.chunks, self.gaps_fwd + self.gaps_bwd)


_KindFields = plain_twin(_Kind)

#: The per-stage arrays a layer adds to (:meth:`_Kind.row`), in the order of its entries.
ROW_FIELDS = ("fwd", "bwd", "rec", "gemm", "att", "mem", "lin_f", "lin_b", "flop", "lin_flop", "lin_time", "clock",
              "chunks", "gaps")


def _by_pass(times_s: Sequence[float]) -> dict[str, float]:
    """The seconds of each pass of GEMM rows' ``times_s``, summed in row order: the rows of the compute model come as
    each forward GEMM's three passes in :data:`~commscope.estimate.compute.gemm.PASSES`' order (:func:`_gemm_rows`)."""
    return {"fwd": sum(times_s[0::3], 0.0), "dgrad": sum(times_s[1::3], 0.0), "wgrad": sum(times_s[2::3], 0.0)}


#: A GEMM row's FLOP (:attr:`_GemmRow.flop`), and its calls.
_FLOP, _CALLS = itemgetter(4), itemgetter(3)


def _chunked(g: _GemmRow, parallel: ParallelSpec) -> _GemmRow:
    """``g`` as Transformer Engine's overlap runs it: ``n`` GEMMs of 1/n of the tokens (M) each."""
    n = overlap_chunks(g.name, g.pass_, parallel)
    if n == 1:
        return g
    m_whole, n_, k, batch, _ = g.key
    m = -(-m_whole // n)
    return g._replace(key=(m, n_, k, batch, m * k + k * n_ + m * n_), calls=g.calls * n,
                      flop=_gemm_flop(m, n_, k, batch, g.calls * n))


def logits_times(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, timer: GemmTimer | None = None,
                 gemms: tuple[_GemmRow, ...] | None = None) -> dict[str, float]:
    """Seconds of the output layer's GEMMs per pass (fwd, dgrad, wgrad), at the sustained clock (``gemms``: the
    output layer's, where the caller has them; ``timer``: the caller's, where it has announced them to one)."""
    if gemms is None:
        gemms = _gemm_rows(model, parallel, _dims(model, parallel), part="logits")
    out = _by_pass((timer or GemmTimer(gpu)).row_times_s(gemms, model.dtype))
    return {k: v * gpu.clock_factor for k, v in out.items()}


def _dims(model: ModelSpec, parallel: ParallelSpec) -> dict[str, int]:
    """:func:`~commscope.estimate.compute.gemm.layer_dims` of ``parallel``."""
    return layer_dims(model, tp=parallel.tp, cp=parallel.cp, ep=parallel.ep, micro_batch_size=parallel.micro_batch_size)


@dataclass(frozen=True, slots=True)
class _LayerPlan:
    """The GEMMs of one layer of one kind by how they are timed."""

    linear: tuple[_GemmRow, ...]
    """The linear GEMMs, those in ``lin_dtype`` first (all but the router), then the router's in the model's."""
    num_lin_dtype: int
    pieces: tuple[_GemmRow, ...] | None
    """The first ``num_lin_dtype`` as Transformer Engine's overlap cuts them (None where it cuts none)."""
    core: tuple[_GemmRow, ...]
    """The attention core's batched GEMMs (unfused attention only)."""
    lin_dtype: str
    num_fwd: int
    """GEMM calls of the layer's forward."""


def _layer_plan(parallel: ParallelSpec, attention: _AttentionGemms, body: tuple[_GemmRow, ...],
                lin_dtype: str) -> _LayerPlan:
    """How the GEMMs of one layer are timed (see :class:`_LayerPlan`): ``attention``, its attention's, ``body`` the
    rest (:func:`~commscope.estimate.compute.gemm._gemm_rows`); ``lin_dtype``: the linear GEMMs' dtype
    (:func:`~commscope.estimate.compute.kernels.linear_gemm_dtype`)."""
    router = tuple(g for g in body if g.name == "router")
    body = tuple(g for g in body if g.name != "router") if router else body
    fp8 = attention.linear + body
    pieces = attention.pieces + _pieces(body, parallel) if attention.pieces is not None else None
    return _LayerPlan(linear=fp8 + router, num_lin_dtype=len(fp8), pieces=pieces, core=attention.core,
                      lin_dtype=lin_dtype,
                      num_fwd=attention.num_fwd + sum(map(_CALLS, (body + router)[0::3])))


def _pieces(gemms: tuple[_GemmRow, ...], parallel: ParallelSpec) -> tuple[_GemmRow, ...]:
    """``gemms`` as Transformer Engine's overlap cuts them (:func:`_chunked`)."""
    return tuple(_chunked(g, parallel) for g in gemms)


@dataclass(frozen=True, slots=True)
class _AttentionGemms:
    """The attention's GEMMs of a layer, alike in every layer kind."""

    linear: tuple[_GemmRow, ...]
    """QKV and the projection."""
    core: tuple[_GemmRow, ...]
    """The core's batched GEMMs (unfused attention only)."""
    pieces: tuple[_GemmRow, ...] | None
    """``linear`` as Transformer Engine's overlap cuts them (None where it overlaps nothing)."""
    num_fwd: int
    """GEMM calls of the attention's forward (linear and core)."""


def job_gemms(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec,
              timer: GemmTimer | None) -> tuple[dict[str, _LayerPlan], tuple[_GemmRow, ...]]:
    """The GEMMs of one layer of each kind the model has (dense, moe) as they are timed, and the output layer's,
    all announced to ``timer`` where one is given (so that one call per dtype times them). The attention's GEMMs,
    alike in every kind, are made and announced once."""
    dims = _dims(model, parallel)
    if parallel.fp8_format is not None and "fp8" not in gpu.peak_flops:
        raise ConfigError("fp8_format", parallel.fp8_format,
                          f"GPU {gpu.name!r} has no FP8 tensor cores (FP8 needs Hopper or Ada, sm_89+); it has "
                          f"{', '.join(sorted(gpu.peak_flops))}: drop --fp8-format")
    rows = _gemm_rows(model, parallel, dims, part="attention", attention=parallel.attention,
                      core=parallel.attention == "unfused")
    linear = tuple(g for g in rows if g.name not in CORE_GEMMS)
    attention = _AttentionGemms(linear=linear, core=tuple(g for g in rows if g.name in CORE_GEMMS),
                                pieces=_pieces(linear, parallel) if overlaps_tp_comm(parallel) else None,
                                num_fwd=sum(map(_CALLS, rows[0::3])))
    lin_dtype = linear_gemm_dtype(model, parallel)
    plans = {kind: _layer_plan(parallel, attention, _gemm_rows(model, parallel, dims, part=kind,
                                                               attention=parallel.attention), lin_dtype)
             for kind in _layer_kinds(model)}
    logits_gemms = _gemm_rows(model, parallel, dims, part="logits")
    if timer is not None:
        # every GEMM announced once: the attention's, then each kind's own (its linear GEMMs past the attention's)
        n = len(linear)
        in_lin = [*linear, *(attention.pieces or ())]
        in_model = [*attention.core, *logits_gemms]
        for plan in plans.values():
            in_lin += plan.linear[n:plan.num_lin_dtype] + (plan.pieces or ())[n:]
            in_model += plan.linear[plan.num_lin_dtype:]
        if lin_dtype == model.dtype:
            timer.prefetch_rows(in_lin + in_model, lin_dtype)
        else:
            timer.prefetch_rows(in_lin, lin_dtype)
            timer.prefetch_rows(in_model, model.dtype)
    return plans, logits_gemms


def _kind(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, kind: str) -> _Kind:
    """One layer of ``kind``."""
    return _kinds(model, parallel, gpu, kind, GemmTimer(gpu), (parallel.recompute,))[parallel.recompute]


def _kinds(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, kind: str, timer: GemmTimer,
           recomputes: tuple[str, ...], plan: _LayerPlan | None = None,
           attention: tuple[float, float, float] | None = None) -> dict[str, _Kind]:
    """One layer of ``kind`` under each recomputation of ``recomputes`` (``parallel.recompute`` aside, what a layer
    costs does not depend on it: worked out once); ``plan``: the layer's GEMMs, where the caller has announced them
    to ``timer``; ``attention``: :func:`~commscope.estimate.compute.kernels.attention_core_s`, where the caller has
    it (alike in every layer kind)."""
    if plan is None:
        plan = job_gemms(model, parallel, gpu, None)[0][kind]
    linear, core, n_fp8, lin_dtype = plan.linear, plan.core, plan.num_lin_dtype, plan.lin_dtype
    whole = (timer.row_times_s(linear, lin_dtype) if lin_dtype == model.dtype
             else timer.row_times_s(linear[:n_fp8], lin_dtype) + timer.row_times_s(linear[n_fp8:], model.dtype))
    if plan.pieces is not None:
        # the pieces run on several streams (Transformer Engine's userbuffers), one piece's launch and ramp under
        # the previous one's tail: the fixed cost of a GEMM call is paid once per GEMM, not per piece
        lin = [t - (c.calls - g.calls) * gpu.kernel_overhead_s
               for t, c, g in zip(timer.row_times_s(plan.pieces, lin_dtype), plan.pieces, linear)] + whole[n_fp8:]
    else:
        lin = whole
    cor = timer.row_times_s(core, model.dtype) if core else []  # (no core GEMMs under flash attention)
    k: LayerKernels = layer_kernels(model, parallel, gpu, moe=(kind == "moe"), attention=attention)
    clock = gpu.clock_factor
    lp, cp_ = _by_pass(lin), _by_pass(cor)
    lp = {p: t * clock for p, t in lp.items()}
    flash = parallel.attention == "flash"
    # compute-bound at the sustained clock: the GEMMs and the fused kernel; unfused softmax/dropout are memory-bound
    att_fwd = (k.attention_fwd_s * clock if flash else k.attention_fwd_s) + cp_["fwd"] * clock
    att_bwd = (k.attention_bwd_s * clock if flash else k.attention_bwd_s) + (cp_["dgrad"] + cp_["wgrad"]) * clock
    att_compute_fwd = (k.attention_fwd_s if flash else 0.0) + cp_["fwd"]
    att_compute_bwd = (k.attention_bwd_s if flash else 0.0) + cp_["dgrad"] + cp_["wgrad"]
    lin_fwd, lin_bwd = lp["fwd"], lp["dgrad"] + lp["wgrad"]
    fwd = lin_fwd + att_fwd + k.memory_fwd_s
    # host launch gaps: an eager framework's layer cannot run faster than its kernels are launched
    n_fwd, n_bwd = layer_kernel_count(gemms=plan.num_fwd, attention_fused=flash,
                                      rope=model.position_embedding == "rope", gated=model.gated_mlp)
    gaps_fwd = float(launch_gap_s(n_fwd, fwd))
    lin_flop = sum(map(_FLOP, linear))
    lin_whole = sum(whole)
    lin_pieces = sum(lin)
    layer_flop = lin_flop + sum(map(_FLOP, core)) + (1 + BACKWARD_RATIO) * k.attention_flop
    out = {}
    for recomputation in recomputes:
        recompute_linear = 0.0
        flop = layer_flop
        if recomputation == "full":
            recompute, recompute_linear = fwd + gaps_fwd, lin_fwd
            recompute_compute = sum(lin[0::3]) + att_compute_fwd  # (the forward rows: the first of each three)
            flop += sum(map(_FLOP, (linear + core)[0::3])) + k.attention_flop
        elif recomputation == "selective":
            recompute, recompute_compute = att_fwd, att_compute_fwd
            flop += sum(map(_FLOP, core[0::3])) + k.attention_flop
        else:
            recompute, recompute_compute = 0.0, 0.0
        bwd_kernels = lin_bwd + att_bwd + k.memory_bwd_s + recompute
        gaps_bwd = float(launch_gap_s(n_bwd, bwd_kernels))
        compute_bound = lin_pieces + att_compute_fwd + att_compute_bwd + recompute_compute
        # (through _Kind's plain twin, commscope.estimate.plain, as Gemm and StageCompute are built)
        out[recomputation] = frozen(_KindFields(
            lin_fwd=lin_fwd, lin_bwd=lin_bwd, att_fwd=att_fwd, att_bwd=att_bwd, mem_fwd=k.memory_fwd_s,
            mem_bwd=k.memory_bwd_s, recompute=recompute, recompute_linear=recompute_linear, flop=flop, lin_flop=lin_flop,
            lin_time=lin_whole, clock=compute_bound * (clock - 1.0), chunks=(lin_pieces - lin_whole) * clock,
            gaps_fwd=gaps_fwd, gaps_bwd=gaps_bwd), _Kind)
    return out


def first_max(x: Any, rel: float = 1e-9) -> Any:
    """Index along the last axis of the first value within ``rel`` of the largest: the stage that decides, the
    same one whatever order its time was summed in (np.argmax alone lets a rounding difference between two equal
    stages pick either, and the scalar and the many-configuration paths sum in different orders)."""
    x = np.asarray(x)
    if x.ndim <= 2 and x.size == x.shape[-1]:  # one row (one configuration): the same test on numbers
        i = _first_max_of(x.reshape(-1).tolist(), rel)
        return np.intp(i) if x.ndim == 1 else np.array([i], dtype=np.intp)
    top = x.max(axis=-1, keepdims=True)
    return np.argmax(x >= top - rel * np.abs(top), axis=-1)


def _first_max_of(row: list[float], rel: float = 1e-9) -> int:
    """:func:`first_max` of one row of numbers."""
    top = max(row)
    bar = top - rel * abs(top)
    return next((j for j, value in enumerate(row) if value >= bar), 0)


def _softmax_fallback_note(model: ModelSpec, parallel: ParallelSpec) -> str:
    """Why Megatron's fused softmax kernel does not run in this unfused attention, and what the fallback costs."""
    batches = parallel.micro_batch_size * (model.num_heads // parallel.tp)
    rows = max(4, softmax_rows_per_block(model.seq_len))
    if model.dtype not in HALF_DTYPES:
        why = f"{model.dtype} scores (the kernel takes fp16/bf16)"
    elif not fused_softmax_available(model, micro_batch_size=rows, tp=model.num_heads, cp=parallel.cp):
        # (refused even with a whole block of rows: the sequence is what the kernel does not take)
        why = f"sequence {model.seq_len} (the kernel takes 16 < s <= 4096, a multiple of 4)"
    else:
        why = (f"micro-batch {parallel.micro_batch_size} x {model.num_heads // parallel.tp} heads per rank = {batches}, "
               f"not a multiple of the kernel's {rows} rows per block: a micro-batch that makes it one avoids this")
    fwd, _ = torch_softmax_extra_bytes(model)
    kernel = 2 * model.dtype_bytes
    return (f"unfused attention: Megatron's fused softmax kernel does not run ({why}); PyTorch's scale, mask and "
            f"softmax are timed instead ({(kernel + fwd) / kernel:.0f}x the kernel's bytes forward)")


def timed_attention(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec) -> tuple[ParallelSpec, tuple[str, ...]]:
    """``parallel`` with its attention as ``gpu`` runs it (unfused where the GPU has no fused kernels), and notes
    that say where that, or Megatron's softmax kernel, differs from what was asked."""
    notes = []
    if parallel.attention == "flash" and not gpu.flash_attention:
        notes.append(f"{gpu.name} has no fused (flash) attention kernels: attention is timed unfused")
        parallel = replace(parallel, attention="unfused")
    if parallel.attention == "unfused" and not fused_softmax_available(
            model, micro_batch_size=parallel.micro_batch_size, tp=parallel.tp, cp=parallel.cp):
        notes.append(_softmax_fallback_note(model, parallel))
    return parallel, tuple(notes)


def compute_efficiency(parallel: ParallelSpec, cluster_efficiency: float = 1.0) -> float:
    """The fraction of the modelled speed compute runs at: the named stack's efficiency (:mod:`commscope.estimate.stacks`)
    times the cluster's own (``ClusterSpec.compute_efficiency``, fitted by ``validate --fit``)."""
    if parallel.stack is None:
        return cluster_efficiency
    from commscope.estimate.stacks import stack_preset

    return stack_preset(parallel.stack).compute_efficiency * cluster_efficiency


#: The per-stage arrays a compute efficiency scales (every time, none of the FLOP counts).
TIME_ARRAYS = ("fwd", "bwd", "rec", "gemm", "att", "mem", "lin_f", "lin_b", "opt", "clock", "chunks", "gaps")


def stage_ends_bytes(model: ModelSpec, parallel: ParallelSpec) -> list[tuple[float, float]]:
    """Memory-bound (forward, backward) bytes of the first stage's ends, a middle stage's (none), the last's, and
    the one stage of pp 1 (first and last): :func:`commscope.estimate.compute.kernels.stage_extra_bytes` of each,
    the last of them the sum of the first and the third (what stage_extra_bytes adds for it, in its order)."""
    (ff, fb), (lf, lb) = (stage_extra_bytes(model, parallel, first=True, last=False),
                          stage_extra_bytes(model, parallel, first=False, last=True))
    return [(ff, fb), (0.0, 0.0), (lf, lb), (ff + lf, fb + lb)]


def stage_arrays(gpu: GpuSpec, *, dense: np.ndarray, moe: np.ndarray | None, dense_layers: np.ndarray,
                 moe_layers: np.ndarray, extra_bytes: np.ndarray, logits: np.ndarray, logits_flop: Any,
                 params: np.ndarray, accumulation_bytes: Any, optimizer_s: np.ndarray,
                 efficiency: Any) -> dict[str, np.ndarray]:
    """The per-stage arrays of :class:`StageCompute` of ``n`` configurations with ``p`` stages each, (n, p) each
    (the optimizer step per iteration, the rest per micro-batch), or of one configuration, (p,) each, where every
    argument has its leading n left out. One function for one configuration (:func:`stage_compute`) and many
    (:mod:`commscope.estimate.many`), so that both sum in one order.

    ``dense``, ``moe``: (n, :data:`ROW_FIELDS`) one layer of each kind (:meth:`_Kind.row`; ``moe`` None for a dense
    model); ``dense_layers``, ``moe_layers``: (n, p) layers of each kind per stage; ``extra_bytes``: (n, 4, 2)
    memory-bound (forward, backward) bytes of the first stage's ends, a middle stage's, the last's, and the one stage
    of pp 1 (:func:`commscope.estimate.compute.kernels.stage_extra_bytes`); ``logits``: (n, 3) the output layer's
    GEMMs' forward, dgrad, wgrad; ``logits_flop``: (n,); ``params``: (n, p) parameters of a rank of each stage;
    ``accumulation_bytes``: (n, 1) bytes per parameter of adding a micro-batch's weight gradients, None where every
    configuration fuses the add; ``optimizer_s``: (n, p); ``efficiency``: (n, 1) the compute efficiency
    (:func:`compute_efficiency`), None where every configuration's is 1.
    """
    p = dense_layers.shape[-1]
    # (fields, n, p): every quantity of a layer times the layers of its kind on each stage, at once
    per_stage = dense.T[..., None] * dense_layers
    if moe is not None:
        per_stage = per_stage + moe.T[..., None] * moe_layers
    c = dict(zip(ROW_FIELDS, per_stage))
    bw = gpu.streaming_bandwidth_bytes_per_s
    # (n, p, 2): the first stage's ends, a middle stage's, the last's; with pp 1 the one stage is first and last
    ends = np.ones(p, dtype=np.intp)
    ends[0], ends[-1] = (3, 3) if p == 1 else (0, 2)
    ext = extra_bytes[..., ends, :]
    c["fwd"] = c["fwd"] + ext[..., 0] / bw
    c["bwd"] = c["bwd"] + ext[..., 1] / bw
    c["mem"] = c["mem"] + (ext[..., 0] + ext[..., 1]) / bw
    # the output layer's GEMMs on the last stage (added to its column: every other stage's would add 0)
    lf, ld, lw = logits.T  # forward, dgrad, wgrad: (n,) each, or numbers
    all_logits = lf + ld + lw
    c["fwd"][..., -1] += lf
    c["bwd"][..., -1] += ld + lw
    c["gemm"][..., -1] += all_logits
    c["clock"][..., -1] += all_logits * (1.0 - 1.0 / gpu.clock_factor)
    c["flop"][..., -1] += logits_flop
    if accumulation_bytes is not None:
        # without gradient accumulation fusion, each micro-batch's backward adds its weight gradients into the
        # accumulated ones (kernels.grad_accumulation_bytes_per_param)
        accumulate = params * accumulation_bytes / bw
        c["bwd"] = c["bwd"] + accumulate
        c["mem"] = c["mem"] + accumulate
    c["opt"] = optimizer_s
    # the stack's and the cluster's compute efficiency (apply_efficiency), per configuration (none: what it adds
    # is 0 everywhere)
    if efficiency is not None:
        scale = 1.0 / efficiency
        c["stack"] = (c["fwd"] + c["bwd"]) * (scale - 1.0)
        c["stack_opt"] = c["opt"] * (scale - 1.0)
        for key in TIME_ARRAYS:
            c[key] = c[key] * scale
    else:
        c["stack"], c["stack_opt"] = np.zeros(c["fwd"].shape), np.zeros(np.shape(c["opt"]))
    return c


def stage_compute(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, *, efficiency: float = 1.0,
                  layers: tuple[np.ndarray, ...] | None = None) -> StageCompute:
    """Per-stage compute of ``model`` under ``parallel`` on ``gpu`` (see the module docstring); ``efficiency``
    is the cluster's own compute efficiency (the stack's is read from ``parallel.stack``). Its cost does not grow
    with the stages or the layers: one layer of each kind is worked out, and the stages are arrays of layer counts
    (``layers``: :func:`commscope.estimate.stage_structure._stage_layers` of the job, where the caller has them)."""
    parallel, attention_notes = timed_attention(model, parallel, gpu)
    notes = list(attention_notes)
    timer = GemmTimer(gpu)  # every GEMM of the job timed in one call per dtype
    plans, logits_gemms = job_gemms(model, parallel, gpu, timer)
    attention = attention_core_s(model, parallel, gpu)
    rows = {kind: np.array(_kinds(model, parallel, gpu, kind, timer, (parallel.recompute,), plan,
                                  attention)[parallel.recompute].row()) for kind, plan in plans.items()}
    logits = logits_times(model, parallel, gpu, timer, logits_gemms)
    accumulation_bytes = grad_accumulation_bytes_per_param(model, parallel)
    accumulation_note = grad_accumulation_note(model, parallel)
    if accumulation_note:
        notes.append(accumulation_note)
    dense_layers, moe_layers, dense_params, expert_params = layers or _stage_layers(model, parallel)
    eff_total = compute_efficiency(parallel, efficiency)
    # (one configuration: stage_arrays' arguments without their leading axis of configurations)
    arrays = stage_arrays(
        gpu, dense=rows["dense"] if "dense" in rows else np.zeros(len(ROW_FIELDS)), moe=rows.get("moe"),
        dense_layers=dense_layers, moe_layers=moe_layers,
        extra_bytes=np.array(stage_ends_bytes(model, parallel)),
        logits=np.array([logits["fwd"], logits["dgrad"], logits["wgrad"]]),
        logits_flop=sum(map(_FLOP, logits_gemms)), params=dense_params + expert_params,
        accumulation_bytes=float(accumulation_bytes) if accumulation_bytes else None,
        optimizer_s=optimizer_step_time_s(model, parallel, gpu, dense_params=dense_params, expert_params=expert_params),
        efficiency=eff_total if eff_total != 1.0 else None)
    crit = _first_max_of((arrays["fwd"] + arrays["bwd"]).tolist())
    lin_dtype = linear_gemm_dtype(model, parallel)
    peak = gpu.peak_flops_for(lin_dtype)
    eff = float(arrays["lin_flop"][crit] / (arrays["lin_time"][crit] * peak)) if arrays["lin_time"][crit] else 0.0
    notes.append(compute_note(gpu, lin_dtype, eff, parallel))
    notes += effects_notes(model, parallel, gpu, arrays, crit, eff_total)
    # (through StageCompute's plain twin, commscope.estimate.plain)
    return frozen(_StageComputeFields(
        forward_s=arrays["fwd"], backward_s=arrays["bwd"], recompute_s=arrays["rec"], gemm_s=arrays["gemm"],
        attention_s=arrays["att"], memory_s=arrays["mem"], linear_forward_s=arrays["lin_f"],
        linear_backward_s=arrays["lin_b"], optimizer_s=arrays["opt"], flop=arrays["flop"], gemm_efficiency=eff,
        gpu=gpu.name, notes=tuple(notes), clock_s=arrays["clock"], chunks_s=arrays["chunks"], gaps_s=arrays["gaps"],
        stack_s=arrays["stack"], stack_opt_s=arrays["stack_opt"], efficiency=eff_total), StageCompute)


def compute_note(gpu: GpuSpec, lin_dtype: str, gemm_efficiency: float, parallel: ParallelSpec) -> str:
    """The compute model's line in an estimate's notes: what it timed with which constants, and the command that
    replaces the constants with the user's own GPU's."""
    attention: str = parallel.attention
    if attention == "flash" and gpu.attention_kernels:
        attention = f"fused ({attention_kernel_for(parallel, gpu)[0]})"
    return (f"compute: per-GEMM tile/wave model on {gpu.name} ({lin_dtype} linear GEMMs at {gemm_efficiency:.0%} of "
            f"peak), {attention} attention, memory-bound kernels at {round(gpu.memory_efficiency * 100, 1):g}% of "
            f"{gpu.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s, Adam step; kernel constants from the {gpu.name} "
            "file (`commscope calibrate --model ... --out gpu.toml` on your GPU measures its own: --gpu gpu.toml)")


def effects_notes(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, arrays: dict[str, np.ndarray], crit: int,
                  efficiency: float) -> list[str]:
    """What the in-training effects and the efficiency did to the critical stage, said where a user sees it."""
    per_mb = float(arrays["fwd"][crit] + arrays["bwd"][crit]) or 1.0
    notes = []
    if gpu.clock_factor != 1.0:
        notes.append(f"in training: compute-bound kernels at the sustained clock ({gpu.sustained_clock_MHz:g} MHz at the "
                     f"power limit against {gpu.kernel_clock_MHz:g} MHz measured): +{arrays['clock'][crit] / per_mb:.1%}")
    else:
        notes.append(f"in training: {gpu.name} states no sustained clock: kernels timed at their calibrated clock "
                     "(`commscope calibrate` on the GPU measures it)")
    if arrays["chunks"][crit] > 0:
        notes.append(f"in training: --tp-comm-overlap cuts the overlapped GEMMs into Transformer Engine's pieces "
                     f"(tp {parallel.tp} for the all-gathers' ring exchange, 4 for the pipelined reduce-scatters): "
                     f"+{arrays['chunks'][crit] / per_mb:.1%}")
    if arrays["gaps"][crit] > 0:
        notes.append(f"in training: the layers' kernels run shorter than an eager framework launches them "
                     f"(~8 us each): the GPU waits {arrays['gaps'][crit] / per_mb:.1%} of its compute on the host")
    if efficiency != 1.0:
        who = f"stack {parallel.stack}" if parallel.stack else "this cluster's fitted compute efficiency"
        notes.append(f"compute at {efficiency:.0%} of the modelled speed ({who}): "
                     f"+{arrays['stack'][crit] / (per_mb - arrays['stack'][crit]):.1%}")
    return notes
