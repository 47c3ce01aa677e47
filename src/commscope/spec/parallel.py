"""The parallelism configuration, with Megatron-LM's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from commscope.errors import ConfigError, check
from commscope.units import dtype_among

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "gpipe"]
Attention = Literal["flash", "unfused"]
Fp8Format = Literal["hybrid", "e4m3"]

#: Attention kernels (ParallelSpec.attention): ``flash`` is one fused kernel that keeps the s x s scores on chip
#: (FlashAttention; Megatron-core's ``--attention-backend flash|fused|auto`` with Transformer Engine, PyTorch's
#: scaled_dot_product_attention); ``unfused`` is two batched GEMMs with softmax and dropout kernels between
#: them (Megatron-LM 2021-22 and Megatron-DeepSpeed, ``--attention-backend unfused|local``).
ATTENTION_KINDS = ("flash", "unfused")
#: Megatron-core's ``--attention-backend`` spellings -> commscope's attention kind.
ATTENTION_BACKENDS = {"auto": "flash", "flash": "flash", "fused": "flash", "unfused": "unfused", "local": "unfused"}
#: Transformer Engine FP8 recipes (Megatron ``--fp8-format``): ``hybrid`` (E4M3 forward, E5M2 gradients), ``e4m3``.
FP8_FORMATS = ("hybrid", "e4m3")

#: Megatron-core's gradient bucket with --overlap-grad-reduce and no --ddp-bucket-size:
#: max(40,000,000, 1,000,000 x dp) elements (megatron/training/training.py, get_model's DDP config).
MEGATRON_MIN_BUCKET_ELEMENTS = 40_000_000

#: Megatron-core's default rank order: tp innermost, pp outermost.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
ORDER_TOKENS = ("tp", "cp", "ep", "dp", "pp")


#: Implementations whose communication commscope predicts (ParallelSpec.framework).
FRAMEWORKS = ("megatron", "torch-ddp", "torch-fsdp2")

_VALID_FRAMEWORKS = f"valid: {', '.join(FRAMEWORKS)}"
_VALID_ATTENTION = f"valid: {', '.join(ATTENTION_KINDS)}"
_VALID_FP8 = f"valid: {', '.join(FP8_FORMATS)} or unset"


#: The dtypes gradients are reduced in (Megatron's --grad-reduce-in-bf16, fp32 by default, fp8 in some recipes).
_GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16", "fp8")

@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelSpec:
    """How one training iteration is split over GPUs (world size = tp x cp x dp x pp)."""

    tp: int = 1
    """Tensor-parallel size (t)."""
    pp: int = 1
    """Pipeline-parallel size (p)."""
    dp: int = 1
    """Data-parallel size (d), not counting cp."""
    cp: int = 1
    """Context-parallel size (c): the sequence is split over c ranks, ring attention between them."""
    ep: int = 1
    """Expert-parallel size; folded inside dp x cp as Megatron-core does (ep must divide dp x cp)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: TP all-reduces become all-gather + reduce-scatter."""
    zero_stage: int = 0
    """0: all-reduce gradients; 1/2: reduce-scatter gradients, all-gather parameters; 3: also gather parameters per layer."""
    distributed_optimizer: bool = False
    """Megatron's distributed optimizer (communicates like ZeRO-1)."""
    recompute: Recompute = "none"
    """Activation recomputation: ``full`` replays each layer's forward (and its TP communication) in backward."""
    virtual_pipeline_size: int = 1
    """Model chunks per pipeline rank (v); > 1 selects the interleaved 1F1B schedule."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule: ``1f1b`` (PipeDream-flush, Megatron's default) or ``gpipe``."""
    global_batch_size: int = 512
    """Sequences per iteration (gb)."""
    micro_batch_size: int = 1
    """Sequences per micro-batch (b)."""
    order: str = DEFAULT_ORDER
    """Rank order of the axes, innermost first (Megatron ``--order``)."""
    grad_reduce_dtype: str | None = None
    """dtype of gradient reduction; default fp32 for bf16 models (Megatron accumulates bf16 grads in fp32), else the model dtype."""
    grad_bucket_size: int | None = None
    """Elements per DP gradient bucket; ``None``: one bucket per stage (Megatron without --overlap-grad-reduce)."""
    overlap_grad_reduce: bool = False
    """Megatron --overlap-grad-reduce: DP gradient reduction runs in buckets during the last backward pass."""
    pipeline_layers: tuple[int, ...] | None = None
    """Explicit layers per pipeline stage (sums to num_layers); default: an even split, or, when pp does not
    divide the layers, a balanced split (stage loads one layer apart at most) with the first and last stages among
    the lighter (see :func:`commscope.pattern.workload.stages.balanced_pipeline_layers`)."""
    decoder_first_pipeline_num_layers: int | None = None
    """Megatron ``--decoder-first-pipeline-num-layers``: layers of the first stage; the rest split evenly."""
    decoder_last_pipeline_num_layers: int | None = None
    """Megatron ``--decoder-last-pipeline-num-layers``: layers of the last stage; the rest split evenly."""
    tp_comm_overlap: bool = False
    """Megatron ``--tp-comm-overlap``: TP all-gathers and reduce-scatters run in chunks under the GEMMs that
    consume or produce them (Transformer Engine userbuffers); needs sequence parallelism."""
    overlap_p2p_comm: bool = True
    """Megatron's ``--overlap-p2p-communication`` (on by default; ``--no-overlap-p2p-communication`` turns it off):
    in the interleaved schedule (virtual_pipeline_size > 1) pipeline sends and receives run asynchronously under
    the compute of the other model chunks. Without interleaving Megatron's 1F1B exchanges block, and so does
    the model."""
    overlap_param_gather: bool = False
    """Megatron ``--overlap-param-gather``: the distributed optimizer's parameter all-gather runs bucket by
    bucket under the next iteration's forward pass; needs a sharded optimizer."""
    scatter_gather_tensors_in_pipeline: bool = False
    """Megatron-LM's scatter/gather optimisation of pipeline messages ([megatron-sc21] sec. 4.1; the default of
    Megatron-LM until megatron-core's p2p code, 2023, which dropped it): without sequence parallelism each
    TP rank sends only its 1/t of the activation to the next stage, which all-gathers it over its TP group.
    With sequence parallelism the activation is already split and the flag changes nothing, as in Megatron."""
    gradient_accumulation_fusion: bool = True
    """Megatron's gradient accumulation fusion (on by default; ``--no-gradient-accumulation-fusion`` turns it off):
    each weight-gradient GEMM adds its result straight into the accumulated gradient. Off, a separate kernel adds
    every micro-batch's weight gradients into it (read the new gradient, read and write the accumulated one).
    Megatron-LM has had it since February 2022, until September 2022 only with fp32 gradient accumulation (fp16
    runs without ``--accumulate-allreduce-grads-in-fp32`` had it off, as every run before it did); DeepSpeed's engine
    (Megatron-DeepSpeed) never has it: there autograd accumulates ``.grad`` itself. PyTorch's DDP and FSDP2
    have no such fusion either (autograd adds each micro-batch's gradients after the first), but the default stays
    on for every framework: the compute model is Megatron's for all of them (fp32 master weights, Adam), and it
    is not calibrated on a PyTorch run; pass False to count the adds."""
    attention: Attention = "flash"
    """Attention kernels: ``flash`` (fused, the default of Megatron-core and PyTorch) or ``unfused``
    (Megatron-LM 2021-22, Megatron-DeepSpeed); see :data:`ATTENTION_KINDS`."""
    fp8_format: Fp8Format | None = None
    """Megatron ``--fp8-format``: the linear layers' GEMMs run in FP8 (Transformer Engine); None: all in the
    model dtype."""
    framework: str = "megatron"
    """Whose implementation communicates: ``megatron`` (Megatron-LM/-core), ``torch-ddp`` or ``torch-fsdp2``
    (PyTorch's DDP or FSDP2 for data parallelism, DTensor for tensor/sequence parallelism,
    torch.distributed.pipelining for pipelines: what ``commscope workload gpt`` runs)."""
    stack: str | None = None
    """The software stack whose measured efficiency scales compute time (a preset of :mod:`commscope.estimate.stacks`, e.g.
    ``megatron-core-2024``); None: the kernel-level model alone. Timing only: it changes no op."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "virtual_pipeline_size", "global_batch_size", "micro_batch_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, value, "must be a positive integer")
        check(self.zero_stage in (0, 1, 2, 3), "zero_stage", self.zero_stage, "valid: 0, 1, 2, 3")
        check(self.recompute in ("none", "selective", "full"), "recompute", self.recompute, "valid: none, selective, full")
        check(self.schedule in ("1f1b", "gpipe"), "schedule", self.schedule, "valid: 1f1b, gpipe")
        check(self.framework in FRAMEWORKS, "framework", self.framework, _VALID_FRAMEWORKS)
        if self.stack is not None:
            from commscope.estimate.stacks import stack_preset

            stack_preset(self.stack)  # a name that is no preset is refused here, naming the valid ones
        check(self.attention in ATTENTION_KINDS, "attention", self.attention, _VALID_ATTENTION)
        check(self.fp8_format is None or self.fp8_format in FP8_FORMATS, "fp8_format", self.fp8_format, _VALID_FP8)
        check(not self.tp_comm_overlap or self.tp == 1 or self.sequence_parallel, "tp_comm_overlap", True,
              "needs sequence parallelism (Megatron: --tp-comm-overlap requires --sequence-parallel)")
        check(not self.scatter_gather_tensors_in_pipeline or self.framework == "megatron",
              "scatter_gather_tensors_in_pipeline", True, "is Megatron-LM's optimisation: needs framework megatron")
        check(not self.overlap_param_gather or self.shards_optimizer, "overlap_param_gather", True,
              "needs the distributed optimizer or ZeRO >= 1 (there is no parameter all-gather to overlap otherwise)")
        for name in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            value = getattr(self, name)
            check(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1), name, value,
                  "must be a positive integer or unset")
            check(value is None or self.pp > 1, name, value, "needs pp > 1")
            check(value is None or self.pipeline_layers is None, name, value,
                  "give either pipeline_layers or the first/last stage layers, not both")
        check(not (self.zero_stage == 3 and self.distributed_optimizer), "zero_stage", self.zero_stage,
              "ZeRO-3 and the distributed optimizer exclude each other; choose one")
        check(self.virtual_pipeline_size == 1 or self.pp > 1, "virtual_pipeline_size", self.virtual_pipeline_size,
              "needs pp > 1 (interleaving splits each pipeline stage)")
        check(self.virtual_pipeline_size == 1 or self.schedule == "1f1b", "schedule", self.schedule,
              "the interleaved schedule (virtual_pipeline_size > 1) is a 1F1B schedule")
        # (the messages below are built only when the check fails: a sweep builds thousands of these)
        if (self.dp * self.cp) % self.ep:
            raise ConfigError("ep", self.ep, f"must divide dp x cp = {self.dp * self.cp} (expert parallelism is folded "
                                             "inside data and context parallelism)")
        if self.order != DEFAULT_ORDER and sorted(self.order.split("-")) != sorted(ORDER_TOKENS):
            raise ConfigError("order", self.order,
                              f"must name each of {', '.join(ORDER_TOKENS)} once, separated by '-', e.g. {DEFAULT_ORDER}")
        if self.global_batch_size % (self.micro_batch_size * self.dp):
            raise ConfigError("global_batch_size", self.global_batch_size,
                              f"must be divisible by micro_batch_size x dp = {self.micro_batch_size} x {self.dp} = "
                              f"{self.micro_batch_size * self.dp}")
        if self.grad_reduce_dtype is not None:
            # gradients are floating point: int8 would quarter the DP bytes
            object.__setattr__(self, "grad_reduce_dtype",
                               dtype_among("grad_reduce_dtype", self.grad_reduce_dtype, _GRAD_REDUCE_DTYPES))
        check(self.grad_bucket_size is None or self.grad_bucket_size >= 1, "grad_bucket_size", self.grad_bucket_size,
              "must be a positive number of elements or unset")
        if self.pipeline_layers is not None:
            object.__setattr__(self, "pipeline_layers", tuple(int(x) for x in self.pipeline_layers))
            check(len(self.pipeline_layers) == self.pp * self.virtual_pipeline_size, "pipeline_layers", self.pipeline_layers,
                  f"needs one entry per pipeline stage and virtual chunk: pp x virtual_pipeline_size = {self.pp * self.virtual_pipeline_size}")
            check(all(x >= 0 for x in self.pipeline_layers), "pipeline_layers", self.pipeline_layers, "entries must be >= 0")
        if self.virtual_pipeline_size > 1:
            m = self.num_micro_batches
            check(m % self.pp == 0, "global_batch_size", self.global_batch_size,
                  f"the interleaved schedule needs the number of micro-batches ({m}) to be a multiple of pp={self.pp}")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_micro_batches(self) -> int:
        """m = gb / (b d)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def grad_bucket_elements(self) -> int | None:
        """Elements per DP gradient bucket: ``grad_bucket_size``, else Megatron-core's default with
        ``overlap_grad_reduce`` (max(40M, 1M x dp)), else None (one bucket per stage)."""
        if self.grad_bucket_size is not None:
            return self.grad_bucket_size
        if self.overlap_grad_reduce and self.framework == "megatron":
            return max(MEGATRON_MIN_BUCKET_ELEMENTS, 1_000_000 * self.dp * self.cp)
        return None

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel size: dp x cp / ep."""
        return self.dp * self.cp // self.ep

    @property
    def shards_optimizer(self) -> bool:
        """Gradients are reduce-scattered and parameters all-gathered (ZeRO >= 1 or distributed optimizer)."""
        return self.zero_stage >= 1 or self.distributed_optimizer
