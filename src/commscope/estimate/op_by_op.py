"""The refined estimate op by op: every op set of the predicted workload timed on its slowest group and added to
its pipeline stage, then the 1F1B schedule over the stages.

This is the definition of the refined method (:mod:`commscope.estimate.iteration` states its formulas): the path of
:func:`commscope.estimate.estimate_op_by_op`, and of :func:`commscope.estimate.estimate` for every job the closed
form of :mod:`commscope.estimate.closed_form` does not answer (other frameworks, routed or capacity-limited MoE,
measured bandwidth tables). tests/estimate/test_estimate_many.py holds the two equal on random jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from commscope.estimate.bandwidth import BandwidthModel, GroupSpan
from commscope.estimate.compute.effects import comm_sm_time_s
from commscope.estimate.compute.model import StageCompute, first_max
from commscope.estimate.flops import token_flops
from commscope.estimate.overlap import HIDDEN_MIN_S, OVERLAP_NOTES, _late_gathers, _overlapped_buckets
from commscope.estimate.terms import Estimate, _finish
from commscope.pattern.workload.stages import pipeline_split_note, stage_layers

if TYPE_CHECKING:
    from commscope.api import Prediction
    from commscope.estimate.gpus import GpuSpec
    from commscope.pattern.workload.base import Workload

#: What one stage's communication is kept by: axis -> "fwd", "bwd" (the passes) or "iter" (once per iteration) ->
#: seconds per stage.
_StageComm = dict[str, dict[str, np.ndarray]]


def _span_of(groups: np.ndarray, gpus_per_node: int) -> GroupSpan:
    """Where the slowest group of an op set sits (its groups run at once: the op set takes the slowest's time)."""
    return GroupSpan.slowest(groups, gpus_per_node)


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


def _stage_comm(wl: Workload, bw: BandwidthModel, gpn: int,
                p: int) -> tuple[_StageComm, list[list[float]], list[list[float]], dict[str, list[float]]]:
    """Every op set of ``wl`` timed on its slowest group and added to its stage: each axis's seconds per stage in the
    forward passes, the backward passes and once per iteration; the data-parallel step's gradient and parameter
    buckets of each stage (their overlap is a recurrence over them); and the bus bandwidth of every op set, by axis."""
    stage_of = wl.layout.stage_of()
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
    return comm, grad_buckets, param_buckets, busbw_sum


def _refined(prediction: Prediction, u: float, peak: float, bw: BandwidthModel, compute: StageCompute | None,
             notes: list[str], gpu: GpuSpec | None = None) -> Estimate:
    """The refined estimate of ``prediction`` from its op list (``compute``: the compute per stage of ``gpu``'s
    compute model; None: FLOP / (u x peak))."""
    model, par, wl = prediction.model, prediction.parallel, prediction.workload
    gpn = prediction.cluster.gpus_per_node
    p, m, v = par.pp, par.num_micro_batches, par.virtual_pipeline_size
    if compute is not None:
        fwd, bwd, attn = compute.forward_s, compute.backward_s, compute.attention_s
        lin_f, lin_b, opt = compute.linear_forward_s, compute.linear_backward_s, compute.optimizer_s
        notes = notes + list(compute.notes)
    else:
        fwd, bwd, attn = _flop_compute(prediction, u, peak)
        lin_f, lin_b, opt = fwd, bwd, np.zeros(p)

    comm, grad_buckets, param_buckets, busbw_sum = _stage_comm(wl, bw, gpn, p)

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
