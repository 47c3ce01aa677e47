"""What a transformer layer computes besides its linear GEMMs: attention, memory-bound kernels, the optimizer step.

Three kinds of kernels, each timed by the roofline that bounds it on a :class:`~commscope.estimate.gpus.GpuSpec`:

1. **Attention core** (``Q K^T``, softmax, ``P V``), two ways [megatron-core; flashattention-2022; dao-2023]:

   - ``flash``: one fused kernel that keeps the s x s scores on chip. It computes only the unmasked half of a
     causal score matrix, so its forward runs ``1/2 x 4 b (a/t) (s/c) s d`` FLOP, and its backward 2.5 times that
     (five GEMMs against the forward's two: the scores are recomputed). Time = FLOP / (peak x fraction), with
     the GPU file's ``flash_attention_fwd_fraction`` and ``flash_attention_bwd_fraction`` (FlashAttention-2
     reaches 50-73% of the A100's peak forward; FlashAttention-3 and cuDNN 75% of the H100's bf16 peak forward).
   - ``unfused``: the two batched GEMMs of :mod:`commscope.estimate.compute.gemm` over the whole s x s matrix (cuBLAS
     does not skip the masked half), and between them the scale-mask-softmax and dropout kernels that write and
     read the b (a/t) (s/c) s scores in the model dtype (dropout also a 1-byte mask): 4.5 element passes forward,
     5.5 backward (Megatron-LM 2021-22's fused scale-mask-softmax [megatron-sc21]). Where that kernel does not run
     (:func:`fused_softmax_available`: b x a/t not a multiple of 4, s > 4096, fp32), Megatron falls back to PyTorch's
     scale, masked_fill and softmax in fp32, which move 32 more bytes per score forward and 34 backward (fp16).

2. **Memory-bound kernels** per layer and micro-batch, as bytes moved through HBM at
   ``memory_efficiency x`` the GPU's memory bandwidth. Per token, in elements of the activation dtype
   (B bytes), with T = b s / c tokens on the rank, T' = T / t under sequence parallelism (else T), h hidden,
   q and g the local query and key/value widths, f the local FFN width:

   ======================================  ======================  ===========================================
   kernel                                  forward elements        where
   ======================================  ======================  ===========================================
   two norms (read x, write y)             2 x 2 h T'              LayerNorm or RMSNorm
   two residual adds (+ bias, dropout)     2 x 3 h T'              read x and residual, write the sum
   rotary embedding of q and k             2 (q + g) T             RoPE models only
   MLP activation                          2 f T  (GeLU)           3 f T for a gated MLP (SwiGLU)
   ======================================  ======================  ===========================================

   Backward moves twice the forward's bytes (each kernel reads the saved input and the incoming gradient and
   writes a gradient; norms also reduce their weight gradients), the usual roofline assumption of analytic
   models [isaev-2023 (Calculon)]. The last stage adds the final norm and Megatron's vocabulary-parallel
   cross-entropy over T x V'/t logits, computed unfused in fp32 (``logits.float()``, max, subtract, exp, sum,
   normalise; the backward scales the saved softmax by the incoming gradient and casts it back): B + 36 bytes
   per logit forward, B + 12 backward; the first stage the embedding lookup (2 h T forward and backward). FP8 adds the casts of every linear layer's inputs and
   output gradients (B + 1 bytes per element, forward and backward) [transformer-engine].

   Without gradient accumulation fusion (``gradient_accumulation_fusion=False``) the backward of every micro-batch
   also adds each weight gradient into the accumulated gradient with a separate kernel: B bytes read (the new
   gradient) and the accumulated gradient read and written, in fp32 where Megatron accumulates in fp32 (bf16
   models), else in the model dtype: B + 2 x 4 or 3 B bytes per parameter of the rank. Megatron's DDP hook
   (``main_grad.add_(grad)``) runs it for every micro-batch; autograd's own accumulation (PyTorch, DeepSpeed) skips
   the first, one add in m fewer, which the model does not tell apart. Worked example: GPT 18.4B (fp16) on t = 4,
   p = 2: 2.36 G parameters on a rank of the first stage x 6 bytes = 14.1 GB per micro-batch, 8.2 ms at the A100
   preset's 0.85 x 2039 GB/s, 0.065 s over 8 micro-batches.

3. **Optimizer step** (Adam with fp32 master weights, Megatron's mixed precision [megatron-core]): per
   parameter it reads the fp32 gradient, master weight and two moments and writes the weight and moments back
   (28 bytes), copies the master weight into the model dtype (4 + B) and reads the gradient once more for the
   norm used by clipping (4): 36 + B bytes per updated parameter, 4 more with fp16 loss scaling; and the whole
   gradient buffer is zeroed (4 bytes per parameter). The distributed optimizer and ZeRO update 1/d of the
   parameters on each rank (the buffer is still zeroed whole). Worked example: GPT-3 175B (bf16) on t = 8,
   p = 16, d = 8 with the distributed optimizer: 1.37 G parameters per rank, 1.37e9/8 x 38 + 1.37e9 x 4 bytes
   = 12.0 GB, 6.9 ms at the A100 preset's 0.85 x 2039 GB/s.

Sources (keys in docs/references.md): [flashattention-2022] FlashAttention; [dao-2023] FlashAttention-2; [shah-2024]
FlashAttention-3; [megatron-sc21]; [korthikanti-2022]; [megatron-core]; [transformer-engine]; [isaev-2023].
Plain arithmetic on a few numbers per layer kind (numpy only where a caller passes arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from commscope.estimate.compute.attention import fused_attention_time_s
from commscope.estimate.gpus import AttentionKernel, GpuSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.units import dtype_bytes
from commscope.pattern.workload.framework import grad_dtype

__all__ = ["HALF_DTYPES", "LayerKernels", "adam_bytes_per_param", "adam_step_time_s", "attention_core_s", "attention_kernel_for", "attention_time_s",
           "fused_softmax_available", "grad_accumulation_bytes_per_param", "grad_accumulation_note", "layer_kernels",
           "linear_gemm_dtype", "optimizer_step_time_s", "softmax_fallback_saved_bytes", "softmax_rows_per_block", "stage_extra_bytes", "torch_softmax_extra_bytes"]

#: Score dtypes Megatron's fused softmax kernels take (``input_in_float16``).
HALF_DTYPES = ("fp16", "bf16")


def adam_bytes_per_param(act_bytes: int, *, fp16: bool) -> tuple[int, int]:
    """(bytes per updated parameter, bytes per parameter of the whole gradient buffer) of one Adam step."""
    update = 28 + (4 + act_bytes) + 4 + (4 if fp16 else 0)
    return update, 4


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerKernels:
    """One layer's attention and memory-bound work for one micro-batch on one GPU (seconds)."""

    attention_fwd_s: float
    """Attention core forward (fused kernel, or unfused softmax/dropout kernels; unfused GEMMs are timed as GEMMs)."""
    attention_bwd_s: float
    memory_fwd_s: float
    """Norms, residual adds, activation, rotary, FP8 casts."""
    memory_bwd_s: float
    attention_flop: float
    """Forward FLOP of the attention core as the fused kernel computes it (causal half); 0 when unfused."""


def fused_softmax_available(model: ModelSpec, *, micro_batch_size: Any, tp: Any, cp: Any = 1) -> Any:
    """Whether Megatron's fused causal scale-mask-softmax kernel runs in unfused attention (else PyTorch's ops do):
    fp16/bf16 scores, 16 < s <= 4096, s and s/c multiples of 4, and b x heads/t a multiple of 4 and of the kernel's
    batches per 128-thread block (4 for s > 128: a warp per row; 8 below) [megatron-core fusions/fused_softmax.py
    FusedScaleMaskSoftmax.is_kernel_available, get_batch_per_block]. GPT 18.4B (48 heads) on t 16 at micro-batch 2
    has 6 such batches: its softmax runs in PyTorch. The sizes may be arrays (memory of many configurations)."""
    sk = model.seq_len
    if model.dtype not in HALF_DTYPES or not 16 < sk <= 4096 or sk % 4:
        return micro_batch_size < 0  # False (elementwise for arrays)
    batches = micro_batch_size * (model.num_heads // tp)
    per_block = softmax_rows_per_block(sk)
    return ((sk // cp) % 4 == 0) & (batches % 4 == 0) & (batches % per_block == 0)


def softmax_rows_per_block(seq_len: int) -> int:
    """Score rows (batches x heads) one 128-thread block of Megatron's fused softmax takes at ``seq_len`` keys: a
    warp per row, two rows per warp up to 128 keys [megatron-core get_batch_per_block]."""
    next_pow2 = 1 << (seq_len - 1).bit_length()
    return (128 // min(next_pow2, 32)) * (2 if next_pow2 <= 128 else 1)


def softmax_fallback_saved_bytes(model: ModelSpec) -> float:
    """Bytes per score element that PyTorch's softmax saves for backward beyond the fused kernel: its output in
    fp32 (4) where the kernel keeps the model dtype (B); nothing more for fp32 scores."""
    return float(max(0, 4 - model.dtype_bytes)) if model.dtype in HALF_DTYPES else 0.0


def torch_softmax_extra_bytes(model: ModelSpec) -> tuple[float, float]:
    """(forward, backward) HBM bytes per score element that PyTorch's scale, mask and softmax move beyond the fused
    kernel's (its read and write forward, 3 tensors backward). fp16/bf16 scores: softmax in fp32 with query-key layer
    scaling (Megatron 2021-22's default): cast up B+4, scale 8, masked_fill 8, softmax 8, cast down 4+B (2B + 32
    against 2B); backward the five adjoints, 2B + 36 against 3B. Other dtypes: no casts, 6B against 2B forward, 7B
    against 3B backward."""
    B = model.dtype_bytes
    if model.dtype in HALF_DTYPES:
        return 32.0, 36.0 - B
    return 4.0 * B, 4.0 * B


def _tokens(model: ModelSpec, parallel: ParallelSpec) -> tuple[int, int]:
    """(T, T'): tokens per rank per micro-batch, and those a sequence-parallel norm sees."""
    tokens = parallel.micro_batch_size * model.seq_len // parallel.cp
    sp = parallel.sequence_parallel and parallel.tp > 1
    return tokens, tokens // parallel.tp if sp else tokens


def attention_kernel_for(parallel: ParallelSpec, gpu: GpuSpec) -> tuple[str, AttentionKernel]:
    """The fused attention kernel a job runs: cuDNN's under Megatron with Transformer Engine, which prefers it to
    FlashAttention on Hopper and newer [transformer-engine get_attention_backend: "Disabling FlashAttention to give
    FusedAttention preference on Hopper+ for performance reasons"]; FlashAttention-2 under PyTorch's
    scaled_dot_product_attention (DDP, FSDP2). The GPU's first kernel where it has not the one named."""
    return gpu.attention_kernel("cudnn" if parallel.framework == "megatron" else "flash")


def attention_time_s(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec) -> tuple[float, float, float]:
    """(forward s, backward s, forward FLOP) of one layer's fused attention core for one micro-batch, by the
    tile/wave model of :mod:`commscope.estimate.compute.attention`."""
    b, s, c, t = parallel.micro_batch_size, model.seq_len, parallel.cp, parallel.tp
    _, kernel = attention_kernel_for(parallel, gpu)
    fwd, bwd, flop = fused_attention_time_s(kernel, gpu, batch_heads=b * (model.num_heads // t), seq_q=s // c, seq_k=s,
                                            head_dim=model.head_size, dtype=model.dtype)
    return float(fwd), float(bwd), float(flop)


def layer_kernels(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, *, moe: bool = False,
                  attention: tuple[float, float, float] | None = None) -> LayerKernels:
    """Attention core (fused) or softmax/dropout (unfused) and the memory-bound kernels of one layer (``attention``:
    :func:`attention_core_s`, where the caller has it: alike in every layer kind)."""
    B = model.dtype_bytes
    T, Tn = _tokens(model, parallel)
    t = parallel.tp
    h = model.hidden_size
    q = model.num_heads // t * model.head_size
    g = max(1, model.kv_heads // t) * model.head_size
    if moe:
        # routed experts see T x top_k tokens per rank on balanced routing (over E/e local experts, each f_moe/t
        # wide), shared experts T tokens of their combined width
        f_tokens = T * model.top_k * model.moe_ffn // t + T * model.num_shared_experts * model.moe_ffn // t
    else:
        f_tokens = T * model.ffn // t
    act = (3 if model.gated_mlp else 2) * f_tokens
    elements = 2 * 2 * h * Tn + 2 * 3 * h * Tn + act
    if model.position_embedding == "rope":
        elements += 2 * (q + g) * T
    fwd_bytes = float(elements * B)
    if parallel.fp8_format is not None:
        # inputs of qkv, proj, fc1 and fc2 cast to FP8 forward (and their output gradients backward)
        fwd_bytes += (B + 1) * (T * (h + q + h) + f_tokens)
    bw = gpu.streaming_bandwidth_bytes_per_s
    mem_fwd = fwd_bytes / bw
    mem_bwd = 2 * fwd_bytes / bw
    att_fwd, att_bwd, flop = attention if attention is not None else attention_core_s(model, parallel, gpu)
    return LayerKernels(attention_fwd_s=att_fwd, attention_bwd_s=att_bwd, memory_fwd_s=mem_fwd, memory_bwd_s=mem_bwd,
                        attention_flop=flop)


def attention_core_s(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec) -> tuple[float, float, float]:
    """(forward s, backward s, forward FLOP) of one layer's attention core beside its GEMMs: the fused kernel
    (:func:`attention_time_s`), or the unfused softmax and dropout (memory-bound; their FLOP not counted)."""
    if parallel.attention == "flash":
        return attention_time_s(model, parallel, gpu)
    B, t, bw = model.dtype_bytes, parallel.tp, gpu.streaming_bandwidth_bytes_per_s
    scores = parallel.micro_batch_size * (model.num_heads // t) * (model.seq_len // parallel.cp) * model.seq_len
    att_fwd = (4 * B + 1) * scores / bw
    att_bwd = (5 * B + 1.5) * scores / bw
    if not fused_softmax_available(model, micro_batch_size=parallel.micro_batch_size, tp=t, cp=parallel.cp):
        extra_fwd, extra_bwd = torch_softmax_extra_bytes(model)
        att_fwd += extra_fwd * scores / bw
        att_bwd += extra_bwd * scores / bw
    return att_fwd, att_bwd, 0.0


def stage_extra_bytes(model: ModelSpec, parallel: ParallelSpec, *, first: bool, last: bool) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the first stage's embedding and the last stage's final norm and
    cross-entropy, per micro-batch."""
    B = model.dtype_bytes
    T, Tn = _tokens(model, parallel)
    h = model.hidden_size
    fwd = bwd = 0.0
    if first:
        fwd += 2 * h * T * B
        bwd += 2 * h * T * B
    if last:
        logits = T * model.padded_vocab_size(parallel.tp) // parallel.tp
        # fp32 cross-entropy [megatron-core tensor_parallel/cross_entropy.py]: upcast (B + 4), max (4), subtract
        # (8), exp (8), sum (4), normalise (8); backward: scale by the gradient (8), cast back (4 + B)
        fwd += 2 * h * Tn * B + logits * (B + 36)
        bwd += 2 * 2 * h * Tn * B + logits * (B + 12)
    return fwd, bwd


def grad_accumulation_bytes_per_param(model: ModelSpec, parallel: ParallelSpec) -> int:
    """HBM bytes per parameter of the rank that adding one micro-batch's weight gradients into the accumulated
    gradient moves (see the module docstring); 0 with gradient accumulation fusion. The accumulated gradient is in
    the dtype gradients are reduced in, or fp32 where that is fp8 (an fp8 reduction casts from a wider buffer:
    fp32 assumed)."""
    if parallel.gradient_accumulation_fusion:
        return 0
    accumulated = grad_dtype(model, parallel)
    return model.dtype_bytes + 2 * (4 if accumulated in ("fp32", "fp8") else dtype_bytes(accumulated))


def grad_accumulation_note(model: ModelSpec, parallel: ParallelSpec) -> str | None:
    """What the compute model assumed of gradient accumulation, when it costs time (None with fusion)."""
    per_param = grad_accumulation_bytes_per_param(model, parallel)
    if not per_param or parallel.num_micro_batches < 1:
        return None
    m = parallel.num_micro_batches
    return (f"weight gradients added into the accumulated gradients by a separate kernel each micro-batch "
            f"(--no-gradient-accumulation-fusion): {per_param} bytes per parameter of the rank, "
            f"{'once' if m == 1 else f'{m} times'} per iteration")


def optimizer_step_time_s(model: ModelSpec, parallel: ParallelSpec, gpu: GpuSpec, *, dense_params: Any,
                          expert_params: Any) -> Any:
    """Time of one Adam step on a rank holding ``dense_params`` and ``expert_params`` (see the module docstring): a
    float, or an array of one per stage where the parameter counts are arrays."""
    shards = parallel.shards_optimizer or parallel.framework == "torch-fsdp2"
    out = adam_step_time_s(model, gpu, dense_params=dense_params, expert_params=expert_params,
                           dense_shard=parallel.dp * parallel.cp if shards else 1,
                           expert_shard=parallel.expert_dp if shards else 1)
    return out if hasattr(out, "shape") and out.shape else float(out)


def adam_step_time_s(model: ModelSpec, gpu: GpuSpec, *, dense_params: Any, expert_params: Any, dense_shard: Any,
                     expert_shard: Any) -> Any:
    """:func:`optimizer_step_time_s` with the shard counts given; every argument may be a numpy array (many
    configurations at once, :mod:`commscope.estimate.many`)."""
    update, buffer = adam_bytes_per_param(model.dtype_bytes, fp16=model.dtype == "fp16")
    updated = dense_params / dense_shard + expert_params / expert_shard
    total = update * updated + buffer * (dense_params + expert_params)
    return total / gpu.streaming_bandwidth_bytes_per_s + (updated != 0) * gpu.kernel_overhead_s


def linear_gemm_dtype(model: ModelSpec, parallel: ParallelSpec) -> str:
    """dtype of the linear layers' GEMMs: fp8 under --fp8-format (1 byte, [transformer-engine]), else the model dtype."""
    return "fp8" if parallel.fp8_format is not None else model.dtype
