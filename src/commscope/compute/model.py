"""Compute time of one training iteration, per pipeline stage and micro-batch, from the GPU's own model.

For each layer kind of the model (dense, MoE) on one GPU and one micro-batch:

- the linear GEMMs (QKV, attention output, MLP or experts, router) forward, dgrad and wgrad, each timed by
  the tile/wave model of :mod:`commscope.compute.gemm` (in FP8 under ``fp8_format``);
- the attention core, fused or unfused, and the memory-bound kernels of :mod:`commscope.compute.kernels`;
- without gradient accumulation fusion, the add of each micro-batch's weight gradients into the accumulated ones;
- recomputation: ``full`` repeats the layer's whole forward in backward; ``selective`` repeats the attention
  core [korthikanti-2022]: the two batched GEMMs, softmax and dropout when unfused, the fused kernel's forward
  when flash (Megatron-core checkpoints its core attention either way, so with flash attention selective costs a
  kernel forward and saves only the kernel's softmax statistics).

A stage sums the layers it holds (all its virtual chunks), the first stage adds the embedding, the last the
final norm, the logits GEMMs and the cross-entropy. The optimizer step is per iteration and per stage.

The result also says how much of each pass is linear-layer GEMM time, which is what tensor-parallel
communication can hide under with ``--tp-comm-overlap``, and how much is attention, which hides the context-
parallel ring (:mod:`commscope.estimate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from commscope.compute.gemm import GemmResult, layer_gemms, time_gemms
from commscope.compute.kernels import (
    HALF_DTYPES,
    LayerKernels,
    fused_softmax_available,
    grad_accumulation_bytes_per_param,
    grad_accumulation_note,
    softmax_rows_per_block,
    layer_kernels,
    linear_gemm_dtype,
    optimizer_step_time_s,
    stage_extra_bytes,
    torch_softmax_extra_bytes,
)
from commscope.errors import ConfigError
from commscope.gpus import GpuSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.spec.params import stage_params
from commscope.workload.stages import stage_layers

__all__ = ["StageCompute", "stage_compute", "timed_attention"]

_CORE = frozenset({"attn_scores", "attn_values"})


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCompute:
    """Compute of one GPU of each pipeline stage (arrays of length pp; seconds per micro-batch unless noted)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    """dgrad + wgrad + attention and memory-bound backward + recomputation."""
    recompute_s: np.ndarray
    """The part of ``backward_s`` that repeats forward work."""
    gemm_s: np.ndarray
    """Linear-layer and logits GEMMs, forward and backward (recomputation apart)."""
    attention_s: np.ndarray
    """Attention core forward and backward (fused kernel, or unfused GEMMs and softmax/dropout)."""
    memory_s: np.ndarray
    """Memory-bound kernels forward and backward."""
    linear_forward_s: np.ndarray
    """Forward linear-layer GEMM time (what TP communication overlaps with, forward)."""
    linear_backward_s: np.ndarray
    """Backward linear-layer GEMM time, recomputed forward GEMMs included."""
    optimizer_s: np.ndarray
    """Optimizer step, once per iteration."""
    flop: np.ndarray
    """FLOP the kernels execute per micro-batch (causal attention at half, recomputation included)."""
    gemm_efficiency: float
    """FLOP-weighted fraction of peak of the linear GEMMs of the slowest stage."""
    gpu: str
    notes: tuple[str, ...] = ()

    def breakdown(self, stage: int, num_micro_batches: int) -> dict[str, float]:
        """Seconds per iteration of ``stage`` by kind of work."""
        m = num_micro_batches
        return {"gemm_s": float(self.gemm_s[stage] * m), "attention_s": float(self.attention_s[stage] * m),
                "memory_bound_s": float(self.memory_s[stage] * m), "recompute_s": float(self.recompute_s[stage] * m),
                "optimizer_s": float(self.optimizer_s[stage])}



@dataclass(frozen=True, slots=True)
class _Kind:
    """One layer of one kind for one micro-batch (seconds)."""

    lin_fwd: float
    lin_bwd: float
    att_fwd: float
    att_bwd: float
    mem_fwd: float
    mem_bwd: float
    recompute: float
    recompute_linear: float
    flop: float
    lin_flop: float
    lin_time: float

    @property
    def fwd(self) -> float:
        return self.lin_fwd + self.att_fwd + self.mem_fwd

    @property
    def bwd(self) -> float:
        return self.lin_bwd + self.att_bwd + self.mem_bwd + self.recompute


def _by_pass(results: tuple[GemmResult, ...]) -> dict[str, float]:
    out = {"fwd": 0.0, "dgrad": 0.0, "wgrad": 0.0}
    for r in results:
        out[r.gemm.pass_] += r.time_s
    return out


def _kind(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, kind: str, timer: Callable[..., Any] = time_gemms) -> _Kind:
    """One layer of ``kind``; ``timer`` times GEMMs (:func:`time_gemms`, or a :class:`GemmTimer`)."""
    gemms = layer_gemms(model, parallel, layer_kind=kind, attention=parallel.attention)
    linear = tuple(g for g in gemms if g.name not in _CORE)
    core = tuple(g for g in gemms if g.name in _CORE) if parallel.attention == "unfused" else ()
    lin_dtype = linear_gemm_dtype(model, parallel)
    if parallel.fp8_format is not None and "fp8" not in gpu.peak_flops:
        raise ConfigError("fp8_format", parallel.fp8_format,
                          f"GPU {gpu.name!r} has no FP8 tensor cores (FP8 needs Hopper or Ada, sm_89+); it has "
                          f"{', '.join(sorted(gpu.peak_flops))}: drop --fp8-format")
    fp8 = tuple((g, 1) for g in linear if g.name != "router")
    plain = tuple((g, 1) for g in linear if g.name == "router")
    lin = timer(fp8, gpu, lin_dtype) + timer(plain, gpu, model.dtype)
    cor = timer(tuple((g, 1) for g in core), gpu, model.dtype)
    k: LayerKernels = layer_kernels(model, parallel, gpu, moe=(kind == "moe"))
    lp, cp_ = _by_pass(lin), _by_pass(cor)
    att_fwd = k.attention_fwd_s + cp_["fwd"]
    att_bwd = k.attention_bwd_s + cp_["dgrad"] + cp_["wgrad"]
    fwd = lp["fwd"] + att_fwd + k.memory_fwd_s
    recompute_linear = 0.0
    if parallel.recompute == "full":
        recompute, recompute_linear = fwd, lp["fwd"]
    elif parallel.recompute == "selective":
        recompute = att_fwd
    else:
        recompute = 0.0
    lin_flop = sum(r.gemm.flop for r in lin)
    flop = lin_flop + sum(r.gemm.flop for r in cor) + (1 + 2.5) * k.attention_flop
    if parallel.recompute == "full":
        flop += sum(r.gemm.flop for r in lin + cor if r.gemm.pass_ == "fwd") + k.attention_flop
    elif parallel.recompute == "selective":
        flop += sum(r.gemm.flop for r in cor if r.gemm.pass_ == "fwd") + k.attention_flop
    return _Kind(lin_fwd=lp["fwd"], lin_bwd=lp["dgrad"] + lp["wgrad"], att_fwd=att_fwd, att_bwd=att_bwd,
                 mem_fwd=k.memory_fwd_s, mem_bwd=k.memory_bwd_s, recompute=recompute,
                 recompute_linear=recompute_linear, flop=flop, lin_flop=lin_flop, lin_time=sum(r.time_s for r in lin))


def first_max(x: Any, rel: float = 1e-9) -> Any:
    """Index along the last axis of the first value within ``rel`` of the largest: the stage that decides, the
    same one whatever order its time was summed in (np.argmax alone lets a rounding difference between two equal
    stages pick either, and the scalar and the many-configuration paths sum in different orders)."""
    x = np.asarray(x)
    top = x.max(axis=-1, keepdims=True)
    return np.argmax(x >= top - rel * np.abs(top), axis=-1)


def _softmax_fallback_note(model: ModelSpec, parallel: ParallelSpec) -> str:
    """Why Megatron's fused softmax kernel does not run in this unfused attention, and what the fallback costs."""
    batches = parallel.micro_batch_size * (model.num_heads // parallel.tp)
    rows = max(4, softmax_rows_per_block(model.seq_len))
    if model.dtype not in HALF_DTYPES:
        why = f"{model.dtype} scores (the kernel takes fp16/bf16)"
    elif not fused_softmax_available(model, micro_batch_size=rows, tp=model.num_heads, cp=parallel.cp):
        # (refused even with a whole block of rows: the sequence is what the kernel does not take)
        why = f"sequence {model.seq_len} (the kernel takes 16 < s <= 4096, a multiple of 4)"
    else:
        why = (f"micro-batch {parallel.micro_batch_size} x {model.num_heads // parallel.tp} heads per rank = {batches}, "
               f"not a multiple of the kernel's {rows} rows per block: a micro-batch that makes it one avoids this")
    fwd, _ = torch_softmax_extra_bytes(model)
    kernel = 2 * model.dtype_bytes
    return (f"unfused attention: Megatron's fused softmax kernel does not run ({why}); PyTorch's scale, mask and "
            f"softmax are timed instead ({(kernel + fwd) / kernel:.0f}x the kernel's bytes forward)")


def timed_attention(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec) -> tuple[ParallelSpec, tuple[str, ...]]:
    """``parallel`` with its attention as ``gpu`` runs it (unfused where the GPU has no fused kernels), and notes
    that say where that, or Megatron's softmax kernel, differs from what was asked."""
    notes = []
    if parallel.attention == "flash" and not gpu.flash_attention:
        notes.append(f"{gpu.name} has no fused (flash) attention kernels: attention is timed unfused")
        parallel = replace(parallel, attention="unfused")
    if parallel.attention == "unfused" and not fused_softmax_available(
            model, micro_batch_size=parallel.micro_batch_size, tp=parallel.tp, cp=parallel.cp):
        notes.append(_softmax_fallback_note(model, parallel))
    return parallel, tuple(notes)


def stage_compute(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec) -> StageCompute:
    """Per-stage compute of ``model`` under ``parallel`` on ``gpu`` (see the module docstring)."""
    parallel, attention_notes = timed_attention(model, parallel, gpu)
    notes = list(attention_notes)
    p = parallel.pp
    kinds = {"dense": _kind(model, parallel, gpu, "dense")} if model.num_layers > model.num_moe_layers else {}
    if model.is_moe:
        kinds["moe"] = _kind(model, parallel, gpu, "moe")
    logits_gemms = layer_gemms(model, parallel, logits=True)
    logits = _by_pass(time_gemms(tuple((g, 1) for g in logits_gemms), gpu, model.dtype))
    logits_flop = sum(g.flop for g in logits_gemms)
    bandwidth = gpu.streaming_bandwidth_bytes_per_s
    accumulation_bytes = grad_accumulation_bytes_per_param(model, parallel)
    accumulation_note = grad_accumulation_note(model, parallel)
    if accumulation_note:
        notes.append(accumulation_note)
    arrays = {key: np.zeros(p) for key in ("fwd", "bwd", "rec", "gemm", "att", "mem", "lin_f", "lin_b", "opt", "flop",
                                           "lin_flop", "lin_time")}
    for stage in range(p):
        chunks = stage_layers(model, parallel, stage)
        layers = [layer for chunk in chunks for layer in chunk]
        first, last = stage == 0, stage == p - 1
        for layer in layers:
            k = kinds["moe" if model.is_moe_layer(layer) else "dense"]
            for key, value in (("fwd", k.fwd), ("bwd", k.bwd), ("rec", k.recompute), ("gemm", k.lin_fwd + k.lin_bwd),
                               ("att", k.att_fwd + k.att_bwd), ("mem", k.mem_fwd + k.mem_bwd), ("lin_f", k.lin_fwd),
                               ("lin_b", k.lin_bwd + k.recompute_linear), ("flop", k.flop), ("lin_flop", k.lin_flop),
                               ("lin_time", k.lin_time)):
                arrays[key][stage] += value
        extra_fwd, extra_bwd = stage_extra_bytes(model, parallel, first=first, last=last)
        arrays["fwd"][stage] += extra_fwd / bandwidth
        arrays["bwd"][stage] += extra_bwd / bandwidth
        arrays["mem"][stage] += (extra_fwd + extra_bwd) / bandwidth
        if last:
            arrays["fwd"][stage] += logits["fwd"]
            arrays["bwd"][stage] += logits["dgrad"] + logits["wgrad"]
            arrays["gemm"][stage] += logits["fwd"] + logits["dgrad"] + logits["wgrad"]
            arrays["flop"][stage] += logits_flop
        params = [stage_params(model, chunk, tp=parallel.tp, ep=parallel.ep, first=first and i == 0,
                               last=last and i == len(chunks) - 1) for i, chunk in enumerate(chunks)]
        dense_params, expert_params = sum(s.dense for s in params), sum(s.expert for s in params)
        arrays["opt"][stage] = optimizer_step_time_s(model, parallel, gpu, dense_params=dense_params,
                                                     expert_params=expert_params)
        accumulate = (dense_params + expert_params) * accumulation_bytes / bandwidth
        arrays["bwd"][stage] += accumulate
        arrays["mem"][stage] += accumulate
    crit = int(first_max(arrays["fwd"] + arrays["bwd"]))
    lin_dtype = linear_gemm_dtype(model, parallel)
    peak = gpu.peak_flops_for(lin_dtype)
    eff = float(arrays["lin_flop"][crit] / (arrays["lin_time"][crit] * peak)) if arrays["lin_time"][crit] else 0.0
    notes.append(f"compute: per-GEMM tile/wave model on {gpu.name} ({lin_dtype} linear GEMMs at {eff:.0%} of peak), "
                 f"{parallel.attention} attention, memory-bound kernels at {round(gpu.memory_efficiency * 100, 1):g}% of "
                 f"{gpu.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s, Adam step")
    return StageCompute(forward_s=arrays["fwd"], backward_s=arrays["bwd"], recompute_s=arrays["rec"],
                        gemm_s=arrays["gemm"], attention_s=arrays["att"], memory_s=arrays["mem"],
                        linear_forward_s=arrays["lin_f"], linear_backward_s=arrays["lin_b"], optimizer_s=arrays["opt"],
                        flop=arrays["flop"], gemm_efficiency=eff, gpu=gpu.name, notes=tuple(notes))
