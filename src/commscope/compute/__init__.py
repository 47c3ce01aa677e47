"""The compute model: how long one GPU computes for a micro-batch, a pipeline stage and an iteration.

Layers (each imports only the ones above it):

- :mod:`commscope.compute.gemm`: the GEMM shapes of a transformer layer and the tile/wave model that times them;
- :mod:`commscope.compute.kernels`: attention (fused flash or unfused), the memory-bound kernels (norms,
  activations, dropout, residual adds, rotary, softmax, cross-entropy) at the HBM roofline, and the optimizer step;
- :mod:`commscope.compute.model`: per pipeline stage and micro-batch, forward, backward and recomputation
  time, the GEMM time that tensor-parallel communication can hide under, and the optimizer step.

numpy and the standard library only.
"""
