"""One GPU as a matrix-multiply engine: SMs, CTA tile sizes, peak FLOP/s, HBM bandwidth, alignment rules.

The GEMM model of :mod:`commscope.estimate.shapes` needs more of a GPU than :class:`~commscope.spec.cluster.ClusterSpec`
holds: how many streaming multiprocessors (SMs) share the output tiles, which CTA tile sizes cuBLAS picks
from, and which leading dimensions the tensor cores like. Those numbers live in data files,
``presets/gpus/<name>.toml``, one per GPU, in human units with the unit in the key's name::

    name = "A100-SXM4-80GB"
    aliases = ["a100"]                 # matched against ClusterSpec.gpu, case and punctuation ignored
    num_sms = 108
    memory_GiB = 80
    memory_bandwidth_GBps = 2039       # -> memory_bandwidth_bytes_per_s
    l2_cache_MiB = 40                  # -> l2_cache_bytes
    tile_sizes = [[256, 128], [128, 128], ...]   # CTA tiles (M x N) cuBLAS chooses from
    tile_k = 32                        # K depth of one main-loop step of a CTA
    kernel_overhead_us = 4             # launch + prologue/epilogue of one GEMM kernel
    [peak_tflops]                      # dense datasheet peak of one GPU per dtype
    bf16 = 312

Sources (keys for ``docs/references.md``):

- **[nvidia-matmul-guide]** NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning Performance
  documentation): output tiles per CTA (256x128, 128x256, 128x128, 256x64, 64x256, 128x64, 64x128, 64x64),
  tile quantisation, wave quantisation over the SMs, the roofline by arithmetic intensity, and the tensor-core
  alignment table: with cuBLAS >= 11 tensor cores are always used, most efficiently when M, N, K are
  multiples of 16 bytes (8 fp16/bf16 elements, 4 tf32, 16 int8), and on A100 multiples of 128 bytes
  (64 fp16/bf16 elements).
- **[anthony-2024]** Q. Anthony et al., "The Case for Co-Designing Model Architectures with Hardware",
  ICPP 2024 (arXiv:2401.14489): the same effects measured on transformer GEMMs (V100, A100, H100).
- Datasheets and architecture white papers for SM counts, peaks, bandwidths and L2 (cited per file).

Assumptions (named constants in each file, to be calibrated with ``commscope shapes --measure``):
``achievable_fraction`` (a large, aligned GEMM reaches ~0.8 of the datasheet peak), ``memory_efficiency``
(~0.85 of datasheet HBM bandwidth is reachable), ``partial_alignment_factor`` and ``unaligned_factor``
(the slowdown of 16-byte-aligned-but-not-128-byte-aligned and of unaligned dimensions), and the efficiency of
a CTA tile relative to 256x128 (default ``sqrt(I / I_256x128)`` with ``I = m n / (m + n)``, the multiply-adds
per element a CTA loads: 128x128 -> 0.87, 128x64 -> 0.71, 64x64 -> 0.61).

``L2`` size is carried as data (and shown) but not used by the model yet.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError, check
from commscope.estimate.plain import held_by_object
from commscope.spec.cluster import ClusterSpec
from commscope.units import GB, TFLOP, US, GiB, MiB, canonical_dtype

__all__ = ["AttentionKernel", "GpuSpec", "gpu_for_cluster", "gpu_from_mapping", "gpu_names", "gpu_preset", "load_gpu"]

_US_PER_S = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionKernel:
    """One fused (flash) attention kernel as the tile/wave model of :mod:`commscope.estimate.compute.attention` times it.

    The kernel cuts the queries of every (micro-batch x head) into tiles of ``tile_q`` rows; causal, query tile i
    works through i + 1 key blocks of ``tile_q`` columns. The blocks are spread over the SMs (balanced), except a
    ``tail`` share of the longest tile's blocks, which run at the end when nothing is left to balance them against.
    Constants are per pass (forward, backward); the backward computes 2.5x the forward's FLOP.
    """

    fwd_fraction: float
    """Fraction of the dense peak one SM reaches on the forward's blocks (of the FLOP the kernel computes)."""
    bwd_fraction: float
    fwd_tail: float = 0.0
    """Share of the longest query tile's blocks that run unbalanced at the end of the forward (0: none)."""
    bwd_tail: float = 0.0
    fwd_overhead_s: float = 4e-6
    """Fixed time of one forward call (launch, prologue, the softmax statistics written out)."""
    bwd_overhead_s: float = 4e-6
    """Fixed time of one backward call (its pre- and post-processing kernels included)."""
    tile_q: int = 128
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("fwd_fraction", "bwd_fraction"):
            value = getattr(self, name)
            check(0 < value <= 1, name, value, "must be a fraction of the peak in (0, 1]")
        for name in ("fwd_tail", "bwd_tail", "fwd_overhead_s", "bwd_overhead_s"):
            value = getattr(self, name)
            check(value >= 0 and math.isfinite(value), name, value, "must be a finite number >= 0")
        check(isinstance(self.tile_q, int) and self.tile_q >= 1, "tile_q", self.tile_q, "must be a positive integer")

    def to_dict(self) -> dict[str, Any]:
        """Human units, as in a GPU file's ``[attention.NAME]`` table."""
        return {"fwd_fraction": self.fwd_fraction, "bwd_fraction": self.bwd_fraction, "fwd_tail": self.fwd_tail,
                "bwd_tail": self.bwd_tail, "fwd_overhead_us": self.fwd_overhead_s / US,
                "bwd_overhead_us": self.bwd_overhead_s / US, "tile_q": self.tile_q, "source": self.source}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """A GPU as the GEMM model of :mod:`commscope.estimate.shapes` sees it (SI units)."""

    name: str
    """Model, e.g. ``A100-SXM4-80GB``."""
    aliases: tuple[str, ...] = ()
    """Substrings that identify this GPU in :attr:`ClusterSpec.gpu` (``a100``)."""
    architecture: str = ""
    """Architecture and compute capability, for reports."""
    num_sms: int
    """Streaming multiprocessors: the CTAs of one wave."""
    peak_flops: dict[str, float] = field(default_factory=dict)
    """Dense datasheet peak FLOP/s per dtype (tensor cores where the dtype has them)."""
    memory_bandwidth_bytes_per_s: float
    """Datasheet HBM (or GDDR) bandwidth."""
    memory_bytes: int = 0
    l2_cache_bytes: int = 0
    """L2 cache size (data only; the model does not use it yet)."""
    tile_sizes: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256),
                                               (128, 64), (64, 128), (64, 64))
    """CTA output tiles (tile_m, tile_n) the library chooses from [nvidia-matmul-guide]."""
    tile_throughput: tuple[float, ...] | None = None
    """Throughput of each tile relative to the best (None: ``(I / I_max) ** tile_reuse_exponent``, I = m n / (m + n))."""
    tile_reuse_exponent: float = 0.5
    """How strongly a smaller tile's lower operand reuse slows it: 0.5 is the square-root rule; Hopper's wgmma
    kernels, which stage operands through TMA, lose far less on 128 x 128 tiles (calibration constant)."""
    tile_k: int = 32
    """K depth of one main-loop step: K is padded up to a multiple of it."""
    ctas_per_sm: int = 1
    """CTAs of the large tiles resident on one SM at once (one wave = num_sms x ctas_per_sm tiles)."""
    cta_fill_steps: float = 0.0
    """K steps of work a CTA spends outside its steady main loop: filling the multi-stage operand pipeline before
    the first multiply and writing its output tile after the last (prologue and epilogue). Short-K GEMMs pay it
    relatively more (calibration constant)."""
    persistent_gemm: bool = False
    """Whether the GEMM library runs persistent, warp-specialised kernels (cuBLAS on Hopper): one CTA per SM loops
    over output tiles, so ``cta_fill_steps`` are paid once per SM and kernel, and a tile's epilogue overlaps the
    next tile's main loop except ``epilogue_steps``. False: every CTA fills its pipeline and writes its tile alone."""
    epilogue_steps: float = 0.0
    """K steps of each tile's epilogue that a persistent kernel does not hide (calibration constant)."""
    split_k: tuple[int, ...] = (1, 2, 4, 8)
    """Split-K factors the library may use when the output tiles fill less than one wave."""
    achievable_fraction: float = 0.8
    """Fraction of the datasheet peak a large, aligned GEMM reaches (calibration constant)."""
    memory_efficiency: float = 0.85
    """Fraction of the datasheet memory bandwidth a streaming kernel reaches (calibration constant)."""
    achievable_fraction_fp8: float | None = None
    """Fraction of the FP8 peak a large FP8 GEMM reaches (None: ``achievable_fraction``)."""
    flash_attention: bool = True
    """Whether fused (flash) attention kernels exist for this GPU (FlashAttention needs sm_75/sm_80 or newer)."""
    flash_attention_fwd_fraction: float = 0.6
    """Fraction of the dense peak a fused (flash) attention forward kernel reaches on the FLOPs it computes."""
    flash_attention_bwd_fraction: float = 0.45
    """The same for the fused attention backward kernel (it recomputes the scores: 2.5x the forward FLOPs)."""
    kernel_overhead_s: float = 4e-6
    """Fixed cost of one GEMM kernel (launch, prologue, epilogue)."""
    alignment_required_bytes: int = 16
    """Dimensions that are multiples of this many bytes get the fast tensor-core paths [nvidia-matmul-guide]."""
    alignment_optimal_bytes: int = 128
    """Dimensions that are multiples of this many bytes are the most efficient (A100: 128 B = 64 fp16)."""
    partial_alignment_factor: float = 0.95
    """Throughput factor when every dimension is 16-byte aligned but some is not 128-byte aligned (assumed)."""
    unaligned_factor: float = 0.5
    """Throughput factor when some dimension is not 16-byte aligned (assumed; narrower loads, masked tiles)."""
    tma_alignment_bytes: int = 0
    """GPUs whose fast GEMM kernels load operands with the Tensor Memory Accelerator (Hopper: 16): TMA needs every
    leading dimension to be a multiple of 16 bytes, else cuBLAS runs an older, non-persistent kernel of the
    previous architecture (mma.sync, no TMA). 0: no such split."""
    legacy_gemm_fraction: float = 1.0
    """Per-SM rate of that older kernel relative to the TMA kernel's (Hopper: its mma.sync instructions issue at
    half wgmma's rate per SM and clock [nvidia-h100-whitepaper]); ``unaligned_factor`` applies on top of it."""
    attention_kernels: dict[str, AttentionKernel] = field(default_factory=dict)
    """Fused attention kernels by name (``cudnn``: cuDNN's, which Transformer Engine prefers on Hopper; ``flash``:
    FlashAttention-2, PyTorch's scaled_dot_product_attention); empty: one kernel built from the two
    ``flash_attention_*_fraction`` fields."""
    kernel_clock_MHz: float | None = None
    """SM clock at which the kernel constants above hold: the clock the calibration's kernels ran at. None: the
    constants are taken as what kernels reach inside training (no clock correction)."""
    sustained_clock_MHz: float | None = None
    """SM clock under sustained training load, at the GPU's power limit (H200/H100 SXM: 1,575 MHz median at 700 W,
    measured). Compute-bound kernels take ``kernel_clock_MHz / sustained_clock_MHz`` times their calibrated time in
    training; None: not measured for this GPU, no correction."""
    source: str = ""

    def __post_init__(self) -> None:
        check(isinstance(self.num_sms, int) and self.num_sms >= 1, "num_sms", self.num_sms, "must be a positive integer")
        check(self.memory_bandwidth_bytes_per_s > 0, "memory_bandwidth_bytes_per_s", self.memory_bandwidth_bytes_per_s,
              "must be > 0")
        check(len(self.tile_sizes) >= 1 and all(len(t) == 2 and t[0] >= 1 and t[1] >= 1 for t in self.tile_sizes),
              "tile_sizes", self.tile_sizes, "must be a non-empty list of [tile_m, tile_n] pairs of positive integers")
        object.__setattr__(self, "tile_sizes", tuple((int(m), int(n)) for m, n in self.tile_sizes))
        if self.tile_throughput is not None:
            object.__setattr__(self, "tile_throughput", tuple(float(x) for x in self.tile_throughput))
            check(len(self.tile_throughput) == len(self.tile_sizes) and all(0 < x <= 1 for x in self.tile_throughput),
                  "tile_throughput", self.tile_throughput, f"needs one value in (0, 1] per tile size ({len(self.tile_sizes)})")
        check(self.tile_k >= 1, "tile_k", self.tile_k, "must be a positive integer")
        for name in ("achievable_fraction", "memory_efficiency", "achievable_fraction_fp8", "flash_attention_fwd_fraction",
                     "flash_attention_bwd_fraction"):
            value = getattr(self, name)
            check(value is None or 0 < value <= 1, name, value, "must be a fraction of the peak in (0, 1]")
        check(self.ctas_per_sm >= 1, "ctas_per_sm", self.ctas_per_sm, "must be a positive integer")
        object.__setattr__(self, "split_k", tuple(int(s) for s in self.split_k))
        check(len(self.split_k) >= 1 and 1 in self.split_k and all(s >= 1 for s in self.split_k), "split_k", self.split_k,
              "must be a list of positive integers that contains 1")
        for name in ("achievable_fraction", "memory_efficiency", "partial_alignment_factor", "unaligned_factor"):
            value = getattr(self, name)
            check(0 < value <= 1, name, value, "must be in (0, 1]")
        check(self.kernel_overhead_s >= 0, "kernel_overhead_s", self.kernel_overhead_s, "must be >= 0")
        check(0 <= self.tile_reuse_exponent <= 2, "tile_reuse_exponent", self.tile_reuse_exponent, "must be in [0, 2]")
        check(0 <= self.cta_fill_steps <= 1000, "cta_fill_steps", self.cta_fill_steps, "must be in [0, 1000]")
        check(0 <= self.epilogue_steps <= 1000, "epilogue_steps", self.epilogue_steps, "must be in [0, 1000]")
        check(0 < self.legacy_gemm_fraction <= 1, "legacy_gemm_fraction", self.legacy_gemm_fraction, "must be in (0, 1]")
        check(self.tma_alignment_bytes >= 0, "tma_alignment_bytes", self.tma_alignment_bytes, "must be >= 0 (0: no TMA)")
        for name in ("kernel_clock_MHz", "sustained_clock_MHz"):
            value = getattr(self, name)
            check(value is None or 100 <= value <= 5000, name, value, "must be an SM clock in MHz (100 to 5000)")
        for key, kernel in self.attention_kernels.items():
            check(isinstance(kernel, AttentionKernel), f"attention.{key}", kernel, "must be an attention kernel table")
        check(self.alignment_required_bytes >= 1 and self.alignment_optimal_bytes % self.alignment_required_bytes == 0,
              "alignment_optimal_bytes", self.alignment_optimal_bytes,
              f"must be a multiple of alignment_required_bytes={self.alignment_required_bytes}")
        for dtype, flops in self.peak_flops.items():
            check(flops > 0, f"peak_flops.{dtype}", flops, "must be > 0")

    @property
    def tile_throughputs(self) -> tuple[float, ...]:
        """Relative throughput of each tile: the given ``tile_throughput`` or ``sqrt(I / I_max)``.

        I = m n / (m + n) is the multiply-adds per element loaded by a CTA of an m x n tile per K step
        (operand reuse); 256x128 has I = 85.3 and 64x64 has I = 32, so 64x64 runs at sqrt(32 / 85.3) = 0.61.
        """
        if self.tile_throughput is not None:
            return self.tile_throughput
        reuse = [m * n / (m + n) for m, n in self.tile_sizes]
        best = max(reuse)
        return tuple((r / best) ** self.tile_reuse_exponent for r in reuse)

    @property
    def clock_factor(self) -> float:
        """How much longer a compute-bound kernel takes in sustained training than as calibrated:
        ``kernel_clock_MHz / sustained_clock_MHz`` (1 where either is unknown)."""
        if self.kernel_clock_MHz is None or self.sustained_clock_MHz is None:
            return 1.0
        return self.kernel_clock_MHz / self.sustained_clock_MHz

    def attention_kernel(self, name: str | None = None) -> tuple[str, AttentionKernel]:
        """The fused attention kernel ``name`` (default: the first of :attr:`attention_kernels`), or one built from
        the ``flash_attention_*_fraction`` fields where the file has no kernel table."""
        if self.attention_kernels:
            if name is not None and name in self.attention_kernels:
                return name, self.attention_kernels[name]
            first = next(iter(self.attention_kernels))
            return first, self.attention_kernels[first]
        return "flash", AttentionKernel(fwd_fraction=self.flash_attention_fwd_fraction,
                                        bwd_fraction=self.flash_attention_bwd_fraction,
                                        fwd_overhead_s=self.kernel_overhead_s, bwd_overhead_s=self.kernel_overhead_s)

    @property
    def streaming_bandwidth_bytes_per_s(self) -> float:
        """HBM bandwidth a streaming kernel reaches: ``memory_efficiency`` x the datasheet bandwidth."""
        return self.memory_bandwidth_bytes_per_s * self.memory_efficiency

    def achievable_fraction_for(self, dtype: str) -> float:
        """Fraction of ``dtype``'s peak a large aligned GEMM reaches (FP8 has its own)."""
        if canonical_dtype(dtype) == "fp8" and self.achievable_fraction_fp8 is not None:
            return self.achievable_fraction_fp8
        return self.achievable_fraction

    def dtype_problem(self, dtype: str) -> str | None:
        """Why this GPU cannot compute in ``dtype`` (bf16 before sm_80, Ampere), or None. :meth:`peak_flops_for`
        then lets fp16's figure stand in; the command line says so in a warning."""
        sm = re.search(r"sm_(\d+)", self.architecture or "")
        if canonical_dtype(dtype) == "bf16" and "bf16" not in self.peak_flops and sm is not None and int(sm.group(1)) < 80:
            return (f"dtype=bf16 on {self.name} ({self.architecture}), which has no bf16 arithmetic (bf16 needs sm_80, "
                    "Ampere, or newer): timed at its fp16 peak; give --dtype fp16 for what this GPU would run")
        return None

    def peak_flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; fp16 and bf16 stand in for each other when only one is given."""
        key = canonical_dtype(dtype)
        for k in (key, {"bf16": "fp16", "fp16": "bf16"}.get(key, key)):
            if k in self.peak_flops:
                return self.peak_flops[k]
        raise ConfigError("dtype", dtype, f"GPU {self.name!r} has no peak FLOP/s for it; it has {', '.join(sorted(self.peak_flops))}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary in human units."""
        return {"name": self.name, "architecture": self.architecture, "num_sms": self.num_sms,
                "peak_tflops": {k: v / TFLOP for k, v in self.peak_flops.items()},
                "memory_bandwidth_GBps": self.memory_bandwidth_bytes_per_s / GB,
                "l2_cache_MiB": self.l2_cache_bytes / MiB, "tile_sizes": [list(t) for t in self.tile_sizes],
                "tile_throughput": list(self.tile_throughputs), "tile_k": self.tile_k, "ctas_per_sm": self.ctas_per_sm,
                "split_k": list(self.split_k), "cta_fill_steps": self.cta_fill_steps, "achievable_fraction": self.achievable_fraction,
                "memory_efficiency": self.memory_efficiency,
                "achievable_fraction_fp8": self.achievable_fraction_fp8,
                "flash_attention": self.flash_attention,
                "flash_attention_fwd_fraction": self.flash_attention_fwd_fraction,
                "flash_attention_bwd_fraction": self.flash_attention_bwd_fraction, "kernel_overhead_us": self.kernel_overhead_s / US,
                "alignment_required_bytes": self.alignment_required_bytes,
                "alignment_optimal_bytes": self.alignment_optimal_bytes,
                "partial_alignment_factor": self.partial_alignment_factor, "unaligned_factor": self.unaligned_factor,
                "tile_reuse_exponent": self.tile_reuse_exponent, "persistent_gemm": self.persistent_gemm,
                "epilogue_steps": self.epilogue_steps, "tma_alignment_bytes": self.tma_alignment_bytes,
                "legacy_gemm_fraction": self.legacy_gemm_fraction,
                "attention": {k: v.to_dict() for k, v in self.attention_kernels.items()},
                "kernel_clock_MHz": self.kernel_clock_MHz, "sustained_clock_MHz": self.sustained_clock_MHz,
                "source": self.source}


# ---------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------

#: Human-unit keys of a GPU file: key -> (SI field, multiplier to SI).
GPU_UNIT_KEYS: dict[str, tuple[str, float]] = {
    "memory_GiB": ("memory_bytes", GiB),
    "memory_bandwidth_GBps": ("memory_bandwidth_bytes_per_s", GB),
    "l2_cache_MiB": ("l2_cache_bytes", MiB),
    "kernel_overhead_us": ("kernel_overhead_s", US),
    "peak_tflops": ("peak_flops", TFLOP),
}
_INT_FIELDS = {"num_sms", "tile_k", "ctas_per_sm", "alignment_required_bytes", "alignment_optimal_bytes", "memory_bytes",
               "l2_cache_bytes", "tma_alignment_bytes"}
_FLOAT_FIELDS = {"memory_bandwidth_bytes_per_s", "achievable_fraction", "memory_efficiency", "kernel_overhead_s",
                 "achievable_fraction_fp8", "flash_attention_fwd_fraction", "flash_attention_bwd_fraction",
                 "partial_alignment_factor", "unaligned_factor", "tile_reuse_exponent", "epilogue_steps",
                 "legacy_gemm_fraction", "kernel_clock_MHz", "sustained_clock_MHz", "cta_fill_steps"}
_STR_FIELDS = {"name", "architecture", "source"}
_BOOL_FIELDS = {"flash_attention", "persistent_gemm"}
_FIELDS = _INT_FIELDS | _FLOAT_FIELDS | _STR_FIELDS | _BOOL_FIELDS | {"aliases", "peak_flops", "tile_sizes", "tile_throughput",
                                                                      "split_k", "attention"}
#: Keys of a GPU file's ``[attention.NAME]`` table -> (AttentionKernel field, multiplier to SI).
_ATTENTION_KEYS: dict[str, tuple[str, float]] = {
    "fwd_fraction": ("fwd_fraction", 1.0), "bwd_fraction": ("bwd_fraction", 1.0), "fwd_tail": ("fwd_tail", 1.0),
    "bwd_tail": ("bwd_tail", 1.0), "fwd_overhead_us": ("fwd_overhead_s", US), "bwd_overhead_us": ("bwd_overhead_s", US),
    "tile_q": ("tile_q", 1.0), "source": ("source", 1.0)}


def _attention_kernels(value: Any, source: str | None) -> dict[str, AttentionKernel]:
    """The ``[attention.NAME]`` tables of a GPU file."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError("attention", value, "expected tables [attention.NAME] of kernel constants, e.g. "
                          "[attention.cudnn] fwd_fraction = 0.69", source=source)
    out = {}
    for name, table in value.items():
        kwargs: dict[str, Any] = {}
        for key, item in table.items():
            if key not in _ATTENTION_KEYS:
                close = difflib.get_close_matches(str(key), list(_ATTENTION_KEYS), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"attention.{name}.{key}", item, f"unknown key; valid: {', '.join(_ATTENTION_KEYS)}{hint}",
                                  source=source)
            field_name, scale = _ATTENTION_KEYS[key]
            if key == "source":
                if not isinstance(item, str):
                    raise ConfigError(f"attention.{name}.{key}", item, "expected a string", source=source)
                kwargs[field_name] = item
            elif key == "tile_q":
                if not (isinstance(item, int) and not isinstance(item, bool)):
                    raise ConfigError(f"attention.{name}.{key}", item, "expected an integer", source=source)
                kwargs[field_name] = item
            elif not _is_number(item):
                raise ConfigError(f"attention.{name}.{key}", item, f"expected a number, got {_type_name(item)}", source=source)
            else:
                kwargs[field_name] = float(item) * scale
        for required in ("fwd_fraction", "bwd_fraction"):
            if required not in kwargs:
                raise ConfigError(f"attention.{name}.{required}", None, "required key missing", source=source)
        try:
            out[str(name)] = AttentionKernel(**kwargs)
        except ConfigError as exc:
            raise ConfigError(f"attention.{name}.{exc.field}", exc.value, exc.expected, source=source) from None
    return out


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def gpu_from_mapping(d: dict[str, Any], *, source: str | None = None, name: str | None = None) -> GpuSpec:
    """A :class:`GpuSpec` from a mapping in human units (see the module docstring) or SI field names.

    Every mistake raises :class:`ConfigError` naming the key and what would be valid.
    """
    if not isinstance(d, dict):
        raise ConfigError("gpu", d, f"expected a table of keys to values, got {_type_name(d)}", source=source)
    kwargs: dict[str, Any] = {"name": name} if name else {}
    for key, value in d.items():
        if key == "meta":
            if isinstance(value, dict) and "source" not in d and isinstance(value.get("source"), str):
                kwargs["source"] = value["source"]
            continue
        if key in GPU_UNIT_KEYS:
            si, scale = GPU_UNIT_KEYS[key]
            if si in d:
                raise ConfigError(key, value, f"give either {key} or {si}, not both", source=source)
            if key == "peak_tflops":
                if not isinstance(value, dict) or not all(_is_number(v) for v in value.values()):
                    raise ConfigError(key, value, "expected a table of dtype = number, e.g. bf16 = 312", source=source)
                table = {}
                for dtype, number in value.items():
                    try:
                        table[canonical_dtype(dtype)] = float(number) * scale
                    except ValueError as exc:
                        raise ConfigError(f"{key}.{dtype}", number, str(exc), source=source) from None
                kwargs[si] = table
            elif not _is_number(value):
                raise ConfigError(key, value, f"expected a number, got {_type_name(value)}", source=source)
            elif key == "kernel_overhead_us":
                kwargs[si] = float(value) / _US_PER_S
            elif si in _INT_FIELDS:
                kwargs[si] = round(value * scale)
            else:
                kwargs[si] = float(value * scale)
        elif key in _INT_FIELDS:
            if not (isinstance(value, int) and not isinstance(value, bool)):
                raise ConfigError(key, value, f"expected an integer, got {_type_name(value)}", source=source)
            kwargs[key] = value
        elif key in _FLOAT_FIELDS:
            if not _is_number(value):
                raise ConfigError(key, value, f"expected a number, got {_type_name(value)}", source=source)
            kwargs[key] = float(value)
        elif key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise ConfigError(key, value, f"expected true or false, got {_type_name(value)}", source=source)
            kwargs[key] = value
        elif key in _STR_FIELDS:
            if not isinstance(value, str):
                raise ConfigError(key, value, f"expected a string, got {_type_name(value)}", source=source)
            kwargs[key] = value
        elif key == "aliases":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(key, value, "expected a list of strings", source=source)
            kwargs[key] = tuple(value)
        elif key == "peak_flops":
            if not isinstance(value, dict) or not all(_is_number(v) for v in value.values()):
                raise ConfigError(key, value, "expected a table of dtype = FLOP/s", source=source)
            kwargs[key] = {canonical_dtype(k): float(v) for k, v in value.items()}
        elif key == "attention":
            kwargs["attention_kernels"] = _attention_kernels(value, source)
        elif key in ("tile_sizes",):
            if not isinstance(value, list) or not all(isinstance(t, list) and len(t) == 2 and all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in t) for t in value) or not value:
                raise ConfigError(key, value, "expected a list of [tile_m, tile_n] pairs, e.g. [[256, 128], [128, 128]]",
                                  source=source)
            kwargs[key] = tuple((t[0], t[1]) for t in value)
        elif key in ("tile_throughput", "split_k"):
            if not isinstance(value, list) or not all(_is_number(v) for v in value):
                raise ConfigError(key, value, "expected a list of numbers", source=source)
            kwargs[key] = tuple(value)
        else:
            valid = sorted((_FIELDS - {v[0] for v in GPU_UNIT_KEYS.values()}) | set(GPU_UNIT_KEYS) | {"meta"})
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(str(key), value, f"unknown key in a GPU file; valid keys: {', '.join(valid)}{hint}", source=source)
    for required in ("name", "num_sms", "memory_bandwidth_bytes_per_s"):
        if required not in kwargs:
            hint = " (or memory_bandwidth_GBps)" if required == "memory_bandwidth_bytes_per_s" else ""
            raise ConfigError(required, None, f"required key missing from a GPU file{hint}", source=source)
    try:
        return GpuSpec(**kwargs)
    except ConfigError as exc:
        if exc.source is not None or source is None:
            raise
        raise ConfigError(exc.field, exc.value, exc.expected, source=source) from None


def _folder() -> Any:
    return resources.files("commscope.presets").joinpath("gpus")


def gpu_names() -> list[str]:
    """Sorted names of the GPU presets (``a100``, ``h100``, ``rtx3090``, ``v100``)."""
    return sorted(e.name.removesuffix(".toml") for e in _folder().iterdir() if e.name.endswith(".toml") and e.is_file())


@functools.lru_cache(maxsize=32)
def _read_preset(name: str) -> GpuSpec:
    """One preset file, parsed once per process (``estimate`` asks for it per configuration)."""
    entry = _folder().joinpath(f"{name}.toml")
    try:
        d = tomllib.loads(entry.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("path", f"gpus/{name}.toml", f"malformed TOML: {exc}") from None
    return gpu_from_mapping(d, source=f"gpus/{name}.toml")


def gpu_preset(name: str) -> GpuSpec:
    """The :class:`GpuSpec` of GPU preset ``name`` (``a100``, ``h100``, ``v100``, ``rtx3090``), or of the preset
    one of whose aliases ``name`` contains (``A100-SXM4-80GB`` -> ``a100``)."""
    key = str(name).strip().lower()
    names = gpu_names()
    if key in names:
        return _read_preset(key)
    match = _match_alias(key)
    if match is not None:
        return _read_preset(match)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError("gpu", name, f"not a GPU preset or an existing file; valid presets: {', '.join(names)}{hint}")


def _normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


@functools.lru_cache(maxsize=64)
def _match_alias(text: str) -> str | None:
    """The preset whose longest alias occurs in ``text`` (case and punctuation ignored), or None."""
    norm = _normal(text)
    best: tuple[int, str] | None = None
    for preset in gpu_names():
        spec = _read_preset(preset)
        for alias in (preset, *spec.aliases):
            a = _normal(alias)
            if a and a in norm and (best is None or len(a) > best[0]):
                best = (len(a), preset)
    return None if best is None else best[1]


def load_gpu(name_or_path: str | os.PathLike[str] | GpuSpec) -> GpuSpec:
    """A GPU from a preset name, an alias contained in a GPU model string, or a ``.toml``/``.json`` file."""
    if isinstance(name_or_path, GpuSpec):
        return name_or_path
    p = Path(name_or_path)
    if p.is_file():
        from commscope.spec.files import read_mapping

        return gpu_from_mapping(read_mapping(p), source=str(p), name=p.stem)
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or "/" in text or p.suffix.lower() in (".toml", ".json", ".yaml", ".yml"):
        raise ConfigError("gpu", text, "no such file")
    return gpu_preset(text)


def gpu_for_cluster(cluster: ClusterSpec, gpu: str | os.PathLike[str] | GpuSpec | None = None) -> GpuSpec:
    """The GPU of ``cluster`` (matched by :attr:`ClusterSpec.gpu`, or ``gpu`` when given), with the cluster's
    peak FLOP/s and memory bandwidth where it states them, so that the GEMM model and
    :func:`commscope.estimate.estimate` use the same peak."""
    if gpu is None:
        # the cluster's own GPU: worked out once per (frozen) cluster object (every estimate asks; a GpuSpec checks
        # all its fields)
        return held_by_object(_CLUSTER_GPUS, cluster, None, lambda: _gpu_for_cluster(cluster, None))
    return _gpu_for_cluster(cluster, gpu)


_CLUSTER_GPUS: dict[tuple[int, Any], tuple[ClusterSpec, GpuSpec]] = {}


def _gpu_for_cluster(cluster: ClusterSpec, gpu: str | os.PathLike[str] | GpuSpec | None) -> GpuSpec:
    """:func:`gpu_for_cluster`, worked out."""
    if gpu is not None:
        spec = load_gpu(gpu)
    else:
        match = _match_alias(cluster.gpu)
        if match is None:
            raise ConfigError("gpu", cluster.gpu, f"no GPU preset matches cluster {cluster.name!r}; set the cluster file's "
                                                  f"gpu to one of {', '.join(gpu_names())} (`shapes` also takes "
                                                  "--gpu NAME or a GPU file)")
        spec = _read_preset(match)
    from dataclasses import replace

    peak = {**spec.peak_flops, **cluster.peak_flops}
    bandwidth = cluster.memory_bandwidth_bytes_per_s or spec.memory_bandwidth_bytes_per_s
    if peak == spec.peak_flops and bandwidth == spec.memory_bandwidth_bytes_per_s:
        return spec  # (frozen: the preset itself, not a copy that checks every field again)
    return replace(spec, peak_flops=peak, memory_bandwidth_bytes_per_s=bandwidth)
