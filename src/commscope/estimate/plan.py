"""Search over parallelism configurations: valid ones that fit in memory, ranked by predicted iteration time.

Two passes:

1. *Screen*, vectorised over every candidate (numpy arrays, no Python loop per configuration):
   validity (divisibility rules of :func:`commscope.pattern.workload.dense.check_job`), memory per GPU
   (:func:`commscope.estimate.memory.total_memory_bytes`), and a closed-form time: compute from Megatron's FLOP
   count, TP/PP/DP/CP/EP op counts x the alpha-beta op time of each axis's group, bubble (p-1)/v of a
   micro-batch. Ranks stay in Megatron's default order (tp innermost), so a group's span over nodes
   follows from its stride.
2. *Rank*: every candidate that fits (or the best ``refine`` of the screen, when given) is estimated exactly, op
   by op, with :func:`commscope.estimate.many.estimate_many` (the result of :func:`commscope.estimate.estimate`
   for each, thousands per second), and sorted by that time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commscope.estimate.bandwidth import alpha_beta_time_s
from commscope.errors import ConfigError
from commscope.estimate.flops import token_flops
from commscope.estimate.memory import USABLE_MEMORY_FRACTION
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import Attention, Fp8Format, ParallelSpec, Recompute
from commscope.units import divisors, dtype_bytes

RECOMPUTE_CODES: tuple[Recompute, ...] = ("none", "selective", "full")
#: ZeRO choices: (zero_stage, distributed_optimizer)
ZERO_CHOICES = ((0, False), (1, True), (3, False))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSpace:
    """The values the search may take for each knob."""

    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    virtual_pipeline_sizes: tuple[int, ...] = (1, 2, 4)
    sequence_parallel: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero: tuple[tuple[int, bool], ...] = ZERO_CHOICES
    cp_sizes: tuple[int, ...] = (1,)
    ep_sizes: tuple[int, ...] | None = None
    """None: (1,) for dense models, powers of two dividing num_experts for MoE."""
    max_tp: int | None = None
    """Largest tp; default: GPUs per node (TP across nodes is rarely worth it)."""

    def __post_init__(self) -> None:
        for name in ("micro_batch_sizes", "virtual_pipeline_sizes", "cp_sizes", "ep_sizes"):
            values = getattr(self, name)
            if values is not None and (not values or any(v < 1 for v in values)):
                raise ConfigError(name.replace("_", "-"), ",".join(map(str, values)),
                                  "must be one or more positive integers, e.g. 1,2,4")
        if self.max_tp is not None and self.max_tp < 1:
            raise ConfigError("max-tp", self.max_tp, "must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanEntry:
    parallel: ParallelSpec
    estimate: Any
    memory_bytes: float
    screen_time_s: float

    @property
    def reason(self) -> str:
        """What this configuration's time is mostly made of, in a few words."""
        e = self.estimate
        terms = {"compute": e.compute_s, "TP": e.tp_s, "PP": e.pp_s, "DP": e.dp_s + e.emb_s, "CP": e.cp_s,
                 "EP": e.ep_s, "bubble": e.bubble_s}
        top = max(terms, key=lambda k: terms[k])
        share = terms[top] / e.iteration_time_s
        comm = e.comm_ratio
        return f"largest cost {top} ({share:.0%}); comm {comm:.0%}, bubble {e.bubble_ratio:.0%}"

    def to_dict(self) -> dict[str, Any]:
        p = self.parallel
        return {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "micro_batch_size": p.micro_batch_size,
                "virtual_pipeline_size": p.virtual_pipeline_size, "sequence_parallel": p.sequence_parallel,
                "recompute": p.recompute, "zero_stage": p.zero_stage, "distributed_optimizer": p.distributed_optimizer,
                "gradient_accumulation_fusion": p.gradient_accumulation_fusion, "attention": p.attention,
                "fp8_format": p.fp8_format, "num_micro_batches": p.num_micro_batches, "memory_GiB": self.memory_bytes / 2**30,
                "screen_time_s": self.screen_time_s, "reason": self.reason, **self.estimate.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    global_batch_size: int
    num_candidates: int
    """Configurations enumerated."""
    num_valid: int
    """Of those, valid for the model."""
    num_fit: int
    """Of those, fitting in GPU memory."""
    entries: tuple[PlanEntry, ...]
    screen_s: float
    rank_s: float
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.name, "cluster": self.cluster.name, "num_gpus": self.num_gpus,
                "global_batch_size": self.global_batch_size, "num_candidates": self.num_candidates,
                "num_valid": self.num_valid, "num_fit": self.num_fit, "screen_s": self.screen_s, "rank_s": self.rank_s,
                "notes": list(self.notes), "top": [e.to_dict() for e in self.entries]}


def candidates(model: ModelSpec, num_gpus: int, cluster: ClusterSpec, global_batch_size: int,
               space: PlanSpace = PlanSpace()) -> dict[str, np.ndarray]:
    """Every combination of the knobs as flat arrays (before validity checks)."""
    max_tp = space.max_tp or cluster.gpus_per_node
    tps = [d for d in divisors(num_gpus) if d <= max_tp]
    pps = [d for d in divisors(num_gpus) if d <= model.num_layers]
    if space.ep_sizes is not None:
        eps = list(space.ep_sizes)
    elif model.is_moe:
        eps = [d for d in divisors(model.num_experts) if d <= num_gpus]
    else:
        eps = [1]
    grids = np.meshgrid(tps, pps, list(space.cp_sizes), eps, list(space.micro_batch_sizes),
                        list(space.virtual_pipeline_sizes), [int(x) for x in space.sequence_parallel],
                        [RECOMPUTE_CODES.index(r) for r in space.recompute], list(range(len(space.zero))),
                        indexing="ij")
    names = ("tp", "pp", "cp", "ep", "mb", "v", "sp", "recompute", "zero_choice")
    out = {k: g.ravel().astype(np.int64) for k, g in zip(names, grids)}
    zero = np.array([z for z, _ in space.zero], dtype=np.int64)
    dist = np.array([d for _, d in space.zero], dtype=bool)
    out["zero"] = zero[out["zero_choice"]]
    out["dist_opt"] = dist[out["zero_choice"]]
    per_replica = out["tp"] * out["pp"] * out["cp"]
    out["dp"] = np.where(num_gpus % per_replica == 0, num_gpus // np.maximum(per_replica, 1), 0)
    out["gb"] = np.full_like(out["tp"], global_batch_size)
    return out


def _validity_terms(model: ModelSpec, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rules of check_job, one boolean array each, in the order :func:`_why_none_valid` blames them."""
    tp, pp, cp, ep, dp, mb, v, sp = (c[k] for k in ("tp", "pp", "cp", "ep", "dp", "mb", "v", "sp"))
    dpm = np.maximum(dp, 1)
    m = c["gb"] // (mb * dpm)
    ep_ok = (model.num_experts % ep == 0) if model.is_moe else (ep == 1)
    tp_ok = (model.num_heads % tp == 0) & ((model.kv_heads % tp == 0) | (tp % model.kv_heads == 0))
    tp_ok &= model.ffn % tp == 0
    if model.is_moe:
        tp_ok &= model.moe_ffn % tp == 0
    return {
        "ep": ep_ok,
        "split": dp >= 1,  # tp x pp x cp divides the GPUs
        "tp": tp_ok,
        "cp": model.seq_len % cp == 0,
        "sp": (sp == 0) | ((tp > 1) & (model.seq_len % (cp * tp) == 0)),
        # pp x v dividing the layers, or an uneven split with lighter first and last stages (or chunks)
        "layers": pp * v <= model.num_layers,
        "v_pp": (v == 1) | (pp > 1),
        "batch": c["gb"] % (mb * dpm) == 0,
        "v_batch": (v == 1) | (m % pp == 0),
        "ep_dp": (dpm * cp) % ep == 0,
    }


def valid_mask(model: ModelSpec, c: dict[str, np.ndarray]) -> np.ndarray:
    """Vectorised check_job + ParallelSpec validation, one spelling per job: sequence parallelism only with tp > 1
    (one rank has nothing to split), interleaving only with pp > 1, and with dp x cp = 1 (one replica: nothing
    to shard the optimizer, gradients or parameters over) only the plainest ZeRO choice of the space (the lowest
    stage, without the distributed optimizer), since every ZeRO choice is then the same job."""
    ok = np.ones(c["tp"].shape, dtype=bool)
    for term in _validity_terms(model, c).values():
        ok &= term
    if ok.size:
        zero_key = c["zero"] * 2 + c["dist_opt"]
        ok &= (c["dp"] * c["cp"] > 1) | (zero_key == zero_key.min())
    return ok


def _values(values: Any) -> str:
    return ",".join(str(int(x)) for x in values)


def _why_none_valid(model: ModelSpec, num_gpus: int, global_batch_size: int, max_tp: int,
                    c: dict[str, np.ndarray]) -> ConfigError:
    """The error to raise when no candidate of ``c`` is valid: the rule of :func:`_validity_terms` that, applied
    in order, rules out the last candidates, said in terms of the knob the user can change."""
    gb, L = global_batch_size, model.num_layers
    split = f"tp <= {max_tp} and pp <= num_layers={L} dividing {num_gpus} GPUs"
    survivors = np.ones(c["tp"].shape, dtype=bool)
    for name, term in _validity_terms(model, c).items():
        if (survivors & term).any():
            survivors &= term
            continue
        left = {k: a[survivors] for k, a in c.items()}
        eps = _values(np.unique(c["ep"]))
        if name == "ep":
            if not model.is_moe:
                return ConfigError("ep-sizes", eps, f"{model.name} is dense (no experts): expert parallelism needs an "
                                                    "MoE model; leave --ep-sizes out (ep=1)")
            fits = [d for d in divisors(model.num_experts) if d <= num_gpus]
            return ConfigError("ep-sizes", eps, f"ep must divide num_experts={model.num_experts} of {model.name}: "
                                                f"valid {_values(fits)}")
        if name == "split":
            return ConfigError("cp-sizes", _values(np.unique(c["cp"])),
                               f"cp must divide gpus={num_gpus} (tp x pp x cp divides the GPUs)")
        if name in ("cp", "sp"):
            return ConfigError("cp-sizes", _values(np.unique(c["cp"])), f"cp must divide seq_len={model.seq_len}")
        if name in ("layers", "v_pp", "v_batch"):
            return ConfigError("virtual-pipeline-sizes", _values(np.unique(c["v"])),
                               f"no candidate: v > 1 interleaves a pipeline, which needs pp > 1, pp x v <= "
                               f"num_layers={L} and micro-batches per iteration a multiple of pp; include 1")
        if name == "batch":
            dps = np.unique(left["dp"])
            mbs = _values(np.unique(left["mb"]))
            would = [b for b in PlanSpace().micro_batch_sizes if (gb % (b * dps) == 0).any()]
            if would:
                return ConfigError("micro-batch-sizes", mbs,
                                   f"no candidate: the global batch {gb} is not divisible by {mbs} x dp for any dp "
                                   f"(dp can be {_values(dps)} on {num_gpus} GPUs); valid e.g. {_values(would)}")
            if dps.min() > gb:
                return ConfigError("gpus", num_gpus,
                                   f"no valid configuration: every split ({split}) leaves at least {int(dps.min()):,} "
                                   f"data-parallel replicas, more than the {gb} sequences of the global batch; use fewer "
                                   "GPUs or a larger --global-batch-size")
            return ConfigError("gpus", num_gpus,
                               f"no valid configuration: the global batch {gb} is not divisible by any dp a split "
                               f"({split}) leaves: dp can be {_values(dps)}; choose a --global-batch-size that one of "
                               "them divides, or another GPU count")
        if name == "ep_dp":
            dcs = _values(np.unique(left["dp"] * left["cp"]))
            return ConfigError("ep-sizes", _values(np.unique(left["ep"])),
                               f"ep must divide dp x cp, which can be {dcs} on {num_gpus} GPUs")
        break
    return ConfigError("gpus", num_gpus, f"no valid configuration for {model.name} with global_batch_size={gb}")


def _span(size: np.ndarray, stride: np.ndarray, gpn: int) -> tuple[np.ndarray, np.ndarray]:
    """(num_nodes, per_node) of a group of ``size`` ranks spaced ``stride`` apart (Megatron order)."""
    extent = (size - 1) * stride + 1
    per_node = np.clip(gpn // np.maximum(stride, 1), 1, None)
    per_node = np.minimum(per_node, size)
    nodes = np.where(extent <= gpn, 1, np.ceil(size / per_node)).astype(np.int64)
    per_node = np.where(nodes == 1, size, per_node)
    return nodes, per_node


def screen_time_s(model: ModelSpec, cluster: ClusterSpec, c: dict[str, np.ndarray], gpu_util: float | None = None) -> np.ndarray:
    """Closed-form iteration time of every candidate (the first pass; see the module docstring)."""
    u = gpu_util or cluster.gpu_util
    peak = cluster.peak_flops_for(model.dtype)
    gpn = cluster.gpus_per_node
    tp, pp, cp, ep, dp, mb, v = (c[k] for k in ("tp", "pp", "cp", "ep", "dp", "mb", "v"))
    sp = c["sp"].astype(bool)
    rc = c["recompute"]
    dp = np.maximum(dp, 1)
    m = c["gb"] // (mb * dp)
    B = model.dtype_bytes
    tf = token_flops(model)
    L = model.num_layers
    layers_fl = sum(tf.layers)
    extra = np.where(rc == 2, layers_fl, np.where(rc == 1, sum(tf.attention_core), 0.0))
    tokens = mb * model.seq_len / cp
    stage_fl = (3 * layers_fl + extra) / pp + 3 * tf.logits  # the last stage, which also computes the logits
    comp = m * tokens * stage_fl / tp / (u * peak)
    act = tokens * model.hidden_size * B
    layers_per_stage = L / pp
    # TP: per layer and micro-batch 4 all-reduces (or 4 AG + 4 RS with SP), +2 (+2+2) with full recompute
    tp_nodes, tp_k = _span(tp, np.ones_like(tp), gpn)
    n_ar = (4 + 2 * (rc == 2)) * layers_per_stage + 2
    t_ar = alpha_beta_time_s(cluster, "all_reduce", act, tp, tp_nodes, tp_k)
    t_ag = alpha_beta_time_s(cluster, "all_gather", act, tp, tp_nodes, tp_k)
    t_rs = alpha_beta_time_s(cluster, "reduce_scatter", act, tp, tp_nodes, tp_k)
    tp_time = m * np.where(sp, n_ar * (t_ag + t_rs), n_ar * t_ar)
    # PP: a middle stage sends and receives one activation and one gradient per micro-batch
    stride_pp = tp * cp * dp
    pp_inter = stride_pp >= gpn
    msg = np.where(sp, act / tp, act)
    t_p2p = alpha_beta_time_s(cluster, "send", msg, 2, np.where(pp_inter, 2, 1), 1)
    pp_time = np.where(pp > 1, m * 2 * t_p2p, 0.0)
    # CP ring: (c-1)(3 + f) K/V transfers per layer and micro-batch, overlapped with attention compute
    kv = 2 * tokens * np.maximum(1, model.kv_heads // tp) * model.head_size * B
    cp_nodes, _ = _span(cp, tp, gpn)
    t_kv = alpha_beta_time_s(cluster, "send", kv, 2, np.where(cp_nodes > 1, 2, 1), 1)
    attn = m * tokens * sum(tf.attention_core) * 3 / pp / tp / (u * peak)
    cp_time = np.maximum(0.0, m * layers_per_stage * (cp - 1) * (3 + (rc == 2)) * t_kv - attn)
    # EP all-to-all: 4 per MoE layer and micro-batch
    if model.is_moe:
        moe_tokens = np.where(sp, tokens / tp, tokens)
        a2a = moe_tokens * model.top_k * model.hidden_size * B
        ep_nodes, ep_k = _span(ep, tp, gpn)
        ep_time = m * 4 * model.num_moe_layers / pp * alpha_beta_time_s(cluster, "all_to_all", a2a, ep, ep_nodes, ep_k)
    else:
        ep_time = np.zeros_like(comp)
    # DP: local parameters of a stage (approximated as 1/pp of the total plus the embedding share)
    G = dtype_bytes("fp32" if model.dtype == "bf16" else model.dtype)
    n_params = model.num_parameters(padded_vocab=True)
    local = n_params / (pp * tp)
    dc = dp * cp
    dp_nodes, dp_k = _span(dc, tp, gpn)
    zero, dist = c["zero"], c["dist_opt"]
    t_dp_ar = alpha_beta_time_s(cluster, "all_reduce", local * G, dc, dp_nodes, dp_k)
    t_dp_rs = alpha_beta_time_s(cluster, "reduce_scatter", local * G, dc, dp_nodes, dp_k)
    t_dp_ag = alpha_beta_time_s(cluster, "all_gather", local * B, dc, dp_nodes, dp_k)
    dp_time = np.where(zero == 3, m * (2 * t_dp_ag + t_dp_rs),
                       np.where((zero >= 1) | dist, t_dp_rs + t_dp_ag, t_dp_ar))
    per_mb = (comp + tp_time + pp_time + cp_time + ep_time) / m
    bubble = (pp - 1) / v * per_mb
    return np.asarray(m * per_mb + bubble + dp_time)


def plan(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, global_batch_size: int, *, top: int = 10,
         space: PlanSpace = PlanSpace(), refine: int | None = None, gpu_util: float | None = None,
         memory_fraction: float = USABLE_MEMORY_FRACTION, progress: Callable[[int, int], None] | None = None,
         gradient_accumulation_fusion: bool = True, attention: Attention = "flash",
         fp8_format: Fp8Format | None = None, stack: str | None = None) -> Plan:
    """The ``top`` fastest configurations of ``model`` on ``num_gpus`` GPUs that fit in memory (``refine``: estimate
    only the best of the screen op by op instead of all of them).

    ``gradient_accumulation_fusion``, ``attention``, ``fp8_format`` and ``stack`` are not searched but taken from the job (what
    its framework and kernels do, see :class:`~commscope.spec.parallel.ParallelSpec`): every configuration is
    estimated with them, and the memory check holds unfused attention's score matrices, so that a plan compared with
    a job times the same kernels (the closed-form screen leaves them out, as it leaves out every memory-bound
    kernel)."""
    from commscope.estimate.iteration import compute_gpu
    from commscope.estimate.many import estimate_many
    from commscope.estimate.memory import total_memory_bytes

    if num_gpus < 1:
        raise ConfigError("gpus", num_gpus, "must be a positive integer")
    if global_batch_size < 1:
        raise ConfigError("global_batch_size", global_batch_size, "must be a positive integer")
    if refine is not None and refine < 1:
        raise ConfigError("refine", refine, "must be >= 1 (None: every configuration that fits)")
    ParallelSpec(attention=attention, fp8_format=fp8_format, stack=stack)  # the job's settings, by the spec's own rules
    t0 = time.perf_counter()
    c = candidates(model, num_gpus, cluster, global_batch_size, space)
    n_candidates = c["tp"].size
    ok = valid_mask(model, c)
    if not ok.any():
        raise _why_none_valid(model, num_gpus, global_batch_size, space.max_tp or cluster.gpus_per_node, c)
    c = {k: v[ok] for k, v in c.items()}
    n_valid = c["tp"].size
    mem = total_memory_bytes(model, tp=c["tp"], pp=c["pp"], dp=c["dp"], cp=c["cp"], ep=c["ep"],
                             micro_batch_size=c["mb"], global_batch_size=c["gb"], virtual_pipeline_size=c["v"],
                             sequence_parallel=c["sp"].astype(bool),
                             recompute=np.array(RECOMPUTE_CODES, dtype=object)[c["recompute"]],
                             zero_stage=c["zero"], distributed_optimizer=c["dist_opt"], attention=attention)
    fits = mem <= memory_fraction * cluster.memory_bytes
    c = {k: v[fits] for k, v in c.items()}
    mem = mem[fits]
    n_fit = c["tp"].size
    notes: list[str] = []
    if not gradient_accumulation_fusion and compute_gpu(cluster, gpu_util)[0] is not None:
        # (FLOP / (u x peak), with --gpu-util or for a GPU without a model, has no kernels to add it to)
        notes.append("every configuration without gradient accumulation fusion (--no-gradient-accumulation-fusion): "
                     "each micro-batch's weight gradients added by a separate kernel, more of them the more "
                     "micro-batches")
    if attention == "unfused":
        notes.append("every configuration with unfused attention (--attention-backend unfused): its s x s scores in "
                     "memory, and GEMMs with softmax and dropout kernels in the time")
    if fp8_format is not None:
        notes.append(f"every configuration with FP8 linear-layer GEMMs (--fp8-format {fp8_format})")
    if stack is not None:
        notes.append(f"every configuration with the software stack {stack}'s compute efficiency (--stack {stack})")
    if n_fit == 0:
        reason = f"none of the {n_valid:,} valid configurations fits in {memory_fraction:.0%} of {cluster.memory_bytes / 2**30:.0f} GiB"
        raise ConfigError("gpus", num_gpus, f"{reason} for {model.name} with global_batch_size={global_batch_size}")
    times = screen_time_s(model, cluster, c, gpu_util)
    order = np.argsort(times, kind="stable")
    if refine is not None:
        order = order[: max(refine, top)]
    screen_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    parallels = [
        ParallelSpec(tp=int(c["tp"][idx]), pp=int(c["pp"][idx]), dp=int(c["dp"][idx]), cp=int(c["cp"][idx]),
                     ep=int(c["ep"][idx]), micro_batch_size=int(c["mb"][idx]), global_batch_size=global_batch_size,
                     virtual_pipeline_size=int(c["v"][idx]), sequence_parallel=bool(c["sp"][idx]),
                     recompute=RECOMPUTE_CODES[int(c["recompute"][idx])], zero_stage=int(c["zero"][idx]),
                     distributed_optimizer=bool(c["dist_opt"][idx]),
                     gradient_accumulation_fusion=gradient_accumulation_fusion, attention=attention,
                     fp8_format=fp8_format, stack=stack)
        for idx in order]
    entries = []
    chunk = 1024  # configurations per estimate_many call (and per progress step)
    for start in range(0, len(order), chunk):
        ests = estimate_many(model, cluster, parallels[start:start + chunk], gpu_util=gpu_util)
        for par, est, idx in zip(parallels[start:start + chunk], ests, order[start:start + chunk]):
            entries.append(PlanEntry(parallel=par, estimate=est, memory_bytes=float(mem[idx]),
                                     screen_time_s=float(times[idx])))
        if progress is not None:
            progress(len(entries), len(order))
    entries.sort(key=lambda e: e.estimate.iteration_time_s)
    return Plan(model=model, cluster=cluster, num_gpus=num_gpus, global_batch_size=global_batch_size,
                num_candidates=int(n_candidates), num_valid=int(n_valid), num_fit=int(n_fit),
                entries=tuple(entries[:top]), screen_s=screen_s, rank_s=time.perf_counter() - t1, notes=tuple(notes))
