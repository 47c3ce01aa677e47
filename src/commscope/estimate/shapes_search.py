"""Nearby model shapes that run faster: the shape search.

:func:`suggest_shapes` searches shapes near a model's (hidden size, heads, FFN, layers) whose parameter count stays
within a tolerance (default 5%), screens them by their GEMM time per micro-batch in one vectorised call of the GEMM
model (:func:`_gemm_times_s`), and ranks the best by the iteration time of :func:`commscope.estimate.estimate`, whose
compute model (:mod:`commscope.estimate.compute`) times every GEMM of the shape with the same tile/wave model.
Communication follows from the shape through the estimate (time) and :func:`commscope.pattern.volumes.axis_volumes`
(bytes). Part of :mod:`commscope.estimate.shapes`, which re-exports its names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from commscope.errors import ConfigError
from commscope.estimate.compute.gemm import ALIGN_ELEMENTS, Gemm, layer_gemms, time_gemms
from commscope.estimate.gpus import GpuSpec, gpu_for_cluster
from commscope.estimate.shapes_report import _gemm_efficiency, _shape_dict
from commscope.estimate.shapes_rules import _broken
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import Attention, ParallelSpec


def _gemm_times_s(models: Sequence[ModelSpec], parallel: ParallelSpec, gpu: GpuSpec, dtype: str,
                  attention: str) -> list[float]:
    """GEMM time of one micro-batch of each model (``_totals(time_gemms(model_gemms(...)))[1]``), with the GEMMs of
    one layer of each kind timed once per shape and multiplied by the layers of that kind: models that differ only
    in their layer count share them."""
    shapes: dict[tuple[Any, ...], list[tuple[str, int]]] = {}  # shape but the layer count -> (kind, GEMMs) in flat
    flat: list[tuple[Gemm, int]] = []
    keys = []
    for m in models:
        key = tuple(getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "num_layers")
        keys.append(key)
        if key in shapes:
            continue
        kinds = (["dense"] if not m.is_moe or m.moe_layer_freq > 1 or m.first_k_dense_layers else []) + (
            ["moe"] if m.is_moe else [])
        spans = []
        for kind in [*kinds, "logits"]:
            gemms = layer_gemms(m, parallel, logits=True, attention=attention) if kind == "logits" else \
                layer_gemms(m, parallel, layer_kind=kind, attention=attention)
            flat.extend((g, 1) for g in gemms)
            spans.append((kind, len(gemms)))
        shapes[key] = spans
    results = time_gemms(flat, gpu, dtype)
    start = 0
    per_shape: dict[tuple[Any, ...], dict[str, float]] = {}
    for key, spans in shapes.items():
        per_shape[key] = {}
        for kind, span in spans:
            per_shape[key][kind] = sum(r.time_s for r in results[start:start + span])
            start += span
    out = []
    for m, key in zip(models, keys):
        t = per_shape[key]
        num_moe = m.num_moe_layers
        num_dense = m.num_layers - num_moe
        out.append((num_dense * t["dense"] if num_dense else 0.0) + (num_moe * t["moe"] if num_moe else 0.0)
                   + t["logits"])
    return out


RankBy = Literal["time", "time_per_param"]
RANK_BY = ("time", "time_per_param")


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestion:
    """A shape with its shape-aware estimate and what changes against the original."""

    model: ModelSpec
    num_parameters: int
    param_change: float
    """Relative change of the parameter count."""
    estimate: Any
    gemm_efficiency: float
    gpu_util: float
    iteration_speedup: float
    """Original iteration time over this one."""
    compute_speedup: float
    """Original compute time over this one."""
    comm_time_change_s: float
    """Communication time (TP + PP + DP + CP + EP + embedding) minus the original's."""
    comm_bytes: dict[str, int]
    """Wire bytes per iteration per axis (:func:`commscope.pattern.volumes.axis_volumes`)."""
    comm_bytes_change: float
    """Relative change of the total wire bytes."""
    broken_rules: tuple[str, ...]
    changes: str
    """What differs from the original, e.g. ``h 3072->3200, heads 32->25``."""

    def to_dict(self) -> dict[str, Any]:
        return {**_shape_dict(self.model), "param_change": self.param_change, "changes": self.changes,
                "iteration_time_s": self.estimate.iteration_time_s, "iteration_speedup": self.iteration_speedup,
                "compute_s": self.estimate.compute_s, "compute_speedup": self.compute_speedup,
                "gemm_efficiency": self.gemm_efficiency, "gpu_util": self.gpu_util, "comm_s": self.estimate.comm_s,
                "comm_time_change_s": self.comm_time_change_s, "comm_bytes": self.comm_bytes,
                "comm_bytes_change": self.comm_bytes_change, "tokens_per_s": self.estimate.tokens_per_s,
                "broken_rules": list(self.broken_rules)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestions:
    original: Suggestion
    entries: tuple[Suggestion, ...]
    """The fastest shapes, no slower than the original, best first."""
    tolerance: float
    rank_by: str
    num_candidates: int
    """Shapes generated (valid for the parallelism)."""
    num_within_tolerance: int
    num_estimated: int
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "rank_by": self.rank_by, "num_candidates": self.num_candidates,
                "num_within_tolerance": self.num_within_tolerance, "num_estimated": self.num_estimated,
                "original": self.original.to_dict(), "suggestions": [s.to_dict() for s in self.entries],
                "notes": list(self.notes)}


def _changes(old: ModelSpec, new: ModelSpec) -> str:
    parts = []
    for label, a, b in (("layers", old.num_layers, new.num_layers), ("h", old.hidden_size, new.hidden_size),
                        ("heads", old.num_heads, new.num_heads), ("d", old.head_size, new.head_size),
                        ("groups", old.kv_heads, new.kv_heads), ("ffn", old.ffn, new.ffn),
                        ("moe_ffn", old.moe_ffn, new.moe_ffn)):
        if label == "groups" and old.num_query_groups is None:
            continue
        if label == "moe_ffn" and not old.is_moe:
            continue
        if a != b:
            parts.append(f"{label} {a}->{b}")
    return ", ".join(parts) or "unchanged"


def _variant(model: ModelSpec, **changes: Any) -> ModelSpec | None:
    try:
        return dataclasses.replace(model, **changes)
    except (ConfigError, ValueError, TypeError):
        return None


def _candidate_models(model: ModelSpec, parallel: ParallelSpec, tolerance: float, hidden_range: float) -> list[ModelSpec]:
    """Nearby shapes: h a multiple of 64 within ``hidden_range``, head size 64, 128 or the original's, query
    groups as many as before or in the same ratio to the heads, FFN with the original ratio rounded to
    multiples of 64 t (and 256 t), layers that keep the parameters within ``tolerance`` and divide the pipeline."""
    t, q = parallel.tp, ALIGN_ELEMENTS
    h0 = model.hidden_size
    group_ratio = model.num_heads // model.kv_heads
    lo, hi = math.ceil(h0 * (1 - hidden_range) / q) * q, math.floor(h0 * (1 + hidden_range) / q) * q
    seen: set[tuple[int, ...]] = set()
    out: list[ModelSpec] = []
    for h in sorted(set(range(max(q, lo), hi + 1, q)) | {h0}):
        for d in sorted({64, 128, model.head_size}):
            if h % d or (h // d) % t:
                continue
            a = h // d
            # grouped-query attention: keep the number of groups (as Llama 3 keeps 8 across sizes) or the ratio
            groups = {a} if model.num_query_groups is None else {
                x for x in (model.kv_heads, a // group_ratio if a % group_ratio == 0 else 0) if x and a % x == 0}
            for g in sorted(x for x in groups if x % t == 0 or t % x == 0):
                out += _shape_variants(model, parallel, h, a, d, g, tolerance, seen)
    return out


def _shape_variants(model: ModelSpec, parallel: ParallelSpec, h: int, a: int, d: int, g: int, tolerance: float,
                    seen: set[tuple[int, ...]]) -> list[ModelSpec]:
    """The candidates of one (h, heads, head size, groups): MLP widths near the original ratio, then the layer
    counts that keep the parameters within ``tolerance``."""
    from commscope.pattern.workload.dense import check_job

    t, q = parallel.tp, ALIGN_ELEMENTS
    h0, n0 = model.hidden_size, model.num_parameters()
    ratio_f = model.ffn / h0
    ratio_moe = model.moe_ffn / h0 if model.is_moe else None
    stages = parallel.pp * parallel.virtual_pipeline_size
    # the MLP width that matters is varied (the experts' when every layer is MoE), the other one scaled
    vary_moe = ratio_moe is not None and model.moe_ffn_hidden_size is not None and model.num_moe_layers == model.num_layers
    ratio, current = (ratio_moe, model.moe_ffn) if vary_moe and ratio_moe is not None else (ratio_f, model.ffn)
    target = ratio * h
    widths = {max(q * t, math.floor(target / (q * t)) * q * t), math.ceil(target / (q * t)) * q * t,
              max(4 * q * t, round(target / (4 * q * t)) * 4 * q * t)}
    if h == h0:
        widths.add(current)
    out: list[ModelSpec] = []
    for width in sorted(widths):
        scaled_ffn = max(q * t, round(ratio_f * h / (q * t)) * q * t) if h != h0 else model.ffn
        changes: dict[str, Any] = {"hidden_size": h, "num_heads": a, "head_dim": None if a * d == h else d,
                                   "ffn_hidden_size": scaled_ffn if vary_moe else width,
                                   "num_query_groups": None if model.num_query_groups is None else g}
        if ratio_moe is not None and model.moe_ffn_hidden_size is not None:
            changes["moe_ffn_hidden_size"] = width if vary_moe else (
                max(q * t, round(ratio_moe * h / (q * t)) * q * t) if h != h0 else model.moe_ffn)
        # parameters are (close to) linear in the layers: N(L) ~ N(L0) + (L - L0) x per-layer; the range found
        # so is widened by one layer each side and checked exactly by the caller
        one = _variant(model, **changes)
        step = model.moe_layer_freq if model.is_moe else 1
        two = _variant(model, num_layers=model.num_layers + step, **changes)
        if one is None or two is None:
            continue
        n_ref = one.num_parameters()
        per_layer = (two.num_parameters() - n_ref) / step
        l_lo = max(model.first_k_dense_layers + 1, math.ceil(model.num_layers + (n0 * (1 - tolerance) - n_ref) / per_layer) - 1)
        l_hi = math.floor(model.num_layers + (n0 * (1 + tolerance) - n_ref) / per_layer) + 1
        for num_layers in range(l_lo, l_hi + 1):
            if parallel.pipeline_layers is not None and num_layers != model.num_layers:
                continue
            if stages > 1 and parallel.pipeline_layers is None and num_layers % stages:
                continue
            key = (num_layers, h, a, d, g, changes["ffn_hidden_size"], changes.get("moe_ffn_hidden_size", 0))
            if key in seen:
                continue
            seen.add(key)
            cand = _variant(one, num_layers=num_layers)
            if cand is None:
                continue
            try:
                check_job(cand, parallel)
            except ConfigError:
                continue
            out.append(cand)
    return out


def _suggestion(model: ModelSpec, original: ModelSpec, parallel: ParallelSpec, cluster: ClusterSpec, gpu: GpuSpec,
                ref: Suggestion | None, bandwidth: Any, attention: Attention) -> Suggestion:
    from commscope.api import predict
    from commscope.estimate.iteration import estimate
    from commscope.pattern.volumes import axis_volumes

    _, flop, time = _gemm_efficiency(model, parallel, gpu, attention)
    eff = flop / (time * gpu.peak_flops_for(model.dtype))
    est = estimate(predict(model, dataclasses.replace(parallel, attention=attention), cluster), gpu=gpu, bandwidth=bandwidth)
    u = est.gpu_util
    p = parallel
    vol = axis_volumes(model, tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, micro_batch_size=p.micro_batch_size,
                       global_batch_size=p.global_batch_size, virtual_pipeline_size=p.virtual_pipeline_size,
                       sequence_parallel=p.sequence_parallel, recompute_full=p.recompute == "full",
                       zero_stage=p.zero_stage, distributed_optimizer=p.distributed_optimizer,
                       grad_reduce_dtype=p.grad_reduce_dtype)
    comm = {axis: int(v) for axis, v in vol.items()}
    total = sum(comm.values())
    n = model.num_parameters()
    n0 = original.num_parameters()
    if ref is None:
        return Suggestion(model=model, num_parameters=n, param_change=0.0, estimate=est, gemm_efficiency=eff, gpu_util=u,
                          iteration_speedup=1.0, compute_speedup=1.0, comm_time_change_s=0.0, comm_bytes=comm,
                          comm_bytes_change=0.0, broken_rules=_broken(model, parallel), changes="original")
    ref_total = sum(ref.comm_bytes.values())
    return Suggestion(
        model=model, num_parameters=n, param_change=n / n0 - 1, estimate=est, gemm_efficiency=eff, gpu_util=u,
        iteration_speedup=ref.estimate.iteration_time_s / est.iteration_time_s,
        compute_speedup=ref.estimate.compute_s / est.compute_s if est.compute_s else float("inf"),
        comm_time_change_s=est.comm_s - ref.estimate.comm_s, comm_bytes=comm,
        comm_bytes_change=total / ref_total - 1 if ref_total else 0.0, broken_rules=_broken(model, parallel),
        changes=_changes(original, model))


def suggest_shapes(model: ModelSpec, parallel: ParallelSpec, cluster: ClusterSpec, gpu: GpuSpec | None = None, *,
                   tolerance: float = 0.05, top: int = 5, refine: int = 48, rank_by: str = "time",
                   hidden_range: float = 0.25, attention: Attention = "flash", bandwidth: Any = None) -> Suggestions:
    """Nearby shapes with parameters within ``tolerance`` that run faster, best first.

    Candidates (see :func:`_candidate_models`) are screened by their GEMM time per micro-batch and parameter
    (one vectorised call of the GEMM model); the ``refine`` best are estimated with
    :func:`commscope.estimate.estimate` at their shape-aware utilisation and ranked by iteration time
    (``rank_by="time"``) or iteration time per parameter (``"time_per_param"``). Only shapes no slower than
    the original by the same measure are kept. Memory is not re-checked: parameters stay within tolerance.
    """
    if not 0 <= tolerance < 1:
        raise ConfigError("tolerance", tolerance, "must be in [0, 1), e.g. 0.05 for +-5% parameters")
    if rank_by not in RANK_BY:
        raise ConfigError("rank_by", rank_by, f"valid: {', '.join(RANK_BY)}")
    if top < 1:
        raise ConfigError("top", top, "must be >= 1")
    if refine < 1:  # estimating none would say that no nearby shape is faster
        raise ConfigError("refine", refine, "must be >= 1: how many of the screened shapes are estimated in full")
    g = gpu or gpu_for_cluster(cluster)
    original = _suggestion(model, model, parallel, cluster, g, None, bandwidth, attention)
    cands = _candidate_models(model, parallel, tolerance, hidden_range)
    n0 = model.num_parameters()
    def shape_key(m: ModelSpec) -> tuple[int, ...]:
        return (m.num_layers, m.hidden_size, m.num_heads, m.head_size, m.kv_heads, m.ffn, m.moe_ffn if m.is_moe else 0)

    cands = [c for c in cands if shape_key(c) != shape_key(model)]
    num_candidates = len(cands)
    within = [c for c in cands if abs(c.num_parameters() / n0 - 1) <= tolerance]
    # screen: GEMM time of a micro-batch (per parameter when ranking so), all candidates in one call
    screen = [t / c.num_parameters() if rank_by == "time_per_param" else t
              for c, t in zip(within, _gemm_times_s(within, parallel, g, model.dtype, attention))]
    order = np.argsort(np.asarray(screen), kind="stable")[:refine] if screen else np.zeros(0, dtype=np.int64)
    estimated = [_suggestion(within[i], model, parallel, cluster, g, original, bandwidth, attention) for i in order]

    def key(s: Suggestion) -> float:
        t = s.estimate.iteration_time_s
        return t / s.num_parameters if rank_by == "time_per_param" else t

    ref = key(original)
    kept = sorted((s for s in estimated if key(s) <= ref), key=key)
    heads = ", ".join(str(d) for d in sorted({64, 128, model.head_size}))
    groups = (f", {model.kv_heads} query groups or {model.num_heads // model.kv_heads} heads per group"
              if model.num_query_groups is not None else "")
    notes = [(f"candidates: h a multiple of {ALIGN_ELEMENTS} within +-{hidden_range:.0%} of {model.hidden_size}, head size "
             f"{heads}{groups}, FFN at the original ratio {model.ffn / model.hidden_size:.3g} x h rounded to multiples of "
             f"64 x tp, layers keeping parameters within +-{tolerance:.0%} and divisible by the pipeline"),
             "memory is not re-checked (parameters stay within the tolerance)"]
    return Suggestions(original=original, entries=tuple(kept[:top]), tolerance=tolerance, rank_by=rank_by,
                       num_candidates=num_candidates, num_within_tolerance=len(within), num_estimated=len(estimated),
                       notes=tuple(notes))
