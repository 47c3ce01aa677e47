"""The compute nodes of a Chakra trace: every kernel group of a layer with its time, FLOP, HBM bytes and class.

A simulator that re-times compute (ASTRA-sim's roofline mode: ``time = num_ops / min(bandwidth x num_ops /
tensor_size, peak)``) needs each compute node's FLOP (``num_ops``), the bytes it moves through HBM
(``tensor_size``) and what kind of kernel it is; a simulator that replays needs its time. This module gives all
four for every compute node :mod:`commscope.io.chakra_trace` places, from the public functions of the compute
model (:mod:`commscope.estimate.compute`), the same numbers the estimate uses.

One transformer layer runs these kernel groups, forward in this order (backward in reverse, the backward of each):

========================  ============  ==========================================================================
slot                      kernel        what (one GPU, one micro-batch)
========================  ============  ==========================================================================
``attn_norm``             memory_bound  input norm, rotary embedding of q and k, FP8 casts of the attention inputs
``qkv``                   gemm          the column-parallel QKV projection
``attention``             attention     the attention core: the fused (flash) kernel, or the two batched GEMMs
                                        with softmax and dropout between them (unfused)
``attn_proj``             gemm          the row-parallel output projection
``mlp_norm``              memory_bound  residual add, norm, FP8 casts of the MLP inputs
``mlp_up``, ``mlp_down``  gemm          dense MLP (gate and up fused)
``router``                gemm          MoE: router; ``experts_up``, ``experts_down``: local (and shared) experts
``mlp_act``               memory_bound  the activation (GeLU, SwiGLU)
``residual``              memory_bound  the second residual add
========================  ============  ==========================================================================

A stage adds the embedding lookup (first stage), the final norm, the logits GEMM and the cross-entropy (last
stage), the weight-gradient accumulation of each micro-batch without gradient accumulation fusion, and the
optimizer step (kernel class ``optimizer``). Recomputation replays the layer's forward (``full``) or its attention
core (``selective``) at the start of the layer's backward.

Where the numbers come from: GEMM time, FLOP and operand elements from :func:`~commscope.estimate.compute.gemm.layer_gemms`
and :func:`~commscope.estimate.compute.gemm.time_gemms`; attention and memory-bound time from
:func:`~commscope.estimate.compute.kernels.layer_kernels` and :func:`~commscope.estimate.compute.kernels.stage_extra_bytes`;
accumulation and the optimizer step from their functions there. The compute model does not expose how a layer's
memory-bound time divides between its kernels, so this module splits :func:`layer_kernels`' total by the element
counts of the kernels' table in :mod:`commscope.estimate.compute.kernels` (norms 2 x 2 h T', residual adds 2 x 3 h T', rotary
2 (q + g) T, activation 2 or 3 f T), and a memory-bound node's bytes are its time x the GPU's streaming bandwidth.
Each stage's forward and backward are then scaled to the compute model's own per-stage totals
(:func:`~commscope.estimate.compute.model.stage_compute`), so the trace's compute is the estimate's whatever the split;
``scale`` says by how much (1 while the two agree). With ``gpu_util`` (no GPU model) compute is Megatron's FLOP
count at u x peak, as the estimate has it: GEMMs and attention only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from commscope.estimate.compute.attention import BACKWARD_RATIO
from commscope.estimate.compute.gemm import Gemm, layer_gemms, time_gemms
from commscope.estimate.compute.kernels import (
    adam_bytes_per_param,
    grad_accumulation_bytes_per_param,
    layer_kernels,
    linear_gemm_dtype,
    optimizer_step_time_s,
    stage_extra_bytes,
)
from commscope.estimate.compute.model import _kind, stage_compute, timed_attention
from commscope.estimate.flops import token_flops
from commscope.estimate.stage_structure import _layer_kinds
from commscope.spec.model import ModelSpec
from commscope.spec.params import stage_params
from commscope.spec.parallel import ParallelSpec
from commscope.units import dtype_bytes
from commscope.pattern.workload.stages import stage_layers

__all__ = ["KERNEL_CLASSES", "Kernel", "LayerPlan", "StageKernels", "job_kernels"]

#: The kernel class of a compute node (its ``commscope_kernel`` attribute).
KERNEL_CLASSES = ("gemm", "attention", "memory_bound", "optimizer", "launch_gap")

#: The kernel groups of one layer's forward, in order (see the module docstring).
DENSE_SLOTS = ("attn_norm", "qkv", "attention", "attn_proj", "mlp_norm", "mlp_up", "mlp_act", "mlp_down", "residual")
MOE_SLOTS = ("attn_norm", "qkv", "attention", "attn_proj", "mlp_norm", "router", "experts_up", "mlp_act",
             "experts_down", "residual")
#: GEMM name (:func:`layer_gemms`) -> the slot that runs it.
_GEMM_SLOT = {"qkv": "qkv", "attn_proj": "attn_proj", "mlp_up": "mlp_up", "mlp_down": "mlp_down", "router": "router",
              "expert_up": "experts_up", "shared_up": "experts_up", "expert_down": "experts_down",
              "shared_down": "experts_down", "attn_scores": "attention", "attn_values": "attention"}
_MEMORY_SLOTS = ("attn_norm", "mlp_norm", "mlp_act", "residual")


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel:
    """One compute node's work on one GPU."""

    name: str
    kernel: str
    """One of :data:`KERNEL_CLASSES`."""
    time_s: float
    flop: float
    """FLOP it executes (a simulator's ``num_ops``)."""
    hbm_bytes: float
    """Bytes it moves through HBM (a simulator's ``tensor_size``)."""

    def scaled(self, factor: float) -> Kernel:
        return replace(self, time_s=self.time_s * factor)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerPlan:
    """The kernels of one layer of one kind (dense or MoE), for one micro-batch."""

    forward: tuple[Kernel, ...]
    """In forward order, one per slot."""
    backward: tuple[Kernel, ...]
    """The backward of each forward slot, in forward order (a backward pass runs them reversed)."""
    recompute: tuple[Kernel, ...]
    """What the backward replays first: the whole forward (full recomputation), the attention core (selective)."""

    def scaled(self, fwd: float, bwd: float) -> LayerPlan:
        return LayerPlan(forward=tuple(k.scaled(fwd) for k in self.forward),
                         backward=tuple(k.scaled(bwd) for k in self.backward),
                         recompute=tuple(k.scaled(bwd) for k in self.recompute))

    @property
    def forward_s(self) -> float:
        return sum(k.time_s for k in self.forward)

    @property
    def backward_s(self) -> float:
        return sum(k.time_s for k in self.backward) + sum(k.time_s for k in self.recompute)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageKernels:
    """The compute of one rank of a pipeline stage: per-layer kernels and the stage's own, one micro-batch each."""

    layers: dict[str, LayerPlan]
    """By layer kind: ``dense``, ``moe``."""
    embedding: tuple[Kernel, Kernel] | None
    """(forward, backward) of the embedding lookup, on the first stage."""
    head_forward: tuple[Kernel, ...]
    """Final norm, logits GEMM, cross-entropy (last stage), in forward order."""
    head_backward: tuple[Kernel, ...]
    """Their backward, in backward order (cross-entropy first)."""
    accumulate: tuple[Kernel | None, ...]
    """Per model chunk: adding a micro-batch's weight gradients into the accumulated ones (None with fusion)."""
    optimizer: Kernel
    scale: tuple[float, float]
    """(forward, backward) factors that brought this module's sums to the compute model's stage totals."""

    def layer(self, model: ModelSpec, layer: int) -> LayerPlan:
        return self.layers["moe" if model.is_moe_layer(layer) else "dense"]


def _kernel(name: str, kernel: str, time_s: float, flop: float, hbm_bytes: float) -> Kernel:
    return Kernel(name=name, kernel=kernel, time_s=float(time_s), flop=float(flop), hbm_bytes=float(hbm_bytes))


def _gemm_bytes(g: Gemm, elem_bytes: int) -> float:
    return float(elem_bytes * g.batch * g.io_elements * g.count)


def _memory_weights(model: ModelSpec, parallel: ParallelSpec, kind: str) -> dict[str, float]:
    """Forward HBM bytes of each memory-bound slot by the element counts of :mod:`commscope.estimate.compute.kernels`' table
    (its per-kernel split is not exposed; only shares of these are used)."""
    B, t = model.dtype_bytes, parallel.tp
    T = parallel.micro_batch_size * model.seq_len // parallel.cp
    Tn = T // t if parallel.sequence_parallel and t > 1 else T
    h = model.hidden_size
    q = model.num_heads // t * model.head_size
    g = max(1, model.kv_heads // t) * model.head_size
    if kind == "moe":
        f_tokens = T * model.top_k * model.moe_ffn // t + T * model.num_shared_experts * model.moe_ffn // t
    else:
        f_tokens = T * model.ffn // t
    rope = 2 * (q + g) * T if model.position_embedding == "rope" else 0
    out = {"attn_norm": float((2 * h * Tn + rope) * B), "mlp_norm": float(5 * h * Tn * B),
           "mlp_act": float((3 if model.gated_mlp else 2) * f_tokens * B), "residual": float(3 * h * Tn * B)}
    if parallel.fp8_format is not None:  # casts of the linear layers' inputs to FP8
        out["attn_norm"] += (B + 1) * T * (h + q)
        out["mlp_norm"] += (B + 1) * (T * h + f_tokens)
    return out


def _split(total_s: float, weights: dict[str, float]) -> dict[str, float]:
    whole = sum(weights.values())
    if whole <= 0:
        return {k: total_s / len(weights) for k in weights}
    return {k: total_s * w / whole for k, w in weights.items()}


def _gpu_layer(model: ModelSpec, parallel: ParallelSpec, gpu: Any, kind: str) -> LayerPlan:
    """One layer of ``kind`` on ``gpu``, the way :func:`commscope.estimate.compute.model.stage_compute` times it."""
    slots = MOE_SLOTS if kind == "moe" else DENSE_SLOTS
    bandwidth = gpu.streaming_bandwidth_bytes_per_s
    B = model.dtype_bytes
    gemms = layer_gemms(model, parallel, layer_kind=kind, attention=parallel.attention)
    core = {"attn_scores", "attn_values"}
    linear = [g for g in gemms if g.name not in core]
    lin_dtype = linear_gemm_dtype(model, parallel)
    timed = list(time_gemms(tuple((g, 1) for g in linear if g.name != "router"), gpu, lin_dtype))
    timed += time_gemms(tuple((g, 1) for g in linear if g.name == "router"), gpu, model.dtype)
    if parallel.attention == "unfused":
        timed += time_gemms(tuple((g, 1) for g in gemms if g.name in core), gpu, model.dtype)
    work: dict[tuple[str, str], list[float]] = {}  # (slot, fwd|bwd) -> [time, flop, bytes]
    for r in timed:
        slot = _GEMM_SLOT[r.gemm.name]
        elem = dtype_bytes(lin_dtype if slot != "attention" and r.gemm.name != "router" else model.dtype)
        acc = work.setdefault((slot, "fwd" if r.gemm.pass_ == "fwd" else "bwd"), [0.0, 0.0, 0.0])
        acc[0] += r.time_s
        acc[1] += r.gemm.flop
        acc[2] += _gemm_bytes(r.gemm, elem)
    k = layer_kernels(model, parallel, gpu, moe=(kind == "moe"))
    # attention core: the fused kernel (or the unfused softmax and dropout around the GEMMs above)
    T = parallel.micro_batch_size * model.seq_len // parallel.cp
    q = model.num_heads // parallel.tp * model.head_size
    g = max(1, model.kv_heads // parallel.tp) * model.head_size
    for pass_, time_s, flop in (("fwd", k.attention_fwd_s, k.attention_flop),
                                ("bwd", k.attention_bwd_s, BACKWARD_RATIO * k.attention_flop)):
        acc = work.setdefault(("attention", pass_), [0.0, 0.0, 0.0])
        acc[0] += time_s
        acc[1] += flop
        if parallel.attention == "flash":  # Q, O and the sequence's K, V (and their gradients backward)
            acc[2] += (1 if pass_ == "fwd" else 2) * B * (2 * T * q + 2 * parallel.micro_batch_size * model.seq_len * g)
        else:
            acc[2] += time_s * bandwidth
    weights = _memory_weights(model, parallel, kind)
    for pass_, total in (("fwd", k.memory_fwd_s), ("bwd", k.memory_bwd_s)):
        for slot, time_s in _split(total, weights).items():
            work[(slot, pass_)] = [time_s, time_s * bandwidth / B, time_s * bandwidth]

    def kernel(slot: str, pass_: str) -> Kernel:
        time_s, flop, nbytes = work.get((slot, pass_), [0.0, 0.0, 0.0])
        cls = "gemm" if slot in _GEMM_SLOT.values() and slot != "attention" else (
            "attention" if slot == "attention" else "memory_bound")
        return _kernel(slot, cls, time_s, flop, nbytes)

    forward = tuple(kernel(s, "fwd") for s in slots)
    backward = tuple(kernel(s, "bwd") for s in slots)
    # the in-training effects, as the compute model has them per layer (compute.effects): each class brought to the
    # model's own time (sustained clock, Transformer Engine's GEMM pieces), and the host launch gaps as nodes of
    # their own, a class a roofline does not re-time
    k_ = _kind(model, parallel, gpu, kind)
    forward = _to_classes(forward, {"gemm": k_.lin_fwd, "attention": k_.att_fwd, "memory_bound": k_.mem_fwd})
    backward = _to_classes(backward, {"gemm": k_.lin_bwd, "attention": k_.att_bwd, "memory_bound": k_.mem_bwd})
    if k_.gaps_fwd > 0:
        forward += (_kernel("launch_gap", "launch_gap", k_.gaps_fwd, 1.0, 1.0),)
    if k_.gaps_bwd > 0:
        backward += (_kernel("launch_gap", "launch_gap", k_.gaps_bwd, 1.0, 1.0),)
    return LayerPlan(forward=forward, backward=backward, recompute=_recompute(forward, parallel.recompute))


def _to_classes(kernels: tuple[Kernel, ...], targets: dict[str, float]) -> tuple[Kernel, ...]:
    """``kernels`` with each class's times scaled to sum to ``targets[class]`` (a class without time kept)."""
    sums: dict[str, float] = {}
    for k in kernels:
        sums[k.kernel] = sums.get(k.kernel, 0.0) + k.time_s
    return tuple(k.scaled(targets[k.kernel] / sums[k.kernel]) if sums.get(k.kernel, 0.0) > 0 and k.kernel in targets
                 else k for k in kernels)


def _recompute(forward: tuple[Kernel, ...], recompute: str) -> tuple[Kernel, ...]:
    if recompute == "full":
        return forward
    if recompute == "selective":
        return tuple(k for k in forward if k.kernel == "attention")
    return ()


def _flop_layer(model: ModelSpec, parallel: ParallelSpec, layer: int, rate: float) -> LayerPlan:
    """One layer at FLOP / (u x peak): Megatron's FLOP count (:func:`commscope.estimate.flops.token_flops`) split over the
    GEMM slots by their FLOP, the attention core apart; backward twice the forward (the estimate's rule)."""
    kind = "moe" if model.is_moe_layer(layer) else "dense"
    slots = MOE_SLOTS if kind == "moe" else DENSE_SLOTS
    tf = token_flops(model)
    tokens = parallel.micro_batch_size * model.seq_len / parallel.cp
    gemms = [g for g in layer_gemms(model, parallel, layer_kind=kind, attention=parallel.attention)
             if g.pass_ == "fwd" and g.name not in ("attn_scores", "attn_values")]
    by_slot: dict[str, float] = {}
    nbytes: dict[str, float] = {}
    for g in gemms:
        by_slot[_GEMM_SLOT[g.name]] = by_slot.get(_GEMM_SLOT[g.name], 0.0) + g.flop
        nbytes[_GEMM_SLOT[g.name]] = nbytes.get(_GEMM_SLOT[g.name], 0.0) + _gemm_bytes(g, model.dtype_bytes)
    linear_flop = tokens * (tf.layers[layer] - tf.attention_core[layer]) / parallel.tp
    core_flop = tokens * tf.attention_core[layer] / parallel.tp
    share = _split(linear_flop, by_slot)
    forward, backward = [], []
    for slot in slots:
        if slot == "attention":
            flop, cls = core_flop, "attention"
        elif slot in share:
            flop, cls = share[slot], "gemm"
        else:
            flop, cls = 0.0, "memory_bound"
        forward.append(_kernel(slot, cls, flop / rate, flop, nbytes.get(slot, 0.0)))
        backward.append(_kernel(slot, cls, 2 * flop / rate, 2 * flop, 2 * nbytes.get(slot, 0.0)))
    fwd = tuple(forward)
    return LayerPlan(forward=fwd, backward=tuple(backward), recompute=_recompute(fwd, parallel.recompute))


def _optimizer(model: ModelSpec, parallel: ParallelSpec, gpu: Any, stage: int) -> Kernel:
    p = parallel.pp
    chunks = stage_layers(model, parallel, stage)
    params = [stage_params(model, chunk, tp=parallel.tp, ep=parallel.ep, first=stage == 0 and i == 0,
                           last=stage == p - 1 and i == len(chunks) - 1) for i, chunk in enumerate(chunks)]
    dense, expert = sum(s.dense for s in params), sum(s.expert for s in params)
    shards = parallel.shards_optimizer or parallel.framework == "torch-fsdp2"
    updated = dense / (parallel.dp * parallel.cp if shards else 1) + expert / (parallel.expert_dp if shards else 1)
    update, buffer = adam_bytes_per_param(model.dtype_bytes, fp16=model.dtype == "fp16")
    nbytes = update * updated + buffer * (dense + expert)
    time_s = 0.0 if gpu is None else optimizer_step_time_s(model, parallel, gpu, dense_params=dense, expert_params=expert)
    return _kernel("optimizer_step", "optimizer", time_s, updated, nbytes)


def _chunk_params(model: ModelSpec, parallel: ParallelSpec, stage: int) -> list[int]:
    chunks = stage_layers(model, parallel, stage)
    p = parallel.pp
    out = []
    for i, chunk in enumerate(chunks):
        sp = stage_params(model, chunk, tp=parallel.tp, ep=parallel.ep, first=stage == 0 and i == 0,
                          last=stage == p - 1 and i == len(chunks) - 1)
        out.append(sp.dense + sp.expert)
    return out


def _stage_sums(model: ModelSpec, parallel: ParallelSpec, stage: int, layers: dict[str, LayerPlan],
                embedding: tuple[Kernel, Kernel] | None, head_f: Iterable[Kernel], head_b: Iterable[Kernel],
                accumulate: Iterable[Kernel | None]) -> tuple[float, float]:
    fwd = bwd = 0.0
    for chunk in stage_layers(model, parallel, stage):
        for layer in chunk:
            plan = layers["moe" if model.is_moe_layer(layer) else "dense"]
            fwd += plan.forward_s
            bwd += plan.backward_s
    if embedding is not None:
        fwd += embedding[0].time_s
        bwd += embedding[1].time_s
    fwd += sum(k.time_s for k in head_f)
    bwd += sum(k.time_s for k in head_b) + sum(k.time_s for k in accumulate if k is not None)
    return fwd, bwd


def job_kernels(prediction: Any, estimate: Any, gpu: Any = None) -> list[StageKernels]:
    """The kernels of every pipeline stage of ``prediction``, timed as ``estimate`` was: by the GPU's compute model
    (``estimate.compute_model == "gpu"``; ``gpu`` as :func:`commscope.estimate.estimate` took it), else at FLOP /
    (u x peak) with the estimate's u. Each stage's totals are the compute model's (module docstring)."""
    from commscope.estimate.iteration import compute_gpu

    model, parallel, cluster = prediction.model, prediction.parallel, prediction.cluster
    spec = None
    if estimate.compute_model == "gpu":
        spec, _ = compute_gpu(cluster, None, gpu)
    p = parallel.pp
    out = []
    if spec is not None:
        par, _ = timed_attention(model, parallel, spec)
        totals = stage_compute(model, parallel, spec)
        kinds = {kind: _gpu_layer(model, par, spec, kind) for kind in _layer_kinds(model)}
        logits = list(time_gemms(tuple((g, 1) for g in layer_gemms(model, par, logits=True)), spec, model.dtype))
        per_param = grad_accumulation_bytes_per_param(model, par)
    else:
        par = parallel
        rate = estimate.gpu_util * estimate.peak_flops  # FLOP/s of one rank
        fwd_logits = [g for g in layer_gemms(model, parallel, logits=True) if g.pass_ == "fwd"]
    B = model.dtype_bytes
    T = parallel.micro_batch_size * model.seq_len // parallel.cp
    Tn = T // parallel.tp if parallel.sequence_parallel and parallel.tp > 1 else T
    for stage in range(p):
        first, last = stage == 0, stage == p - 1
        # the embedding lookup, final norm and cross-entropy are memory-bound: timed at the GPU's streaming
        # bandwidth, or not at all at FLOP / (u x peak) (the estimate's FLOP count has no memory-bound work)
        seconds_per_byte = 1.0 / spec.streaming_bandwidth_bytes_per_s if spec is not None else 0.0
        embedding = None
        if first:
            ef, eb = stage_extra_bytes(model, par, first=True, last=False)
            embedding = (_kernel("embedding", "memory_bound", ef * seconds_per_byte, ef / B, ef),
                         _kernel("embedding", "memory_bound", eb * seconds_per_byte, eb / B, eb))
        head_f: list[Kernel] = []
        head_b: list[Kernel] = []
        if last:
            hf, hb = stage_extra_bytes(model, par, first=False, last=True)
            norm_f, norm_b = 2.0 * model.hidden_size * Tn * B, 4.0 * model.hidden_size * Tn * B
            if spec is not None:
                lf = [(r.time_s, r.gemm) for r in logits if r.gemm.pass_ == "fwd"]
                lb = [(r.time_s, r.gemm) for r in logits if r.gemm.pass_ != "fwd"]
            else:
                flop = T * token_flops(model).logits / parallel.tp
                lf = [(flop / rate * g.flop / sum(x.flop for x in fwd_logits), g) for g in fwd_logits]
                lb = [(2 * time_s, g) for time_s, g in lf]
            head_f = [_kernel("final_norm", "memory_bound", norm_f * seconds_per_byte, norm_f / B, norm_f),
                      _kernel("logits", "gemm", sum(t for t, _ in lf), sum(g.flop for _, g in lf),
                              sum(_gemm_bytes(g, B) for _, g in lf)),
                      _kernel("cross_entropy", "memory_bound", (hf - norm_f) * seconds_per_byte, (hf - norm_f) / B,
                              hf - norm_f)]
            head_b = [_kernel("cross_entropy", "memory_bound", (hb - norm_b) * seconds_per_byte, (hb - norm_b) / B,
                              hb - norm_b),
                      _kernel("logits", "gemm", sum(t for t, _ in lb), sum(g.flop for _, g in lb),
                              sum(_gemm_bytes(g, B) for _, g in lb)),
                      _kernel("final_norm", "memory_bound", norm_b * seconds_per_byte, norm_b / B, norm_b)]
        accumulate: list[Kernel | None] = []
        if spec is not None:
            layers = kinds
            for n in _chunk_params(model, par, stage):
                nbytes = n * per_param
                accumulate.append(_kernel("grad_accumulation", "memory_bound", nbytes * seconds_per_byte, n, nbytes)
                                  if nbytes else None)
            fwd, bwd = _stage_sums(model, par, stage, layers, embedding, head_f, head_b, accumulate)
            scale = (float(totals.forward_s[stage]) / fwd if fwd > 0 else 1.0,
                     float(totals.backward_s[stage]) / bwd if bwd > 0 else 1.0)
        else:
            layers = {}
            for chunk in stage_layers(model, parallel, stage):
                for layer in chunk:
                    layers.setdefault("moe" if model.is_moe_layer(layer) else "dense",
                                      _flop_layer(model, parallel, layer, rate))
            accumulate = [None] * parallel.virtual_pipeline_size
            scale = (1.0, 1.0)
        f_s, b_s = scale
        out.append(StageKernels(
            layers={kind: plan.scaled(f_s, b_s) for kind, plan in layers.items()},
            embedding=None if embedding is None else (embedding[0].scaled(f_s), embedding[1].scaled(b_s)),
            head_forward=tuple(k.scaled(f_s) for k in head_f), head_backward=tuple(k.scaled(b_s) for k in head_b),
            accumulate=tuple(None if k is None else k.scaled(b_s) for k in accumulate),
            optimizer=_optimizer(model, par, spec, stage), scale=scale))
    if spec is None and estimate.compute_s > 0:
        # the seed method times compute by its own formula: bring the critical stage to it
        crit = estimate.critical_stage
        m = parallel.num_micro_batches
        fwd, bwd = _stage_sums(model, parallel, crit, out[crit].layers, out[crit].embedding, out[crit].head_forward,
                               out[crit].head_backward, out[crit].accumulate)
        factor = estimate.compute_s / (m * (fwd + bwd)) if fwd + bwd > 0 else 1.0
        if abs(factor - 1) > 1e-9:
            out = [replace(s, layers={k: v.scaled(factor, factor) for k, v in s.layers.items()},
                           head_forward=tuple(k.scaled(factor) for k in s.head_forward),
                           head_backward=tuple(k.scaled(factor) for k in s.head_backward),
                           scale=(factor, factor)) for s in out]
    return out
