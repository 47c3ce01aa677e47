"""Model shapes against the GPU: the GEMMs of a transformer layer, their predicted efficiency, the shape rules
they break, and nearby shapes that run faster.

Co-design [anthony-2024]: models of the same size run up to 39% faster when their shapes suit the GPU's
matrix units. This module makes that quantitative for one job (model, parallelism, cluster):

1. The GEMMs of a layer and the tile/wave model that times them live in :mod:`commscope.estimate.compute.gemm`
   (re-exported here): :func:`layer_gemms`, :func:`gemm_timing`, :func:`time_gemms`.

3. :func:`shape_rules` checks the rules of [anthony-2024] and [nvidia-matmul-guide] (hidden size, head size,
   hidden and FFN width per TP rank, vocabulary padding, sequence length, tokens per micro-batch multiples
   of 64; heads divisible by t; experts divisible by e; layers divisible by the pipeline) and prices each
   broken one on this GPU: the affected GEMMs against themselves at the compute speed per FLOP they would
   reach with the offending dimension rounded up to the next multiple of 64 (same memory traffic).

4. :func:`suggest_shapes` searches nearby shapes (hidden, heads, FFN, layers) whose parameter count stays
   within a tolerance (default 5%) and ranks them by the iteration time of :func:`commscope.estimate.estimate`,
   whose compute model (:mod:`commscope.estimate.compute`) times every GEMM of the shape with the same tile/wave model.
   :func:`shape_util` keeps the older flat-``u`` approximation (the cluster's ``gpu_util`` scaled by this
   shape's GEMM efficiency over the ideal) for the baseline.
   Communication follows from the shape through the estimate (time) and :func:`commscope.pattern.volumes.axis_volumes`
   (bytes).

The analytical functions import numpy only; :func:`measure_gemms` imports torch inside (extra ``torch``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal
from collections.abc import Sequence

import numpy as np

from commscope.estimate.compute.gemm import (  # re-exported: shapes' public API
    ALIGN_ELEMENTS,
    ATTENTION,
    PASSES,
    Gemm,
    GemmResult,
    GemmTiming,
    alignment_factor,
    gemm_timing,
    layer_dims,
    layer_gemms,
    model_gemms,
    time_gemms,
)
from commscope.errors import ConfigError
from commscope.estimate.gpus import GpuSpec, gpu_for_cluster
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import Attention, ParallelSpec
from commscope.units import TFLOP, divisors

__all__ = [
    "ALIGN_ELEMENTS",
    "ATTENTION",
    "PASSES",
    "SWEEP_KEYS",
    "Gemm",
    "GemmResult",
    "GemmTiming",
    "MeasuredGemm",
    "RuleCheck",
    "ShapeReport",
    "Suggestion",
    "Suggestions",
    "SweepResult",
    "alignment_factor",
    "analyse_shapes",
    "cuda_available",
    "gemm_timing",
    "layer_dims",
    "layer_gemms",
    "measure_gemms",
    "measured_over_predicted",
    "model_gemms",
    "shape_rules",
    "shape_util",
    "suggest_shapes",
    "sweep_shapes",
    "time_gemms",
]

def _totals(results: Sequence[GemmResult]) -> tuple[float, float]:
    """(FLOP, time) of ``results`` weighted by their layer multiplicity."""
    flop = sum(r.gemm.flop * r.layers for r in results)
    time = sum(r.time_s * r.layers for r in results)
    return flop, time


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


def shape_util(gpu_util: float, gemm_efficiency: float, gpu: GpuSpec) -> float:
    """Shape-aware utilisation for :func:`commscope.estimate.estimate`: ``u x E / E_ideal``, at most 1.

    ``u`` (the cluster's ``gpu_util``) is what a perfectly shaped model reaches end to end (non-GEMM kernels
    included); ``E`` is this shape's GEMM efficiency (FLOP-weighted over every GEMM of a micro-batch) and
    ``E_ideal = achievable_fraction``, the efficiency of a large aligned GEMM without tile or wave loss.
    Worked example: u = 0.5, E = 0.72, E_ideal = 0.8 -> 0.45.
    """
    return float(min(1.0, gpu_util * gemm_efficiency / gpu.achievable_fraction))


# ---------------------------------------------------------------------------------------------------------
# 3. Rules
# ---------------------------------------------------------------------------------------------------------

RuleStatus = Literal["ok", "warn", "broken", "invalid"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleCheck:
    """One shape rule checked on a job, with what breaking it costs on this GPU."""

    rule: str
    """Id: ``hidden_size``, ``head_size``, ``hidden_per_tp``, ``ffn_per_tp``, ``vocab``, ``seq_len``, ``tokens``,
    ``expert_tokens``, ``expert_ffn_per_tp``, ``heads_tp``, ``ffn_tp``, ``experts_ep``, ``layers_pp``."""
    title: str
    value: Any
    """The checked quantity."""
    requirement: str
    status: str
    """``ok``; ``warn`` (fine here, e.g. thanks to padding, but fragile); ``broken`` (costs time);
    ``invalid`` (Megatron refuses the job)."""
    explanation: str
    source: str
    affected: tuple[str, ...] = ()
    """GEMM names whose dimensions the rule governs."""
    fix: str = ""
    slowdown: float | None = None
    """Time of the affected GEMMs over their time with the compute speed per FLOP of the shape rounded up to a
    multiple of 64 (same memory traffic), minus 1: the tile, wave and alignment loss the rule costs."""
    time_lost_s: float | None = None
    """GEMM time per micro-batch on one GPU lost to it (all layers)."""
    share: float | None = None
    """``time_lost_s`` over the GEMM time of a micro-batch."""

    @property
    def broken(self) -> bool:
        return self.status in ("broken", "invalid")

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": self.title, "value": self.value, "requirement": self.requirement,
                "status": self.status, "broken": self.broken, "explanation": self.explanation, "source": self.source,
                "affected": list(self.affected), "fix": self.fix, "slowdown": self.slowdown,
                "time_lost_s": self.time_lost_s, "share": self.share}


_SRC_CODESIGN = "[anthony-2024] Anthony et al. 2024, 'The Case for Co-Designing Model Architectures with Hardware'"
_SRC_GUIDE = "[nvidia-matmul-guide] NVIDIA Matrix Multiplication Background User's Guide"


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _rule_cost(gemms: Sequence[tuple[Gemm, int]], gpu: GpuSpec, dtype: str, fixed: dict[str, int],
               actual: dict[str, int] | None = None) -> tuple[tuple[str, ...], float | None, float | None, float | None]:
    """(affected GEMM names, slowdown, time lost, share) of the GEMMs that use a symbol in ``fixed``.

    Each affected GEMM (its dimensions as they are, or as ``actual`` sets them) is compared with itself running
    its compute at the speed per FLOP of the same GEMM with ``fixed``'s dimensions, keeping its own memory
    traffic and overheads: the loss from tiles, waves and alignment, not from arithmetic intensity.
    Worked example (gpt-3b, tp 2, micro-batch 4, A100): attention x V with N = d = 96 fills 75% of a
    128-wide tile and runs at 45% of peak, with d = 128 at 63%; over both attention GEMMs and their backward
    GEMMs (some of which have d as K, where 96 loses nothing) the head-size rule costs +28%."""
    syms = set(fixed)
    affected = [(g, layers) for g, layers in gemms if g.symbols & syms]
    if not affected:
        return (), None, None, None

    def resized(g: Gemm, values: dict[str, int]) -> Gemm:
        m, n, k = ((coef * values[sym]) if sym in values else size for (sym, coef), size in zip(g.dims, (g.m, g.n, g.k)))
        return dataclasses.replace(g, m=m, n=n, k=k)

    base = [(resized(g, actual) if actual else g, layers) for g, layers in affected]
    fix = [(resized(g, fixed), layers) for g, layers in affected]
    r_base, r_fix = time_gemms(base, gpu, dtype), time_gemms(fix, gpu, dtype)
    # the time each GEMM would take if its compute ran at the fixed shape's speed per FLOP, with its own
    # memory traffic and overheads: isolates tile, wave and alignment losses from arithmetic intensity
    time_b = time_alt = 0.0
    for rb, rf in zip(r_base, r_fix):
        rest = rb.time_s - max(rb.compute_time_s, rb.memory_time_s)
        comp_alt = rf.compute_time_s * rb.gemm.flop / rf.gemm.flop
        time_b += rb.time_s * rb.layers
        time_alt += (max(comp_alt, rb.memory_time_s) + rest) * rb.layers
    lost = time_b - time_alt
    total = _totals(time_gemms(gemms, gpu, dtype))[1]
    names = tuple(dict.fromkeys(g.name for g, _ in affected))
    return names, time_b / time_alt - 1.0, lost, lost / total if total else None


def shape_rules(model: ModelSpec, parallel: ParallelSpec | None = None, gpu: GpuSpec | None = None, *,
                attention: str = "flash") -> tuple[RuleCheck, ...]:
    """Check the shape rules of [anthony-2024] and [nvidia-matmul-guide] for ``model`` under ``parallel``.

    With a ``gpu``, each broken rule is priced (:func:`_rule_cost`): the GEMMs it governs, timed as they are
    and at the compute speed per FLOP they would have with the offending dimension rounded up to the next
    multiple of :data:`ALIGN_ELEMENTS` (``slowdown``), and the GEMM time per micro-batch that costs
    (``time_lost_s``, ``share``). Never raises for a shape; hard constraints Megatron enforces (heads
    divisible by tp, ...) come back as ``invalid``.
    """
    par = parallel or ParallelSpec()
    t, c, e, b = par.tp, par.cp, par.ep, par.micro_batch_size
    q = ALIGN_ELEMENTS
    rules: list[RuleCheck] = []

    # -- hard constraints (Megatron refuses the job) --
    hard = [
        ("heads_tp", "attention heads divisible by tp", model.num_heads, f"multiple of tp={t}",
         model.num_heads % t == 0 and (model.kv_heads % t == 0 or t % model.kv_heads == 0),
         (f"each TP rank computes a/t = {model.num_heads}/{t} whole heads (and its share of the {model.kv_heads} "
         "key/value groups); the attention GEMMs are batched over b a/t, which must be an integer [megatron-lm-2019]"),
         [f"tp in {', '.join(str(x) for x in divisors(model.num_heads) if x <= 8)}"]),
        ("ffn_tp", "FFN width divisible by tp", model.ffn, f"multiple of tp={t}", model.ffn % t == 0,
         "the MLP's column- and row-parallel GEMMs split f over tp ranks", []),
        ("layers_pp", "layers divisible by the pipeline", model.num_layers,
         f"multiple of pp x virtual = {par.pp * par.virtual_pipeline_size}",
         par.pipeline_layers is not None or model.num_layers % (par.pp * par.virtual_pipeline_size) == 0,
         ("every pipeline stage (and virtual chunk) holds the same number of layers unless pipeline_layers says otherwise; "
         "an uneven split makes the slowest stage set the pace"), []),
    ]
    if model.is_moe:
        hard.append(("experts_ep", "experts divisible by ep", model.num_experts, f"multiple of ep={e}",
                     model.num_experts % e == 0,
                     "each expert-parallel rank holds E/ep whole experts; the all-to-all dispatches to them", []))
    valid = all(ok for *_, ok, _, _ in hard) and model.seq_len % c == 0 and (not model.is_moe or model.moe_ffn % t == 0)
    for rule, title, value, req, ok, why, fix in hard:
        rules.append(RuleCheck(rule=rule, title=title, value=value, requirement=req, status="ok" if ok else "invalid",
                               explanation=why, source="Megatron-LM (check_job)", fix="" if ok else "; ".join(fix)))

    # -- alignment rules, priced on the GPU --
    dims = layer_dims(model, tp=t, cp=c, ep=e, micro_batch_size=b) if valid else None
    gemms = model_gemms(model, par, dims=dims, attention=attention) if valid else ()
    dtype = model.dtype

    def priced(fixed: dict[str, int], actual: dict[str, int] | None = None) -> dict[str, Any]:
        if gpu is None or not valid:
            names = tuple(dict.fromkeys(g.name for g, _ in gemms if g.symbols & set(fixed)))
            return {"affected": names}
        names, slowdown, lost, share = _rule_cost(gemms, gpu, dtype, fixed, actual)
        return {"affected": names, "slowdown": slowdown, "time_lost_s": lost, "share": share}

    def aligned(rule: str, title: str, symbols: dict[str, Any], value: Any, why: str, source: str, fix: str) -> None:
        ok = all(v % q == 0 for v in symbols.values())
        extra: dict[str, Any] = {}
        if dims is not None:
            present = {s: v for s, v in symbols.items() if s in dims}
            if not ok and present:
                extra = priced({s: _round_up(v, q) for s, v in present.items()})
            else:
                extra = {"affected": tuple(dict.fromkeys(g.name for g, _ in gemms if g.symbols & set(present)))}
        rules.append(RuleCheck(rule=rule, title=title, value=value, requirement=f"multiple of {q}",
                               status="ok" if ok else "broken", explanation=why, source=source,
                               fix="" if ok else fix, **extra))

    h, a, d, f = model.hidden_size, model.num_heads, model.head_size, model.ffn
    aligned("hidden_size", "hidden size h", {"hidden": h}, h,
            "h is the K of the QKV, MLP-up and logits GEMMs and the N of the attention-output and MLP-down GEMMs "
            "(and M, N or K of their backward GEMMs); tensor cores need multiples of 8 elements (16 B) and A100/H100 "
            "are fastest at multiples of 64 (128 B) [nvidia-matmul-guide]; 64 also fills the 64/128-wide CTA tiles",
            f"{_SRC_GUIDE}; {_SRC_CODESIGN}", f"h = {_round_up(h, q)} or {max(q, h // q * q)}")
    head_fix = ", ".join(f"d = {dd} ({h // dd} heads)" for dd in (64, 128) if h % dd == 0 and (h // dd) % t == 0) \
        or f"d = {_round_up(d, q)}"
    aligned("head_size", "head size d = h/a", {"head": d}, d,
            "d is the K of Q K^T and the N of attention x V (batched over heads); a d that is not a multiple of 64 "
            "wastes part of every tile of both attention GEMMs, and FlashAttention kernels are fastest at d = 64 or 128",
            f"{_SRC_CODESIGN}; {_SRC_GUIDE}", head_fix)
    widths: dict[str, Any] = {"q_width": a * d // t if a % t == 0 else a * d / t}
    if dims is not None:
        widths["qkv_width"] = dims["qkv_width"]
    aligned("hidden_per_tp", "attention width per TP rank a d / t", widths, widths["q_width"],
            "a d / t (and (a + 2g) d / t with grouped-query attention) is the N of the QKV GEMM and the K of the "
            "attention-output GEMM on each TP rank [anthony-2024: h/t divisible by 64]",
            _SRC_CODESIGN, "choose heads and tp so that a d / t is a multiple of 64")
    aligned("ffn_per_tp", "FFN width per TP rank f / t", {"ffn_width": f // t if f % t == 0 else f / t},
            f // t if f % t == 0 else f / t,
            "f / t is the N of the MLP-up GEMM (2 f / t gated) and the K of the MLP-down GEMM on each TP rank",
            _SRC_CODESIGN, f"f = {_round_up(f, q * t)} (a multiple of 64 x tp = {q * t})")
    if model.is_moe:
        aligned("expert_ffn_per_tp", "expert FFN width per TP rank", {"expert_ffn_width": model.moe_ffn // t},
                model.moe_ffn // t, "the N and K of every expert GEMM", _SRC_CODESIGN,
                f"moe_ffn_hidden_size = {_round_up(model.moe_ffn, q * t)}")
        if dims is not None:
            aligned("expert_tokens", "tokens per expert (balanced routing)", {"expert_tokens": dims["expert_tokens"]},
                    dims["expert_tokens"],
                    "the M of each expert GEMM: b s top_k ep / E tokens per local expert when routing is balanced; real "
                    "routing varies, so this is the best case", _SRC_CODESIGN, "choose b s top_k ep / E a multiple of 64")
    aligned("seq_len", "sequence length s", {"seq_q": model.seq_len // c, "seq_k": model.seq_len}, model.seq_len,
            "s is M and N of Q K^T and M and K of attention x V", _SRC_CODESIGN, f"s = {_round_up(model.seq_len, q * c)}")
    aligned("tokens", "tokens per micro-batch b s / cp", {"tokens": b * model.seq_len // c}, b * model.seq_len // c,
            "b s is the M of every linear GEMM (and the K of their weight-gradient GEMMs) [anthony-2024: b s divisible "
            "by a power of two, no gain beyond 64]", _SRC_CODESIGN, "choose b and s so that b s / cp is a multiple of 64")

    # vocabulary: Megatron pads V to a multiple of make_vocab_size_divisible_by x tp
    v, v_pad = model.vocab_size, model.padded_vocab_size(t)
    width = v_pad // t
    why = (f"V' / t is the N of the logits GEMM (and of its dgrad's K, its wgrad's N), the largest single GEMM of small "
           f"models; Megatron pads V = {v} to {v_pad} (make_vocab_size_divisible_by = "
           f"{model.make_vocab_size_divisible_by} x tp = {t}); a multiple of 64 x tp (128 x tp as Megatron does) keeps "
           f"every rank's share a multiple of 64 [anthony-2024: vocabulary divisible by 64]")
    if width % q:
        status, vocab_fix = "broken", (f"make_vocab_size_divisible_by = 128 (V' = {_round_up(v, 128 * t)}), or pad the "
                                 f"vocabulary to a multiple of {q * t}")
        extra = priced({"vocab_width": _round_up(width, q)}) if dims is not None else {}
    elif v % (q * t):
        # fine thanks to the padding; say what running it unpadded would cost (Hugging Face does not pad)
        status, vocab_fix = "warn", (f"fine under Megatron's padding to {v_pad}; without it (e.g. Hugging Face) pad the "
                               f"tokenizer to {_round_up(v, q * t)}")
        extra = priced({"vocab_width": width}, actual={"vocab_width": -(-v // t)}) if dims is not None else {}
    else:
        status, vocab_fix, extra = "ok", "", ({"affected": ("logits",)} if dims is not None else {})
    rules.append(RuleCheck(rule="vocab", title="vocabulary V (padded) per TP rank", value=width,
                           requirement=f"V'/t multiple of {q}", status=status, explanation=why,
                           source=f"{_SRC_CODESIGN}; Megatron-LM _vocab_size_with_padding", fix=vocab_fix, **extra))
    return tuple(rules)


# ---------------------------------------------------------------------------------------------------------
# 4. The report of one job
# ---------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------
# 5. Suggestions
# ---------------------------------------------------------------------------------------------------------

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


def _broken(model: ModelSpec, parallel: ParallelSpec) -> tuple[str, ...]:
    return tuple(r.rule for r in shape_rules(model, parallel) if r.broken)


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


# ---------------------------------------------------------------------------------------------------------
# 6. Sweeps
# ---------------------------------------------------------------------------------------------------------

#: Sweepable quantities and what varies with them.
SWEEP_KEYS: dict[str, str] = {
    "hidden": "hidden_size (heads kept, so the head size changes; FFN kept at the same ratio to h)",
    "heads": "num_heads (h kept, so the head size changes; query groups kept in proportion)",
    "ffn": "ffn_hidden_size",
    "layers": "num_layers",
    "seq": "seq_len",
    "micro_batch": "micro_batch_size",
    "vocab": "vocab_size (padded as make_vocab_size_divisible_by says)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult:
    """Predicted throughput of a job as one shape quantity varies (arrays over ``values``; NaN where skipped)."""

    key: str
    values: np.ndarray
    valid: np.ndarray
    gemm_efficiency: np.ndarray
    gemm_tflops_per_gpu: np.ndarray
    """Achieved TFLOP/s of the GEMMs of a micro-batch (the co-design paper's y axis)."""
    model_tflops_per_gpu: np.ndarray
    """Model FLOPs per second per GPU of the whole iteration (MFU x peak; communication and bubble included)."""
    iteration_time_s: np.ndarray
    tokens_per_s: np.ndarray
    num_parameters: np.ndarray
    broken_rules: tuple[tuple[str, ...], ...]
    skipped: tuple[str, ...]
    """Why each skipped value was skipped."""
    model: str
    gpu: str

    def to_dict(self) -> dict[str, Any]:
        def clean(a: np.ndarray) -> list[Any]:
            return [None if (isinstance(x, float) and math.isnan(x)) else x for x in a.tolist()]

        return {"key": self.key, "model": self.model, "gpu": self.gpu, "values": self.values.tolist(),
                "valid": self.valid.tolist(), "gemm_efficiency": clean(self.gemm_efficiency),
                "gemm_tflops_per_gpu": clean(self.gemm_tflops_per_gpu),
                "model_tflops_per_gpu": clean(self.model_tflops_per_gpu),
                "iteration_time_s": clean(self.iteration_time_s), "tokens_per_s": clean(self.tokens_per_s),
                "num_parameters": clean(self.num_parameters), "broken_rules": [list(r) for r in self.broken_rules],
                "skipped": list(self.skipped)}


def _sweep_job(model: ModelSpec, parallel: ParallelSpec, key: str, value: int) -> tuple[ModelSpec, ParallelSpec]:
    if key == "hidden":
        if value % model.num_heads:
            raise ConfigError("hidden", value, f"not divisible by num_heads={model.num_heads}")
        f = round(model.ffn / model.hidden_size * value / parallel.tp) * parallel.tp
        return dataclasses.replace(model, hidden_size=value, head_dim=None, ffn_hidden_size=f), parallel
    if key == "heads":
        ratio = model.num_heads // model.kv_heads
        if value % ratio:
            raise ConfigError("heads", value, f"not a multiple of the query-group ratio {ratio}")
        groups = None if model.num_query_groups is None else value // ratio
        return dataclasses.replace(model, num_heads=value, head_dim=None, num_query_groups=groups), parallel
    if key == "ffn":
        return dataclasses.replace(model, ffn_hidden_size=value), parallel
    if key == "layers":
        return dataclasses.replace(model, num_layers=value), parallel
    if key == "seq":
        return dataclasses.replace(model, seq_len=value), parallel
    if key == "micro_batch":
        return model, dataclasses.replace(parallel, micro_batch_size=value)
    if key == "vocab":
        return dataclasses.replace(model, vocab_size=value), parallel
    raise ConfigError("sweep", key, f"valid keys: {', '.join(SWEEP_KEYS)}")


def sweep_shapes(model: ModelSpec, parallel: ParallelSpec, cluster: ClusterSpec, values: Sequence[int], *,
                 key: str = "hidden", gpu: GpuSpec | None = None, attention: Attention = "flash",
                 bandwidth: Any = None) -> SweepResult:
    """Predicted GEMM and end-to-end throughput of the job for each value of ``key`` (see :data:`SWEEP_KEYS`).

    Values that make an invalid job (heads that do not divide h, tp that does not divide the heads, ...) are
    skipped and said why.
    """
    from commscope.api import predict
    from commscope.estimate.iteration import estimate
    from commscope.pattern.workload.dense import check_job

    if key not in SWEEP_KEYS:
        raise ConfigError("sweep", key, f"valid keys: {', '.join(SWEEP_KEYS)}")
    if not len(values):
        raise ConfigError("sweep", list(values), "needs at least one value")
    g = gpu or gpu_for_cluster(cluster)
    peak = g.peak_flops_for(model.dtype)
    n = len(values)
    arrays = {name: np.full(n, np.nan) for name in ("eff", "gemm", "model", "iter", "tokens", "params")}
    valid = np.zeros(n, dtype=bool)
    broken: list[tuple[str, ...]] = []
    skipped: list[str] = []
    for i, value in enumerate(values):
        try:
            m, p = _sweep_job(model, parallel, key, int(value))
            check_job(m, p)
        except (ConfigError, ValueError) as exc:
            skipped.append(f"{key}={value}: {exc}")
            broken.append(())
            continue
        _, flop, time = _gemm_efficiency(m, p, g, attention)
        eff = flop / (time * peak)
        est = estimate(predict(m, dataclasses.replace(p, attention=attention), cluster), gpu=g, bandwidth=bandwidth)
        valid[i] = True
        arrays["eff"][i] = eff
        arrays["gemm"][i] = flop / time / TFLOP
        arrays["model"][i] = est.mfu * est.peak_flops / TFLOP
        arrays["iter"][i] = est.iteration_time_s
        arrays["tokens"][i] = est.tokens_per_s
        arrays["params"][i] = m.num_parameters()
        broken.append(_broken(m, p))
    return SweepResult(key=key, values=np.asarray(values, dtype=np.int64), valid=valid, gemm_efficiency=arrays["eff"],
                       gemm_tflops_per_gpu=arrays["gemm"], model_tflops_per_gpu=arrays["model"],
                       iteration_time_s=arrays["iter"], tokens_per_s=arrays["tokens"], num_parameters=arrays["params"],
                       broken_rules=tuple(broken), skipped=tuple(skipped), model=model.name, gpu=g.name)


# ---------------------------------------------------------------------------------------------------------
# 7. Measurement (torch, on a CUDA GPU)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredGemm:
    """A GEMM timed with torch on a GPU next to its prediction."""

    result: GemmResult
    measured_s: float
    """Measured time of one layer's calls (``count`` x one call)."""

    @property
    def predicted_over_measured(self) -> float:
        return self.result.time_s / self.measured_s

    @property
    def measured_efficiency(self) -> float:
        return self.result.efficiency * self.result.time_s / self.measured_s

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "measured_s": self.measured_s,
                "measured_tflops": self.result.gemm.flop / self.measured_s / TFLOP,
                "measured_efficiency": self.measured_efficiency, "predicted_over_measured": self.predicted_over_measured}


def cuda_available() -> tuple[bool, str]:
    """Whether torch with a CUDA GPU is importable here, and why not."""
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed (pip install 'commscope[torch]')"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA GPU on this machine"
    return True, torch.cuda.get_device_name(0)


def measure_gemms(results: Sequence[GemmResult], dtype: str, *, warmup: int = 3, iters: int = 10,
                  device: str = "cuda", load_s: float = 0.3) -> tuple[MeasuredGemm, ...]:
    """Time each GEMM shape with ``torch.matmul`` in the layout training runs its pass in (identical shapes once),
    as ``commscope calibrate`` does (:func:`commscope.measure.bench.kernels.time_gemm`): ``load_s`` of back-to-back calls
    right before the timed ones (the GPU at its loaded clock), then at least ``iters`` calls, each between CUDA
    events, and their median, after ``warmup`` calls.

    ``device="cuda"`` (what ``commscope shapes --measure`` uses) raises :class:`ConfigError` when torch or a
    CUDA GPU is missing; ``device="cpu"`` times with ``time.perf_counter`` (a smoke test of this code, not a
    comparison with the GPU model).
    """
    if device == "cuda":
        ok, why = cuda_available()
        if not ok:
            raise ConfigError("measure", True, f"needs a CUDA GPU: {why}; run without --measure for predictions only")
    elif device != "cpu":
        raise ConfigError("device", device, "valid: cuda, cpu")
    if dtype not in ("bf16", "fp16", "fp32", "tf32"):
        raise ConfigError("dtype", dtype, "measurable dtypes: bf16, fp16, fp32")
    from commscope.measure.bench.kernels import MeasureConfig, time_gemm

    config = MeasureConfig(load_s=load_s, min_calls=iters, max_calls=max(iters, 2000), warmup_calls=warmup)
    cache: dict[tuple[str, int, int, int, int], float] = {}
    out = []
    for r in results:
        g = r.gemm
        key = (g.pass_, g.batch, g.m, g.n, g.k)
        if key not in cache:
            cache[key] = time_gemm(g.pass_, g.m, g.n, g.k, batch=g.batch, dtype=dtype, device=device, config=config)
        out.append(MeasuredGemm(result=r, measured_s=cache[key] * g.count))
    return tuple(out)


def measured_over_predicted(measured: Sequence[MeasuredGemm], *, min_flop: float = 1e9) -> float | None:
    """Median measured / predicted time of the compute-bound GEMMs of ``measured`` above ``min_flop`` (None: none):
    how far the GPU model is from this GPU on these shapes. ``commscope calibrate --kernels`` fits the model's
    constants to such measurements (``shapes --measure --kernels-out DIR`` writes them)."""
    ratios = [1.0 / m.predicted_over_measured for m in measured
              if not m.result.memory_bound and m.result.gemm.flop >= min_flop]
    return float(statistics.median(ratios)) if ratios else None
