"""The shape report of one job: every GEMM of a layer with its predicted efficiency, the shape rules, and the
shape-aware estimate.

:func:`analyse_shapes` times the GEMMs of a micro-batch with the tile/wave model of
:mod:`commscope.estimate.compute.gemm`, marks each with the rules of :mod:`commscope.estimate.shapes_rules` that
govern it, and estimates the iteration with the compute model (:func:`commscope.estimate.estimate`) beside the
cluster's flat ``gpu_util`` baseline; :func:`shape_util` keeps the older flat-``u`` approximation (the cluster's
``gpu_util`` scaled by this shape's GEMM efficiency over the ideal). Part of :mod:`commscope.estimate.shapes`, which
re-exports its names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from commscope.estimate.compute.gemm import GemmResult, model_gemms, time_gemms
from commscope.estimate.gpus import GpuSpec, gpu_for_cluster
from commscope.estimate.shapes_rules import RuleCheck, _totals, shape_rules
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import Attention, ParallelSpec


def shape_util(gpu_util: float, gemm_efficiency: float, gpu: GpuSpec) -> float:
    """Shape-aware utilisation for :func:`commscope.estimate.estimate`: ``u x E / E_ideal``, at most 1.

    ``u`` (the cluster's ``gpu_util``) is what a perfectly shaped model reaches end to end (non-GEMM kernels
    included); ``E`` is this shape's GEMM efficiency (FLOP-weighted over every GEMM of a micro-batch) and
    ``E_ideal = achievable_fraction``, the efficiency of a large aligned GEMM without tile or wave loss.
    Worked example: u = 0.5, E = 0.72, E_ideal = 0.8 -> 0.45.
    """
    return float(min(1.0, gpu_util * gemm_efficiency / gpu.achievable_fraction))


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeReport:
    """Every GEMM of a job with its predicted efficiency, the shape rules, and the shape-aware estimate."""

    model: ModelSpec
    parallel: ParallelSpec
    cluster: ClusterSpec
    gpu: GpuSpec
    gemms: tuple[GemmResult, ...]
    rules: tuple[RuleCheck, ...]
    gemm_flop: float
    """FLOP of every GEMM of one micro-batch on one TP rank (all layers and the logits)."""
    gemm_time_s: float
    """Predicted time of those GEMMs."""
    gpu_util: float
    """Fraction of peak the compute model reaches during compute (the estimate's ``gpu_util``)."""
    estimate: Any
    """:class:`~commscope.estimate.Estimate` with the compute model of :mod:`commscope.estimate.compute`."""
    baseline_estimate: Any
    """The estimate with the cluster's flat ``gpu_util``."""
    notes: tuple[str, ...] = ()

    @property
    def gemm_efficiency(self) -> float:
        """FLOP-weighted GEMM efficiency: gemm_flop / (gemm_time_s x peak)."""
        return self.gemm_flop / (self.gemm_time_s * self.gpu.peak_flops_for(self.model.dtype))

    @property
    def broken_rules(self) -> tuple[RuleCheck, ...]:
        return tuple(r for r in self.rules if r.broken)

    def layer_time_s(self, layer_kind: str = "dense") -> float:
        return sum(r.time_s for r in self.gemms if r.gemm.layer_kind == layer_kind)

    def to_dict(self) -> dict[str, Any]:
        par = self.parallel
        return {
            "model": self.model.name, "cluster": self.cluster.name, "gpu": self.gpu.to_dict(), "dtype": self.model.dtype,
            "parallel": {"tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp, "ep": par.ep,
                         "micro_batch_size": par.micro_batch_size, "sequence_parallel": par.sequence_parallel},
            "shape": _shape_dict(self.model),
            "gemms": [r.to_dict() for r in self.gemms],
            "rules": [r.to_dict() for r in self.rules],
            "summary": {"gemm_flop": self.gemm_flop, "gemm_time_s": self.gemm_time_s,
                        "gemm_efficiency": self.gemm_efficiency, "ideal_efficiency": self.gpu.achievable_fraction,
                        "layer_time_s": self.layer_time_s("moe" if self.model.is_moe else "dense"),
                        "gpu_util": self.gpu_util, "cluster_gpu_util": self.cluster.gpu_util,
                        "broken_rules": [r.rule for r in self.broken_rules]},
            "estimate": self.estimate.to_dict(),
            "baseline_estimate": self.baseline_estimate.to_dict(),
            "notes": list(self.notes),
        }


def _shape_dict(model: ModelSpec) -> dict[str, Any]:
    return {"num_layers": model.num_layers, "hidden_size": model.hidden_size, "num_heads": model.num_heads,
            "num_query_groups": model.kv_heads, "head_size": model.head_size, "ffn_hidden_size": model.ffn,
            "vocab_size": model.vocab_size, "padded_vocab_size": model.padded_vocab_size(1), "seq_len": model.seq_len,
            "num_experts": model.num_experts, "num_parameters": model.num_parameters()}


def _gemm_efficiency(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec,
                     attention: str = "flash") -> tuple[tuple[GemmResult, ...], float, float]:
    results = time_gemms(model_gemms(model, parallel, attention=attention), gpu, model.dtype)
    flop, time = _totals(results)
    return results, flop, time


def analyse_shapes(model: ModelSpec, parallel: ParallelSpec, cluster: ClusterSpec, gpu: GpuSpec | None = None,
                   *, attention: Attention = "flash", bandwidth: Any = None) -> ShapeReport:
    """GEMMs, rules and the shape-aware estimate of one job (``gpu`` defaults to the cluster's)."""
    from commscope.api import predict
    from commscope.estimate.iteration import estimate
    from commscope.pattern.workload.dense import check_job

    check_job(model, parallel)
    g = gpu or gpu_for_cluster(cluster)
    rules = shape_rules(model, parallel, g, attention=attention)
    results, flop, time = _gemm_efficiency(model, parallel, g, attention)
    by_gemm: dict[str, list[str]] = {}
    for r in rules:
        if r.broken or r.status == "warn":
            for name in r.affected:
                by_gemm.setdefault(name, []).append(r.rule)
    results = tuple(dataclasses.replace(r, broken_rules=tuple(by_gemm.get(r.gemm.name, ()))) for r in results)
    pred = predict(model, dataclasses.replace(parallel, attention=attention), cluster)
    est = estimate(pred, gpu=g, bandwidth=bandwidth)
    u = est.gpu_util
    base = estimate(pred, gpu_util=cluster.gpu_util, bandwidth=bandwidth)
    notes = [(f"GEMM model on {g.name}: achievable {g.achievable_fraction:.0%} of peak for large aligned GEMMs "
             f"(a kernel constant: `commscope calibrate` fits it to this GPU's measured kernels)"),
             (f"the estimate times every kernel with the compute model (commscope.estimate.compute): {u:.3f} of peak during "
             f"compute; the baseline uses the cluster's flat u = {cluster.gpu_util:.2f}"),
             ("attention GEMMs: batched over b a/t; " + (
                 "fused (flash): the s x s scores stay on chip; the backward's recomputation of Q K^T is not counted"
                 if attention == "flash" else "unfused: the s x s scores go through HBM"))]
    if parallel.sequence_parallel:
        notes.append("sequence parallelism gathers the full sequence before each column-parallel GEMM: GEMM shapes "
                     "are those without it")
    if model.is_moe:
        notes.append("expert GEMMs assume balanced routing (b s top_k ep / E tokens per expert)")
    return ShapeReport(model=model, parallel=parallel, cluster=cluster, gpu=g, gemms=results, rules=rules,
                       gemm_flop=flop, gemm_time_s=time, gpu_util=u, estimate=est, baseline_estimate=base,
                       notes=tuple(notes))
