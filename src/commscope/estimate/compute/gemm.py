"""The GEMMs one GPU runs for a transformer layer, and how long the GPU takes for each.

The compute model's lowest layer (:mod:`commscope.estimate.compute`): :func:`layer_gemms` lists the GEMM shapes,
:func:`gemm_timing` times them on a :class:`~commscope.estimate.gpus.GpuSpec` with the tile/wave model. Both serve
:mod:`commscope.estimate.compute.model` (iteration compute time, used by ``estimate`` and ``plan``) and
:mod:`commscope.estimate.shapes` (shape rules and suggestions).

1. :func:`layer_gemms` lists the GEMMs one GPU runs for one transformer layer and one micro-batch under
   tensor (t), sequence, context (c) and expert (e) parallelism, Megatron-style [megatron-lm-2019]:

   =============  =========  ==============  ============  =============  ==========================
   GEMM           batch      M               N             K              notes
   =============  =========  ==============  ============  =============  ==========================
   qkv            1          b s / c         (a + 2g) d/t  h              column-parallel
   attn_scores    b a / t    s / c           s             d              Q K^T per head
   attn_values    b a / t    s / c           d             s              softmax(Q K^T) V per head
   attn_proj      1          b s / c         h             a d / t        row-parallel
   mlp_up         1          b s / c         f/t (x2 gated) h             column-parallel (gate + up fused)
   mlp_down       1          b s / c         h             f / t          row-parallel
   logits         1          b s / c         V' / t        h              once per model (last stage)
   =============  =========  ==============  ============  =============  ==========================

   with a heads, g query groups, d head size, f FFN width, V' the padded vocabulary. Sequence parallelism
   all-gathers the sequence before the column-parallel GEMMs and reduce-scatters after the row-parallel ones,
   so the GEMM shapes are those without it (only norms and dropout run on s/t). Each forward GEMM
   C[M, N] = A[M, K] B[K, N] has two backward GEMMs: ``dgrad`` dA = dC B^T with (M, N, K) -> (M, K, N) and
   ``wgrad`` dB = A^T dC with (M, N, K) -> (K, N, M). For the attention GEMMs both operands are
   activations (dQ, dK; dP, dV); the names keep the operand order. FlashAttention fuses the two attention
   GEMMs into one kernel whose tiles see the same M, N, K; the model treats them as cuBLAS batched GEMMs.
   MoE layers replace the MLP by a router GEMM (b s/c x E x h) and ``E/e`` local experts, each a GEMM of
   ``b s/c x top_k x e / E`` tokens (balanced routing) [megatron-core].

2. :func:`gemm_timing` predicts the time of a GEMM on a :class:`~commscope.estimate.gpus.GpuSpec`
   [nvidia-matmul-guide]:

   - the output is cut into CTA tiles of tile_m x tile_n; ``ceil(M/tile_m) ceil(N/tile_n)`` tiles (times the
     batch) are computed whole: *tile quantisation*, tile efficiency = M N / (padded M x padded N);
   - K is padded to a multiple of the tile's K step (``tile_k``);
   - the tiles run in waves of ``num_sms x ctas_per_sm``; the last wave may be partly empty: *wave
     quantisation*, wave efficiency = tiles / (waves x SMs);
   - one CTA computes its tile at ``achievable_fraction x peak / SMs x tile_throughput x alignment``:
     ``achievable_fraction`` (~0.8) is the calibration constant for large aligned GEMMs, ``tile_throughput``
     the relative speed of smaller tiles, ``alignment`` 1 when M, N, K are multiples of 128 bytes (64
     fp16/bf16 elements), ``partial_alignment_factor`` when they are multiples of 16 bytes (8 elements)
     only, ``unaligned_factor`` otherwise (the tensor-core rule of [nvidia-matmul-guide]; the factors are
     assumptions to calibrate);
   - the memory roofline: the operands and the result move at least once, ``B (M K + K N + M N)`` bytes per
     GEMM, at ``memory_efficiency x`` HBM bandwidth; arithmetic intensity = FLOP / bytes;
   - time = max(compute, memory) + split-K reduction + kernel overhead, minimised over the tile sizes and
     (when the tiles fill less than one wave) split-K factors, as cuBLAS's heuristics choose.

   - each CTA also spends ``cta_fill_steps`` K steps filling its operand pipeline and writing its tile
     (prologue and epilogue), which short-K GEMMs feel most;

   Worked example (A100 preset: 108 SMs, 312 TFLOP/s, achievable 0.80, K step 32, 4 fill steps): M = N = K =
   4096 in bf16 on 256x128 tiles gives 16 x 32 = 512 tiles in ceil(512/108) = 5 waves (wave efficiency
   512/540 = 0.95); one CTA needs 2 x 256 x 128 x (128 + 4) x 32 / (0.80 x 312e12 / 108) = 120 us, so 5 waves
   take 599 us + 4 us overhead: 228 TFLOP/s, 73% of peak.

The functions import numpy only.
"""

from __future__ import annotations

import itertools
import math
import operator

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np

from commscope.errors import ConfigError
from commscope.estimate.gpus import GpuSpec
from commscope.estimate.plain import frozen, held_by_object, plain_twin
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.units import TFLOP, dtype_bytes

__all__ = [
    "ALIGN_ELEMENTS",
    "ATTENTION",
    "CORE_GEMMS",
    "PASSES",
    "SYMBOL_TEXT",
    "Gemm",
    "GemmResult",
    "GemmTimer",
    "GemmTiming",
    "alignment_factor",
    "gemm_timing",
    "layer_dims",
    "layer_gemms",
    "model_gemms",
    "time_gemms",
]

Pass = Literal["fwd", "dgrad", "wgrad"]
PASSES: tuple[str, ...] = ("fwd", "dgrad", "wgrad")

#: The multiple the shape rules ask for, in elements: 64 [anthony-2024] (128 bytes of fp16/bf16, the A100
#: optimum of [nvidia-matmul-guide], and the narrow side of the 64/128/256-wide CTA tiles).
ALIGN_ELEMENTS = 64

#: How each dimension symbol reads in a table.
SYMBOL_TEXT: dict[str, str] = {
    "tokens": "b*s/cp", "seq_q": "s/cp", "seq_k": "s", "hidden": "h", "head": "d", "q_width": "a*d/t",
    "qkv_width": "(a+2g)*d/t", "ffn_width": "f/t", "vocab_width": "V'/t", "experts": "E",
    "expert_tokens": "b*s*k*e/E", "expert_ffn_width": "f_moe/t", "shared_ffn_width": "f_shared/t",
}


# ---------------------------------------------------------------------------------------------------------
# 1. The GEMMs of a layer
# ---------------------------------------------------------------------------------------------------------


Dim = tuple[str, int]
"""A GEMM dimension as (symbol, coefficient): its size is ``coefficient x dims[symbol]``."""
_D = TypeVar("_D")


@dataclass(frozen=True, slots=True, kw_only=True)
class Gemm:
    """One GEMM shape that one GPU runs per layer and micro-batch: ``batch`` x (M x K) @ (K x N), ``count`` times."""

    name: str
    """``qkv``, ``attn_scores``, ``attn_values``, ``attn_proj``, ``mlp_up``, ``mlp_down``, ``logits``, ``router``,
    ``expert_up``, ``expert_down``, ``shared_up``, ``shared_down``."""
    pass_: str
    """``fwd``, ``dgrad`` (gradient of the first operand) or ``wgrad`` (of the second)."""
    m: int
    n: int
    k: int
    batch: int = 1
    """Independent GEMMs of the same shape in one batched call (attention: micro-batch x local heads)."""
    count: int = 1
    """Calls of this shape per layer (MoE: local experts)."""
    dims: tuple[Dim, Dim, Dim]
    """Symbols of M, N, K (see :data:`SYMBOL_TEXT`)."""
    part: str
    """``attention``, ``mlp``, ``moe`` or ``logits``."""
    layer_kind: str = "dense"
    """``dense`` or ``moe`` layer; ``model`` for the logits (once per model)."""
    io_elements: int
    """Elements one GEMM of the batch moves through HBM: M K + K N + M N, less the s x s score matrices that a
    fused (flash) attention kernel keeps on chip."""

    @property
    def flop(self) -> float:
        """2 M N K per GEMM (one multiply-add = 2 FLOP), times batch and count."""
        return _gemm_flop(self.m, self.n, self.k, self.batch, self.count)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(sym for sym, _ in self.dims)

    def dim_text(self, i: int) -> str:
        sym, coef = self.dims[i]
        text = SYMBOL_TEXT.get(sym, sym)
        return f"{coef}*{text}" if coef != 1 else text

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pass": self.pass_, "m": self.m, "n": self.n, "k": self.k, "batch": self.batch,
                "count": self.count, "flop": self.flop, "io_elements": self.io_elements, "part": self.part, "layer_kind": self.layer_kind,
                "m_dim": self.dim_text(0), "n_dim": self.dim_text(1), "k_dim": self.dim_text(2)}


_GemmFields = plain_twin(Gemm)


def _gemm_flop(m: int, n: int, k: int, batch: int, count: int) -> float:
    """FLOP of ``count`` calls of ``batch`` x (m x k) @ (k x n): 2 M N K each (one multiply-add = 2 FLOP)."""
    return 2.0 * m * n * k * batch * count


ShapeKey = tuple[int, int, int, int, int]
"""(M, N, K, batch, io_elements): what the time of one GEMM call depends on."""


class _GemmRow(NamedTuple):
    """One GEMM of a layer as the compute model's estimate path reads it: a :class:`Gemm` without its symbols, part
    and layer kind (:func:`_gemm_rows`; every estimate makes its job's, and a Gemm costs several times as much)."""

    name: str
    pass_: str
    key: ShapeKey
    calls: int
    """Calls per layer (:attr:`Gemm.count`)."""
    flop: float
    """:attr:`Gemm.flop`."""


#: A row's key, and its (key, calls).
_KEY, _KEY_CALLS = operator.itemgetter(2), operator.itemgetter(2, 3)


def layer_dims(model: ModelSpec, *, tp: int = 1, cp: int = 1, ep: int = 1, micro_batch_size: int = 1) -> dict[str, int]:
    """The size of every dimension symbol for one GPU (see :data:`SYMBOL_TEXT`).

    Raises :class:`ConfigError` when tp, cp or ep do not divide what they split (Megatron refuses those).
    """
    t, c, e, b = tp, cp, ep, micro_batch_size
    a, g, d = model.num_heads, model.kv_heads, model.head_size
    if a % t:
        raise ConfigError("tp", t, f"must divide num_heads={a}")
    if g % t and t % g:
        raise ConfigError("tp", t, f"must divide num_query_groups={g} (or be a multiple of it)")
    if model.ffn % t:
        raise ConfigError("tp", t, f"must divide ffn_hidden_size={model.ffn}")
    if model.seq_len % c:
        raise ConfigError("cp", c, f"must divide seq_length={model.seq_len}")
    kv_local = max(1, g // t)  # with t > g each rank keeps one (replicated) key/value head
    dims = {
        "tokens": b * model.seq_len // c,
        "seq_q": model.seq_len // c,
        "seq_k": model.seq_len,
        "hidden": model.hidden_size,
        "head": d,
        "q_width": a * d // t,
        "qkv_width": (a // t + 2 * kv_local) * d,
        "ffn_width": model.ffn // t,
        "vocab_width": model.padded_vocab_size(t) // t,
    }
    if model.is_moe:
        if model.num_experts % e:
            raise ConfigError("ep", e, f"must divide num_experts={model.num_experts}")
        if model.moe_ffn % t:
            raise ConfigError("tp", t, f"must divide moe_ffn_hidden_size={model.moe_ffn}")
        dims["experts"] = model.num_experts
        dims["expert_tokens"] = -(-dims["tokens"] * model.top_k * e // model.num_experts)
        dims["expert_ffn_width"] = model.moe_ffn // t
        if model.num_shared_experts:
            dims["shared_ffn_width"] = model.moe_ffn * model.num_shared_experts // t
    return dims


# (name, part, batch symbol or None, M, N, K) of each forward GEMM; "gate" marks the x2 of a gated MLP.
_ATTENTION = (
    ("qkv", None, ("tokens", 1), ("qkv_width", 1), ("hidden", 1)),
    ("attn_scores", "heads", ("seq_q", 1), ("seq_k", 1), ("head", 1)),
    ("attn_values", "heads", ("seq_q", 1), ("head", 1), ("seq_k", 1)),
    ("attn_proj", None, ("tokens", 1), ("hidden", 1), ("q_width", 1)),
)


def _backward(m: _D, n: _D, k: _D) -> tuple[tuple[str, tuple[_D, _D, _D]], ...]:
    """(pass, (M, N, K)) of the forward GEMM and its two backward GEMMs [nvidia-matmul-guide, "backward pass"] (as
    symbols or as sizes)."""
    return ("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (k, n, m))


ForwardSpec = tuple[str, str, str | None, int, Dim, Dim, Dim]
"""(name, part, batch kind, count, M, N, K) of a forward GEMM; count -1: the local experts."""


def _forward_specs(model: ModelSpec, layer_kind: str) -> list[ForwardSpec]:
    """(name, part, batch kind, count symbol, M, N, K) of the forward GEMMs of one layer of ``layer_kind``."""
    return [*_ATTENTION_SPECS, *_body_specs(model, layer_kind)]


_ATTENTION_SPECS: tuple[ForwardSpec, ...] = tuple((name, "attention", batch, 1, m, n, k) for name, batch, m, n, k in _ATTENTION)
_LOGITS_SPECS: tuple[ForwardSpec, ...] = (("logits", "logits", None, 1, ("tokens", 1), ("vocab_width", 1), ("hidden", 1)),)


def _body_specs(model: ModelSpec, layer_kind: str) -> list[ForwardSpec]:
    """:func:`_forward_specs` after the attention's: the MLP, or the router and experts."""
    up = 2 if model.gated_mlp else 1
    specs: list[ForwardSpec] = []
    if layer_kind == "moe":
        specs.append(("router", "moe", None, 1, ("tokens", 1), ("experts", 1), ("hidden", 1)))
        specs.append(("expert_up", "moe", None, -1, ("expert_tokens", 1), ("expert_ffn_width", up), ("hidden", 1)))
        specs.append(("expert_down", "moe", None, -1, ("expert_tokens", 1), ("hidden", 1), ("expert_ffn_width", 1)))
        if model.num_shared_experts:
            specs.append(("shared_up", "moe", None, 1, ("tokens", 1), ("shared_ffn_width", up), ("hidden", 1)))
            specs.append(("shared_down", "moe", None, 1, ("tokens", 1), ("hidden", 1), ("shared_ffn_width", 1)))
    else:
        specs.append(("mlp_up", "mlp", None, 1, ("tokens", 1), ("ffn_width", up), ("hidden", 1)))
        specs.append(("mlp_down", "mlp", None, 1, ("tokens", 1), ("hidden", 1), ("ffn_width", 1)))
    return specs


def _batched_specs(model: ModelSpec, par: ParallelSpec, forward: Sequence[ForwardSpec],
                   core: bool) -> Iterator[tuple[str, str, int, int, tuple[Dim, Dim, Dim]]]:
    """(name, part, batch, count, symbols of M, N, K) of each forward GEMM of ``forward``, in order (``core=False``:
    the attention core's left out); each comes with its two backward GEMMs (:func:`_backward`)."""
    heads_batch = par.micro_batch_size * (model.num_heads // par.tp)
    for name, part, batch_kind, count, m, n, k in forward:
        if not core and name in CORE_GEMMS:
            continue
        batch = heads_batch if batch_kind == "heads" else 1
        num = model.num_experts // par.ep if count == -1 else count
        yield name, part, batch, num, (m, n, k)


_SEQ = frozenset({"seq_q", "seq_k"})

Attention = Literal["flash", "unfused"]
ATTENTION = ("flash", "unfused")


def _io_elements(dims3: tuple[Dim, Dim, Dim], sizes: tuple[int, int, int], attention: str) -> int:
    """Elements of A (M x K), B (K x N) and C (M x N) that move through HBM; with ``flash`` attention the
    s x s scores and probabilities stay on chip [FlashAttention, Dao et al. 2022]."""
    m, n, k = sizes
    if attention != "flash":
        return m * k + k * n + m * n
    on_seq = [sym in _SEQ for sym, _ in dims3]  # M, N, K
    return ((0 if on_seq[0] and on_seq[2] else m * k) + (0 if on_seq[2] and on_seq[1] else k * n)
            + (0 if on_seq[0] and on_seq[1] else m * n))


def _sizes(dims3: tuple[Dim, Dim, Dim], values: dict[str, int], attention: str) -> tuple[int, int, int, int]:
    """(M, N, K, io_elements) of a GEMM of symbols ``dims3`` at the sizes ``values``."""
    (ms, mc), (ns, nc), (ks, kc) = dims3
    m, n, k = mc * values[ms], nc * values[ns], kc * values[ks]
    # (a GEMM with no sequence dimension moves all three operands whatever the attention: _io_elements's first case)
    io = (m * k + k * n + m * n if ms not in _SEQ and ns not in _SEQ and ks not in _SEQ
          else _io_elements(dims3, (m, n, k), attention))
    return m, n, k, io


def _build(name: str, part: str, pass_: str, dims3: tuple[Dim, Dim, Dim], values: dict[str, int], batch: int,
           count: int, layer_kind: str, attention: str = "flash") -> Gemm:
    m, n, k, io = _sizes(dims3, values, attention)
    # (through Gemm's plain twin, commscope.estimate.plain: Gemm's frozen constructor costs three times as much)
    return frozen(_GemmFields(name=name, pass_=pass_, m=m, n=n, k=k, batch=batch, count=count, dims=dims3, part=part,
                              layer_kind=layer_kind, io_elements=io), Gemm)


def layer_gemms(model: ModelSpec, parallel: ParallelSpec | None = None, *, layer_kind: str | None = None,
                logits: bool = False, dims: dict[str, int] | None = None, attention: str = "flash") -> tuple[Gemm, ...]:
    """The GEMMs one GPU runs for one layer and one micro-batch: forward, dgrad and wgrad of each.

    ``layer_kind`` is ``dense`` or ``moe`` (default: ``moe`` for an MoE model, else ``dense``); ``logits=True``
    returns the output-layer GEMMs instead. ``dims`` replaces the sizes of :func:`layer_dims` (used to price
    a rule by rounding one symbol up). ``attention="flash"`` (default, Megatron with Transformer Engine)
    keeps the s x s score matrix on chip; ``"unfused"`` writes and reads it (the memory roofline then
    dominates the attention GEMMs).

    >>> from commscope.presets import model_preset
    >>> [(g.name, g.m, g.n, g.k) for g in layer_gemms(model_preset("gpt3-2.7b")) if g.pass_ == "fwd"][:3]
    [('qkv', 2048, 7680, 2560), ('attn_scores', 2048, 2048, 80), ('attn_values', 2048, 80, 2048)]
    """
    return _layer_gemms(model, parallel, layer_kind=layer_kind, logits=logits, dims=dims, attention=attention)


#: The attention core's batched GEMMs (the rest of a layer's are its linear layers').
CORE_GEMMS = frozenset({"attn_scores", "attn_values"})


def _layer_gemms(model: ModelSpec, parallel: ParallelSpec | None = None, *, layer_kind: str | None = None,
                 logits: bool = False, dims: dict[str, int] | None = None, attention: str = "flash",
                 core: bool = True) -> tuple[Gemm, ...]:
    """:func:`layer_gemms`; ``core=False`` leaves out the attention core's GEMMs (those a fused kernel runs, which
    the compute model times as that kernel)."""
    if attention not in ATTENTION:
        raise ConfigError("attention", attention, f"valid: {', '.join(ATTENTION)}")
    par = parallel or ParallelSpec()
    values = dims if dims is not None else layer_dims(model, tp=par.tp, cp=par.cp, ep=par.ep,
                                                       micro_batch_size=par.micro_batch_size)
    if logits:
        return tuple(_build(name, part, pass_, d3, values, batch, num, "model", attention)
                     for name, part, batch, num, fwd in _batched_specs(model, par, _LOGITS_SPECS, core)
                     for pass_, d3 in _backward(*fwd))
    kind = layer_kind or ("moe" if model.is_moe else "dense")
    if kind not in ("dense", "moe"):
        raise ConfigError("layer_kind", kind, "valid: dense, moe")
    if kind == "moe" and not model.is_moe:
        raise ConfigError("layer_kind", kind, f"{model.name} has no MoE layers")
    return tuple(_build(name, part, pass_, d3, values, batch, num, kind, attention)
                 for name, part, batch, num, fwd in _batched_specs(model, par, _forward_specs(model, kind), core)
                 for pass_, d3 in _backward(*fwd))


def _gemm_rows(model: ModelSpec, parallel: ParallelSpec, dims: dict[str, int], *, part: str,
              attention: str = "flash", core: bool = True) -> tuple[_GemmRow, ...]:
    """The rows (:class:`_GemmRow`) of one part of a layer, in :func:`layer_gemms`' order (each forward GEMM and its
    dgrad and wgrad, in :data:`PASSES`' order, which the compute model's sums by pass read): ``attention`` (QKV, the
    core, the projection; ``core=False`` leaves the core out), ``dense`` or ``moe`` (the MLP, or the router and
    experts: the rest of a layer of that kind), ``logits`` (the output layer). ``dims``: :func:`layer_dims`."""
    forward = _ATTENTION_SPECS if part == "attention" else _LOGITS_SPECS if part == "logits" else _body_specs(model, part)
    row = _GemmRow._make  # (tuple's own constructor: the named one is a Python function)
    out = []
    for name, _, batch, num, fwd in _batched_specs(model, parallel, forward, core):
        if attention == "flash" and (fwd[0][0] in _SEQ or fwd[1][0] in _SEQ or fwd[2][0] in _SEQ):
            # (the passes of a flash core GEMM keep different operands on chip: each pass's own elements)
            for pass_, d3 in _backward(*fwd):
                m, n, k, io = _sizes(d3, dims, attention)
                out.append(row((name, pass_, (m, n, k, batch, io), num, _gemm_flop(m, n, k, batch, num))))
            continue
        # the backward GEMMs move the forward's three operands (M K + K N + M N elements whatever the order)
        fm, fn, fk, io = _sizes(fwd, dims, attention)
        for pass_, (m, n, k) in _backward(fm, fn, fk):
            out.append(row((name, pass_, (m, n, k, batch, io), num, _gemm_flop(m, n, k, batch, num))))
    return tuple(out)


def model_gemms(model: ModelSpec, parallel: ParallelSpec | None = None, *, dims: dict[str, int] | None = None,
                attention: str = "flash") -> tuple[tuple[Gemm, int], ...]:
    """Every GEMM shape of one micro-batch on one tensor-parallel rank with how many layers run it.

    Dense layers, MoE layers and the logits (multiplicity 1); summed over the pipeline stages.
    """
    par = parallel or ParallelSpec()
    num_moe = model.num_moe_layers
    num_dense = model.num_layers - num_moe
    out: list[tuple[Gemm, int]] = []
    if num_dense:
        out += [(g, num_dense) for g in layer_gemms(model, par, layer_kind="dense", dims=dims, attention=attention)]
    if num_moe:
        out += [(g, num_moe) for g in layer_gemms(model, par, layer_kind="moe", dims=dims, attention=attention)]
    out += [(g, 1) for g in layer_gemms(model, par, logits=True, dims=dims, attention=attention)]
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------
# 2. The GEMM model
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmTiming:
    """Predicted execution of GEMMs (arrays, one entry per GEMM; see the module docstring, point 2)."""

    time_s: np.ndarray
    """Predicted time of one call: max(compute, memory) + split-K reduction + kernel overhead."""
    compute_time_s: np.ndarray
    memory_time_s: np.ndarray
    flop: np.ndarray
    efficiency: np.ndarray
    """FLOP / (time x datasheet peak)."""
    tile_m: np.ndarray
    tile_n: np.ndarray
    split_k: np.ndarray
    num_tiles: np.ndarray
    """Output tiles including the batch (CTAs before split-K)."""
    num_waves: np.ndarray
    tile_efficiency: np.ndarray
    """M N over the padded M x padded N of the tiles: 1 means no tile quantisation."""
    wave_efficiency: np.ndarray
    """CTAs over waves x SM slots: 1 means no wave quantisation."""
    k_efficiency: np.ndarray
    """K over K padded to the tile's K step (and split)."""
    tile_throughput: np.ndarray
    """Relative speed of the chosen tile size (1 for the largest)."""
    alignment_factor: np.ndarray
    arithmetic_intensity: np.ndarray
    """FLOP per byte of the operands and result moved once."""
    memory_bound: np.ndarray
    peak_flops: float


def _ceil_div(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    return -(-a // b)


def alignment_factor(gpu: GpuSpec, elem_bytes: int, *dims: np.ndarray) -> np.ndarray:
    """1 when every dimension is a multiple of ``alignment_optimal_bytes``; ``partial_alignment_factor`` when
    every one is a multiple of ``alignment_required_bytes`` (16 B: 8 fp16 elements); else ``unaligned_factor``
    [nvidia-matmul-guide, "Tensor Core Requirements"]."""
    off = _misses(_multiples_elements(gpu, elem_bytes), _stacked(dims))
    return _alignment_of_flags(gpu, off[0], off[1])


def legacy_kernel(gpu: GpuSpec, elem_bytes: int, *dims: np.ndarray) -> np.ndarray:
    """Where a GPU with TMA (``tma_alignment_bytes``, Hopper: 16) must run the older, non-TMA kernel: some dimension
    is not a multiple of that many bytes (TMA needs 16-byte aligned strides) [nvidia-matmul-guide, cuda-tma]."""
    stacked = _stacked(dims)
    if not gpu.tma_alignment_bytes:
        return np.zeros(stacked.shape[1:], dtype=bool)
    out: np.ndarray = _misses(_multiples_elements(gpu, elem_bytes), stacked)[2]
    return out


def _stacked(dims: tuple[Any, ...]) -> np.ndarray:
    """(len(dims), ...): the dimensions broadcast to one shape and stacked."""
    return np.stack(np.broadcast_arrays(*(np.asarray(d, dtype=np.int64) for d in dims)))


def _multiples_elements(gpu: GpuSpec, elem_bytes: int) -> np.ndarray:
    """The multiples a dimension should be of, in elements of ``elem_bytes``: the optimal, the required and (on a GPU
    with TMA) TMA's multiple in bytes, each ``b / gcd(b, elem_bytes)`` elements (``size x elem_bytes`` is a multiple
    of ``b`` bytes exactly where ``size`` is a multiple of that)."""
    multiples = [gpu.alignment_optimal_bytes, gpu.alignment_required_bytes] + (
        [gpu.tma_alignment_bytes] if gpu.tma_alignment_bytes else [])
    return np.array([b // math.gcd(b, elem_bytes) for b in multiples], dtype=np.int64)


def _misses(multiples: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """(multiples, ...): where some of the stacked dimensions ``dims`` (dimensions on the first axis) is not a
    multiple of each of ``multiples`` (:func:`_multiples_elements`)."""
    out: np.ndarray = (dims[:, None] % multiples.reshape(-1, *(1,) * (dims.ndim - 1))).any(axis=0)
    return out


def _alignment_of_flags(gpu: GpuSpec, off_optimal: Any, off_required: Any) -> np.ndarray:
    """:func:`alignment_factor` of GEMMs some of whose dimensions are off the optimal multiple (``off_optimal``)
    and off the required one (``off_required``)."""
    out: np.ndarray = np.where(off_optimal, np.where(off_required, gpu.unaligned_factor, gpu.partial_alignment_factor),
                               1.0)
    return out


def k_step_elements(gpu: GpuSpec, elem_bytes: int) -> int:
    """Elements of K one main-loop step covers: ``tile_k`` is given for 2-byte types, and a step moves the same
    bytes whatever the type (Hopper: 64 bf16 or 128 FP8 elements, 128 bytes of each operand row)."""
    return max(1, gpu.tile_k * 2 // elem_bytes)


def gemm_timing(gpu: GpuSpec, m: Any, n: Any, k: Any, batch: Any = 1, *, dtype: str = "bf16",
                io_elements: Any = None) -> GemmTiming:
    """Predicted time and efficiency of ``batch`` x (m x k) @ (k x n) GEMMs; arguments broadcast (numpy).

    ``io_elements`` (per GEMM of the batch) replaces ``m k + k n + m n`` in the memory roofline. See the module
    docstring (point 2) for the model and a worked example.
    """
    m, n, k, batch = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (m, n, k, batch)))
    io = (m * k + k * n + m * n) if io_elements is None else np.broadcast_to(np.asarray(io_elements, dtype=np.int64), m.shape)
    shape = m.shape
    pick = _pick(gpu, np.stack([m.ravel(), n.ravel(), k.ravel(), batch.ravel(), io.ravel()]), dtype)
    i = pick.index.reshape(shape)
    elem, peak, slots, k_step = pick.elem_bytes, pick.peak_flops, pick.slots, pick.k_step
    comp = pick.compute_times_s[np.arange(pick.index.size), pick.index].reshape(shape)
    best_t, t_mem = pick.time_s.reshape(shape), pick.memory_time_s.reshape(shape)
    flop = 2.0 * m * n * k * batch
    operand_bytes = elem * batch * io
    # the picked candidate's own numbers, recomputed from its tile and split (cheaper than picking each array)
    tm, tn, thr, split = pick.candidates
    ptm, ptn, pthr, psplit = tm[i], tn[i], thr[i], split[i]
    p_tiles_m, p_tiles_n = _ceil_div(m, ptm), _ceil_div(n, ptn)
    p_tiles = p_tiles_m * p_tiles_n * batch
    p_ksteps = _ceil_div(_ceil_div(k, psplit), k_step)
    p_waves = _ceil_div(p_tiles * psplit, slots)
    return GemmTiming(
        time_s=best_t, compute_time_s=comp, memory_time_s=t_mem, flop=flop, efficiency=flop / (best_t * peak),
        tile_m=ptm, tile_n=ptn, split_k=psplit, num_tiles=p_tiles, num_waves=p_waves,
        tile_efficiency=(m * n) / (p_tiles_m * ptm * p_tiles_n * ptn), wave_efficiency=p_tiles * psplit / (p_waves * slots),
        k_efficiency=k / (psplit * p_ksteps * k_step), tile_throughput=pthr,
        alignment_factor=pick.alignment_factor.reshape(shape), arithmetic_intensity=flop / operand_bytes,
        memory_bound=t_mem > comp, peak_flops=peak)


@dataclass(frozen=True, slots=True)
class _Picked:
    """What :func:`_pick` found for a flat list of GEMMs (one entry each) and the constants it used."""

    time_s: np.ndarray
    compute_times_s: np.ndarray
    """(n, C): the compute time of every candidate (``compute_times_s[arange(n), index]``: the picked one's)."""
    memory_time_s: np.ndarray
    index: np.ndarray
    """The picked candidate of each GEMM (into ``candidates``)."""
    alignment_factor: np.ndarray
    candidates: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    elem_bytes: int
    peak_flops: float
    slots: int
    k_step: int


def _pick(gpu: GpuSpec, shapes: np.ndarray, dtype: str) -> _Picked:
    """The tile/wave model of :func:`gemm_timing` for the GEMMs of ``shapes`` ((5, n) int64: M, N, K, batch and the
    elements each GEMM of the batch moves): the time of the fastest allowed candidate kernel of each, with as few
    numpy calls as the model allows (its per-GEMM cost is the calls', not the arithmetic's): what depends on the GPU
    and the dtype alone is :func:`_kernel_table`'s."""
    if shapes.shape[1] and shapes[:4].min() < 1:
        m, n, k = shapes[0], shapes[1], shapes[2]
        raise ConfigError("gemm", (m.tolist(), n.tolist(), k.tolist()), "GEMM dimensions must be positive")
    kt = _kernel_table(gpu, dtype)
    batch, io = shapes[3], shapes[4]
    # each GEMM's alignment case (:attr:`_KernelTable.alignment`): which multiples its dimensions miss
    code = kt.case_weights @ _misses(kt.multiples_elements, shapes[:3])
    t_mem = kt.elem_bytes * batch * io / kt.bandwidth
    # M, N, K and the batch as floats, converted once (each operation with a float converted them again, to the
    # same floats); the steps below work in place where what they replace is read no more (the same floats)
    mnkb = shapes[:4].astype(np.float64)

    # every (tile, split-K) candidate on a last axis, in the order cuBLAS's heuristics are read here (tiles outer,
    # splits inner): the first fastest allowed candidate is the one picked. The counts are integers held in float64,
    # the ceilings taken of float quotients (cheaper than integer division): exact while the integers stay below 2^52
    # (a quotient of such integers that is not whole lies at least 1/b from every integer, beyond its rounding)
    quotients = mnkb[:3, :, None] / kt.divisors
    tiles_m, tiles_n, k_split = np.ceil(quotients, out=quotients)  # (n, C) each: M / tile_m, N / tile_n, K / split
    tiles = tiles_m * tiles_n
    tiles *= mnkb[3][:, None]
    # split-K only where the tiles fill less than a wave and each split keeps two K steps (unsplit: always, so that
    # every GEMM has a candidate)
    refused = (tiles >= kt.split_below_tiles) | (k_split < kt.split_from_k)
    waves = tiles * kt.splits
    waves /= kt.slots
    np.ceil(waves, out=waves)
    # one CTA per tile fills its pipeline and writes its tile alone (steps beside each tile's K steps: the fill; none
    # once per kernel); a persistent kernel's CTA fills once and hides all but epilogue_steps of each tile's epilogue
    # under the next tile's main loop (kt.steps)
    steps = kt.steps[code]
    t_comp = k_split / kt.k_step  # the K steps of each split, then (waves x (them + fill) + once) x a step's time
    np.ceil(t_comp, out=t_comp)
    t_comp += steps[:, 0:1]
    t_comp *= waves
    t_comp += steps[:, 1:2]
    t_comp *= kt.t_step[code]
    # split-K: every split writes fp32 partial tiles that a reduction reads back and sums (kt.reduce_tiles: 0 unsplit)
    t = (4.0 * mnkb[3] * mnkb[0] * mnkb[1])[:, None] * kt.reduce_tiles
    t /= kt.bandwidth
    t += np.maximum(t_comp, t_mem[:, None])
    t += gpu.kernel_overhead_s
    t[refused] = np.inf
    i = t.argmin(axis=-1)  # the picked candidate of each GEMM (allowed: a refused one is inf)
    return _Picked(time_s=t[np.arange(len(i)), i], compute_times_s=t_comp, memory_time_s=t_mem, index=i,
                   alignment_factor=kt.alignment[code], candidates=kt.candidates, elem_bytes=kt.elem_bytes,
                   peak_flops=kt.peak_flops, slots=kt.slots, k_step=kt.k_step)


@dataclass(frozen=True, slots=True, kw_only=True)
class _KernelTable:
    """What :func:`_pick` reads of a GPU for one dtype: its candidate kernels and their constants, made once per GPU
    object and dtype (:func:`_kernel_table`). Arrays over the candidates (C) are in :func:`_candidates`' order;
    arrays over the alignment cases (8) are indexed by a GEMM's case, ``1 x (some dimension off the optimal
    multiple) + 2 x (off the required one) + 4 x (off TMA's: the legacy kernel)``."""

    elem_bytes: int
    peak_flops: float
    slots: int
    """CTAs of one wave."""
    k_step: int
    bandwidth: float
    """Streaming bandwidth, bytes/s."""
    candidates: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    divisors: np.ndarray
    """(3, 1, C): tile_m, tile_n and split-K of each candidate (what M, N and K are cut by), as floats (the integers
    they hold: numpy's division would convert them each call)."""
    splits: np.ndarray
    """(C,): split-K of each candidate, as floats."""
    split_below_tiles: np.ndarray
    """(C,): a split-K candidate runs below a wave of tiles (``slots``); an unsplit one always (inf)."""
    split_from_k: np.ndarray
    """(C,): a split-K candidate needs two K steps per split; an unsplit one nothing (0)."""
    reduce_tiles: np.ndarray
    """(C,): split + 1 (the partial tiles written and the result) of each split-K candidate, 0 unsplit (floats)."""
    multiples_elements: np.ndarray
    """:func:`_multiples_elements`."""
    case_weights: np.ndarray
    """What missing each of ``multiples_elements`` adds to a GEMM's alignment case."""
    alignment: np.ndarray
    """(8,): the alignment factor of each case, the legacy kernel's fraction included."""
    t_step: np.ndarray
    """(8, C): seconds of one K step of one CTA of each candidate in each case."""
    steps: np.ndarray
    """(8, 2): steps per tile beyond its K steps (the fill; a persistent kernel's epilogue steps), and steps once per
    CTA (a persistent kernel's fill; 0 otherwise)."""


def _kernel_table(gpu: GpuSpec, dtype: str) -> _KernelTable:
    """:class:`_KernelTable` of ``gpu`` and ``dtype``: a constant of the GPU object (as its preset is), made once
    per object and dtype, whose entry holds the object so that its id names it for as long as the entry stands."""
    return held_by_object(_KERNEL_TABLES, gpu, dtype, lambda: _make_kernel_table(gpu, dtype))


_KERNEL_TABLES: dict[tuple[int, Any], tuple[GpuSpec, _KernelTable]] = {}


def _make_kernel_table(gpu: GpuSpec, dtype: str) -> _KernelTable:
    """:func:`_kernel_table`, worked out."""
    elem = dtype_bytes(dtype)
    peak = gpu.peak_flops_for(dtype)
    slots = gpu.num_sms * gpu.ctas_per_sm
    rate_per_slot = peak * gpu.achievable_fraction_for(dtype) / slots  # FLOP/s of one CTA on the best tile, aligned
    k_step = k_step_elements(gpu, elem)
    candidates = tm, tn, thr, split = _candidates(gpu)
    case = np.arange(8)
    off_optimal, off_required, legacy = case & 1 > 0, case & 2 > 0, case & 4 > 0
    align = _alignment_of_flags(gpu, off_optimal, off_required)
    persistent = np.full(8, gpu.persistent_gemm)
    if gpu.tma_alignment_bytes:
        # the older kernel where TMA cannot run (legacy_kernel): its own per-SM rate, and never persistent
        align = np.where(legacy, align * gpu.legacy_gemm_fraction, align)
        persistent &= ~legacy
    multiples = _multiples_elements(gpu, elem)
    unsplit = split == 1
    out = _KernelTable(
        elem_bytes=elem, peak_flops=peak, slots=slots, k_step=k_step, bandwidth=gpu.streaming_bandwidth_bytes_per_s,
        candidates=candidates, divisors=np.stack([tm, tn, split])[:, None, :].astype(float), splits=split.astype(float),
        split_below_tiles=np.where(unsplit, np.inf, slots), split_from_k=np.where(unsplit, 0, 2 * k_step),
        reduce_tiles=np.where(unsplit, 0, split + 1).astype(float),
        multiples_elements=multiples,
        case_weights=np.array([1, 2, 4][:len(multiples)], dtype=np.int64), alignment=align,
        t_step=2.0 * tm * tn * k_step / (rate_per_slot * thr * align[:, None]),
        steps=np.stack([np.where(persistent, float(gpu.epilogue_steps), float(gpu.cta_fill_steps)),
                        np.where(persistent, float(gpu.cta_fill_steps), 0.0)], axis=1))
    for x in (out.divisors, out.splits, out.split_below_tiles, out.split_from_k, out.reduce_tiles, out.multiples_elements,
              out.case_weights, out.alignment, out.t_step, out.steps):
        x.setflags(write=False)
    return out


def _candidates(gpu: GpuSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tile_m, tile_n, relative throughput, split-K) of every candidate kernel of ``gpu``, tiles outer, read-only
    (made once per GPU object and dtype, with its :func:`_kernel_table`)."""
    ints = np.array([(t[0], t[1], sk) for t in gpu.tile_sizes for sk in gpu.split_k], dtype=np.int64).T
    thr = np.repeat(np.array(gpu.tile_throughputs, dtype=float), len(gpu.split_k))
    out = (ints[0].copy(), ints[1].copy(), thr, ints[2].copy())
    for x in out:
        x.setflags(write=False)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmResult:
    """One GEMM with its predicted execution on one GPU."""

    gemm: Gemm
    layers: int
    """Layers (per micro-batch, summed over pipeline stages) that run this GEMM; 1 for the logits."""
    time_s: float
    """One layer's calls: ``count`` x the time of one (batched) call."""
    compute_time_s: float
    memory_time_s: float
    efficiency: float
    tile: tuple[int, int]
    split_k: int
    num_tiles: int
    num_waves: int
    tile_efficiency: float
    wave_efficiency: float
    k_efficiency: float
    tile_throughput: float
    alignment_factor: float
    arithmetic_intensity: float
    memory_bound: bool
    broken_rules: tuple[str, ...] = ()
    """Ids of the shape rules whose dimensions this GEMM has."""

    @property
    def achieved_flops(self) -> float:
        return self.gemm.flop / self.time_s

    def to_dict(self) -> dict[str, Any]:
        d = self.gemm.to_dict()
        d.update({"layers": self.layers, "time_s": self.time_s, "compute_time_s": self.compute_time_s,
                  "memory_time_s": self.memory_time_s, "efficiency": self.efficiency,
                  "achieved_tflops": self.achieved_flops / TFLOP, "tile": list(self.tile), "split_k": self.split_k,
                  "num_tiles": self.num_tiles, "num_waves": self.num_waves, "tile_efficiency": self.tile_efficiency,
                  "wave_efficiency": self.wave_efficiency, "k_efficiency": self.k_efficiency,
                  "tile_throughput": self.tile_throughput, "alignment_factor": self.alignment_factor,
                  "arithmetic_intensity_flop_per_byte": self.arithmetic_intensity,
                  "bound": "memory" if self.memory_bound else "compute", "broken_rules": list(self.broken_rules)})
        return d


def _results(gemms: Sequence[tuple[Gemm, int]], t: GemmTiming, rows: Sequence[int]) -> tuple[GemmResult, ...]:
    out = []
    for (g, layers), i in zip(gemms, rows):
        out.append(GemmResult(
            gemm=g, layers=layers, time_s=float(t.time_s[i]) * g.count, compute_time_s=float(t.compute_time_s[i]) * g.count,
            memory_time_s=float(t.memory_time_s[i]) * g.count, efficiency=float(t.efficiency[i]),
            tile=(int(t.tile_m[i]), int(t.tile_n[i])), split_k=int(t.split_k[i]), num_tiles=int(t.num_tiles[i]),
            num_waves=int(t.num_waves[i]), tile_efficiency=float(t.tile_efficiency[i]),
            wave_efficiency=float(t.wave_efficiency[i]), k_efficiency=float(t.k_efficiency[i]),
            tile_throughput=float(t.tile_throughput[i]), alignment_factor=float(t.alignment_factor[i]),
            arithmetic_intensity=float(t.arithmetic_intensity[i]), memory_bound=bool(t.memory_bound[i])))
    return tuple(out)


def _shape_key(g: Gemm) -> ShapeKey:
    return (g.m, g.n, g.k, g.batch, g.io_elements)


def _gemm_key_calls(g: Gemm) -> tuple[ShapeKey, int]:
    return _shape_key(g), g.count


def _timing(keys: Sequence[ShapeKey], gpu: GpuSpec, dtype: str) -> GemmTiming:
    arr = np.array(keys, dtype=np.int64).reshape(-1, 5)
    return gemm_timing(gpu, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], dtype=dtype, io_elements=arr[:, 4])


def time_gemms(gemms: Sequence[tuple[Gemm, int]], gpu: GpuSpec, dtype: str) -> tuple[GemmResult, ...]:
    """Time every (GEMM, layers) pair with :func:`gemm_timing` in one vectorised call."""
    if not gemms:
        return ()
    return _results(gemms, _timing([_shape_key(g) for g, _ in gemms], gpu, dtype), range(len(gemms)))


class GemmTimer:
    """:func:`time_gemms` for many calls on one GPU: the shapes announced with :meth:`prefetch` are timed together
    in one :func:`gemm_timing` call per dtype (each GEMM's time depends on its own shape only, so the results are
    those of :func:`time_gemms`). :func:`commscope.estimate.compute.model.stage_compute` times every GEMM of a
    configuration so, and :mod:`commscope.estimate.many` the layers of thousands of configurations."""

    def __init__(self, gpu: GpuSpec) -> None:
        self.gpu = gpu
        self._pending: dict[str, dict[ShapeKey, None]] = {}
        self._time_of: dict[str, dict[ShapeKey, float]] = {}
        """The time of one call of every timed key, in the order they were timed (their index into ``_timing``)."""
        self._timing: dict[str, GemmTiming] = {}

    def prefetch(self, gemms: Sequence[Gemm], dtype: str) -> None:
        self._announce(map(_shape_key, gemms), dtype)

    def prefetch_rows(self, rows: Sequence[_GemmRow], dtype: str) -> None:
        """:meth:`prefetch` of the compute model's rows (:func:`_gemm_rows`)."""
        self._announce(map(_KEY, rows), dtype)

    def _announce(self, keys: Iterable[ShapeKey], dtype: str) -> None:
        pending = self._pending.get(dtype)
        if pending is None:
            self._pending[dtype] = dict.fromkeys(keys)
        else:
            pending.update(dict.fromkeys(keys))

    def _ready(self, keys: Sequence[ShapeKey], dtype: str) -> dict[ShapeKey, float]:
        """The time of one call of every timed key, ``keys`` among them, timing what is pending first."""
        time_of = self._time_of.get(dtype, {})
        if self._pending.get(dtype) or any(k not in time_of for k in keys):
            self._announce(keys, dtype)
            pending = self._pending.pop(dtype)
            timed = [*time_of, *(k for k in pending if k not in time_of)] if time_of else list(pending)
            shapes = np.fromiter(itertools.chain.from_iterable(timed), np.int64, 5 * len(timed)).reshape(-1, 5).T
            self._time_of[dtype] = time_of = dict(zip(timed, _pick(self.gpu, shapes, dtype).time_s.tolist()))
            self._timing.pop(dtype, None)
        return time_of

    def times_s(self, gemms: Sequence[Gemm], dtype: str) -> list[float]:
        """``time_s`` of :func:`time_gemms`'s result of each GEMM (its ``count`` calls), without the results."""
        return self._times_s(gemms, _gemm_key_calls, dtype)

    def row_times_s(self, rows: Sequence[_GemmRow], dtype: str) -> list[float]:
        """:meth:`times_s` of the compute model's rows (:func:`_gemm_rows`)."""
        return self._times_s(rows, _KEY_CALLS, dtype)

    def _times_s(self, items: Sequence[Any], key_calls: Callable[[Any], tuple[ShapeKey, int]],
                 dtype: str) -> list[float]:
        """The time of each of ``items``, whose (key, calls) ``key_calls`` reads."""
        time_of = self._ready((), dtype) if self._pending.get(dtype) else self._time_of.get(dtype, {})
        try:
            return [time_of[k] * calls for k, calls in map(key_calls, items)]
        except KeyError:  # (a shape nobody announced: timed now)
            self._ready([k for k, _ in map(key_calls, items)], dtype)
            return self._times_s(items, key_calls, dtype)

    def __call__(self, gemms: Sequence[tuple[Gemm, int]], gpu: GpuSpec, dtype: str) -> tuple[GemmResult, ...]:
        if not gemms:
            return ()
        assert gpu is self.gpu
        keys = [_shape_key(g) for g, _ in gemms]
        index = {k: i for i, k in enumerate(self._ready(keys, dtype))}
        if dtype not in self._timing:
            self._timing[dtype] = _timing(list(index), self.gpu, dtype)
        return _results(gemms, self._timing[dtype], [index[k] for k in keys])
