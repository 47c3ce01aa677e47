"""Op-level estimates of many configurations at once: :func:`commscope.estimate.estimate` vectorised.

``estimate_many(model, cluster, parallels)`` returns, for every ParallelSpec, the Estimate that
``estimate(predict(model, parallel, cluster))`` returns (the refined method: every op of the Megatron workload
timed by the alpha-beta model, compute by the GPU's model per stage), without building workloads or traffic
matrices. Equal to the scalar path up to the order of floating-point sums (relative 1e-12;
tests/core/test_estimate_many.py holds them equal on random configurations).

How: configurations are grouped by *structure* (tp, pp, dp, cp, ep, v, rank order, layer split). What depends
only on the structure is computed once per group from the real :class:`~commscope.layout.Layout` and the
workload's own helpers (layers and parameters per stage, the span over nodes of the first group of every op
set, which is what the scalar path times). The op sets of :mod:`commscope.workload.dense` then reduce to counts
per stage x op time, evaluated for the whole group as (configurations, stages) arrays; the layer compute of
:mod:`commscope.compute.model` is computed once per distinct (tp, cp, ep, micro-batch, sp, recomputation,
attention, fp8) and summed per stage by layer counts. The pipeline-schedule arithmetic of
:func:`commscope.estimate._refined` runs on those arrays.

Configurations outside that (another framework, gradient buckets that split a stage, MoE capacity factors)
go through the scalar path, so every input gets its exact estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from commscope.bandwidth import GroupSpan, alpha_beta_busbw_bytes_per_s, alpha_beta_time_s, slowest_row
from commscope.compute.effects import comm_sm_time_s
from commscope.compute.model import TIME_ARRAYS, compute_efficiency, compute_note, effects_notes, first_max
from commscope.compute.kernels import (
    adam_step_time_s,
    grad_accumulation_bytes_per_param,
    grad_accumulation_note,
    linear_gemm_dtype,
    stage_extra_bytes,
)
from commscope.errors import ConfigError
from commscope.estimate import (
    HIDDEN_MIN_S,
    Estimate,
    _finish,
    _late_gathers,
    _overlapped_buckets,
    compute_gpu,
    estimate,
)
from commscope.flops import token_flops
from commscope.layout import Layout
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.spec.params import layer_params, stage_params
from commscope.units import dtype_bytes
from commscope.workload.dense import check_job
from commscope.workload.framework import grad_dtype
from commscope.workload.stages import pipeline_split_note, virtual_stage_layers

__all__ = ["estimate_many"]

_Span = tuple[np.ndarray, np.ndarray, np.ndarray]  # n, num_nodes, per_node, one entry per stage


@dataclass(frozen=True, slots=True)
class _Job:
    """What :func:`commscope.estimate._finish` reads of a Prediction."""

    model: ModelSpec
    parallel: ParallelSpec


def _structure_key(p: ParallelSpec) -> tuple[Any, ...]:
    return (p.tp, p.pp, p.dp, p.cp, p.ep, p.virtual_pipeline_size, p.order, p.pipeline_layers,
            p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers)


def _padded(entries: list[list[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-stage lists of (elements, ops per micro-batch) as two (stages, sizes) arrays, zero-padded."""
    width = max(1, max(len(e) for e in entries))
    num, per_mb = np.zeros((len(entries), width)), np.zeros((len(entries), width))
    for s, ent in enumerate(entries):
        for j, (n, k) in enumerate(ent):
            num[s, j], per_mb[s, j] = n, k
    return num, per_mb


def _spans(rows: np.ndarray, stage_of_row: np.ndarray, p: int, gpn: int) -> _Span:
    """(n, num_nodes, per_node) of the slowest group of each stage's op set (what the scalar path times), from all
    the axis's groups (``rows``) and the stage of each: one vectorised pass, then a pick per stage."""
    n = rows.shape[1] if rows.ndim == 2 else 1
    out = np.ones((3, p), dtype=np.int64)
    if rows.size == 0 or n < 2:
        return out[0], out[1], out[2]
    num_nodes, per_node = GroupSpan.row_spans(rows, gpn)
    for s in range(p):
        idx = np.flatnonzero(stage_of_row == s)
        if idx.size == 0:
            continue
        i = idx[slowest_row(num_nodes[idx], per_node[idx])]
        out[:, s] = (n, num_nodes[i], per_node[i])
    return out[0], out[1], out[2]


class _Structure:
    """Everything of a workload that depends on the layout and layer split only (one per group of configurations)."""

    def __init__(self, model: ModelSpec, par: ParallelSpec, gpn: int) -> None:
        p = par.pp
        layout = Layout(par)
        stage_of = layout.stage_of()

        def spans(kind: str, pairs: bool = False) -> _Span:
            """Spans of the slowest group of ``kind`` on each stage (of its (src, dst) ring pairs when ``pairs``, as
            the workload's context-parallel sends)."""
            groups = layout.groups(kind)
            stages = stage_of[groups[:, 0]]
            if pairs:
                groups = np.stack([groups.reshape(-1), np.roll(groups, -1, axis=1).reshape(-1)], axis=1)
                stages = np.repeat(stages, layout.groups(kind).shape[1])
            return _spans(groups, stages, p, gpn)

        tf = token_flops(model)
        self.p = p
        self.layers = np.zeros(p)
        self.moe_layers = np.zeros(p)
        self.dense_params = np.zeros(p)
        self.expert_params = np.zeros(p)
        self.replicated = np.zeros(p)
        self.body_flop = np.zeros(p)
        self.core_flop = np.zeros(p)
        self.core3_flop = np.zeros(p)
        zero3: list[list[tuple[int, int]]] = []
        zero3_expert: list[list[tuple[int, int]]] = []
        moe = [model.is_moe_layer(i) for i in range(model.num_layers)]
        # every layer of a kind has the same parameters
        kind_params = {flag: layer_params(model, moe.index(flag), tp=par.tp, ep=par.ep) for flag in set(moe)}
        split = virtual_stage_layers(model, par)
        for s in range(p):
            chunks = [split[chunk * p + s] for chunk in range(par.virtual_pipeline_size)]
            layers = [layer for chunk in chunks for layer in chunk]
            self.layers[s] = len(layers)
            self.moe_layers[s] = sum(moe[layer] for layer in layers)
            lps = [kind_params[moe[layer]] for layer in layers]
            # stage_params of each chunk: its layers plus the embedding-side parameters of the first and last chunk
            ends = [stage_params(model, range(0), tp=par.tp, ep=par.ep, first=(s == 0 and i == 0),
                                 last=(s == p - 1 and i == len(chunks) - 1)) for i in range(len(chunks))]
            self.dense_params[s] = sum(x.dense for x in ends) + sum(lp.tp_sharded // par.tp + lp.replicated for lp in lps)
            self.expert_params[s] = sum(lp.expert // (par.ep * par.tp) for lp in lps)
            self.replicated[s] = sum(lp.replicated for lp in lps) + (
                model.hidden_size * (2 if model.normalization == "layernorm" else 1) if s == p - 1 else 0)
            self.body_flop[s] = sum(tf.layers[i] for i in layers)
            self.core_flop[s] = sum(tf.attention_core[i] for i in layers)
            self.core3_flop[s] = sum(3 * tf.attention_core[i] for i in layers)
            zero3.append(self._zero3_sizes(model, par, lps, s, expert=False))
            zero3_expert.append(self._zero3_sizes(model, par, lps, s, expert=True))
        self.zero3, self.zero3_expert = _padded(zero3), _padded(zero3_expert)
        self.tp_span = spans("tp")
        self.cp_span = spans("cp", pairs=True)
        self.dp_span = spans("dp-cp")
        self.edp_span = spans("expert-dp")
        self.ep_span = spans("ep")
        self.dp_size = par.dp * par.cp
        self.edp_size = par.expert_dp
        # pipeline boundaries: half of each transfer on the sender's stage, half on the receiver's
        self.pp_halves = np.zeros((2, p))  # [inside one node, across nodes] per stage
        self.pp_sets = np.zeros(2)
        if p > 1:
            pp_groups = layout.groups("pp")
            for k in range(p * par.virtual_pipeline_size - 1):
                a, b = k % p, (k + 1) % p
                across = int(np.any(pp_groups[:, a] // gpn != pp_groups[:, b] // gpn))  # the slowest pair
                self.pp_halves[across, a] += 1
                self.pp_halves[across, b] += 1
                self.pp_sets[across] += 2
        self.emb = p > 1 and model.tied_embeddings
        emb_groups = layout.groups("emb")
        self.emb_span = _spans(emb_groups, np.zeros(len(emb_groups), dtype=np.int64), 1, gpn) if self.emb else None
        self.emb_elements = model.padded_vocab_size(par.tp) * model.hidden_size // par.tp
        self.split_note = pipeline_split_note(model, par)

    @staticmethod
    def _zero3_sizes(model: ModelSpec, par: ParallelSpec, lps: list[Any], stage: int, *, expert: bool) -> list[tuple[int, int]]:
        """(elements, ops per micro-batch) of the ZeRO-3 gathers of one stage, as :func:`workload.dense._zero3_ops`."""
        by_size: dict[int, int] = {}
        for lp in lps:
            n = lp.expert // (par.ep * par.tp) if expert else lp.tp_sharded // par.tp + lp.replicated
            if n:
                by_size[n] = by_size.get(n, 0) + 1
        if not expert:
            whole = stage_params(model, range(0), tp=par.tp, ep=par.ep, first=stage == 0, last=stage == par.pp - 1).dense
            if whole:
                by_size[whole] = by_size.get(whole, 0) + 1
        return list(by_size.items())


class _Times:
    """Alpha-beta op times and bus bandwidths on one structure, for arrays of sizes."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster

    def t(self, op: str, size: Any, span: _Span) -> np.ndarray:
        return np.asarray(alpha_beta_time_s(self.cluster, op, size, *span))

    def bb(self, op: str, span: _Span) -> np.ndarray:
        return np.asarray(alpha_beta_busbw_bytes_per_s(self.cluster, op, *span))


def _col(pars: Sequence[ParallelSpec], name: str, dtype: Any = np.int64) -> np.ndarray:
    return np.array([getattr(p, name) for p in pars], dtype=dtype)[:, None]


def _supported(model: ModelSpec, p: ParallelSpec) -> bool:
    """Megatron's workload with balanced routing (gradient buckets are checked per structure)."""
    return p.framework == "megatron" and not (model.is_moe and model.capacity_factor is not None)


def estimate_many(model: ModelSpec, cluster: ClusterSpec, parallels: Sequence[ParallelSpec], *,
                  gpu_util: float | None = None, gpu: Any = None) -> list[Estimate]:
    """The refined estimate of every configuration in ``parallels`` (see the module docstring), in order.

    Raises :class:`ConfigError` as :func:`commscope.estimate.estimate` and :func:`commscope.predict` would for
    the first invalid configuration.
    """
    if gpu_util is not None and not 0 < gpu_util <= 1:
        raise ConfigError("gpu_util", gpu_util, "must be in (0, 1]")
    gpu_spec, base_notes = compute_gpu(cluster, gpu_util, gpu)
    u = cluster.gpu_util if gpu_util is None else gpu_util
    out: list[Estimate | None] = [None] * len(parallels)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, par in enumerate(parallels):
        check_job(model, par)
        if _supported(model, par):
            groups.setdefault(_structure_key(par), []).append(i)
        else:
            out[i] = _scalar(model, cluster, par, gpu_util, gpu)
    supported = [parallels[i] for idx in groups.values() for i in idx]
    layer_compute = _layer_computes(model, supported, gpu_spec) if gpu_spec is not None else {}
    for idx in groups.values():
        pars = [parallels[i] for i in idx]
        st = _Structure(model, pars[0], cluster.gpus_per_node)
        one_bucket = [_fits_one_bucket(st, p) for p in pars]
        fast = [i for i, ok in zip(idx, one_bucket) if ok]
        for i, ok in zip(idx, one_bucket):
            if not ok:
                out[i] = _scalar(model, cluster, parallels[i], gpu_util, gpu)
        if fast:
            for i, e in zip(fast, _group(model, cluster, [parallels[i] for i in fast], st, gpu_spec, u, base_notes,
                                         layer_compute)):
                out[i] = e
    return [e for e in out if e is not None]


def _scalar(model: ModelSpec, cluster: ClusterSpec, par: ParallelSpec, gpu_util: float | None, gpu: Any) -> Estimate:
    from commscope.api import predict

    return estimate(predict(model, par, cluster), gpu_util=gpu_util, gpu=gpu)


def _fits_one_bucket(st: _Structure, p: ParallelSpec) -> bool:
    bucket = p.grad_bucket_elements
    return bucket is None or bucket >= max(st.dense_params.max(initial=0), st.expert_params.max(initial=0))


# ---------------------------------------------------------------------------------------------------- compute


_KIND_FIELDS = ("fwd", "bwd", "recompute", "lin_fwd", "lin_bwd", "att_fwd", "att_bwd", "mem_fwd", "mem_bwd",
                "recompute_linear", "flop", "lin_flop", "lin_time", "clock", "chunks", "gaps_fwd", "gaps_bwd")


def _compute_key(par: ParallelSpec) -> tuple[Any, ...]:
    """What one layer's compute depends on."""
    return (par.tp, par.cp, par.ep, par.micro_batch_size, par.sequence_parallel, par.recompute, par.attention,
            par.fp8_format, par.tp_comm_overlap, par.framework)


def _layer_computes(model: ModelSpec, pars: Sequence[ParallelSpec], gpu: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The compute model's per-layer and per-stage-end quantities of every distinct :func:`_compute_key`, their
    GEMMs timed together (:class:`~commscope.compute.gemm.GemmTimer`)."""
    from commscope.compute.gemm import GemmTimer, layer_gemms
    from commscope.compute.model import _kind, logits_times, timed_attention

    specs: dict[tuple[Any, ...], ParallelSpec] = {}
    attention_notes: dict[tuple[Any, ...], tuple[str, ...]] = {}
    for par in pars:
        key = _compute_key(par)
        if key not in specs:
            # as stage_compute: attention as the GPU runs it
            specs[key], attention_notes[key] = timed_attention(model, ParallelSpec(
                tp=par.tp, cp=par.cp, ep=par.ep, dp=par.ep, micro_batch_size=par.micro_batch_size,
                global_batch_size=par.micro_batch_size * par.ep, sequence_parallel=par.sequence_parallel,
                recompute=par.recompute, attention=par.attention, fp8_format=par.fp8_format,
                tp_comm_overlap=par.tp_comm_overlap and par.tp > 1, framework=par.framework), gpu)
    kinds = [k for k, present in (("dense", model.num_layers > model.num_moe_layers), ("moe", model.is_moe)) if present]
    timer = GemmTimer(gpu)
    for spec in specs.values():
        gemms = [g for kind in kinds for g in layer_gemms(model, spec, layer_kind=kind, attention=spec.attention)]
        for dtype in {linear_gemm_dtype(model, spec), model.dtype}:
            timer.prefetch(gemms, dtype)
        timer.prefetch(layer_gemms(model, spec, logits=True), model.dtype)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, spec in specs.items():
        per_kind = {kind: dict.fromkeys(_KIND_FIELDS, 0.0) for kind in ("dense", "moe")}
        for kind in kinds:
            k = _kind(model, spec, gpu, kind, timer)
            per_kind[kind] = {f: getattr(k, f) for f in _KIND_FIELDS}
        logits_gemms = layer_gemms(model, spec, logits=True)
        out[key] = {
            "kinds": per_kind, "logits": logits_times(model, spec, gpu, timer),
            "logits_flop": sum(g.flop for g in logits_gemms), "lin_dtype": linear_gemm_dtype(model, spec),
            "extra": {(f, la): stage_extra_bytes(model, spec, first=f, last=la) for f in (False, True) for la in (False, True)},
            "notes": list(attention_notes[key]), "attention": spec.attention}
    return out


def _gpu_compute(model: ModelSpec, pars: Sequence[ParallelSpec], st: _Structure, gpu: Any,
                 layers: dict[tuple[Any, ...], dict[str, Any]],
                 cluster_efficiency: float = 1.0) -> tuple[dict[str, np.ndarray], list[tuple[str, ...]]]:
    """Per-stage arrays of :class:`~commscope.compute.model.StageCompute` for every configuration (n, p)."""
    p = st.p
    per = [layers[_compute_key(par)] for par in pars]
    nd = (st.layers - st.moe_layers)[None, :]
    nm = st.moe_layers[None, :]

    dense = np.array([[c["kinds"]["dense"][f] for f in _KIND_FIELDS] for c in per])
    moe = np.array([[c["kinds"]["moe"][f] for f in _KIND_FIELDS] for c in per])

    def layer(field: str) -> np.ndarray:
        i = _KIND_FIELDS.index(field)
        return np.asarray(nd * dense[:, i:i + 1] + nm * moe[:, i:i + 1])

    last = (np.arange(p) == p - 1)[None, :]
    bw = gpu.streaming_bandwidth_bytes_per_s
    ext = np.zeros((len(pars), p, 2))
    for j, c in enumerate(per):
        for s in range(p):
            ext[j, s] = c["extra"][(s == 0, s == p - 1)]
    lg = {k: np.array([c["logits"][k] for c in per])[:, None] for k in ("fwd", "dgrad", "wgrad")}
    a: dict[str, np.ndarray] = {}
    a["fwd"] = layer("fwd") + ext[:, :, 0] / bw + last * lg["fwd"]
    a["bwd"] = layer("bwd") + ext[:, :, 1] / bw + last * (lg["dgrad"] + lg["wgrad"])
    a["rec"] = layer("recompute")
    a["gemm"] = layer("lin_fwd") + layer("lin_bwd") + last * (lg["fwd"] + lg["dgrad"] + lg["wgrad"])
    a["att"] = layer("att_fwd") + layer("att_bwd")
    a["mem"] = layer("mem_fwd") + layer("mem_bwd") + (ext[:, :, 0] + ext[:, :, 1]) / bw
    a["lin_f"] = layer("lin_fwd")
    a["lin_b"] = layer("lin_bwd") + layer("recompute_linear")
    a["flop"] = layer("flop") + last * np.array([c["logits_flop"] for c in per])[:, None]
    a["lin_flop"] = layer("lin_flop")
    a["lin_time"] = layer("lin_time")
    a["clock"] = layer("clock") + last * (lg["fwd"] + lg["dgrad"] + lg["wgrad"]) * (1.0 - 1.0 / gpu.clock_factor)
    a["chunks"] = layer("chunks")
    a["gaps"] = layer("gaps_fwd") + layer("gaps_bwd")
    # without gradient accumulation fusion, each micro-batch's backward adds its weight gradients into the
    # accumulated ones (compute.kernels.grad_accumulation_bytes_per_param)
    accumulate = ((st.dense_params + st.expert_params)[None, :]
                  * np.array([grad_accumulation_bytes_per_param(model, par) for par in pars])[:, None] / bw)
    a["bwd"] = a["bwd"] + accumulate
    a["mem"] = a["mem"] + accumulate
    shards = np.array([par.shards_optimizer for par in pars])[:, None]
    a["opt"] = adam_step_time_s(model, gpu, dense_params=st.dense_params[None, :], expert_params=st.expert_params[None, :],
                                dense_shard=np.where(shards, st.dp_size, 1), expert_shard=np.where(shards, st.edp_size, 1))
    # the stack's and the cluster's compute efficiency (compute.model.apply_efficiency), per configuration
    effs = np.array([compute_efficiency(par, cluster_efficiency) for par in pars])[:, None]
    scale = 1.0 / effs
    a["stack"] = (a["fwd"] + a["bwd"]) * (scale - 1.0)
    a["stack_opt"] = a["opt"] * (scale - 1.0)
    for key in TIME_ARRAYS:
        a[key] = a[key] * scale
    # the compute model's note: FLOP-weighted GEMM efficiency of its slowest stage
    crit = first_max(a["fwd"] + a["bwd"])
    rows = np.arange(len(pars))
    lin_flop, lin_time = a["lin_flop"][rows, crit], a["lin_time"][rows, crit]
    notes = []
    for j, (par, c) in enumerate(zip(pars, per)):
        peak = gpu.peak_flops_for(c["lin_dtype"])
        eff = float(lin_flop[j] / (lin_time[j] * peak)) if lin_time[j] else 0.0
        line = compute_note(gpu, c["lin_dtype"], eff, replace(par, attention=c["attention"]))
        accumulation = grad_accumulation_note(model, par)
        effects = effects_notes(model, par, gpu, {k: v[j] for k, v in a.items()}, int(crit[j]), float(effs[j, 0]))
        notes.append((*c["notes"], *((accumulation,) if accumulation else ()), line, *effects))
    return a, notes


def _flop_compute(model: ModelSpec, pars: Sequence[ParallelSpec], st: _Structure, u: float,
                  peak: float) -> dict[str, np.ndarray]:
    """:func:`commscope.estimate._flop_compute` for every configuration (n, p)."""
    tf = token_flops(model)
    p = st.p
    tokens_mb = _col(pars, "micro_batch_size") * model.seq_len / _col(pars, "cp")
    rate = _col(pars, "tp") * u * peak
    f = st.body_flop[None, :] + np.where(np.arange(p) == p - 1, tf.logits, 0.0)[None, :]
    rc = np.array([par.recompute for par in pars])[:, None]
    extra = np.where(rc == "selective", st.core_flop[None, :], np.where(rc == "full", st.body_flop[None, :], 0.0))
    fwd = tokens_mb * f / rate
    bwd = tokens_mb * (2 * f + extra) / rate
    att = tokens_mb * st.core3_flop[None, :] / rate
    return {"fwd": fwd, "bwd": bwd, "att": att, "lin_f": fwd, "lin_b": bwd, "opt": np.zeros_like(fwd)}


# ---------------------------------------------------------------------------------------------- communication


def _group(model: ModelSpec, cluster: ClusterSpec, pars: list[ParallelSpec], st: _Structure, gpu: Any, u_flops: float,
           base_notes: list[str], cache: dict[tuple[Any, ...], Any]) -> list[Estimate]:
    n, p = len(pars), st.p
    T = _Times(cluster)
    peak = cluster.peak_flops_for(model.dtype)
    if gpu is not None:
        c, compute_notes = _gpu_compute(model, pars, st, gpu, cache, cluster.compute_efficiency)
    else:
        c, compute_notes = _flop_compute(model, pars, st, u_flops, peak), [()] * n
    fwd, bwd = c["fwd"], c["bwd"]

    tp, cp_, ep = pars[0].tp, pars[0].cp, pars[0].ep
    mb, gb = _col(pars, "micro_batch_size"), _col(pars, "global_batch_size")
    m = gb // (mb * pars[0].dp)
    B = model.dtype_bytes
    G = np.array([dtype_bytes(grad_dtype(model, par)) for par in pars])[:, None]
    tokens = mb * model.seq_len // cp_
    act = tokens * model.hidden_size * B
    sp = np.array([par.sequence_parallel and tp > 1 for par in pars])[:, None]
    full = np.array([par.recompute == "full" for par in pars])[:, None]
    zero3 = np.array([par.zero_stage == 3 for par in pars])[:, None]
    shards = np.array([par.shards_optimizer for par in pars])[:, None]
    stage = np.arange(p)[None, :]
    first, last = stage == 0, stage == p - 1
    L = st.layers[None, :]
    z = np.zeros((n, p))
    comm = {a: {k: z.copy() for k in ("fwd", "bwd", "iter")} for a in ("tp", "pp", "dp", "ep", "cp", "emb")}
    bb_sum: dict[str, np.ndarray] = {}
    bb_cnt: dict[str, np.ndarray] = {}

    def busbw(axis: str, op: str, span: _Span, count: Any) -> None:
        """Add ``count`` op sets (per stage, or a total) at ``span`` to the axis's mean bus bandwidth."""
        cnt = np.broadcast_to(np.asarray(count, dtype=float), (n, p) if np.ndim(count) else ())
        total = (cnt * T.bb(op, span)[None, :]).sum(axis=1) if np.ndim(count) else cnt * T.bb(op, span).sum()
        num = cnt.sum(axis=1) if np.ndim(count) else np.full(n, float(cnt) * len(span[0]))
        bb_sum[axis] = bb_sum.get(axis, 0.0) + total
        bb_cnt[axis] = bb_cnt.get(axis, 0.0) + num

    has_layers = L > 0
    if tp > 1:
        span = st.tp_span
        t_ar, t_ag, t_rs = (T.t(op, act, span) for op in ("all_reduce", "all_gather", "reduce_scatter"))
        t_ce = T.t("all_reduce", tokens * dtype_bytes("fp32"), span)
        lm = L * m
        rec = 1 + full
        f = comm["tp"]["fwd"]
        b = comm["tp"]["bwd"]
        f += np.where(sp, 2 * (t_ag * lm + t_rs * lm), 2 * t_ar * lm)
        b += np.where(sp, 2 * (t_ag * lm + t_rs * lm) * rec, 2 * t_ar * lm * rec)
        f += first * np.where(sp, t_rs * m, t_ar * m)
        b += first * np.where(sp, t_ag * m, 0.0)
        f += last * (np.where(sp, t_ag * m, 0.0) + t_ce * (3 * m))
        b += last * np.where(sp, t_rs * m, t_ar * m)
        repl = st.replicated[None, :] * G
        comm["tp"]["iter"] += np.where(sp & (repl > 0), T.t("all_reduce", repl, span), 0.0)
        per_layer_sets = has_layers * 2 * (2 + full)  # of each of AG and RS with SP, of AR twice that without
        busbw("tp", "all_gather", span, np.where(sp, per_layer_sets + first + last, 0))
        busbw("tp", "reduce_scatter", span, np.where(sp, per_layer_sets + first + last, 0))
        # (counts as integers: numpy adds two boolean arrays as a logical or, which would count the last stage's
        # cross-entropy and sequence-parallel gradient all-reduces as one)
        busbw("tp", "all_reduce", span, np.where(sp, last.astype(np.int64) + (repl > 0), per_layer_sets + first + 2 * last))
    if cp_ > 1:
        kv = 2 * tokens * max(1, model.kv_heads // tp) * model.head_size * B
        t_kv = T.t("send", kv, st.cp_span)
        steps_bwd = 2 * (cp_ - 1) + np.where(full, cp_ - 1, 0)
        comm["cp"]["fwd"] += t_kv * (L * m * (cp_ - 1))
        comm["cp"]["bwd"] += t_kv * (L * m * steps_bwd)
        busbw("cp", "send", st.cp_span, has_layers * 2 * np.ones((n, 1)))
    if p > 1:
        size = np.where(sp, act // tp, act)
        inside = T.t("send", size, (np.array([2]), np.array([1]), np.array([1]))) * m
        across = T.t("send", size, (np.array([2]), np.array([2]), np.array([1]))) * m
        half = st.pp_halves[0][None, :] * (inside / 2) + st.pp_halves[1][None, :] * (across / 2)
        comm["pp"]["fwd"] += half
        comm["pp"]["bwd"] += half
        for j, nodes in enumerate((1, 2)):
            if st.pp_sets[j]:
                busbw("pp", "send", (np.array([2]), np.array([nodes]), np.array([1])), float(st.pp_sets[j]))
    grad_buckets: list[np.ndarray] = []  # one bucket per stage of dense, then of expert parameters (0 s: none)
    param_buckets: list[np.ndarray] = []
    for elements, span, size_dp, entries in ((st.dense_params, st.dp_span, st.dp_size, st.zero3),
                                             (st.expert_params, st.edp_span, st.edp_size, st.zero3_expert)):
        if size_dp < 2:
            continue
        present = (elements > 0)[None, :]
        if not present.any():
            continue
        ag_b = T.t("all_gather", elements[None, :] * B, span)
        rs_g = T.t("reduce_scatter", elements[None, :] * G, span)
        ar_g = T.t("all_reduce", elements[None, :] * G, span)
        grad_buckets.append(np.where(~zero3 & present, np.where(shards, rs_g, ar_g), 0.0))
        param_buckets.append(np.where(~zero3 & present & shards, ag_b, 0.0))
        z3_sets = np.zeros(p)
        if zero3.any():
            num, per_mb = entries  # (stages, sizes): elements and ops per micro-batch of each gather size
            stage_span = (span[0][:, None], span[1][:, None], span[2][:, None])
            t_ag = T.t("all_gather", num * B, stage_span)[None]
            t_rs = T.t("reduce_scatter", num[None] * G[:, :, None], stage_span)
            count = per_mb[None] * m[:, :, None]
            comm["dp"]["fwd"] += np.where(zero3, (t_ag * count).sum(axis=2), 0.0)
            comm["dp"]["bwd"] += np.where(zero3, (t_ag * count + t_rs * count).sum(axis=2), 0.0)
            z3_sets = (per_mb > 0).sum(axis=1) * present[0]
        busbw("dp", "all_gather", span, np.where(zero3, 2 * z3_sets[None, :], present & shards))
        busbw("dp", "reduce_scatter", span, np.where(zero3, z3_sets[None, :], present & shards))
        busbw("dp", "all_reduce", span, np.where(zero3 | shards, 0, present))
    if st.emb_span is not None:
        t_emb = T.t("all_reduce", st.emb_elements * G[:, 0], st.emb_span)
        comm["emb"]["iter"][:, 0] += t_emb
        comm["emb"]["iter"][:, p - 1] += t_emb
        busbw("emb", "all_reduce", st.emb_span, 1.0)
    if model.is_moe and ep > 1:
        from commscope.moe.routing import balanced_routing

        nm = st.moe_layers[None, :]
        routed = np.where(sp, tokens // tp, tokens)
        a2a = np.array([int(balanced_routing(int(r), model.top_k, ep).sum(axis=1).max()) for r in routed[:, 0]])[:, None]
        a2a = a2a * model.hidden_size * B
        t_a2a = T.t("all_to_all", a2a, st.ep_span)
        t_cnt = T.t("all_gather", ep * model.num_experts * 8, st.ep_span)[None, :]
        comm["ep"]["fwd"] += t_cnt * (nm * m) + t_a2a * (nm * m) * 2
        comm["ep"]["bwd"] += t_a2a * (nm * m) * 2
        with_moe = (nm > 0) * np.ones((n, 1))
        busbw("ep", "all_gather", st.ep_span, with_moe)
        busbw("ep", "all_to_all", st.ep_span, 4 * with_moe)

    # --- the pipeline schedule (estimate._refined, vectorised over configurations) ---
    v = _col(pars, "virtual_pipeline_size")
    tp_overlap = _col(pars, "tp_comm_overlap", bool)
    tp_all = comm["tp"]["fwd"] + comm["tp"]["bwd"]
    tp_exp = np.where(tp_overlap, np.maximum(0.0, comm["tp"]["fwd"] - m * c["lin_f"])
                      + np.maximum(0.0, comm["tp"]["bwd"] - m * c["lin_b"]), tp_all)
    cp_all = comm["cp"]["fwd"] + comm["cp"]["bwd"]
    cp_exp = np.maximum(0.0, cp_all - m * c["att"])
    pp_all = comm["pp"]["fwd"] + comm["pp"]["bwd"]
    p2p_overlap = (v > 1) & _col(pars, "overlap_p2p_comm", bool)
    pp_exp = np.where(p2p_overlap, np.maximum(0.0, pp_all - m * (fwd + bwd)), pp_all)
    ep_all = comm["ep"]["fwd"] + comm["ep"]["bwd"]
    dp_layer = comm["dp"]["fwd"] + comm["dp"]["bwd"]
    dp_layer_exp = np.maximum(0.0, comm["dp"]["fwd"] - m * fwd) + np.maximum(0.0, comm["dp"]["bwd"] - m * bwd)
    sm = np.asarray(comm_sm_time_s(gpu, tp=tp_all - tp_exp, cp=cp_all - cp_exp, pp=pp_all - pp_exp,
                                   dp=dp_layer - dp_layer_exp)) * np.ones((n, p))
    per_mb = fwd + bwd + (sm + tp_exp + pp_exp + cp_exp + ep_all + dp_layer_exp) / m
    rows = np.arange(n)
    crit = first_max(per_mb)
    bubble = (per_mb.sum(axis=1) - per_mb[rows, crit]) / v[:, 0]
    grad_t, param_t = sum(grad_buckets, z), sum(param_buckets, z)
    grad_exp = np.where(_col(pars, "overlap_grad_reduce", bool), _overlapped_buckets(grad_buckets, bwd), grad_t)
    param_exp = np.where(_col(pars, "overlap_param_gather", bool), _late_gathers(param_buckets, fwd), param_t)
    dp_tail = grad_exp + param_exp + comm["dp"]["iter"]
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
    hid_tp = tp_all[rows, crit] - tp_exp[rows, crit]
    hid_cp = cp_all[rows, crit] - cp_exp[rows, crit]
    hid_pp = pp_all[rows, crit] - pp_exp[rows, crit]
    hid_dp = (dp_layer[rows, crit] - dp_layer_exp[rows, crit] + grad_t[rows, end] + param_t[rows, end]
              + comm["dp"]["iter"][rows, end] - terms["dp"])
    eff_axes = {a: bb_sum[a] / bb_cnt[a] for a in bb_sum}

    out = []
    for j, par in enumerate(pars):
        k = int(crit[j])
        notes = list(base_notes) + list(compute_notes[j])
        if par.tp_comm_overlap:
            notes.append("TP communication overlapped with the linear GEMMs of the same pass (--tp-comm-overlap)")
        if par.virtual_pipeline_size > 1 and par.overlap_p2p_comm:
            notes.append("pipeline sends/receives overlapped with the other model chunks' compute (interleaved schedule, "
                         "--overlap-p2p-communication)")
        if par.overlap_grad_reduce:
            notes.append("DP gradient buckets reduced during the last backward pass as they fill (--overlap-grad-reduce)")
        if par.overlap_param_gather:
            notes.append("parameter all-gathers overlapped with the next forward pass, bucket by bucket (--overlap-param-gather)")
        if st.split_note:
            notes.append(st.split_note)
        hidden = {key: float(val) for key, val in (("tp", hid_tp[j]), ("cp", hid_cp[j]), ("pp", hid_pp[j]), ("dp", hid_dp[j])) if val > HIDDEN_MIN_S}
        eff = {a: float(val[j]) for a, val in eff_axes.items() if bb_cnt[a][j] > 0}
        mj = int(m[j, 0])
        if gpu is not None:
            breakdown = {"gemm_s": float(c["gemm"][j, k] * mj), "attention_s": float(c["att"][j, k] * mj),
                         "memory_bound_s": float(c["mem"][j, k] * mj), "recompute_s": float(c["rec"][j, k] * mj),
                         "optimizer_s": float(c["opt"][j, k]), "clock_s": float(c["clock"][j, k] * mj),
                         "overlap_chunks_s": float(c["chunks"][j, k] * mj), "launch_gaps_s": float(c["gaps"][j, k] * mj),
                         "stack_s": float(c["stack"][j, k] * mj + c["stack_opt"][j, k])}
            work = fwd[j, k] + bwd[j, k]
            u = float(c["flop"][j, k] / (work * peak)) if work > 0 else u_flops
        else:
            breakdown, u = {}, u_flops
        tj = {key: float(val[j]) for key, val in terms.items()}
        if gpu is not None:
            breakdown["comm_sms_s"] = float(sm[j, k]) + tj["sm"]
        out.append(_finish(_Job(model=model, parallel=par), "refined", u, peak,
                           comp=float(mj * (fwd[j, k] + bwd[j, k]) + sm[j, k]) + tj["sm"],
                           tp=float(tp_exp[j, k]) + tj["tp"], pp=float(pp_exp[j, k]),
                           dp=float(dp_layer_exp[j, k]) + tj["dp"], ep=float(ep_all[j, k]), cp=float(cp_exp[j, k]),
                           emb=tj["emb"], bubble=float(bubble[j]), stage=k, eff=eff, notes=notes, optimizer=tj["opt"],
                           hidden=hidden, breakdown=breakdown, compute_model="gpu" if gpu is not None else "flops",
                           micro_batch=float(per_mb[j, k]), tail=sum(tj.values()), stage_micro_batch=per_mb[j]))
    return out
