"""Fused (flash) attention as a tile/wave model: how long one causal attention call takes on one GPU.

A fused attention kernel [flashattention-2022, dao-2023, shah-2024] cuts the queries of each of the ``B = b x a/t``
(micro-batch x local head) problems into tiles of ``T_q`` rows; query tile i of a causal problem works through the
key blocks up to the diagonal, i + 1 blocks of ``T_q`` keys (``n = ceil(s_q / T_q)`` tiles, ``n (n + 1) / 2`` blocks
per problem). One block costs ``4 T_q^2 d`` FLOP forward (Q K^T and P V) and 2.5 times that backward (the scores
recomputed, dV, dP, dQ, dK). The blocks are spread over the SMs, each running at ``fraction x peak / SMs``:

    t = overhead + (B n (n + 1) / 2 / SMs + tail x n) x 4 T_q^2 d / (fraction x peak / SMs)

The first term is the work balanced over the SMs; ``tail x n`` is the part of the longest tile (n blocks) that
runs at the end with nothing left to balance it against, which is what makes few, long problems slow: 12 heads of
2,048 tokens are 192 tiles for 132 SMs, and the longest tile's 16 blocks decide much of the call. ``fraction``,
``tail`` and ``overhead`` are per kernel and pass (:class:`~commscope.estimate.gpus.AttentionKernel`), fitted by
:mod:`commscope.estimate.compute.calibration` to measured calls; ``overhead`` also holds the backward's pre- and
post-processing kernels (the softmax-gradient dot product, the dQ conversion).

Worked example (the H200 preset's cuDNN kernel, forward: fraction 0.686, tail 0.82, overhead 22.5 us; 989 TFLOP/s,
132 SMs, T_q = 128): Llama 3 70B on t = 8, one sequence of 8,192: B = 8 problems of n = 64 tiles, 8 x 2,080 =
16,640 blocks, 126.1 per SM, plus a tail of 0.82 x 64 = 52.5 blocks; a block is 4 x 128^2 x 128 = 8.39 MFLOP at
0.686 x 989e12 / 132 = 5.14 TFLOP/s per SM, 1.63 us: (126.1 + 52.5) x 1.63 + 22.5 = 314 us, against 319 us measured.

Context parallelism gives each rank ``s_q = s / c`` queries against all ``s`` keys (in ring steps); the causal
work is then half the ``n_q x n_k`` blocks, the longest tile ``n_k`` blocks.

Operators only (numbers or numpy arrays): every argument may be an array.
"""

from __future__ import annotations

from typing import Any

from commscope.estimate.gpus import AttentionKernel, GpuSpec

__all__ = ["BACKWARD_RATIO", "attention_blocks", "fused_attention_time_s"]

#: FLOP of the fused attention backward over its forward: five GEMMs (recomputed scores, dV, dP, dQ, dK) to two.
BACKWARD_RATIO = 2.5


def attention_blocks(batch_heads: Any, seq_q: Any, seq_k: Any, tile_q: int) -> tuple[Any, Any]:
    """(causal blocks of all problems, blocks of the longest query tile) of ``T_q x T_q`` blocks."""
    # (operators only: plain numbers stay plain, arrays broadcast; one estimate's call pays no array overhead)
    n_q = -(-seq_q // tile_q)
    n_k = -(-seq_k // tile_q)
    # s_q == s_k: query tile i sees i + 1 key blocks; s_q < s_k (context parallel): half of n_q x n_k
    same = n_q == n_k
    blocks = same * (n_q * (n_q + 1) // 2) + (1 - same) * ((n_q * n_k + 1) // 2)
    return batch_heads * blocks, n_k


def fused_attention_time_s(kernel: AttentionKernel, gpu: GpuSpec, *, batch_heads: Any, seq_q: Any, seq_k: Any,
                           head_dim: Any, dtype: str = "bf16") -> tuple[Any, Any, Any]:
    """(forward s, backward s, forward FLOP) of one causal fused-attention call over ``batch_heads`` problems of
    ``seq_q`` queries and ``seq_k`` keys of size ``head_dim`` (see the module docstring)."""
    blocks, longest = attention_blocks(batch_heads, seq_q, seq_k, kernel.tile_q)
    block_flop = 4.0 * kernel.tile_q * kernel.tile_q * head_dim
    per_sm = gpu.peak_flops_for(dtype) / gpu.num_sms
    per_block = blocks / gpu.num_sms
    fwd = kernel.fwd_overhead_s + (per_block + kernel.fwd_tail * longest) * block_flop / (kernel.fwd_fraction * per_sm)
    bwd = kernel.bwd_overhead_s + (per_block + kernel.bwd_tail * longest) * BACKWARD_RATIO * block_flop / (
        kernel.bwd_fraction * per_sm)
    # the FLOP a causal kernel computes: half the s_q x s_k scores (what FLOP counts of causal attention take)
    flop = 0.5 * 4.0 * batch_heads * seq_q * seq_k * head_dim
    return fwd, bwd, flop
