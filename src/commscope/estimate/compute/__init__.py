"""The compute model: how long one GPU computes for a micro-batch, a pipeline stage and an iteration.

Layers (each imports only the ones above it):

- :mod:`commscope.estimate.compute.gemm`: the GEMM shapes of a transformer layer and the tile/wave model that times them
  (persistent kernels and the TMA alignment rule on Hopper);
- :mod:`commscope.estimate.compute.attention`: fused (flash) attention as a tile/wave model of its own;
- :mod:`commscope.estimate.compute.kernels`: attention (fused flash or unfused), the memory-bound kernels (norms,
  activations, dropout, residual adds, rotary, softmax, cross-entropy) at the HBM roofline, and the optimizer step;
- :mod:`commscope.estimate.compute.effects`: the in-training effects on those kernels (sustained clock, SMs taken by
  overlapped communication, Transformer Engine's GEMM pieces, host launch gaps);
- :mod:`commscope.estimate.compute.model`: per pipeline stage and micro-batch, forward, backward and recomputation
  time, the GEMM time that tensor-parallel communication can hide under, and the optimizer step; a named
  stack's efficiency (:mod:`commscope.estimate.stacks`) applied last;
- :mod:`commscope.estimate.compute.calibration`: the kernel constants of a GPU fitted to measured kernels
  (``commscope calibrate --kernels``), with leave-one-model-out errors.

numpy and the standard library only.
"""
