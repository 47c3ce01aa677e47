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
messages pay latency and a group spanning nodes pays the network), counts compute with Megatron's FLOP
formula per pipeline stage (attention and logits included, recomputation added), and takes the slowest
stage as the critical path of the 1F1B schedule:

    t_mb(s)  = [comp(s) + tp(s) + pp(s) + cp_exposed(s) + ep(s)] / m
    T_bubble = (p - 1) / v x t_mb(s*)           s* = the slowest stage, v = virtual pipeline size
    T_dp     = slowest stage's DP (and embedding) reduction, minus what overlaps the last backward pass
    T_iter   = m t_mb(s*) + T_bubble + T_dp

Context-parallel transfers overlap attention compute (ring attention), so only their excess is exposed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from commscope.bandwidth import AlphaBeta, BandwidthModel, GroupSpan
from commscope.flops import iteration_flops, token_flops
from commscope.workload.dense import grad_dtype, stage_layers
from commscope.units import dtype_bytes

Method = Literal["refined", "seed"]
METHODS = ("refined", "seed")


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
    notes: tuple[str, ...] = ()

    @property
    def comm_s(self) -> float:
        return self.tp_s + self.pp_s + self.dp_s + self.ep_s + self.cp_s + self.emb_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["comm_s"] = self.comm_s
        return d


def _span_of(groups: np.ndarray, gpus_per_node: int) -> GroupSpan:
    return GroupSpan.of(groups[0], gpus_per_node)


def estimate(prediction, *, method: Method = "refined", gpu_util: float | None = None,
             bandwidth: BandwidthModel | None = None) -> Estimate:
    """Estimate the iteration time of a :class:`~commscope.api.Prediction`."""
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
    return _refined(prediction, u, peak, bw)


def _finish(prediction, method, u, peak, *, comp, tp, pp, dp, ep, cp, emb, bubble, stage, eff, notes) -> Estimate:
    model, par = prediction.model, prediction.parallel
    total = comp + tp + pp + dp + ep + cp + emb + bubble
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
        effective_bandwidth_bytes_per_s=eff, notes=tuple(notes),
    )


def _seed(prediction, u: float, peak: float, bw: BandwidthModel) -> Estimate:
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


def _refined(prediction, u: float, peak: float, bw: BandwidthModel) -> Estimate:
    model, par, wl = prediction.model, prediction.parallel, prediction.workload
    gpn = prediction.cluster.gpus_per_node
    p, m, v = par.pp, par.num_micro_batches, par.virtual_pipeline_size
    stage_of = wl.layout.stage_of()
    tf = token_flops(model)
    tokens_mb = par.micro_batch_size * model.seq_len / par.cp  # tokens per rank per micro-batch
    extra = {"none": 0.0, "selective": 1.0, "full": 1.0}[par.recompute]

    comp = np.zeros(p)
    attn = np.zeros(p)
    for stage in range(p):
        layers = [layer for chunk in stage_layers(model, par, stage) for layer in chunk]
        fl = sum(3 * tf.layers[i] + (extra * (tf.layers[i] if par.recompute == "full" else tf.attention_core[i]))
                 for i in layers)
        if stage == p - 1:
            fl += 3 * tf.logits
        comp[stage] = m * tokens_mb * fl / par.tp / (u * peak)
        attn[stage] = m * tokens_mb * sum(3 * tf.attention_core[i] for i in layers) / par.tp / (u * peak)

    axes = {a: np.zeros(p) for a in ("tp", "pp", "dp", "ep", "cp", "emb")}
    busbw_sum: dict[str, list[float]] = {}
    for s in wl.opsets:
        if s.group_size < 2 or s.op == "recv":
            continue
        span = _span_of(s.groups, gpn)
        size = s.size_bytes
        t_op = bw.op_time_s(s.op, size, span)
        busbw_sum.setdefault(s.axis, []).append(bw.busbw_bytes_per_s(s.op, size, span))
        total = t_op * s.count
        if s.op == "send":
            # a p2p transfer occupies its sender and its receiver; per GPU, sends and receives of the
            # steady state overlap pairwise (send_forward_recv_backward), hence the halves
            src_stage = stage_of[s.groups[0, 0]]
            dst_stage = stage_of[s.groups[0, 1]]
            axes[s.axis][src_stage] += total / 2
            axes[s.axis][dst_stage] += total / 2
        elif s.axis == "emb":
            axes["emb"][0] += total
            axes["emb"][p - 1] += total
        else:
            axes[s.axis][stage_of[s.groups[0, 0]]] += total
    cp_exposed = np.maximum(0.0, axes["cp"] - attn)
    per_mb = (comp + axes["tp"] + axes["pp"] + cp_exposed + axes["ep"]) / m
    crit = int(np.argmax(per_mb))
    bubble = (p - 1) / v * per_mb[crit]
    dp_stage = axes["dp"] + axes["emb"]
    notes = list(bw.notes)
    if par.overlap_grad_reduce:
        # buckets reduce while the last micro-batch's backward (2/3 of its compute) still runs
        backward_last = 2 / 3 * comp / m
        dp_stage = np.maximum(axes["dp"] - backward_last, 0.0) + axes["emb"]
        notes.append("DP gradient reduction overlapped with the last backward pass (--overlap-grad-reduce)")
    dp_crit = int(np.argmax(dp_stage))
    dp_total = float(dp_stage[dp_crit])
    emb = float(axes["emb"][dp_crit])
    eff = {a: float(np.mean(v_)) for a, v_ in busbw_sum.items()}
    return _finish(prediction, "refined", u, peak, comp=float(comp[crit]), tp=float(axes["tp"][crit]),
                   pp=float(axes["pp"][crit]), dp=dp_total - emb, ep=float(axes["ep"][crit]),
                   cp=float(cp_exposed[crit]), emb=emb, bubble=float(bubble), stage=crit, eff=eff, notes=notes)
