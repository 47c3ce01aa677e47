"""The shape rules of a model against the GPU: which it breaks, and what breaking each costs in GEMM time.

:func:`shape_rules` checks the rules of [anthony-2024] and [nvidia-matmul-guide] (hidden size, head size, hidden and
FFN width per TP rank, vocabulary padding, sequence length, tokens per micro-batch multiples of 64; heads divisible by
t; experts divisible by e; layers divisible by the pipeline) and prices each broken one on this GPU
(:func:`_rule_cost`): the affected GEMMs against themselves at the compute speed per FLOP they would reach with the
offending dimension rounded up to the next multiple of 64 (same memory traffic). The hard constraints Megatron
enforces come back as ``invalid``; the alignment rules are priced with the tile/wave model of
:mod:`commscope.estimate.compute.gemm`. Part of :mod:`commscope.estimate.shapes`, which re-exports its names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from commscope.estimate.compute.gemm import ALIGN_ELEMENTS, Gemm, GemmResult, layer_dims, model_gemms, time_gemms
from commscope.estimate.gpus import GpuSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.units import divisors


def _totals(results: Sequence[GemmResult]) -> tuple[float, float]:
    """(FLOP, time) of ``results`` weighted by their layer multiplicity."""
    flop = sum(r.gemm.flop * r.layers for r in results)
    time = sum(r.time_s * r.layers for r in results)
    return flop, time


RuleStatus = Literal["ok", "warn", "broken", "invalid"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleCheck:
    """One shape rule checked on a job, with what breaking it costs on this GPU."""

    rule: str
    """Id: ``hidden_size``, ``head_size``, ``hidden_per_tp``, ``ffn_per_tp``, ``vocab``, ``seq_len``, ``tokens``,
    ``expert_tokens``, ``expert_ffn_per_tp``, ``heads_tp``, ``ffn_tp``, ``experts_ep``, ``layers_pp``."""
    title: str
    value: Any
    """The checked quantity."""
    requirement: str
    status: str
    """``ok``; ``warn`` (fine here, e.g. thanks to padding, but fragile); ``broken`` (costs time);
    ``invalid`` (Megatron refuses the job)."""
    explanation: str
    source: str
    affected: tuple[str, ...] = ()
    """GEMM names whose dimensions the rule governs."""
    fix: str = ""
    slowdown: float | None = None
    """Time of the affected GEMMs over their time with the compute speed per FLOP of the shape rounded up to a
    multiple of 64 (same memory traffic), minus 1: the tile, wave and alignment loss the rule costs."""
    time_lost_s: float | None = None
    """GEMM time per micro-batch on one GPU lost to it (all layers)."""
    share: float | None = None
    """``time_lost_s`` over the GEMM time of a micro-batch."""

    @property
    def broken(self) -> bool:
        return self.status in ("broken", "invalid")

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": self.title, "value": self.value, "requirement": self.requirement,
                "status": self.status, "broken": self.broken, "explanation": self.explanation, "source": self.source,
                "affected": list(self.affected), "fix": self.fix, "slowdown": self.slowdown,
                "time_lost_s": self.time_lost_s, "share": self.share}


_SRC_CODESIGN = "[anthony-2024] Anthony et al. 2024, 'The Case for Co-Designing Model Architectures with Hardware'"
_SRC_GUIDE = "[nvidia-matmul-guide] NVIDIA Matrix Multiplication Background User's Guide"


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _rule_cost(gemms: Sequence[tuple[Gemm, int]], gpu: GpuSpec, dtype: str, fixed: dict[str, int],
               actual: dict[str, int] | None = None) -> tuple[tuple[str, ...], float | None, float | None, float | None]:
    """(affected GEMM names, slowdown, time lost, share) of the GEMMs that use a symbol in ``fixed``.

    Each affected GEMM (its dimensions as they are, or as ``actual`` sets them) is compared with itself running
    its compute at the speed per FLOP of the same GEMM with ``fixed``'s dimensions, keeping its own memory
    traffic and overheads: the loss from tiles, waves and alignment, not from arithmetic intensity.
    Worked example (gpt-3b, tp 2, micro-batch 4, A100): attention x V with N = d = 96 fills 75% of a
    128-wide tile and runs at 45% of peak, with d = 128 at 63%; over both attention GEMMs and their backward
    GEMMs (some of which have d as K, where 96 loses nothing) the head-size rule costs +28%."""
    syms = set(fixed)
    affected = [(g, layers) for g, layers in gemms if g.symbols & syms]
    if not affected:
        return (), None, None, None

    def resized(g: Gemm, values: dict[str, int]) -> Gemm:
        m, n, k = ((coef * values[sym]) if sym in values else size for (sym, coef), size in zip(g.dims, (g.m, g.n, g.k)))
        return dataclasses.replace(g, m=m, n=n, k=k)

    base = [(resized(g, actual) if actual else g, layers) for g, layers in affected]
    fix = [(resized(g, fixed), layers) for g, layers in affected]
    r_base, r_fix = time_gemms(base, gpu, dtype), time_gemms(fix, gpu, dtype)
    # the time each GEMM would take if its compute ran at the fixed shape's speed per FLOP, with its own
    # memory traffic and overheads: isolates tile, wave and alignment losses from arithmetic intensity
    time_b = time_alt = 0.0
    for rb, rf in zip(r_base, r_fix):
        rest = rb.time_s - max(rb.compute_time_s, rb.memory_time_s)
        comp_alt = rf.compute_time_s * rb.gemm.flop / rf.gemm.flop
        time_b += rb.time_s * rb.layers
        time_alt += (max(comp_alt, rb.memory_time_s) + rest) * rb.layers
    lost = time_b - time_alt
    total = _totals(time_gemms(gemms, gpu, dtype))[1]
    names = tuple(dict.fromkeys(g.name for g, _ in affected))
    return names, time_b / time_alt - 1.0, lost, lost / total if total else None


def shape_rules(model: ModelSpec, parallel: ParallelSpec | None = None, gpu: GpuSpec | None = None, *,
                attention: str = "flash") -> tuple[RuleCheck, ...]:
    """Check the shape rules of [anthony-2024] and [nvidia-matmul-guide] for ``model`` under ``parallel``.

    With a ``gpu``, each broken rule is priced (:func:`_rule_cost`): the GEMMs it governs, timed as they are
    and at the compute speed per FLOP they would have with the offending dimension rounded up to the next
    multiple of :data:`ALIGN_ELEMENTS` (``slowdown``), and the GEMM time per micro-batch that costs
    (``time_lost_s``, ``share``). Never raises for a shape; hard constraints Megatron enforces (heads
    divisible by tp, ...) come back as ``invalid``.
    """
    par = parallel or ParallelSpec()
    rules, valid = _hard_rules(model, par)
    return tuple(rules + _alignment_rules(model, par, gpu, valid, attention))


def _hard_rules(model: ModelSpec, par: ParallelSpec) -> tuple[list[RuleCheck], bool]:
    """The constraints Megatron enforces (``invalid`` when broken), and whether the job meets them all (only then
    do its GEMMs exist to price the other rules on)."""
    t, c, e = par.tp, par.cp, par.ep
    rules: list[RuleCheck] = []
    hard = [
        ("heads_tp", "attention heads divisible by tp", model.num_heads, f"multiple of tp={t}",
         model.num_heads % t == 0 and (model.kv_heads % t == 0 or t % model.kv_heads == 0),
         (f"each TP rank computes a/t = {model.num_heads}/{t} whole heads (and its share of the {model.kv_heads} "
         "key/value groups); the attention GEMMs are batched over b a/t, which must be an integer [megatron-lm-2019]"),
         [f"tp in {', '.join(str(x) for x in divisors(model.num_heads) if x <= 8)}"]),
        ("ffn_tp", "FFN width divisible by tp", model.ffn, f"multiple of tp={t}", model.ffn % t == 0,
         "the MLP's column- and row-parallel GEMMs split f over tp ranks", []),
        ("layers_pp", "layers divisible by the pipeline", model.num_layers,
         f"multiple of pp x virtual = {par.pp * par.virtual_pipeline_size}",
         par.pipeline_layers is not None or model.num_layers % (par.pp * par.virtual_pipeline_size) == 0,
         ("every pipeline stage (and virtual chunk) holds the same number of layers unless pipeline_layers says otherwise; "
         "an uneven split makes the slowest stage set the pace"), []),
    ]
    if model.is_moe:
        hard.append(("experts_ep", "experts divisible by ep", model.num_experts, f"multiple of ep={e}",
                     model.num_experts % e == 0,
                     "each expert-parallel rank holds E/ep whole experts; the all-to-all dispatches to them", []))
    valid = all(ok for *_, ok, _, _ in hard) and model.seq_len % c == 0 and (not model.is_moe or model.moe_ffn % t == 0)
    for rule, title, value, req, ok, why, fix in hard:
        rules.append(RuleCheck(rule=rule, title=title, value=value, requirement=req, status="ok" if ok else "invalid",
                               explanation=why, source="Megatron-LM (check_job)", fix="" if ok else "; ".join(fix)))
    return rules, valid


def _alignment_rules(model: ModelSpec, par: ParallelSpec, gpu: GpuSpec | None, valid: bool,
                     attention: str) -> list[RuleCheck]:
    """The rules of multiples of :data:`ALIGN_ELEMENTS` (``broken`` when not met), each priced on ``gpu`` where the
    job is valid."""
    t, c, e, b = par.tp, par.cp, par.ep, par.micro_batch_size
    q = ALIGN_ELEMENTS
    rules: list[RuleCheck] = []
    dims = layer_dims(model, tp=t, cp=c, ep=e, micro_batch_size=b) if valid else None
    gemms = model_gemms(model, par, dims=dims, attention=attention) if valid else ()
    dtype = model.dtype

    def priced(fixed: dict[str, int], actual: dict[str, int] | None = None) -> dict[str, Any]:
        if gpu is None or not valid:
            names = tuple(dict.fromkeys(g.name for g, _ in gemms if g.symbols & set(fixed)))
            return {"affected": names}
        names, slowdown, lost, share = _rule_cost(gemms, gpu, dtype, fixed, actual)
        return {"affected": names, "slowdown": slowdown, "time_lost_s": lost, "share": share}

    def aligned(rule: str, title: str, symbols: dict[str, Any], value: Any, why: str, source: str, fix: str) -> None:
        ok = all(v % q == 0 for v in symbols.values())
        extra: dict[str, Any] = {}
        if dims is not None:
            present = {s: v for s, v in symbols.items() if s in dims}
            if not ok and present:
                extra = priced({s: _round_up(v, q) for s, v in present.items()})
            else:
                extra = {"affected": tuple(dict.fromkeys(g.name for g, _ in gemms if g.symbols & set(present)))}
        rules.append(RuleCheck(rule=rule, title=title, value=value, requirement=f"multiple of {q}",
                               status="ok" if ok else "broken", explanation=why, source=source,
                               fix="" if ok else fix, **extra))

    h, a, d, f = model.hidden_size, model.num_heads, model.head_size, model.ffn
    aligned("hidden_size", "hidden size h", {"hidden": h}, h,
            "h is the K of the QKV, MLP-up and logits GEMMs and the N of the attention-output and MLP-down GEMMs "
            "(and M, N or K of their backward GEMMs); tensor cores need multiples of 8 elements (16 B) and A100/H100 "
            "are fastest at multiples of 64 (128 B) [nvidia-matmul-guide]; 64 also fills the 64/128-wide CTA tiles",
            f"{_SRC_GUIDE}; {_SRC_CODESIGN}", f"h = {_round_up(h, q)} or {max(q, h // q * q)}")
    head_fix = ", ".join(f"d = {dd} ({h // dd} heads)" for dd in (64, 128) if h % dd == 0 and (h // dd) % t == 0) \
        or f"d = {_round_up(d, q)}"
    aligned("head_size", "head size d = h/a", {"head": d}, d,
            "d is the K of Q K^T and the N of attention x V (batched over heads); a d that is not a multiple of 64 "
            "wastes part of every tile of both attention GEMMs, and FlashAttention kernels are fastest at d = 64 or 128",
            f"{_SRC_CODESIGN}; {_SRC_GUIDE}", head_fix)
    widths: dict[str, Any] = {"q_width": a * d // t if a % t == 0 else a * d / t}
    if dims is not None:
        widths["qkv_width"] = dims["qkv_width"]
    aligned("hidden_per_tp", "attention width per TP rank a d / t", widths, widths["q_width"],
            "a d / t (and (a + 2g) d / t with grouped-query attention) is the N of the QKV GEMM and the K of the "
            "attention-output GEMM on each TP rank [anthony-2024: h/t divisible by 64]",
            _SRC_CODESIGN, "choose heads and tp so that a d / t is a multiple of 64")
    aligned("ffn_per_tp", "FFN width per TP rank f / t", {"ffn_width": f // t if f % t == 0 else f / t},
            f // t if f % t == 0 else f / t,
            "f / t is the N of the MLP-up GEMM (2 f / t gated) and the K of the MLP-down GEMM on each TP rank",
            _SRC_CODESIGN, f"f = {_round_up(f, q * t)} (a multiple of 64 x tp = {q * t})")
    if model.is_moe:
        aligned("expert_ffn_per_tp", "expert FFN width per TP rank", {"expert_ffn_width": model.moe_ffn // t},
                model.moe_ffn // t, "the N and K of every expert GEMM", _SRC_CODESIGN,
                f"moe_ffn_hidden_size = {_round_up(model.moe_ffn, q * t)}")
        if dims is not None:
            aligned("expert_tokens", "tokens per expert (balanced routing)", {"expert_tokens": dims["expert_tokens"]},
                    dims["expert_tokens"],
                    "the M of each expert GEMM: b s top_k ep / E tokens per local expert when routing is balanced; real "
                    "routing varies, so this is the best case", _SRC_CODESIGN, "choose b s top_k ep / E a multiple of 64")
    aligned("seq_len", "sequence length s", {"seq_q": model.seq_len // c, "seq_k": model.seq_len}, model.seq_len,
            "s is M and N of Q K^T and M and K of attention x V", _SRC_CODESIGN, f"s = {_round_up(model.seq_len, q * c)}")
    aligned("tokens", "tokens per micro-batch b s / cp", {"tokens": b * model.seq_len // c}, b * model.seq_len // c,
            "b s is the M of every linear GEMM (and the K of their weight-gradient GEMMs) [anthony-2024: b s divisible "
            "by a power of two, no gain beyond 64]", _SRC_CODESIGN, "choose b and s so that b s / cp is a multiple of 64")

    rules.append(_vocab_rule(model, t, dims, priced))
    return rules


def _vocab_rule(model: ModelSpec, t: int, dims: dict[str, int] | None,
                priced: Callable[..., dict[str, Any]]) -> RuleCheck:
    """The vocabulary rule: V padded as Megatron pads it, per TP rank, a multiple of :data:`ALIGN_ELEMENTS`; a
    ``warn`` when only the padding makes it so (``priced`` as :func:`_alignment_rules` prices the others)."""
    q = ALIGN_ELEMENTS
    # vocabulary: Megatron pads V to a multiple of make_vocab_size_divisible_by x tp
    v, v_pad = model.vocab_size, model.padded_vocab_size(t)
    width = v_pad // t
    why = (f"V' / t is the N of the logits GEMM (and of its dgrad's K, its wgrad's N), the largest single GEMM of small "
           f"models; Megatron pads V = {v} to {v_pad} (make_vocab_size_divisible_by = "
           f"{model.make_vocab_size_divisible_by} x tp = {t}); a multiple of 64 x tp (128 x tp as Megatron does) keeps "
           f"every rank's share a multiple of 64 [anthony-2024: vocabulary divisible by 64]")
    if width % q:
        status, vocab_fix = "broken", (f"make_vocab_size_divisible_by = 128 (V' = {_round_up(v, 128 * t)}), or pad the "
                                 f"vocabulary to a multiple of {q * t}")
        extra = priced({"vocab_width": _round_up(width, q)}) if dims is not None else {}
    elif v % (q * t):
        # fine thanks to the padding; say what running it unpadded would cost (Hugging Face does not pad)
        status, vocab_fix = "warn", (f"fine under Megatron's padding to {v_pad}; without it (e.g. Hugging Face) pad the "
                               f"tokenizer to {_round_up(v, q * t)}")
        extra = priced({"vocab_width": width}, actual={"vocab_width": -(-v // t)}) if dims is not None else {}
    else:
        status, vocab_fix, extra = "ok", "", ({"affected": ("logits",)} if dims is not None else {})
    return RuleCheck(rule="vocab", title="vocabulary V (padded) per TP rank", value=width,
                     requirement=f"V'/t multiple of {q}", status=status, explanation=why,
                     source=f"{_SRC_CODESIGN}; Megatron-LM _vocab_size_with_padding", fix=vocab_fix, **extra)


def _broken(model: ModelSpec, parallel: ParallelSpec) -> tuple[str, ...]:
    """The ids of the rules ``model`` breaks under ``parallel`` (unpriced)."""
    return tuple(r.rule for r in shape_rules(model, parallel) if r.broken)
