"""Iteration time: compute + TP + PP + DP (+ CP, EP, embedding sync) communication + pipeline bubble.

Two methods:

``seed`` is exactly the seed talk's formulation (DESIGN.md, after Narayanan et al. 2021):

    FLOP_mb = 8 N/(p t) b s      (6 without full recomputation)
    T_comp  = m FLOP_mb / (u F)
    T_tp, T_pp, T_dp = traffic volume of one GPU / C_tp, C_pp, C_dp
    T_pp    = m x 2 b s h B / C_pp
    T_dp    = N/(p t) B_grad 2(d-1)/d / C_dp
    T_bubble = (p-1)(T_comp + T_pp + T_tp)/m
    T_iter  = T_comp + T_tp + T_pp + T_dp + T_bubble

where each C is the effective bandwidth the bandwidth model gives for that axis's message size and group.

``refined`` (the default) times every op of the predicted workload with the bandwidth model (so small
messages pay latency and a group spanning nodes pays the network), times compute per pipeline stage with the
GPU's own compute model (:mod:`commscope.estimate.compute`: every GEMM by the tile/wave model, attention, the
memory-bound kernels at the HBM roofline, recomputation, the optimizer step), and takes the slowest stage as
the critical path of the 1F1B schedule:

    t_mb(s)  = fwd(s) + bwd(s) + [sm(s) + tp_exp(s) + pp_exp(s) + cp_exp(s) + ep(s) + dp_exp(s)] / m

fwd and bwd are the kernels of :mod:`commscope.estimate.compute` with their in-training effects (sustained clock, Transformer
Engine's GEMM pieces, host launch gaps) and, where the job names one, its software stack's efficiency; sm(s) is the
compute lost to the SMs that overlapped collectives take (:mod:`commscope.estimate.compute.effects`): every one of them is in
``compute_breakdown_s`` (``clock_s``, ``overlap_chunks_s``, ``launch_gaps_s``, ``comm_sms_s``, ``stack_s``).
    T_bubble = sum_{s != s*} t_mb(s) / v         s* = the slowest stage, v = virtual pipeline size

The first micro-batch's forward and the last one's backward pass through every stage other than the slowest
(the fill and the drain), each stage in 1/v of its time with interleaving: (p - 1)/v x t_mb for even stages,
less when the other stages are lighter than the slowest (a last stage with the logits, uneven splits).
    tail(s)  = grad reduction exposed + optimizer step + parameter all-gather exposed + embedding sync
               + the last backward's SMs taken by the gradient buckets reduced beside it
    T_iter   = m t_mb(s*) + T_bubble + max_s [tail(s) - s bwd(s) / v]

Stage s finishes its last backward pass s bwd(s)/v before stage 0 does, so its tail hides that much.

Overlap, each the way the frameworks do it, its hidden part reported per axis (``hidden_s``):

- ``tp_comm_overlap`` (Megatron ``--tp-comm-overlap``): TP all-gathers and reduce-scatters run under the
  linear GEMMs of the same pass; only comm beyond that GEMM time is exposed. Without it TP is exposed whole.
- ``overlap_grad_reduce`` (Megatron ``--overlap-grad-reduce``; always for PyTorch DDP and FSDP2): gradient
  buckets reduce one after another on their own stream as the last micro-batch's backward makes them ready
  (bucket i ready when the fraction of backward that produced buckets 0..i is done); what runs past the end
  of that backward is exposed.
- ``overlap_param_gather`` (Megatron ``--overlap-param-gather``): the distributed optimizer's parameter
  all-gathers run bucket by bucket ahead of the next forward; a bucket late for its layers delays it.
- ZeRO-3 and FSDP2 gather parameters (and reduce-scatter gradients) per layer with prefetching: exposed is
  what exceeds the forward (backward) compute.
- CP's ring attention passes K/V under the attention compute; only the excess is exposed.
- ``overlap_p2p_comm`` (Megatron's default ``--overlap-p2p-communication``, interleaved schedule only):
  pipeline sends and receives run under the other model chunks' compute; only what exceeds it is exposed.
  Without interleaving the 1F1B exchanges block and are exposed whole.

Two ways to the refined estimate, equal to 1e-12 (tests/estimate/test_estimate_many.py holds them equal on random jobs):
:func:`estimate_op_by_op` times every op set of the workload on its slowest group and adds it to its stage
(:mod:`commscope.estimate.op_by_op`: the definition, and the path of other frameworks, routed or capacity-limited MoE
and measured bandwidth tables); :func:`estimate` computes a Megatron job with balanced routing in closed form over its
stages (:mod:`commscope.estimate.closed_form`: op counts per stage x op time, as arrays), without the op list, so that
its cost does not grow with the pipeline depth or the layers. :mod:`commscope.estimate.many` runs the same closed
form over many configurations.

This module holds the entry points (:func:`estimate`, :func:`estimate_op_by_op`), the GPU whose compute model times
compute (:func:`compute_gpu`) and the seed method; the :class:`Estimate` both methods return is made in
:mod:`commscope.estimate.terms`, the overlaps' recurrences are in :mod:`commscope.estimate.overlap`. The names those
modules held here before are importable from here still.

``gpu_util`` given explicitly replaces the compute model by FLOP / (u x peak) per stage (Megatron's FLOP
formula, attention and logits included, recomputation added), as does a cluster whose GPU has no preset.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

import numpy as np

from commscope.estimate.bandwidth import AlphaBeta, BandwidthModel
from commscope.estimate.closed_form import MAX_GRAD_BUCKETS, estimate_one
from commscope.estimate.compute.model import stage_compute
from commscope.estimate.op_by_op import _refined, _span_of
from commscope.estimate.stage_structure import _stage_layers
from commscope.estimate.overlap import HIDDEN_MIN_S, OVERLAP_NOTES
from commscope.estimate.terms import Estimate, JobOf, _finish, finish_many
from commscope.units import dtype_bytes
from commscope.pattern.workload.framework import grad_dtype

if TYPE_CHECKING:  # api and gpus import this module
    from commscope.api import Prediction
    from commscope.estimate.gpus import GpuSpec
    from commscope.spec.cluster import ClusterSpec

__all__ = ["HIDDEN_MIN_S", "MAX_GRAD_BUCKETS", "METHODS", "OVERLAP_NOTES", "Estimate", "JobOf", "Method", "compute_gpu",
           "estimate", "estimate_one", "estimate_op_by_op", "finish_many"]

Method = Literal["refined", "seed"]
METHODS = ("refined", "seed")


def estimate(prediction: Prediction, *, method: Method = "refined", gpu_util: float | None = None,
             bandwidth: BandwidthModel | None = None, gpu: str | os.PathLike[str] | GpuSpec | None = None) -> Estimate:
    """Estimate the iteration time of a :class:`~commscope.api.Prediction`.

    ``gpu_util`` replaces the compute model by FLOP / (u x peak); ``gpu`` (a :class:`~commscope.estimate.gpus.GpuSpec`,
    a preset name or a file) replaces the GPU matched from the cluster; ``bandwidth`` (a measured table) replaces the
    cluster's alpha-beta model.

    The refined estimate of a Megatron job with balanced routing on the cluster's alpha-beta model is computed in
    closed form over the pipeline stages (:func:`estimate_one`), without the op list: its cost
    does not grow with the pipeline depth or the layers. It equals :func:`estimate_op_by_op`, which times every op
    set of the workload and answers every other job.
    """
    return _estimate(prediction, method, gpu_util, bandwidth, gpu, closed_form=True)


def estimate_op_by_op(prediction: Prediction, *, method: Method = "refined", gpu_util: float | None = None,
                      bandwidth: BandwidthModel | None = None,
                      gpu: str | os.PathLike[str] | GpuSpec | None = None) -> Estimate:
    """:func:`estimate` from the prediction's op list: every op set of the workload timed on its slowest group and
    added to its stage (the definition the closed form is tested against; the path of other frameworks, routed or
    capacity-limited MoE and measured bandwidth tables)."""
    return _estimate(prediction, method, gpu_util, bandwidth, gpu, closed_form=False)


def _estimate(prediction: Prediction, method: str, gpu_util: float | None, bandwidth: BandwidthModel | None,
              gpu: str | os.PathLike[str] | GpuSpec | None, *, closed_form: bool) -> Estimate:
    from commscope.errors import ConfigError

    if method not in METHODS:
        raise ConfigError("method", method, f"valid: {', '.join(METHODS)}")
    cluster = prediction.cluster
    u = cluster.gpu_util if gpu_util is None else gpu_util
    if not 0 < u <= 1:
        raise ConfigError("gpu_util", u, "must be in (0, 1]")
    bw = bandwidth if bandwidth is not None else AlphaBeta(cluster)
    peak = cluster.peak_flops_for(prediction.model.dtype)
    if method == "seed":
        return _seed(prediction, u, peak, bw)
    spec, notes = compute_gpu(cluster, gpu_util, gpu)
    # each stage's layers and parameters, counted once for the compute model and the closed form
    layers = _stage_layers(prediction.model, prediction.parallel) if spec is not None else None
    compute = (stage_compute(prediction.model, prediction.parallel, spec, efficiency=cluster.compute_efficiency,
                             layers=layers) if spec is not None else None)
    if closed_form and bandwidth is None and prediction.balanced_megatron:
        est = estimate_one(prediction.model, cluster, prediction.parallel, compute, u, notes, spec, layers=layers)
        if est is not None:
            return est
    return _refined(prediction, u, peak, bw, compute, notes, spec)


def compute_gpu(cluster: ClusterSpec, gpu_util: float | None,
                gpu: str | os.PathLike[str] | GpuSpec | None = None) -> tuple[GpuSpec | None, list[str]]:
    """The GPU whose compute model times compute (None: FLOP / (u x peak)), and the note saying why not."""
    if gpu_util is not None:
        return None, [f"compute: FLOP / (u x peak) with u = {gpu_util:.2f} (--gpu-util)"]
    from commscope.errors import ConfigError
    from commscope.estimate.gpus import gpu_for_cluster

    try:
        return gpu_for_cluster(cluster, gpu), []
    except ConfigError as exc:
        if gpu is not None:
            raise
        return None, [f"compute: FLOP / (u x peak) with the cluster's u = {cluster.gpu_util:.2f} ({exc.expected})"]


def _seed(prediction: Prediction, u: float, peak: float, bw: BandwidthModel) -> Estimate:
    """The seed talk's formulation (the first method of the module docstring): each axis's traffic volume of one GPU
    over the effective bandwidth of its message size and group."""
    model, par, tm = prediction.model, prediction.parallel, prediction.traffic
    gpn = prediction.cluster.gpus_per_node
    p, t, d, m = par.pp, par.tp, par.dp * par.cp, par.num_micro_batches
    b, s, h, B = par.micro_batch_size, model.seq_len, model.hidden_size, model.dtype_bytes
    N = model.num_parameters(padded_vocab=True)
    flop_mb = (8 if par.recompute == "full" else 6) * N / (p * t) * b * s
    comp = m * flop_mb / (u * peak)
    layout = prediction.workload.layout
    eff: dict[str, float] = {}

    def c_of(op: str, size: float, groups: np.ndarray, n_for_factor: int) -> float:
        span = _span_of(groups, gpn)
        time = bw.op_time_s(op, size, span)
        from commscope.estimate.bandwidth import busbw_factor

        return size * busbw_factor(op, n_for_factor) / time if time else float("inf")

    act = b * (s // par.cp) * h * B
    tp_time = pp_time = dp_time = 0.0
    if t > 1:
        src, _, nbytes = tm.pairs("tp")
        rank0 = int(layout.groups("tp")[0][0])
        volume = float(nbytes[src == rank0].sum())
        op = "reduce_scatter" if par.sequence_parallel else "all_reduce"
        eff["tp"] = c_of(op, act, layout.groups("tp"), t)
        tp_time = volume / eff["tp"]
    if p > 1:
        msg = act // t if (par.sequence_parallel and t > 1) else act
        eff["pp"] = c_of("send", msg, np.array([[0, layout.groups("pp")[0][1]]]), 2)
        pp_time = m * 2 * msg / eff["pp"]
    if d > 1:
        G = dtype_bytes(grad_dtype(model, par))
        size = N / (p * t) * G
        eff["dp"] = c_of("all_reduce", size, layout.groups("dp-cp"), d)
        dp_time = size * 2 * (d - 1) / d / eff["dp"]
    bubble = (p - 1) * (comp + pp_time + tp_time) / m
    notes = ["seed method: the talk's formulation; CP, EP and the embedding sync are outside it (0 s)"]
    return _finish(prediction, "seed", u, peak, comp=comp, tp=tp_time, pp=pp_time, dp=dp_time, ep=0.0, cp=0.0,
                   emb=0.0, bubble=bubble, stage=0, eff=eff, notes=notes + list(bw.notes))
