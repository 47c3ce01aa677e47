"""In-training effects: what changes a kernel's time inside a training step against the same kernel measured alone.

The kernel constants of a GPU (:mod:`commscope.estimate.compute.calibration`) say what each kernel costs on its own, at the
clock it was measured at. Inside a training step four things differ, each named here, each measured or taken from
the documented defaults of the software that causes it, and each reported on its own in the estimate's compute
breakdown (``clock_s``, ``comm_sms_s``, ``overlap_chunks_s``, ``launch_gaps_s``). Nothing here is fitted to an
end-to-end run; what an end-to-end table still differs by is the software stack's own efficiency
(:mod:`commscope.estimate.stacks`), kept apart.

1. **Clocks at the power limit** (``clock_s``). Under sustained load an H100/H200 SXM sits at its 700 W limit at a
   median SM clock of 1,575 MHz against the 1,607 MHz its kernels were measured at in bursts (measured:
   shared/data/gpu/h200_sustained_*.csv): compute-bound kernels (GEMMs, attention) take
   ``GpuSpec.clock_factor = kernel_clock / sustained_clock`` times as long; memory-bound kernels do not follow the
   SM clock. 1 where the GPU file does not state both clocks.
2. **SMs taken by communication that overlaps compute** (``comm_sms_s``). An overlapped collective runs kernels on
   some SMs while GEMMs run on the others: Transformer Engine's userbuffers take ``TE_USERBUFFER_SMS`` = 16 SMs for
   the tensor-parallel reduce-scatters they overlap [transformer-engine initialize_ub: num_sm = 16 by default; the
   all-gathers' ring exchange copies through the copy engines], and NCCL one SM per channel, ``NCCL_CTAS`` = 16 for
   the data-, context- and expert-parallel collectives (NCCL_NVLS_NCHANNELS and NCCL_MIN_NCHANNELS on 8-GPU NVLink
   nodes [nccl-env]). While such a collective runs, compute loses that share of the SMs: the overlapped
   communication time x SMs taken / SMs of the GPU is added to compute.
3. **Overlapped GEMMs cut into chunks** (``overlap_chunks_s``). With ``--tp-comm-overlap`` Transformer Engine splits
   each GEMM it overlaps into pieces along the tokens so that communication of one piece runs under the next one's
   GEMM: the all-gather's ring exchange into ``tp`` pieces (QKV and FC1 forward, projection and FC2 dgrad), the
   pipelined reduce-scatter into ``TE_PIPELINE_SPLITS`` = 4 (projection and FC2 forward); the bulk overlaps of the
   other backward GEMMs do not split them [transformer-engine initialize_ub: method ring_exchange / pipeline / bulk,
   num_splits = 4]. Each piece is a smaller GEMM with its own fixed cost and tile/wave losses, timed as such.
4. **Host launch gaps** (``launch_gaps_s``). Eager frameworks launch every kernel from Python: about
   ``EAGER_LAUNCH_S`` = 8 us of host time per kernel (PyTorch's dispatch of a small op, measured on this project's
   machines: presets/gpus/cpu.toml). When a layer's kernels run shorter than that, the GPU waits for the host:
   ``max(0, kernels x 8 us - the layer's kernel time)``. Large models never see it; small ones at small micro-
   batches do.

numpy and the standard library only.
"""

from __future__ import annotations

from typing import Any

from commscope.estimate.gpus import GpuSpec
from commscope.spec.parallel import ParallelSpec

__all__ = ["EAGER_LAUNCH_S", "NCCL_CTAS", "TE_PIPELINE_SPLITS", "TE_USERBUFFER_SMS", "comm_sm_share", "comm_sm_time_s",
           "launch_gap_s", "layer_kernel_count", "overlap_chunks", "overlaps_tp_comm"]

#: SMs Transformer Engine's userbuffers take for an overlapped tensor-parallel reduce-scatter (initialize_ub's
#: num_sm default) [transformer-engine].
TE_USERBUFFER_SMS = 16
#: Pieces Transformer Engine's pipelined reduce-scatter overlap cuts a GEMM into (num_splits default) [transformer-engine].
TE_PIPELINE_SPLITS = 4
#: SMs an NCCL collective occupies while it overlaps compute: one per channel, 16 channels on an 8-GPU NVLink node [nccl-env].
NCCL_CTAS = 16
#: Host seconds an eager framework spends launching one kernel (PyTorch dispatch of a small op; presets/gpus/cpu.toml).
EAGER_LAUNCH_S = 8e-6

#: Transformer Engine's name of each linear GEMM (qkv, proj, fc1, fc2) and, per pass, how it overlaps.
_TE_NAMES = {"qkv": "qkv", "attn_proj": "proj", "mlp_up": "fc1", "mlp_down": "fc2"}
_RING_EXCHANGE = frozenset({("qkv", "fwd"), ("fc1", "fwd"), ("proj", "dgrad"), ("fc2", "dgrad")})
_PIPELINE = frozenset({("proj", "fwd"), ("fc2", "fwd")})


def overlap_chunks(name: str, pass_: str, parallel: ParallelSpec) -> int:
    """Pieces the GEMM ``name`` (``qkv``, ``attn_proj``, ``mlp_up``, ``mlp_down``) of ``pass_`` is cut into by
    Transformer Engine's tensor-parallel communication overlap (1: not cut; see the module docstring, point 3)."""
    if not overlaps_tp_comm(parallel):
        return 1
    te = _TE_NAMES.get(name)
    if te is None:
        return 1
    if (te, pass_) in _RING_EXCHANGE:
        return parallel.tp
    if (te, pass_) in _PIPELINE:
        return TE_PIPELINE_SPLITS
    return 1


def overlaps_tp_comm(parallel: ParallelSpec) -> bool:
    """Whether Transformer Engine overlaps tensor-parallel communication with the GEMMs (and cuts them, point 3)."""
    return parallel.tp_comm_overlap and parallel.tp > 1


def comm_sm_share(gpu: GpuSpec, axis: str) -> float:
    """Share of ``gpu``'s SMs that an overlapped collective of ``axis`` takes from compute (point 2): TE's
    userbuffers for ``tp``, NCCL's channels for the others; the reduce-scatter half of TP's traffic takes them, its
    ring-exchange all-gathers copy through the copy engines, hence half of the userbuffers' SMs on average."""
    sms = TE_USERBUFFER_SMS / 2 if axis == "tp" else NCCL_CTAS
    return min(1.0, sms / gpu.num_sms)


def comm_sm_time_s(gpu: GpuSpec | None, **hidden_s: Any) -> Any:
    """Compute time lost to the SMs that overlapped collectives take: ``hidden_s`` maps an axis (``tp``, ``cp``,
    ``pp``, ``dp``) to the communication seconds it hid under compute (numbers or arrays); 0 without a GPU model."""
    if gpu is None:
        return 0.0
    return sum(t * comm_sm_share(gpu, axis) for axis, t in hidden_s.items())


def layer_kernel_count(*, gemms: int, attention_fused: bool, rope: bool, gated: bool) -> tuple[int, int]:
    """(forward, backward) kernels one layer launches in an eager framework: its GEMMs, the attention core (one
    fused kernel, or two batched GEMMs with softmax and dropout between), two norms, two residual adds, the
    activation (two for a gated one) and rotary embedding of q and k; backward launches about two per forward one
    (each GEMM's dgrad and wgrad, each elementwise kernel's gradient and its input's)."""
    fwd = gemms + (1 if attention_fused else 4) + 2 + 2 + (2 if gated else 1) + (2 if rope else 0)
    return fwd, 2 * fwd


def launch_gap_s(kernels: Any, gpu_time_s: Any, launch_s: float = EAGER_LAUNCH_S) -> Any:
    """Seconds the GPU waits for the host over ``kernels`` launches that run ``gpu_time_s`` on it (point 4)."""
    return max(0.0, kernels * launch_s - gpu_time_s) if not hasattr(gpu_time_s, "shape") else \
        (kernels * launch_s - gpu_time_s).clip(min=0.0)
