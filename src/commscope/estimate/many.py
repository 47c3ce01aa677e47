"""Op-level estimates of many configurations at once: :func:`commscope.estimate.estimate`, vectorised.

``estimate_many(model, cluster, parallels)`` returns, for every ParallelSpec, the Estimate that
``estimate(predict(model, parallel, cluster))`` returns (the refined method: every op of the Megatron workload
timed by the alpha-beta model, compute by the GPU's model per stage), without building workloads or traffic
matrices. Equal up to the order of floating-point sums (relative 1e-12; tests/estimate/test_estimate_many.py holds it
equal to the scalar path, and both to :func:`commscope.estimate.estimate_op_by_op`, on random configurations).

How: the configurations are checked once per distinct job (:func:`commscope.pattern.workload.dense.check_job`), grouped by
pipeline depth, and each group goes through the closed form of :mod:`commscope.estimate.closed_form` (spans of the layout,
layers and parameters of the split, communication and the pipeline schedule as (configurations, stages) arrays) at
once. The layer compute of :mod:`commscope.estimate.compute.model` is computed once per distinct (tp, cp, ep, micro-batch, sp,
recomputation, attention, fp8), its GEMMs timed together, and summed per stage by layer counts: what
:func:`commscope.estimate.compute.model.stage_compute` gives each configuration, without a loop over its stages and layers.

Configurations outside the closed form (another framework, MoE capacity factors, more than
:data:`commscope.estimate.closed_form.MAX_GRAD_BUCKETS` gradient buckets on a stage) go op by op, so every input gets
its exact estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from commscope.estimate.compute.kernels import (
    adam_step_time_s,
    attention_core_s,
    grad_accumulation_bytes_per_param,
    grad_accumulation_note,
    linear_gemm_dtype,
)
from commscope.estimate.compute.model import (
    ROW_FIELDS,
    compute_efficiency,
    compute_note,
    effects_notes,
    first_max,
    stage_arrays,
    stage_ends_bytes,
)
from commscope.errors import ConfigError
from commscope.estimate.closed_form import (
    _CHECK_KEY,
    _FIELDS,
    _ROW,
    _SPANS_KEY,
    _STAGES_KEY,
    MAX_GRAD_BUCKETS,
    _Arrays,
    _evaluate,
    _first_rows,
    _flop_arrays,
    _keys,
    _numeric,
)
from commscope.estimate.iteration import compute_gpu, estimate_op_by_op
from commscope.estimate.stage_structure import _spans, _Spans, _stages
from commscope.estimate.terms import Estimate
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.workload.dense import check_job

__all__ = ["estimate_many"]

# ------------------------------------------------------------------------------------------------- entry points


def estimate_many(model: ModelSpec, cluster: ClusterSpec, parallels: Sequence[ParallelSpec], *,
                  gpu_util: float | None = None, gpu: Any = None) -> list[Estimate]:
    """The refined estimate of every configuration in ``parallels`` (see the module docstring), in order.

    Raises :class:`ConfigError` as :func:`commscope.estimate.estimate` and :func:`commscope.predict` would for
    the first invalid configuration.
    """
    if gpu_util is not None and not 0 < gpu_util <= 1:
        raise ConfigError("gpu_util", gpu_util, "must be in (0, 1]")
    if not parallels:
        return []
    gpu_spec, base_notes = compute_gpu(cluster, gpu_util, gpu)
    u = cluster.gpu_util if gpu_util is None else gpu_util
    columns: dict[str, Any] = dict(zip(_FIELDS, zip(*map(_ROW, parallels))))
    keys = _Keys(columns)
    # every distinct job checked once, in order: the first invalid configuration raises, as one by one
    check_keys, check_index = keys.of(_CHECK_KEY)
    first_of = np.full(len(check_keys), len(parallels))
    np.minimum.at(first_of, check_index, np.arange(len(parallels)))
    for i in first_of:
        check_job(model, parallels[int(i)])
    stage_keys, stage_index = keys.of(_STAGES_KEY)
    zero3 = 3 in columns["zero_stage"]
    stages = [_stages(model, parallels[int(i)], zero3) for i in _first_rows(stage_index, len(stage_keys))]
    # the closed form: Megatron with balanced routing, and gradient buckets the arrays hold
    counted: dict[tuple[int, int | None], int] = {}
    buckets = [counted[k] if k in counted else counted.setdefault(k, stages[k[0]].num_buckets(k[1]))
               for k in zip(stage_index.tolist(), columns["grad_bucket_elements"])]
    ok = ((np.array(columns["framework"]) == "megatron") & (np.array(buckets) <= MAX_GRAD_BUCKETS)
          & (not (model.is_moe and model.capacity_factor is not None)))
    out: list[Estimate | None] = [None] * len(parallels)
    if ok.any():
        peak = cluster.peak_flops_for(model.dtype)
        layer_compute = _layer_computes(model, parallels, keys.of(_COMPUTE_KEY), np.flatnonzero(ok), gpu_spec) \
            if gpu_spec else None
        spans_index = keys.of(_SPANS_KEY)[1]
        numeric = _numeric(columns)
        spans: dict[int, _Spans] = {}
        alike: dict[tuple[Any, ...], tuple[np.ndarray, ...]] = {}  # stage 0's spans, shared by layouts alike
        pp = np.array(columns["pp"])
        for depth in np.unique(pp[ok]).tolist():
            rows = np.flatnonzero(ok & (pp == depth))
            for k in np.unique(spans_index[rows]).tolist():
                if k not in spans:
                    spans[k] = _spans(parallels[int(rows[spans_index[rows] == k][0])], cluster.gpus_per_node, model.is_moe,
                                      alike)
            a = _Arrays(model, parallels, numeric, columns, rows, spans, spans_index[rows], stages, stage_index[rows])
            if layer_compute is not None:
                c, compute_notes = _gpu_compute(model, a, gpu_spec, layer_compute, cluster.compute_efficiency)
            else:
                c, compute_notes = _flop_arrays(model, a, u, peak), [()] * len(rows)
            for i, e in zip(rows.tolist(), _evaluate(model, cluster, a, c, compute_notes,
                                                     gpu_spec if layer_compute is not None else None, u, base_notes)):
                out[i] = e
    for i in np.flatnonzero(~ok).tolist():
        out[i] = _op_by_op(model, cluster, parallels[i], gpu_util, gpu)
    return [e for e in out if e is not None]


def _firsts(keys: Sequence[Any]) -> dict[Any, int]:
    """Each distinct key of ``keys`` and the index of its first occurrence (without a Python loop over them)."""
    return dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))


class _Keys:
    """Distinct keys made of columns, for several sets of columns: the rows are reduced once to their distinct
    combinations of every column any set reads, and each set's keys are made from those."""

    def __init__(self, columns: dict[str, tuple[Any, ...]]) -> None:
        self.names = tuple(dict.fromkeys(_CHECK_KEY + _STAGES_KEY + _SPANS_KEY + _COMPUTE_KEY))
        self.distinct, self.index = _keys(columns, self.names)

    def of(self, names: tuple[str, ...]) -> tuple[list[tuple[Any, ...]], np.ndarray]:
        """The distinct keys made of ``names`` (in order of first appearance) and each row's index into them."""
        at = [self.names.index(n) for n in names]
        get = itemgetter(*at) if len(at) > 1 else lambda k: (k[at[0]],)  # (itemgetter of one index: not a tuple)
        first: dict[tuple[Any, ...], int] = {}
        local = np.array([first.setdefault(key, len(first)) for key in map(get, self.distinct)], dtype=np.int64)
        return list(first), local[self.index]


def _op_by_op(model: ModelSpec, cluster: ClusterSpec, par: ParallelSpec, gpu_util: float | None, gpu: Any) -> Estimate:
    from commscope.api import predict

    return estimate_op_by_op(predict(model, par, cluster), gpu_util=gpu_util, gpu=gpu)


# ---------------------------------------------------------------------------------------------------- compute


@dataclass(frozen=True, slots=True)
class _LayerCompute:
    """The compute model's quantities of every distinct :data:`_COMPUTE_KEY` (one row each) and each row's key."""

    dense: np.ndarray
    """(keys, fields): one dense layer's entries of the per-stage arrays (:data:`~commscope.estimate.compute.model.ROW_FIELDS`)."""
    moe: np.ndarray
    logits: np.ndarray
    """(keys, 3): the logits GEMMs' forward, dgrad, wgrad."""
    logits_flop: np.ndarray
    extra: np.ndarray
    """(keys, 4, 2): memory-bound (forward, backward) bytes of the first stage, a middle one, the last, and the one
    stage of pp 1 (first and last)."""
    lin_dtype: list[str]
    specs: dict[int, ParallelSpec]
    """A ParallelSpec of each key, attention as the GPU runs it (what the compute note names; its recomputation
    that of the first key of its group)."""
    notes: list[tuple[str, ...]]
    index: np.ndarray
    """Every configuration's key."""


#: What one layer's compute depends on (the compute model's inputs of a ParallelSpec).
_COMPUTE_KEY = ("tp", "cp", "ep", "micro_batch_size", "sequence_parallel", "recompute", "attention", "fp8_format",
                "tp_comm_overlap", "framework")


def _layer_computes(model: ModelSpec, parallels: Sequence[ParallelSpec],
                    compute_keys: tuple[list[tuple[Any, ...]], np.ndarray], rows: np.ndarray, gpu: Any) -> _LayerCompute:
    """The compute model's per-layer and per-stage-end quantities of every distinct compute key (``compute_keys``:
    the keys and each configuration's) among ``rows``, their GEMMs timed together
    (:class:`~commscope.estimate.compute.gemm.GemmTimer`). Keys that differ only in recomputation share everything
    but the layer's recomputed part: worked out once per group of them."""
    from commscope.estimate.compute.gemm import GemmTimer
    from commscope.estimate.compute.model import _kinds, job_gemms, logits_times, timed_attention

    keys, index = compute_keys
    wanted = set(index[rows].tolist())
    recompute_at = _COMPUTE_KEY.index("recompute")
    # the keys of each group (the key less recomputation), in order of first appearance
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, i in enumerate(_first_rows(index, len(keys))):
        if k in wanted:
            groups.setdefault(keys[k][:recompute_at] + keys[k][recompute_at + 1:], []).append(i)
    timer = GemmTimer(gpu)
    # per group: a ParallelSpec with attention as the GPU runs it (as stage_compute) and the attention notes, the
    # output layer's GEMMs and each layer kind's (all announced to the timer before any is timed)
    made = []
    for first, *_ in groups.values():
        par = parallels[first]
        spec, attention_notes = timed_attention(model, ParallelSpec(
            tp=par.tp, cp=par.cp, ep=par.ep, dp=par.ep, micro_batch_size=par.micro_batch_size,
            global_batch_size=par.micro_batch_size * par.ep, sequence_parallel=par.sequence_parallel,
            recompute=par.recompute, attention=par.attention, fp8_format=par.fp8_format,
            tp_comm_overlap=par.tp_comm_overlap and par.tp > 1, framework=par.framework), gpu)
        plans, logits_gemms = job_gemms(model, spec, gpu, timer)
        made.append((spec, attention_notes, logits_gemms, plans))
    width = len(keys)
    per_kind = {kind: np.zeros((width, len(ROW_FIELDS))) for kind in ("dense", "moe")}
    logits, logits_flop, extra = np.zeros((width, 3)), np.zeros(width), np.zeros((width, 4, 2))
    lin_dtype = [""] * width
    notes: list[tuple[str, ...]] = [()] * width
    specs: dict[int, ParallelSpec] = {}
    for firsts, (spec, attention_notes, logits_gemms, plans) in zip(groups.values(), made):
        group = [int(index[i]) for i in firsts]
        recomputes = tuple(parallels[i].recompute for i in firsts)
        attention = attention_core_s(model, spec, gpu)
        for kind, plan in plans.items():
            layers = _kinds(model, spec, gpu, kind, timer, recomputes, plan, attention)
            for k, recompute in zip(group, recomputes):
                per_kind[kind][k] = layers[recompute].row()
        by_pass = logits_times(model, spec, gpu, timer, logits_gemms)
        logits[group] = [by_pass["fwd"], by_pass["dgrad"], by_pass["wgrad"]]
        logits_flop[group] = sum(g.flop for g in logits_gemms)
        extra[group] = stage_ends_bytes(model, spec)
        for k in group:
            # (the compute note reads the attention and the framework of it: a group's spec is each key's)
            specs[k], lin_dtype[k], notes[k] = spec, linear_gemm_dtype(model, spec), attention_notes
    return _LayerCompute(dense=per_kind["dense"], moe=per_kind["moe"], logits=logits, logits_flop=logits_flop,
                         extra=extra, lin_dtype=lin_dtype, specs=specs, notes=notes, index=index)


def _gpu_compute(model: ModelSpec, a: _Arrays, gpu: Any, lc: _LayerCompute,
                 cluster_efficiency: float = 1.0) -> tuple[dict[str, np.ndarray], list[tuple[str, ...]]]:
    """Per-stage arrays of :class:`~commscope.estimate.compute.model.StageCompute` for every configuration (n, p)."""
    key = lc.index[a.rows]
    # (gradient accumulation depends on the fusion flag, the gradients' dtype and the micro-batches)
    akeys = list(zip(a.values("gradient_accumulation_fusion"), a.values("grad_reduce_dtype"), a.m[:, 0].tolist()))
    accumulation = {akey: (grad_accumulation_bytes_per_param(model, a.pars[j]), grad_accumulation_note(model, a.pars[j]))
                    for akey, j in _firsts(akeys).items()}
    stacks = a.values("stack")
    efficiency = {st: compute_efficiency(a.pars[j], cluster_efficiency) for st, j in _firsts(stacks).items()}
    accumulation_bytes = [accumulation[k][0] for k in akeys]
    # (a dense model's MoE term is 0.0 everywhere, and adding it changes no time: left out; so are the gradient
    # accumulation where every configuration fuses it and the efficiency where every one's is 1)
    c = stage_arrays(
        gpu, dense=lc.dense[key], moe=lc.moe[key] if model.is_moe else None, dense_layers=a.st_layers - a.st_moe_layers,
        moe_layers=a.st_moe_layers, extra_bytes=lc.extra[key], logits=lc.logits[key], logits_flop=lc.logits_flop[key],
        params=a.st_dense_params + a.st_expert_params,
        accumulation_bytes=np.array(accumulation_bytes, dtype=np.float64)[:, None] if any(accumulation_bytes) else None,
        optimizer_s=adam_step_time_s(model, gpu, dense_params=a.st_dense_params, expert_params=a.st_expert_params,
                                     dense_shard=np.where(a.shards, a.dp * a.cp, 1),
                                     expert_shard=np.where(a.shards, a.dp * a.cp // a.ep, 1)),
        efficiency=np.array([efficiency[st] for st in stacks])[:, None]
        if any(e != 1.0 for e in efficiency.values()) else None)
    lin_flop, lin_time = c.pop("lin_flop"), c.pop("lin_time")
    # the compute model's notes: FLOP-weighted GEMM efficiency of its slowest stage (one note per whole percent, as
    # "{:.0%}" formats it: the product by 100 rounded half to even), and the in-training effects on that stage
    crit = first_max(c["fwd"] + c["bwd"])
    rows = np.arange(a.n)
    lin_flop, lin_time = lin_flop[rows, crit], lin_time[rows, crit]
    peaks = {dt: gpu.peak_flops_for(dt) if dt else 1.0 for dt in set(lc.lin_dtype)}
    peak = np.array([peaks[dt] for dt in lc.lin_dtype])[key]
    eff = np.where(lin_time > 0, lin_flop / (np.where(lin_time > 0, lin_time, 1.0) * peak), 0.0)
    # the critical stage's quantities that the in-training effects' notes read, (n,) each
    critical = {name: c[name][rows, crit] for name in ("fwd", "bwd", "clock", "chunks", "gaps", "stack")}
    # configurations alike in all a note reads share their notes: worked out for the first of each
    note_keys = list(zip(key.tolist(), np.rint(eff * 100).tolist(), [accumulation[k][1] for k in akeys], stacks,
                         *(x.tolist() for x in critical.values())))
    effs = eff.tolist()
    lines: dict[tuple[Any, ...], str] = {}
    made: dict[tuple[Any, ...], tuple[str, ...]] = {}
    for note_key, j in sorted(_firsts(note_keys).items(), key=itemgetter(1)):
        k, pct, note, st = note_key[:4]
        # (the compute model's line reads the linear GEMMs' dtype, the attention and the framework of a key)
        line_key = (lc.lin_dtype[k], lc.specs[k].attention, lc.specs[k].framework, pct)
        if line_key not in lines:
            lines[line_key] = compute_note(gpu, lc.lin_dtype[k], effs[j], lc.specs[k])
        made[note_key] = (*lc.notes[k], *((note,) if note else ()), lines[line_key],
                          *effects_notes(model, a.pars[j], gpu, critical, j, efficiency[st]))
    notes = list(map(made.__getitem__, note_keys))
    return c, notes

