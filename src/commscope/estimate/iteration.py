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
:func:`estimate_op_by_op` times every op set of the workload on its slowest group and adds it to its stage (the
definition, and the path of other frameworks, routed or capacity-limited MoE and measured bandwidth tables);
:func:`estimate` computes a Megatron job with balanced routing in closed form over its stages (the last section of
this module: op counts per stage x op time, as arrays), without the op list, so that its cost does not grow with the
pipeline depth or the layers. :mod:`commscope.estimate.many` runs the same closed form over many configurations.

``gpu_util`` given explicitly replaces the compute model by FLOP / (u x peak) per stage (Megatron's FLOP
formula, attention and logits included, recomputation added), as does a cluster whose GPU has no preset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
import os
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from commscope.estimate.bandwidth import AlphaBeta, BandwidthModel, GroupSpan, _alpha_beta_terms
from commscope.estimate.compute.effects import comm_sm_time_s
from commscope.estimate.compute.model import StageCompute, first_max, stage_compute
from commscope.estimate.flops import iteration_flops, token_flops
from commscope.pattern.layout import Layout
from commscope.spec.params import layer_params, stage_params
from commscope.units import dtype_bytes
from commscope.pattern.workload.framework import grad_dtype
from commscope.pattern.workload.stages import pipeline_split, pipeline_split_note, stage_layers

if TYPE_CHECKING:  # api and gpus import this module
    from commscope.api import Prediction
    from commscope.estimate.gpus import GpuSpec
    from commscope.spec.cluster import ClusterSpec
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec


class JobOf(Protocol):
    """What :func:`_finish` reads of a job: a :class:`~commscope.api.Prediction`, or the lighter record
    :mod:`commscope.estimate.many` builds per configuration."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def parallel(self) -> ParallelSpec: ...

Method = Literal["refined", "seed"]
METHODS = ("refined", "seed")
#: Notes of the overlaps a job turned on, in the order they are reported: ``tp_comm_overlap``, ``overlap_p2p_comm``
#: (interleaved schedule only), ``overlap_grad_reduce``, ``overlap_param_gather``.
OVERLAP_NOTES = (
    "TP communication overlapped with the linear GEMMs of the same pass (--tp-comm-overlap)",
    ("pipeline sends/receives overlapped with the other model chunks' compute (interleaved schedule, "
     "--overlap-p2p-communication)"),
    "DP gradient buckets reduced during the last backward pass as they fill (--overlap-grad-reduce)",
    "parameter all-gathers overlapped with the next forward pass, bucket by bucket (--overlap-param-gather)",
)
#: Hidden time below a nanosecond is not reported: where nothing was hidden, what is left of the difference of
#: sums of op times (all - exposed) is ~1e-19 s of rounding, and estimate_many sums in another order.
HIDDEN_MIN_S = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Predicted time of one iteration, term by term (seconds)."""

    method: str
    iteration_time_s: float
    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    ep_s: float
    cp_s: float
    emb_s: float
    bubble_s: float
    comm_ratio: float
    bubble_ratio: float
    tokens_per_s: float
    tflops_per_gpu: float
    """Hardware TFLOP/s per GPU (recomputation included), as Megatron-LM reports it."""
    mfu: float
    """Model FLOPs (3 x forward, no recomputation) per second over peak FLOP/s."""
    gpu_util: float
    peak_flops: float
    world_size: int
    critical_stage: int
    effective_bandwidth_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """The C of each axis (seed method) or the mean busbw of its ops (refined)."""
    optimizer_s: float = 0.0
    """Optimizer step on the stage whose end of iteration is last (compute model only)."""
    hidden_s: dict[str, float] = field(default_factory=dict)
    """Communication per axis that overlaps compute and so costs no time (the ``*_s`` terms are exposed time)."""
    compute_breakdown_s: dict[str, float] = field(default_factory=dict)
    """The critical stage's compute per iteration by kind: gemm, attention, memory_bound, recompute, optimizer."""
    compute_model: str = "flops"
    """``gpu`` (per-kernel compute model of :mod:`commscope.estimate.compute`) or ``flops`` (FLOP / (u x peak))."""
    micro_batch_s: float = 0.0
    """Time of one micro-batch on the critical stage, exposed pipeline communication included: the unit of the
    pipeline's steady state (the bubble is the fill and drain through the other stages, at most (p - 1) / v of it)."""
    stage_micro_batch_s: tuple[float, ...] = ()
    """``micro_batch_s`` of every pipeline stage (the critical one is the largest): what the fill and the drain
    pass through, and what :func:`commscope.estimate.schedule.schedule_for` times each stage of the timeline with."""
    tail_s: float = 0.0
    """What runs after the pipeline drains on the stage that ends last: exposed gradient reduction, embedding sync,
    optimizer step, exposed parameter all-gather. The iteration is m micro_batch_s + bubble_s + tail_s."""
    notes: tuple[str, ...] = ()

    @property
    def comm_s(self) -> float:
        """Exposed communication."""
        return self.tp_s + self.pp_s + self.dp_s + self.ep_s + self.cp_s + self.emb_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["comm_s"] = self.comm_s
        return d


def _span_of(groups: np.ndarray, gpus_per_node: int) -> GroupSpan:
    """Where the slowest group of an op set sits (its groups run at once: the op set takes the slowest's time)."""
    return GroupSpan.slowest(groups, gpus_per_node)


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
    compute = (stage_compute(prediction.model, prediction.parallel, spec, efficiency=cluster.compute_efficiency)
               if spec is not None else None)
    if closed_form and bandwidth is None and prediction.balanced_megatron:
        est = estimate_one(prediction.model, cluster, prediction.parallel, compute, u, notes, spec)
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


def _finish(prediction: JobOf, method: str, u: float, peak: float, *, comp: float, tp: float, pp: float, dp: float,
            ep: float, cp: float, emb: float, bubble: float, stage: int, eff: dict[str, float], notes: list[str],
            optimizer: float = 0.0, hidden: dict[str, float] | None = None, breakdown: dict[str, float] | None = None,
            compute_model: str = "flops", micro_batch: float | None = None, tail: float | None = None,
            stage_micro_batch: Sequence[float] = ()) -> Estimate:
    par = prediction.parallel
    if micro_batch is None:
        micro_batch = (comp + tp + pp + cp + ep) / par.num_micro_batches
    if tail is None:
        tail = dp + emb + optimizer
    return finish_many(prediction.model, method, u, peak, global_batch_size=np.array([par.global_batch_size]),
                       world_size=np.array([par.world_size]), recompute=[par.recompute], comp=np.array([comp]),
                       tp=np.array([tp]), pp=np.array([pp]), dp=np.array([dp]), ep=np.array([ep]), cp=np.array([cp]),
                       emb=np.array([emb]), bubble=np.array([bubble]), optimizer=np.array([optimizer]),
                       micro_batch=np.array([micro_batch]), tail=np.array([tail]), stage=np.array([stage]), eff=[eff],
                       notes=[tuple(notes)], hidden=[dict(hidden or {})], breakdown=[dict(breakdown or {})],
                       compute_model=compute_model, stage_micro_batch=[tuple(float(x) for x in stage_micro_batch)])[0]


def finish_many(model: ModelSpec, method: str, u: Any, peak: float, *, global_batch_size: np.ndarray,
                world_size: np.ndarray, recompute: Sequence[str], comp: np.ndarray, tp: np.ndarray, pp: np.ndarray,
                dp: np.ndarray, ep: np.ndarray, cp: np.ndarray, emb: np.ndarray, bubble: np.ndarray,
                optimizer: np.ndarray, micro_batch: np.ndarray, tail: np.ndarray, stage: np.ndarray,
                eff: Sequence[dict[str, float]], notes: Sequence[tuple[str, ...]], hidden: Sequence[dict[str, float]],
                breakdown: Sequence[dict[str, float]], compute_model: str,
                stage_micro_batch: np.ndarray | Sequence[Sequence[float]]) -> list[Estimate]:
    """The Estimates of configurations from their exposed terms (arrays, one entry per configuration; ``u`` one or
    one each): the total and what follows from it (ratios, throughput, FLOP rates)."""
    total = comp + tp + pp + dp + ep + cp + emb + bubble + optimizer
    tokens = np.asarray(global_batch_size, dtype=np.int64) * model.seq_len
    world = np.asarray(world_size, dtype=np.int64)
    model_flops, hardware = np.zeros(len(total)), np.zeros(len(total))
    rc = np.array(recompute)
    for kind in set(recompute):
        sel = rc == kind
        fl = iteration_flops(model, tokens[sel], recompute=kind)
        model_flops[sel], hardware[sel] = fl["model"], fl["hardware"]
    nonzero = total != 0
    safe = np.where(nonzero, total, 1.0)

    def share(x: np.ndarray) -> list[float]:
        return np.where(nonzero, x, 0.0).tolist()  # type: ignore[no-any-return]

    per_mb = stage_micro_batch.tolist() if isinstance(stage_micro_batch, np.ndarray) else stage_micro_batch
    return [Estimate(method=method, iteration_time_s=a_total, compute_s=a_comp, tp_s=a_tp, pp_s=a_pp, dp_s=a_dp,
                     ep_s=a_ep, cp_s=a_cp, emb_s=a_emb, bubble_s=a_bubble, comm_ratio=a_comm, bubble_ratio=a_bratio,
                     tokens_per_s=a_tokens, tflops_per_gpu=a_tflops, mfu=a_mfu, gpu_util=a_u, peak_flops=peak,
                     world_size=a_world, critical_stage=a_stage, effective_bandwidth_bytes_per_s=a_eff,
                     optimizer_s=a_opt, hidden_s=a_hidden, compute_breakdown_s=a_breakdown, compute_model=compute_model,
                     micro_batch_s=a_mb, stage_micro_batch_s=tuple(a_stages), tail_s=a_tail, notes=a_notes)
            for (a_total, a_comp, a_tp, a_pp, a_dp, a_ep, a_cp, a_emb, a_bubble, a_comm, a_bratio, a_tokens, a_tflops,
                 a_mfu, a_u, a_world, a_stage, a_eff, a_opt, a_hidden, a_breakdown, a_mb, a_stages, a_tail, a_notes)
            in zip(total.tolist(), comp.tolist(), tp.tolist(), pp.tolist(), dp.tolist(), ep.tolist(), cp.tolist(),
                   emb.tolist(), bubble.tolist(), share((tp + pp + dp + ep + cp + emb) / safe), share(bubble / safe),
                   share(tokens / safe), share(hardware / safe / world / 1e12),
                   share(model_flops / safe / world / peak),
                   np.broadcast_to(np.asarray(u, dtype=np.float64), total.shape).tolist(), world.tolist(),
                   np.asarray(stage).tolist(), eff, optimizer.tolist(), hidden, breakdown, micro_batch.tolist(), per_mb,
                   tail.tolist(), notes)]


def _seed(prediction: Prediction, u: float, peak: float, bw: BandwidthModel) -> Estimate:
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


def _flop_compute(prediction: Prediction, u: float, peak: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, attention) seconds per micro-batch per stage from FLOP / (u x peak): Megatron's FLOP
    count per stage (attention and logits included), backward twice the forward, recomputation added to it."""
    model, par = prediction.model, prediction.parallel
    p = par.pp
    tf = token_flops(model)
    tokens_mb = par.micro_batch_size * model.seq_len / par.cp  # tokens per rank per micro-batch
    rate = par.tp * u * peak
    fwd, bwd, attn = np.zeros(p), np.zeros(p), np.zeros(p)
    for stage in range(p):
        layers = [layer for chunk in stage_layers(model, par, stage) for layer in chunk]
        body = sum(tf.layers[i] for i in layers)
        f = body + (tf.logits if stage == p - 1 else 0.0)
        # recomputation replays the layers (full) or their attention core (selective), never the logits
        extra = {"none": 0.0, "selective": sum(tf.attention_core[i] for i in layers), "full": body}[par.recompute]
        fwd[stage] = tokens_mb * f / rate
        bwd[stage] = tokens_mb * (2 * f + extra) / rate
        attn[stage] = tokens_mb * sum(3 * tf.attention_core[i] for i in layers) / rate
    return fwd, bwd, attn


def _overlapped_buckets(times: Sequence[Any], window: Any) -> Any:
    """Time past the end of a backward pass of ``window`` seconds until gradient buckets ``times`` are reduced.

    Buckets are ready in order, bucket i when the share of backward that produced buckets 0..i has run
    (buckets hold equal parameters per second of backward); reductions run one at a time on their own stream.
    Elementwise on arrays (:mod:`commscope.estimate.many` passes one entry per configuration and stage; a bucket
    of 0 s changes nothing).
    """
    total = sum(times)
    done = ready_share = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in times:
            ready_share = ready_share + t / total
            done = np.maximum(done, window * ready_share) + t
        return np.where(total > 0, np.maximum(0.0, done - window), 0.0)


def _late_gathers(times: Sequence[Any], window: Any) -> Any:
    """Delay of a forward pass of ``window`` seconds whose parameter buckets (all-gathered one at a time from its
    start, in layer order) must each arrive before the forward reaches their layers (elementwise on arrays)."""
    total = sum(times)
    done = needed_share = late = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in times:
            done = done + t
            late = np.maximum(late, done - window * needed_share)
            needed_share = needed_share + t / total
        return np.where(total > 0, np.maximum(0.0, late), 0.0)


def _refined(prediction: Prediction, u: float, peak: float, bw: BandwidthModel, compute: StageCompute | None,
             notes: list[str], gpu: GpuSpec | None = None) -> Estimate:
    model, par, wl = prediction.model, prediction.parallel, prediction.workload
    gpn = prediction.cluster.gpus_per_node
    p, m, v = par.pp, par.num_micro_batches, par.virtual_pipeline_size
    stage_of = wl.layout.stage_of()
    if compute is not None:
        fwd, bwd, attn = compute.forward_s, compute.backward_s, compute.attention_s
        lin_f, lin_b, opt = compute.linear_forward_s, compute.linear_backward_s, compute.optimizer_s
        notes = notes + list(compute.notes)
    else:
        fwd, bwd, attn = _flop_compute(prediction, u, peak)
        lin_f, lin_b, opt = fwd, bwd, np.zeros(p)

    axes = ("tp", "pp", "dp", "ep", "cp", "emb")
    comm = {a: {c: np.zeros(p) for c in ("fwd", "bwd", "iter")} for a in axes}
    grad_buckets: list[list[float]] = [[] for _ in range(p)]
    param_buckets: list[list[float]] = [[] for _ in range(p)]
    busbw_sum: dict[str, list[float]] = {}
    spans: dict[int, GroupSpan] = {}  # op sets of a stage share their group array: one span each
    times: dict[tuple[str, int, GroupSpan], tuple[float, float]] = {}  # (op, size, span) -> (time, busbw)
    for s in wl.opsets:
        if s.group_size < 2 or s.op == "recv":
            continue
        span = spans.get(id(s.groups))
        if span is None:
            span = spans[id(s.groups)] = _span_of(s.groups, gpn)
        key = (s.op, s.size_bytes, span)
        if key not in times:
            times[key] = (bw.op_time_s(s.op, s.size_bytes, span), bw.busbw_bytes_per_s(s.op, s.size_bytes, span))
        t_op, busbw = times[key]
        busbw_sum.setdefault(s.axis, []).append(busbw)
        total = t_op * s.count
        stage = int(stage_of[s.groups[0, 0]])
        once = s.micro_batches is None
        kind = "fwd" if s.phase == "fwd" else ("iter" if s.phase == "optim" and once else "bwd")
        if s.op == "send":
            # a p2p transfer occupies its sender and its receiver; per GPU, sends and receives of the
            # steady state overlap pairwise (send_forward_recv_backward), hence the halves
            comm[s.axis][kind][stage] += total / 2
            comm[s.axis][kind][int(stage_of[s.groups[0, 1]])] += total / 2
        elif s.axis == "emb":
            comm["emb"]["iter"][0] += total
            comm["emb"]["iter"][p - 1] += total
        elif s.axis == "dp" and once and s.phase in ("optim", "bwd") and s.op in ("reduce_scatter", "all_reduce"):
            grad_buckets[stage] += [t_op] * s.count
        elif s.axis == "dp" and once and s.phase == "optim" and s.op == "all_gather":
            param_buckets[stage] += [t_op] * s.count
        else:
            comm[s.axis][kind][stage] += total

    # --- exposed communication inside the pipeline (per stage, whole iteration) ---
    tp_all = comm["tp"]["fwd"] + comm["tp"]["bwd"]
    if par.tp_comm_overlap:
        tp_exp = np.maximum(0.0, comm["tp"]["fwd"] - m * lin_f) + np.maximum(0.0, comm["tp"]["bwd"] - m * lin_b)
        notes.append(OVERLAP_NOTES[0])
    else:
        tp_exp = tp_all
    cp_all = comm["cp"]["fwd"] + comm["cp"]["bwd"]
    cp_exp = np.maximum(0.0, cp_all - m * attn)
    pp_all = comm["pp"]["fwd"] + comm["pp"]["bwd"]
    pp_exp = pp_all
    if v > 1 and par.overlap_p2p_comm:
        pp_exp = np.maximum(0.0, pp_all - m * (fwd + bwd))
        notes.append(OVERLAP_NOTES[1])
    ep_all = comm["ep"]["fwd"] + comm["ep"]["bwd"]
    # ZeRO-3 / FSDP2 gathers and reduce-scatters per layer, prefetched under the compute of their pass
    dp_layer = comm["dp"]["fwd"] + comm["dp"]["bwd"]
    dp_layer_exp = np.maximum(0.0, comm["dp"]["fwd"] - m * fwd) + np.maximum(0.0, comm["dp"]["bwd"] - m * bwd)
    # compute slowed by the SMs that overlapped collectives take (compute.effects, point 2)
    sm = np.asarray(comm_sm_time_s(gpu if compute is not None else None, tp=tp_all - tp_exp, cp=cp_all - cp_exp,
                                   pp=pp_all - pp_exp, dp=dp_layer - dp_layer_exp)) * np.ones(p)
    per_mb = fwd + bwd + (sm + tp_exp + pp_exp + cp_exp + ep_all + dp_layer_exp) / m
    crit = int(first_max(per_mb))
    # fill and drain: the first micro-batch's forward and the last one's backward pass through every other stage
    bubble = (float(per_mb.sum()) - per_mb[crit]) / v

    # --- the end of the iteration: gradient reduction, optimizer step, parameter all-gather ---
    overlap_grads = par.overlap_grad_reduce or par.framework in ("torch-ddp", "torch-fsdp2")
    if par.overlap_grad_reduce:
        notes.append(OVERLAP_NOTES[2])
    if par.overlap_param_gather:
        notes.append(OVERLAP_NOTES[3])
    grad_exp = np.array([float(_overlapped_buckets(b, bwd[s])) if overlap_grads else sum(b)
                         for s, b in enumerate(grad_buckets)])
    param_exp = np.array([float(_late_gathers(b, fwd[s])) if par.overlap_param_gather else sum(b)
                          for s, b in enumerate(param_buckets)])
    grad_all = np.array([sum(b) for b in grad_buckets])
    param_all = np.array([sum(b) for b in param_buckets])
    dp_tail = grad_exp + param_exp + comm["dp"]["iter"]
    # the last backward (and the next forward) slowed by the buckets reduced (gathered) beside them
    sm_tail = np.asarray(comm_sm_time_s(gpu if compute is not None else None,
                                        dp=grad_all - grad_exp + param_all - param_exp)) * np.ones(p)
    tail = dp_tail + comm["emb"]["iter"] + comm["tp"]["iter"] + comm["cp"]["iter"] + comm["ep"]["iter"] + sm_tail + opt
    lead = np.arange(p) * bwd / v  # stage s ends its last backward this much before stage 0
    end = int(first_max(tail - lead))
    # what the lead hides comes off the tail's terms in the order they run: DP, embedding sync, the rest, optimizer
    hide = min(float(lead[end]), float(tail[end]))
    terms = {"dp": float(dp_tail[end]), "emb": float(comm["emb"]["iter"][end]),
             "tp": float(comm["tp"]["iter"][end] + comm["cp"]["iter"][end] + comm["ep"]["iter"][end]),
             "sm": float(sm_tail[end]), "opt": float(opt[end])}
    for term, value in terms.items():
        cut = min(hide, value)
        terms[term] = value - cut
        hide -= cut

    hidden = {"tp": float(tp_all[crit] - tp_exp[crit]), "cp": float(cp_all[crit] - cp_exp[crit]),
              "pp": float(pp_all[crit] - pp_exp[crit]),
              "dp": float(dp_layer[crit] - dp_layer_exp[crit] + grad_all[end] + param_all[end] + comm["dp"]["iter"][end]
                          - terms["dp"])}
    hidden = {k: val for k, val in hidden.items() if val > HIDDEN_MIN_S}
    split_note = pipeline_split_note(model, par)
    if split_note:
        notes.append(split_note)
    eff = {a: float(np.mean(v_)) for a, v_ in busbw_sum.items()}
    breakdown = compute.breakdown(crit, m) if compute is not None else {}
    if compute is not None:
        breakdown["comm_sms_s"] = float(sm[crit]) + terms["sm"]
    if compute is not None and fwd[crit] + bwd[crit] > 0:
        # the compute model's own utilisation: FLOP its kernels execute over their time at the dtype's peak
        u = float(compute.flop[crit] / ((fwd[crit] + bwd[crit]) * peak))
    return _finish(prediction, "refined", u, peak, comp=float(m * (fwd[crit] + bwd[crit]) + sm[crit]) + terms["sm"],
                   tp=float(tp_exp[crit]) + terms["tp"],
                   pp=float(pp_exp[crit]), dp=float(dp_layer_exp[crit]) + terms["dp"], ep=float(ep_all[crit]),
                   cp=float(cp_exp[crit]), emb=terms["emb"], bubble=float(bubble), stage=crit, eff=eff,
                   notes=notes + list(bw.notes), optimizer=terms["opt"], hidden=hidden, breakdown=breakdown,
                   compute_model="gpu" if compute is not None else "flops", micro_batch=float(per_mb[crit]),
                   tail=sum(terms.values()), stage_micro_batch=per_mb)


# ------------------------------------------------------------------------------------------------------------------
# The closed form: the refined estimate of Megatron jobs with balanced routing, on (configurations, stages) arrays
# (estimate() for one configuration, commscope.estimate.many for many). What depends on the layout alone (the span over
# nodes of the slowest group of every axis on every stage, the pipeline boundaries that cross nodes) is computed once
# per (tp, pp, dp, cp, ep, rank order) from the real Layout, in one vectorised pass per axis (_Spans); what depends on
# the layer split alone (layers, parameters, FLOP and ZeRO-3 gathers per stage) once per (tp, ep, pp, v, split), in
# closed form over the stages (_Stages). The op sets of commscope.pattern.workload.dense then reduce to counts per stage x op
# time, and the pipeline schedule of _refined runs on those arrays (_evaluate). No Python loop runs per stage or layer.
# ------------------------------------------------------------------------------------------------------------------

#: More gradient buckets than this on one stage (a tiny ``grad_bucket_size`` on a large model) go op by op: the
#: bucket overlap is a recurrence over buckets, and the arrays hold one entry per bucket.
MAX_GRAD_BUCKETS = 256

#: The axes of the reported mean bus bandwidth, in the order the op-by-op path meets their op sets (layers: TP, CP,
#: EP; stages: PP; step: DP, embedding sync), so that both print them alike.
_EFF_AXES = ("tp", "cp", "ep", "pp", "dp", "emb")


# ------------------------------------------------------------------------------------------------- structure


@dataclass(frozen=True, slots=True)
class _Spans:
    """Where the groups of one layout sit: for every axis, (n, num_nodes, per_node) of the slowest group on each
    stage (what the op-by-op path times each op set by), shape (3, pp); and which pipeline boundaries cross nodes."""

    tp: np.ndarray
    cp: np.ndarray
    """Of the context-parallel ring's (src, dst) pairs (its sends)."""
    dp: np.ndarray
    """Of the dp x cp groups (dense gradients)."""
    edp: np.ndarray
    """Of the expert-data-parallel groups (expert gradients)."""
    ep: np.ndarray
    pp_across: np.ndarray
    """(pp,) bool: some pipeline's boundary from stage s to stage (s + 1) mod pp crosses nodes."""
    emb: np.ndarray
    """(3,) the slowest (first stage, last stage) pair of the tied-embedding sync."""


_NO_ROW = np.iinfo(np.int64).max


def _stage_spans(rows: np.ndarray, stage_of_row: np.ndarray, p: int, gpn: int) -> np.ndarray:
    """(3, p): the span of the slowest of ``rows`` (a (G, n) array of groups) on each stage, by
    :meth:`GroupSpan.slowest`'s order (crossing nodes first, then the fewest members on a node, then the most nodes),
    in one pass: each row's span is ranked by one integer and the smallest per stage kept. A stage without groups
    (or groups of one rank) gets n = 1, which times to 0 s."""
    out = np.ones((3, p), dtype=np.int64)
    n = rows.shape[1]
    if rows.shape[0] == 0 or n < 2:
        return out
    if n == 2:  # pairs (sends, the embedding sync): apart or on one node
        apart = rows[:, 0] // gpn != rows[:, 1] // gpn
        num_nodes, per_node = 1 + apart, 2 - apart
    else:
        num_nodes, per_node = GroupSpan.row_spans(rows, gpn)
    present = np.bincount(stage_of_row, minlength=p) > 0
    if num_nodes.max() == 1:  # every group inside a node (the common case)
        out[0], out[2] = np.where(present, n, 1), np.where(present, n, 1)
        return out
    # rank (num_nodes == 1, per_node, -num_nodes) ascending as one integer: n + 1 > per_node and num_nodes <= n
    rank = ((num_nodes == 1) * (n + 1) + per_node) * (n + 1) + (n - num_nodes)
    best = np.full(p, _NO_ROW)
    np.minimum.at(best, stage_of_row, rank)
    best = np.where(present, best, 0)
    out[0] = np.where(present, n, 1)
    out[1] = np.where(present, n - best % (n + 1), 1)
    out[2] = np.where(present, best // (n + 1) % (n + 1), 1)
    return out


_ONE = np.ones((3, 1), dtype=np.int64)


def _spans(par: ParallelSpec, gpn: int, moe: bool, cache: dict[tuple[Any, ...], tuple[np.ndarray, ...]] | None = None) -> _Spans:
    """:class:`_Spans` of ``par``'s layout (the expert groups only for an MoE model: a dense one has none to time).

    Where pp is the outermost axis of the rank order and a stage spans whole nodes (stage_stride a multiple of the
    GPUs per node), every stage's groups are stage 0's moved by whole nodes, so they sit alike: the axes' spans are
    those of stage 0 on every stage, which do not depend on pp (``cache``, keyed without it, holds them across
    layouts)."""
    layout = Layout(par)
    p = par.pp
    stride = layout.stage_stride
    sizes = {"tp": par.tp, "cp": par.cp, "dp-cp": par.dp * par.cp, "expert-dp": par.expert_dp if moe else 1,
             "ep": par.ep if moe else 1}
    alike = par.order.endswith("-pp") and stride % gpn == 0

    def of(kind: str, pairs: bool = False) -> np.ndarray:
        if sizes[kind] < 2:
            return np.broadcast_to(_ONE, (3, p))
        groups = layout.first_stage_groups(kind) if alike else layout.groups(kind)
        stages = np.zeros(len(groups), dtype=np.int64) if alike else groups[:, 0] // stride % p
        if pairs:  # the ring's (src, dst) sends, as the workload's context-parallel op sets
            stages = np.repeat(stages, groups.shape[1])
            groups = np.stack([groups.reshape(-1), np.roll(groups, -1, axis=1).reshape(-1)], axis=1)
        if alike:
            return np.broadcast_to(_stage_spans(groups, stages, 1, gpn), (3, p))
        return _stage_spans(groups, stages, p, gpn)

    key = (par.tp, par.dp, par.cp, par.ep, par.order, gpn, moe)
    axes = cache.get(key) if alike and cache is not None else None
    if axes is None:
        axes = (of("tp"), of("cp", pairs=True), of("dp-cp"), of("expert-dp"), of("ep"))
        if alike and cache is not None:
            cache[key] = tuple(x[:, :1] for x in axes)
    axes = tuple(np.broadcast_to(x[:, :1], (3, p)) if alike else x for x in axes)
    if p > 1:
        pp_nodes = layout.groups("pp") // gpn
        across = (pp_nodes != np.roll(pp_nodes, -1, axis=1)).any(axis=0)
        emb = layout.groups("emb")
        emb_span = _stage_spans(emb, np.zeros(len(emb), dtype=np.int64), 1, gpn)[:, 0]
    else:
        across, emb_span = np.zeros(1, dtype=bool), _ONE[:, 0]
    return _Spans(tp=axes[0], cp=axes[1], dp=axes[2], edp=axes[3], ep=axes[4], pp_across=across, emb=emb_span)


@dataclass(frozen=True, slots=True)
class _Stages:
    """What each pipeline stage holds under one layer split (arrays of length pp)."""

    layers: np.ndarray
    moe_layers: np.ndarray
    dense_params: np.ndarray
    """Parameters of one rank whose gradients the dp x cp group reduces."""
    expert_params: np.ndarray
    replicated: np.ndarray
    """Of those, copied on every TP rank (sequence parallelism all-reduces their gradients over TP)."""
    body_flop: np.ndarray
    """Forward FLOP per token of the stage's layers (:func:`commscope.estimate.flops.token_flops`)."""
    core_flop: np.ndarray
    """Of those, the attention core's."""
    zero3: np.ndarray
    """(3, pp, 3): per ZeRO-3 gather size of the dense parameters (a dense layer's, an MoE layer's when it differs,
    the embedding-side modules'): elements, gathers per micro-batch, op sets."""
    zero3_expert: np.ndarray
    """(3, pp, 1): the same for the expert parameters of the MoE layers."""
    split_note: str | None

    def num_buckets(self, bucket_elements: int | None) -> int:
        """Gradient buckets of the stage with the most (dense or expert parameters) at ``bucket_elements`` each."""
        most = max(int(self.dense_params.max(initial=0)), int(self.expert_params.max(initial=0)))
        return 1 if not bucket_elements or not most else -(-most // bucket_elements)


def _moe_before(model: ModelSpec, x: np.ndarray) -> np.ndarray:
    """Layers with routed experts among layers 0..x-1 (:meth:`ModelSpec.is_moe_layer`, counted in closed form)."""
    if not model.is_moe:
        return np.zeros_like(x)
    k, f = model.first_k_dense_layers, model.moe_layer_freq
    return np.where(x > k, -(-(x - k) // f), 0)


def _stages(model: ModelSpec, par: ParallelSpec) -> _Stages:
    """:class:`_Stages` of ``par``'s split, without a loop over stages or layers: every layer of one kind (dense,
    MoE) has the same parameters and FLOP, so a stage is its count of each kind plus the first and last stage's
    embedding-side modules."""
    p, v, tp, ep = par.pp, par.virtual_pipeline_size, par.tp, par.ep
    sizes = np.array(pipeline_split(model, par), dtype=np.int64)  # virtual stage k = chunk x pp + stage
    starts = np.cumsum(sizes) - sizes
    moe = (_moe_before(model, starts + sizes) - _moe_before(model, starts)).reshape(v, p).sum(axis=0)
    layers = sizes.reshape(v, p).sum(axis=0)
    dense = layers - moe
    tf = token_flops(model)
    zero = {"dense": 0, "moe": 0}
    shard, repl, expert, flop, core = dict(zero), dict(zero), dict(zero), {"dense": 0.0, "moe": 0.0}, {"dense": 0.0, "moe": 0.0}
    moe_index = model.first_k_dense_layers
    kinds = {"moe": moe_index} if model.num_moe_layers else {}
    if model.num_layers > model.num_moe_layers:  # layer 0, or 1 when experts start at layer 0 (freq > 1)
        kinds["dense"] = 1 if model.is_moe and moe_index == 0 else 0
    for kind, index in kinds.items():
        lp = layer_params(model, index, tp=tp, ep=ep)
        shard[kind], repl[kind] = lp.tp_sharded // tp + lp.replicated, lp.replicated
        expert[kind] = lp.expert // (ep * tp)
        flop[kind], core[kind] = tf.layers[index], tf.attention_core[index]

    def ends(first: bool, last: bool) -> int:
        return stage_params(model, range(0), tp=tp, ep=ep, first=first, last=last).dense

    # the embedding-side parameters of each stage: its first chunk on stage 0, its last chunk on stage p - 1
    middle = ends(False, False)
    end_params = np.full(p, v * middle, dtype=np.int64)
    if p == 1 and v == 1:
        end_params[0] = ends(True, True)
    else:
        end_params[0] += ends(True, False) - middle
        end_params[p - 1] += ends(False, True) - middle
    last = np.arange(p) == p - 1
    norm = model.hidden_size * (2 if model.normalization == "layernorm" else 1)
    # ZeRO-3 gathers each layer's parameters, and the embedding-side modules of the stage (as the first and last
    # stage, whatever its chunks) as one more, once per micro-batch; layers of equal size share an op set
    whole = np.zeros(p, dtype=np.int64)
    whole[0] = ends(True, p == 1)
    if p > 1:
        whole[p - 1] = ends(False, True)
    whole[1:p - 1] = middle
    same = shard["moe"] == shard["dense"]
    z_elements = np.stack([np.full(p, shard["dense"]), np.full(p, shard["moe"]), whole], axis=1)
    z_count = np.stack([dense * (shard["dense"] > 0) + (moe * (shard["moe"] > 0) if same else 0),
                        0 if same else moe * (shard["moe"] > 0), (whole > 0).astype(np.int64)], axis=1)
    zx_count = (moe * (expert["moe"] > 0))[:, None]
    return _Stages(
        layers=layers, moe_layers=moe,
        dense_params=end_params + dense * shard["dense"] + moe * shard["moe"],
        expert_params=moe * expert["moe"],
        replicated=dense * repl["dense"] + moe * repl["moe"] + last * norm,
        body_flop=dense * flop["dense"] + moe * flop["moe"], core_flop=dense * core["dense"] + moe * core["moe"],
        zero3=np.stack([z_elements, z_count, (z_count > 0).astype(np.int64)]),
        zero3_expert=np.stack([np.full((p, 1), expert["moe"]), zx_count, (zx_count > 0).astype(np.int64)]),
        split_note=pipeline_split_note(model, par))


#: What the closed form reads of a ParallelSpec, one column each (properties included).
_FIELDS = ("tp", "pp", "dp", "cp", "ep", "virtual_pipeline_size", "order", "pipeline_layers",
           "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "micro_batch_size",
           "global_batch_size", "sequence_parallel", "recompute", "zero_stage", "shards_optimizer", "framework",
           "attention", "fp8_format", "grad_reduce_dtype", "gradient_accumulation_fusion",
           "scatter_gather_tensors_in_pipeline", "tp_comm_overlap", "overlap_p2p_comm", "overlap_grad_reduce",
           "overlap_param_gather", "grad_bucket_elements", "world_size", "stack")
_ROW = attrgetter(*_FIELDS)
#: The columns each key is made of: the layout (spans), the layer split (stages), the job's validity
#: (:func:`commscope.pattern.workload.dense.check_job`).
_SPANS_KEY = ("tp", "pp", "dp", "cp", "ep", "order")
_STAGES_KEY = ("tp", "ep", "pp", "virtual_pipeline_size", "pipeline_layers", "decoder_first_pipeline_num_layers",
               "decoder_last_pipeline_num_layers")
_CHECK_KEY = ("micro_batch_size", "cp", "sequence_parallel", *_STAGES_KEY)


def _keys(columns: dict[str, tuple[Any, ...]], names: tuple[str, ...]) -> tuple[list[tuple[Any, ...]], np.ndarray]:
    """The distinct keys made of columns ``names`` (in order of first appearance) and each row's index into them."""
    keys = list(zip(*(columns[n] for n in names)))
    first = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return list(first), np.fromiter(map(first.__getitem__, keys), dtype=np.int64, count=len(keys))


#: The columns the arrays read as numbers (the others stay Python values).
_NUMERIC = ("tp", "cp", "ep", "dp", "pp", "micro_batch_size", "global_batch_size", "virtual_pipeline_size",
            "sequence_parallel", "zero_stage", "shards_optimizer", "scatter_gather_tensors_in_pipeline",
            "tp_comm_overlap", "overlap_p2p_comm", "overlap_grad_reduce", "overlap_param_gather", "world_size")


def _numeric(columns: dict[str, tuple[Any, ...]]) -> dict[str, np.ndarray]:
    """The :data:`_NUMERIC` columns as int64 arrays (flags as 0/1), with the gradient bucket size (0: one bucket per
    stage) and full recomputation."""
    out = {name: np.array(columns[name], dtype=np.int64) for name in _NUMERIC}
    out["grad_bucket_elements"] = np.array([b or 0 for b in columns["grad_bucket_elements"]], dtype=np.int64)
    out["full_recompute"] = np.array([r == "full" for r in columns["recompute"]])
    return out


def _first_rows(index: np.ndarray, count: int) -> list[int]:
    """The first row of each of ``count`` keys."""
    first = np.full(count, len(index))
    np.minimum.at(first, index, np.arange(len(index)))
    out: list[int] = first.tolist()
    return out


def estimate_one(model: ModelSpec, cluster: ClusterSpec, par: ParallelSpec, compute: StageCompute | None, u: float,
                 notes: list[str], gpu: GpuSpec | None = None) -> Estimate | None:
    """:func:`estimate` of one Megatron job with balanced routing, whose compute per stage the caller has
    (``compute``: ``gpu``'s compute model; None: FLOP / (u x peak)) and whose job is checked; None where the op-by-op
    path must answer (more than :data:`MAX_GRAD_BUCKETS` gradient buckets on a stage)."""
    st = _stages(model, par)
    if st.num_buckets(par.grad_bucket_elements) > MAX_GRAD_BUCKETS:
        return None
    columns = dict(zip(_FIELDS, ((x,) for x in _ROW(par))))
    zero = np.zeros(1, dtype=np.int64)
    a = _Arrays(model, [par], _numeric(columns), columns, zero, {0: _spans(par, cluster.gpus_per_node, model.is_moe)},
                zero, [st], zero)
    if compute is None:
        peak = cluster.peak_flops_for(model.dtype)
        return _evaluate(model, cluster, a, _flop_arrays(model, a, u, peak), [()], None, u, notes)[0]
    zeros = np.zeros(par.pp)
    c = {key: np.asarray(zeros if value is None else value, dtype=np.float64)[None, :] for key, value in (
        ("fwd", compute.forward_s), ("bwd", compute.backward_s), ("att", compute.attention_s),
        ("lin_f", compute.linear_forward_s), ("lin_b", compute.linear_backward_s), ("opt", compute.optimizer_s),
        ("gemm", compute.gemm_s), ("mem", compute.memory_s), ("rec", compute.recompute_s), ("flop", compute.flop),
        ("clock", compute.clock_s), ("chunks", compute.chunks_s), ("gaps", compute.gaps_s), ("stack", compute.stack_s),
        ("stack_opt", compute.stack_opt_s))}
    return _evaluate(model, cluster, a, c, [compute.notes], gpu, u, notes)[0]


# ------------------------------------------------------------------------------------- arrays of configurations


class _Arrays:
    """The configurations of one pipeline depth as columns (n, 1), their structure as (n, p) arrays."""

    def __init__(self, model: ModelSpec, parallels: Sequence[ParallelSpec], numeric: dict[str, np.ndarray],
                 columns: dict[str, tuple[Any, ...]], rows: np.ndarray, spans: dict[int, _Spans], spans_index: np.ndarray,
                 stages: Sequence[_Stages], stages_index: np.ndarray) -> None:
        self.n = len(rows)
        self.rows = rows
        self.columns, self.numeric = columns, numeric
        self.pars = [parallels[i] for i in rows.tolist()]

        def col(name: str) -> np.ndarray:
            out: np.ndarray = numeric[name][rows][:, None]
            return out

        self.tp, self.cp, self.ep, self.dp = col("tp"), col("cp"), col("ep"), col("dp")
        self.p = int(numeric["pp"][rows[0]])
        self.mb, self.gb, self.v = col("micro_batch_size"), col("global_batch_size"), col("virtual_pipeline_size")
        self.m = self.gb // (self.mb * self.dp)
        self.sp = (col("sequence_parallel") > 0) & (self.tp > 1)
        self.full = col("full_recompute")
        self.zero3 = col("zero_stage") == 3
        self.shards = col("shards_optimizer") > 0
        self.gather = (col("scatter_gather_tensors_in_pipeline") > 0) & (self.tp > 1) & ~self.sp
        self.bucket = col("grad_bucket_elements")
        # bytes of a reduced gradient element (commscope.pattern.workload.framework.grad_dtype)
        reduce_dtype = self.values("grad_reduce_dtype")
        size = {g: dtype_bytes(g or ("fp32" if model.dtype == "bf16" else model.dtype)) for g in set(reduce_dtype)}
        self.G = np.array([size[g] for g in reduce_dtype], dtype=np.int64)[:, None]
        # the distinct structures of these rows, stacked once and indexed per row (one: a view repeated n times)
        st_keys, st_local = np.unique(stages_index, return_inverse=True)
        st = [stages[k] for k in st_keys.tolist()]
        sp_keys, sp_local = np.unique(spans_index, return_inverse=True)
        sp = [spans[k] for k in sp_keys.tolist()]

        def per_row(items: list[Any], local: np.ndarray, name: str) -> np.ndarray:
            if len(items) == 1:
                one = getattr(items[0], name)
                return np.broadcast_to(one, (self.n, *one.shape))
            out: np.ndarray = np.stack([getattr(x, name) for x in items])[local]
            return out

        for name in ("layers", "moe_layers", "dense_params", "expert_params", "replicated", "body_flop", "core_flop",
                     "zero3", "zero3_expert"):
            setattr(self, "st_" + name, per_row(st, st_local, name))
        self.split_notes = [st[k].split_note for k in st_local.tolist()]
        for name in ("tp", "cp", "dp", "edp", "ep"):  # (n, p) each of n, num_nodes, per_node
            x = per_row(sp, sp_local, name)
            setattr(self, "span_" + name, (x[:, 0], x[:, 1], x[:, 2]))
        self.pp_across = per_row(sp, sp_local, "pp_across")
        x = per_row(sp, sp_local, "emb")
        self.span_emb = (x[:, 0:1], x[:, 1:2], x[:, 2:3])

    def flags(self, name: str) -> np.ndarray:
        """A boolean column."""
        out: np.ndarray = self.numeric[name][self.rows][:, None] > 0
        return out

    def values(self, name: str) -> list[Any]:
        """A column's values for these rows."""
        column = self.columns[name]
        return [column[i] for i in self.rows.tolist()]

    # set in __init__ (typed here for mypy)
    st_layers: np.ndarray
    st_moe_layers: np.ndarray
    st_dense_params: np.ndarray
    st_expert_params: np.ndarray
    st_replicated: np.ndarray
    st_body_flop: np.ndarray
    st_core_flop: np.ndarray
    st_zero3: np.ndarray
    st_zero3_expert: np.ndarray
    span_tp: tuple[np.ndarray, np.ndarray, np.ndarray]
    span_cp: tuple[np.ndarray, np.ndarray, np.ndarray]
    span_dp: tuple[np.ndarray, np.ndarray, np.ndarray]
    span_edp: tuple[np.ndarray, np.ndarray, np.ndarray]
    span_ep: tuple[np.ndarray, np.ndarray, np.ndarray]


class _Times:
    """Alpha-beta op times and bus bandwidths (:func:`commscope.estimate.bandwidth.alpha_beta_time_s`, the same arithmetic in
    the same order) with each (op, span)'s latency, bus factor and bandwidth worked out once."""

    def __init__(self, cluster: ClusterSpec, spans: dict[str, tuple[Any, Any, Any]]) -> None:
        self.cluster, self.spans = cluster, spans
        self._terms: dict[tuple[str, str], tuple[Any, ...]] = {}

    def terms(self, op: str, span: str) -> tuple[Any, ...]:
        # all_gather and reduce_scatter have one formula (steps n - 1, bus factor (n - 1) / n: bandwidth.py's docstring)
        key = ("all_gather" if op == "reduce_scatter" else op, span)
        if key not in self._terms:
            n, nodes, k = self.spans[span]
            steps, alpha, f, bw = _alpha_beta_terms(self.cluster, op, np.ones(np.shape(n)), n, nodes, k)
            self._terms[key] = (steps * alpha, f, bw, np.asarray(n) < 2)
        return self._terms[key]

    def t(self, op: str, size: Any, span: str) -> np.ndarray:
        latency, f, bw, alone = self.terms(op, span)
        size = np.asarray(size, dtype=np.float64)
        return np.where(alone | (size <= 0), 0.0, latency + size * f / bw)

    def busbw(self, op: str, span: str) -> np.ndarray:
        """:func:`commscope.estimate.bandwidth.alpha_beta_busbw_bytes_per_s`."""
        _, _, bw, alone = self.terms(op, span)
        return np.where(alone, self.cluster.intra_node.bandwidth_bytes_per_s, bw)


def _flop_arrays(model: ModelSpec, a: _Arrays, u: float, peak: float) -> dict[str, np.ndarray]:
    """The FLOP / (u x peak) compute of :func:`commscope.estimate.estimate_op_by_op` for every configuration (n, p)."""
    tf = token_flops(model)
    p = a.p
    tokens_mb = a.mb * model.seq_len / a.cp
    rate = a.tp * u * peak
    f = a.st_body_flop + np.where(np.arange(p) == p - 1, tf.logits, 0.0)[None, :]
    rc = np.array(a.values("recompute"))[:, None]
    extra = np.where(rc == "selective", a.st_core_flop, np.where(rc == "full", a.st_body_flop, 0.0))
    fwd = tokens_mb * f / rate
    bwd = tokens_mb * (2 * f + extra) / rate
    att = tokens_mb * (3 * a.st_core_flop) / rate
    return {"fwd": fwd, "bwd": bwd, "att": att, "lin_f": fwd, "lin_b": bwd, "opt": np.zeros_like(fwd)}


# ---------------------------------------------------------------------------------------------- communication


def _evaluate(model: ModelSpec, cluster: ClusterSpec, a: _Arrays, c: dict[str, np.ndarray],
              compute_notes: Sequence[tuple[str, ...]], gpu: GpuSpec | None, u_flops: float,
              base_notes: list[str]) -> list[Estimate]:
    """Every configuration's communication op by op in closed form, and the pipeline schedule of
    :func:`commscope.estimate.estimate_op_by_op`, on (configurations, stages) arrays. ``c``: the compute per stage
    (``gpu``: the GPU whose compute model gave it, None for FLOP / (u x peak))."""
    n, p = a.n, a.p
    peak = cluster.peak_flops_for(model.dtype)
    fwd, bwd, m = c["fwd"], c["bwd"], a.m
    B = model.dtype_bytes
    tokens = a.mb * model.seq_len // a.cp
    act = tokens * model.hidden_size * B
    stage = np.arange(p)[None, :]
    first, last = stage == 0, stage == p - 1
    L = a.st_layers
    z = np.zeros((n, p))
    comm = {axis: {k: z for k in ("fwd", "bwd", "iter")} for axis in _EFF_AXES}
    T = _Times(cluster, {"tp": a.span_tp, "cp": a.span_cp, "dp": a.span_dp, "edp": a.span_edp, "ep": a.span_ep,
                         "emb": a.span_emb, "inside": (2, 1, 1), "across": (2, 2, 1)})
    t = T.t
    bb_sum: dict[str, Any] = {}
    bb_cnt: dict[str, Any] = {}

    def busbw(axis: str, op: str, span: str, count: Any) -> None:
        """Add ``count`` op sets per stage (n, p) at ``span`` to the axis's mean bus bandwidth (a group of one
        rank has no op set)."""
        cnt = np.where(T.terms(op, span)[3], 0, count)
        bb_sum[axis] = bb_sum.get(axis, 0.0) + (cnt * T.busbw(op, span)).sum(axis=1)
        bb_cnt[axis] = bb_cnt.get(axis, 0) + cnt.sum(axis=1)

    has_layers = L > 0
    sp, full = a.sp, a.full
    if (a.tp > 1).any():
        t_ar, t_ag, t_rs = (t(op, act, "tp") for op in ("all_reduce", "all_gather", "reduce_scatter"))
        t_ce = t("all_reduce", tokens * dtype_bytes("fp32"), "tp")
        lm = L * m
        rec = 1 + full
        f = np.where(sp, 2 * (t_ag * lm + t_rs * lm), 2 * t_ar * lm)
        b = np.where(sp, 2 * (t_ag * lm + t_rs * lm) * rec, 2 * t_ar * lm * rec)
        f = f + first * np.where(sp, t_rs * m, t_ar * m)
        b = b + first * np.where(sp, t_ag * m, 0.0)
        f = f + last * (np.where(sp, t_ag * m, 0.0) + t_ce * (3 * m))
        b = b + last * np.where(sp, t_rs * m, t_ar * m)
        repl = a.st_replicated * a.G
        comm["tp"] = {"fwd": f, "bwd": b, "iter": np.where(sp & (repl > 0), t("all_reduce", repl, "tp"), 0.0)}
        per_layer_sets = has_layers * 2 * (2 + full)  # of each of AG and RS with SP, of AR twice that without
        sets = np.where(sp, per_layer_sets + first + last, 0)
        busbw("tp", "all_gather", "tp", sets)
        busbw("tp", "reduce_scatter", "tp", sets)
        # (counts as integers: numpy adds two boolean arrays as a logical or, which would count the last stage's
        # cross-entropy and sequence-parallel gradient all-reduces as one)
        busbw("tp", "all_reduce", "tp", np.where(sp, last.astype(np.int64) + (repl > 0), per_layer_sets + first + 2 * last))
    if (a.cp > 1).any():
        kv = 2 * tokens * np.maximum(1, model.kv_heads // a.tp) * model.head_size * B
        t_kv = t("send", kv, "cp")
        steps_bwd = 2 * (a.cp - 1) + np.where(full, a.cp - 1, 0)
        comm["cp"] = {"fwd": t_kv * (L * m * (a.cp - 1)), "bwd": t_kv * (L * m * steps_bwd), "iter": z}
        busbw("cp", "send", "cp", has_layers * 2)
    if model.is_moe and (a.ep > 1).any():
        nm = a.st_moe_layers
        routed = np.where(sp, tokens // a.tp, tokens)  # commscope.moe.routing.routed_tokens_per_rank
        # balanced routing: every rank sends routed x top_k tokens in all (balanced_routing's rows sum to that)
        t_a2a = t("all_to_all", routed * model.top_k * model.hidden_size * B, "ep")
        t_cnt = t("all_gather", a.ep * model.num_experts * 8, "ep")
        comm["ep"] = {"fwd": t_cnt * (nm * m) + t_a2a * (nm * m) * 2, "bwd": t_a2a * (nm * m) * 2, "iter": z}
        with_moe = nm > 0
        busbw("ep", "all_gather", "ep", with_moe)
        busbw("ep", "all_to_all", "ep", 4 * with_moe)
    if p > 1:
        size = np.where(a.sp | a.gather, act // a.tp, act)
        # boundaries from stage s to (s + 1) mod p: v - 1 of them from the last stage (chunk k to chunk k + 1), v from
        # every other; half of each transfer counts on the sender's stage, half on the receiver's
        count = np.broadcast_to(a.v, (n, p)) - last
        half = z
        for span, sel in (("inside", ~a.pp_across), ("across", a.pp_across)):
            k = count * sel
            half = half + (k + np.roll(k, 1, axis=1)) * (t("send", size, span) * m / 2)
            busbw("pp", "send", span, 2 * k)
        comm["pp"] = {"fwd": half, "bwd": half, "iter": z}
        if a.gather.any():  # Megatron's scatter/gather: the receiver all-gathers the pieces over its TP group
            into, out_of = np.roll(count, 1, axis=1) * a.gather, count * a.gather
            t_gather = t("all_gather", act, "tp") * m
            comm["pp"] = {"fwd": half + into * t_gather, "bwd": half + out_of * t_gather, "iter": z}
            busbw("pp", "all_gather", "tp", into + out_of)
    grad_buckets: list[np.ndarray] = []  # (n, p) per bucket: the dense parameters' buckets, then the experts'
    param_buckets: list[np.ndarray] = []
    dp_fwd, dp_bwd = z, z
    for elements, span, entries in ((a.st_dense_params, "dp", a.st_zero3), (a.st_expert_params, "edp", a.st_zero3_expert)):
        present = (elements > 0) & ~T.terms("all_reduce", span)[3]
        if not present.any():
            continue
        # gradient buckets of at most grad_bucket_elements (one per stage without), the last holding the rest
        num = np.where(a.bucket > 0, -(-elements // np.maximum(a.bucket, 1)), 1) * present
        plain = ~a.zero3
        if num.max() == 1:  # one bucket per stage: (n, p)
            span3, sizes, G, shards = span, elements * present, a.G, a.shards
        else:  # (n, p, buckets)
            k = np.arange(int(num.max()))[None, None, :]
            full_size = np.where(a.bucket > 0, a.bucket, elements)[:, :, None]
            rest = (elements - (num - 1) * a.bucket)[:, :, None]
            sizes = np.where(k < num[:, :, None] - 1, full_size, np.where(k < num[:, :, None], rest, 0))
            span3, G, shards, plain = span + "3", a.G[:, :, None], a.shards[:, :, None], plain[:, :, None]
            T.spans[span3] = tuple(x[:, :, None] for x in T.spans[span])
        grads = np.where(shards, t("reduce_scatter", sizes * G, span3), t("all_reduce", sizes * G, span3)) * plain
        params = t("all_gather", sizes * B, span3) * (plain & shards)
        if grads.ndim == 2:
            grad_buckets.append(grads)
            param_buckets.append(params)
        else:
            grad_buckets += list(np.moveaxis(grads, 2, 0))
            param_buckets += list(np.moveaxis(params, 2, 0))
        z3_sets: Any = 0
        if a.zero3.any():
            # (n, p, sizes) each: elements, gathers per micro-batch and op sets of each gather size
            zn, per_mb, sets = entries[:, 0], entries[:, 1], entries[:, 2]
            T.spans[span + "3"] = tuple(x[:, :, None] for x in T.spans[span])
            t_ag = t("all_gather", zn * B, span + "3")
            t_rs = t("reduce_scatter", zn * a.G[:, :, None], span + "3")
            cnt = per_mb * m[:, :, None] * present[:, :, None]
            dp_fwd = dp_fwd + np.where(a.zero3, (t_ag * cnt).sum(axis=2), 0.0)
            dp_bwd = dp_bwd + np.where(a.zero3, (t_ag * cnt + t_rs * cnt).sum(axis=2), 0.0)
            z3_sets = sets.sum(axis=2) * present
        busbw("dp", "all_gather", span, np.where(a.zero3, 2 * z3_sets, num * a.shards))
        busbw("dp", "reduce_scatter", span, np.where(a.zero3, z3_sets, num * a.shards))
        busbw("dp", "all_reduce", span, np.where(a.zero3 | a.shards, 0, num))
    comm["dp"] = {"fwd": dp_fwd, "bwd": dp_bwd, "iter": z}
    if p > 1 and model.tied_embeddings:
        t_emb = t("all_reduce", _emb_elements(model, a.tp) * a.G, "emb")
        comm["emb"] = {"fwd": z, "bwd": z, "iter": (first | last) * t_emb}
        busbw("emb", "all_reduce", "emb", np.ones((n, 1), dtype=np.int64))

    # --- the pipeline schedule (estimate.estimate_op_by_op, on arrays of configurations) ---
    v = a.v
    tp_all = comm["tp"]["fwd"] + comm["tp"]["bwd"]
    tp_exp = np.where(a.flags("tp_comm_overlap"), np.maximum(0.0, comm["tp"]["fwd"] - m * c["lin_f"])
                      + np.maximum(0.0, comm["tp"]["bwd"] - m * c["lin_b"]), tp_all)
    cp_all = comm["cp"]["fwd"] + comm["cp"]["bwd"]
    cp_exp = np.maximum(0.0, cp_all - m * c["att"])
    pp_all = comm["pp"]["fwd"] + comm["pp"]["bwd"]
    p2p_overlap = (v > 1) & a.flags("overlap_p2p_comm")
    pp_exp = np.where(p2p_overlap, np.maximum(0.0, pp_all - m * (fwd + bwd)), pp_all)
    ep_all = comm["ep"]["fwd"] + comm["ep"]["bwd"]
    dp_layer = comm["dp"]["fwd"] + comm["dp"]["bwd"]
    dp_layer_exp = np.maximum(0.0, comm["dp"]["fwd"] - m * fwd) + np.maximum(0.0, comm["dp"]["bwd"] - m * bwd)
    # compute slowed by the SMs that overlapped collectives take (compute.effects, point 2)
    sm = np.asarray(comm_sm_time_s(gpu, tp=tp_all - tp_exp, cp=cp_all - cp_exp, pp=pp_all - pp_exp,
                                   dp=dp_layer - dp_layer_exp)) * np.ones((n, p))
    per_mb = fwd + bwd + (sm + tp_exp + pp_exp + cp_exp + ep_all + dp_layer_exp) / m
    rows = np.arange(n)
    crit = first_max(per_mb)
    bubble = (per_mb.sum(axis=1) - per_mb[rows, crit]) / v[:, 0]
    grad_t, param_t = sum(grad_buckets, z), sum(param_buckets, z)
    grad_exp = np.where(a.flags("overlap_grad_reduce"), _overlapped_buckets(grad_buckets, bwd), grad_t) if grad_buckets else z
    param_exp = np.where(a.flags("overlap_param_gather"), _late_gathers(param_buckets, fwd), param_t) if param_buckets else z
    dp_tail = grad_exp + param_exp + comm["dp"]["iter"]
    # the last backward (and the next forward) slowed by the buckets reduced (gathered) beside them
    sm_tail = np.asarray(comm_sm_time_s(gpu, dp=grad_t - grad_exp + param_t - param_exp)) * np.ones((n, p))
    tail = (dp_tail + comm["emb"]["iter"] + comm["tp"]["iter"] + comm["cp"]["iter"] + comm["ep"]["iter"] + sm_tail
            + c["opt"])
    lead = np.arange(p)[None, :] * bwd / v
    end = first_max(tail - lead)
    hide = np.minimum(lead[rows, end], tail[rows, end])
    terms = {"dp": dp_tail[rows, end], "emb": comm["emb"]["iter"][rows, end],
             "tp": comm["tp"]["iter"][rows, end] + comm["cp"]["iter"][rows, end] + comm["ep"]["iter"][rows, end],
             "sm": sm_tail[rows, end], "opt": c["opt"][rows, end]}
    for key, value in terms.items():
        cut = np.minimum(hide, value)
        terms[key] = value - cut
        hide = hide - cut
    hidden_cols = {"tp": tp_all[rows, crit] - tp_exp[rows, crit], "cp": cp_all[rows, crit] - cp_exp[rows, crit],
                   "pp": pp_all[rows, crit] - pp_exp[rows, crit],
                   "dp": (dp_layer[rows, crit] - dp_layer_exp[rows, crit] + grad_t[rows, end] + param_t[rows, end]
                          + comm["dp"]["iter"][rows, end] - terms["dp"])}
    m_col = m[:, 0]
    work = fwd[rows, crit] + bwd[rows, crit]
    comp = m_col * work + sm[rows, crit] + terms["sm"]
    if gpu is not None:
        u: Any = np.where(work > 0, c["flop"][rows, crit] / (np.where(work > 0, work, 1.0) * peak), u_flops)
        # StageCompute.breakdown's order, then what the collectives' SMs took
        parts = [(name, (c[key][rows, crit] * m_col).tolist()) for name, key in (
            ("gemm_s", "gemm"), ("attention_s", "att"), ("memory_bound_s", "mem"), ("recompute_s", "rec"))]
        parts += [("optimizer_s", c["opt"][rows, crit].tolist())]
        parts += [(name, (c[key][rows, crit] * m_col).tolist()) for name, key in (
            ("clock_s", "clock"), ("overlap_chunks_s", "chunks"), ("launch_gaps_s", "gaps"))]
        parts += [("stack_s", (c["stack"][rows, crit] * m_col + c["stack_opt"][rows, crit]).tolist()),
                  ("comm_sms_s", (sm[rows, crit] + terms["sm"]).tolist())]
        names = [name for name, _ in parts]
        breakdown = [dict(zip(names, values)) for values in zip(*(values for _, values in parts))]
    else:
        u, breakdown = u_flops, [{}] * n
    flags = zip(a.values("tp_comm_overlap"), (p2p_overlap[:, 0]).tolist(), a.values("overlap_grad_reduce"),
                a.values("overlap_param_gather"))
    return finish_many(model, "refined", u, peak, global_batch_size=a.gb[:, 0], world_size=a.numeric["world_size"][a.rows],
                       recompute=a.values("recompute"), comp=comp, tp=tp_exp[rows, crit] + terms["tp"],
                       pp=pp_exp[rows, crit], dp=dp_layer_exp[rows, crit] + terms["dp"], ep=ep_all[rows, crit],
                       cp=cp_exp[rows, crit], emb=terms["emb"], bubble=bubble, optimizer=terms["opt"],
                       micro_batch=per_mb[rows, crit],
                       tail=terms["dp"] + terms["emb"] + terms["tp"] + terms["sm"] + terms["opt"],
                       stage=crit, eff=_dicts(_EFF_AXES, bb_sum, bb_cnt, n), notes=_notes(base_notes, compute_notes, flags, a.split_notes),
                       hidden=_hidden(hidden_cols, n), breakdown=breakdown,
                       compute_model="gpu" if gpu is not None else "flops",
                       stage_micro_batch=per_mb)


def _dicts(axes: tuple[str, ...], sums: dict[str, Any], counts: dict[str, Any], n: int) -> list[dict[str, float]]:
    """Each configuration's mean bus bandwidth per axis (axes without an op set left out), in ``axes`` order."""
    present = [axis for axis in axes if axis in sums]
    means = [np.divide(sums[axis], np.maximum(counts[axis], 1)).tolist() for axis in present]
    has = [(counts[axis] > 0).tolist() for axis in present]
    if all(all(h) for h in has):
        return [dict(zip(present, values)) for values in zip(*means)] if present else [{} for _ in range(n)]
    return [{axis: mean[j] for axis, mean, h in zip(present, means, has) if h[j]} for j in range(n)]


def _hidden(columns: dict[str, np.ndarray], n: int) -> list[dict[str, float]]:
    """Each configuration's hidden communication per axis, what is below HIDDEN_MIN_S left out."""
    names = list(columns)
    values = [columns[k].tolist() for k in names]
    return [{k: x for k, x in zip(names, row) if x > HIDDEN_MIN_S} for row in zip(*values)] if n else []


def _emb_elements(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Word-embedding elements on one TP rank (the vocabulary padded for tp), per configuration."""
    multiple = model.make_vocab_size_divisible_by * tp
    out: np.ndarray = -(-model.vocab_size // multiple) * multiple * model.hidden_size // tp
    return out


def _notes(base: list[str], compute: Sequence[tuple[str, ...]], flags: Any,
           split: Sequence[str | None]) -> list[tuple[str, ...]]:
    """Each configuration's notes, in the op-by-op path's order (built once per distinct combination)."""
    made: dict[tuple[Any, ...], tuple[str, ...]] = {}
    out = []
    for cn, fl, sn in zip(compute, flags, split):
        key = (id(cn), fl, sn)
        if key not in made:
            lines = [*base, *cn]
            lines += [text for on, text in zip(fl, OVERLAP_NOTES) if on]
            made[key] = tuple(lines + ([sn] if sn else []))
        out.append(made[key])
    return out
