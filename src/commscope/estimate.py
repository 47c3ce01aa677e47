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
GPU's own compute model (:mod:`commscope.compute`: every GEMM by the tile/wave model, attention, the
memory-bound kernels at the HBM roofline, recomputation, the optimizer step), and takes the slowest stage as
the critical path of the 1F1B schedule:

    t_mb(s)  = fwd(s) + bwd(s) + [sm(s) + tp_exp(s) + pp_exp(s) + cp_exp(s) + ep(s) + dp_exp(s)] / m

fwd and bwd are the kernels of :mod:`commscope.compute` with their in-training effects (sustained clock, Transformer
Engine's GEMM pieces, host launch gaps) and, where the job names one, its software stack's efficiency; sm(s) is the
compute lost to the SMs that overlapped collectives take (:mod:`commscope.compute.effects`): every one of them is in
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

``gpu_util`` given explicitly replaces the compute model by FLOP / (u x peak) per stage (Megatron's FLOP
formula, attention and logits included, recomputation added), as does a cluster whose GPU has no preset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
import os
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from commscope.bandwidth import AlphaBeta, BandwidthModel, GroupSpan
from commscope.compute.effects import comm_sm_time_s
from commscope.compute.model import StageCompute, first_max, stage_compute
from commscope.flops import iteration_flops, token_flops
from commscope.units import dtype_bytes
from commscope.workload.framework import grad_dtype
from commscope.workload.stages import pipeline_split_note, stage_layers

if TYPE_CHECKING:  # api and gpus import this module
    from commscope.api import Prediction
    from commscope.gpus import GpuSpec
    from commscope.spec.cluster import ClusterSpec
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec


class JobOf(Protocol):
    """What :func:`_finish` reads of a job: a :class:`~commscope.api.Prediction`, or the lighter record
    :mod:`commscope.estimate_many` builds per configuration."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def parallel(self) -> ParallelSpec: ...

Method = Literal["refined", "seed"]
METHODS = ("refined", "seed")
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
    """``gpu`` (per-kernel compute model of :mod:`commscope.compute`) or ``flops`` (FLOP / (u x peak))."""
    micro_batch_s: float = 0.0
    """Time of one micro-batch on the critical stage, exposed pipeline communication included: the unit of the
    pipeline's steady state (the bubble is the fill and drain through the other stages, at most (p - 1) / v of it)."""
    stage_micro_batch_s: tuple[float, ...] = ()
    """``micro_batch_s`` of every pipeline stage (the critical one is the largest): what the fill and the drain
    pass through, and what :func:`commscope.schedule.schedule_for` times each stage of the timeline with."""
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

    ``gpu_util`` replaces the compute model by FLOP / (u x peak); ``gpu`` (a :class:`~commscope.gpus.GpuSpec`,
    a preset name or a file) replaces the GPU matched from the cluster.
    """
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
    return _refined(prediction, u, peak, bw, compute, notes, spec)


def compute_gpu(cluster: ClusterSpec, gpu_util: float | None,
                gpu: str | os.PathLike[str] | GpuSpec | None = None) -> tuple[GpuSpec | None, list[str]]:
    """The GPU whose compute model times compute (None: FLOP / (u x peak)), and the note saying why not."""
    if gpu_util is not None:
        return None, [f"compute: FLOP / (u x peak) with u = {gpu_util:.2f} (--gpu-util)"]
    from commscope.errors import ConfigError
    from commscope.gpus import gpu_for_cluster

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
    model, par = prediction.model, prediction.parallel
    total = comp + tp + pp + dp + ep + cp + emb + bubble + optimizer
    tokens = par.global_batch_size * model.seq_len
    fl = iteration_flops(model, tokens, recompute=par.recompute)
    world = par.world_size
    return Estimate(
        method=method, iteration_time_s=total, compute_s=comp, tp_s=tp, pp_s=pp, dp_s=dp, ep_s=ep, cp_s=cp,
        emb_s=emb, bubble_s=bubble,
        comm_ratio=(tp + pp + dp + ep + cp + emb) / total if total else 0.0,
        bubble_ratio=bubble / total if total else 0.0,
        tokens_per_s=tokens / total if total else 0.0,
        tflops_per_gpu=fl["hardware"] / total / world / 1e12 if total else 0.0,
        mfu=fl["model"] / total / world / peak if total else 0.0,
        gpu_util=u, peak_flops=peak, world_size=world, critical_stage=stage,
        effective_bandwidth_bytes_per_s=eff, optimizer_s=optimizer, hidden_s=dict(hidden or {}),
        compute_breakdown_s=dict(breakdown or {}), compute_model=compute_model, notes=tuple(notes),
        micro_batch_s=((comp + tp + pp + cp + ep) / par.num_micro_batches) if micro_batch is None else micro_batch,
        tail_s=(dp + emb + optimizer) if tail is None else tail,
        stage_micro_batch_s=tuple(stage_micro_batch.tolist() if isinstance(stage_micro_batch, np.ndarray)
                                  else map(float, stage_micro_batch)),
    )


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
        from commscope.bandwidth import busbw_factor

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
    Elementwise on arrays (:mod:`commscope.estimate_many` passes one entry per configuration and stage; a bucket
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
        notes.append("TP communication overlapped with the linear GEMMs of the same pass (--tp-comm-overlap)")
    else:
        tp_exp = tp_all
    cp_all = comm["cp"]["fwd"] + comm["cp"]["bwd"]
    cp_exp = np.maximum(0.0, cp_all - m * attn)
    pp_all = comm["pp"]["fwd"] + comm["pp"]["bwd"]
    pp_exp = pp_all
    if v > 1 and par.overlap_p2p_comm:
        pp_exp = np.maximum(0.0, pp_all - m * (fwd + bwd))
        notes.append("pipeline sends/receives overlapped with the other model chunks' compute (interleaved schedule, "
                     "--overlap-p2p-communication)")
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
        notes.append("DP gradient buckets reduced during the last backward pass as they fill (--overlap-grad-reduce)")
    if par.overlap_param_gather:
        notes.append("parameter all-gathers overlapped with the next forward pass, bucket by bucket (--overlap-param-gather)")
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
