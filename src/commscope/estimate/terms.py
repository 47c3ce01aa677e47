"""The Estimate: the time of one iteration, term by term, and how it is made from its terms.

Both ways to the refined estimate (op by op, :mod:`commscope.estimate.op_by_op`; in closed form,
:mod:`commscope.estimate.closed_form`) and the seed method end the same way: the exposed seconds of every term
(compute, TP, PP, DP, CP, EP, embedding sync, bubble, optimizer) go to :func:`finish_many`, which adds them up and
derives what follows from the total (the communication and bubble ratios, tokens per second, TFLOP/s per GPU and
MFU). It lives here, apart from the entry points of :mod:`commscope.estimate.iteration`, so that every path can
import it without importing the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from commscope.estimate.flops import iteration_flops
from commscope.estimate.plain import frozen, plain_twin

if TYPE_CHECKING:
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec


class JobOf(Protocol):
    """What :func:`_finish` reads of a job: a :class:`~commscope.api.Prediction`, or the lighter record
    :mod:`commscope.estimate.many` builds per configuration."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def parallel(self) -> ParallelSpec: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Predicted time of one iteration, term by term (seconds)."""

    method: str
    iteration_time_s: float
    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    ep_s: float
    cp_s: float
    emb_s: float
    bubble_s: float
    comm_ratio: float
    bubble_ratio: float
    tokens_per_s: float
    tflops_per_gpu: float
    """Hardware TFLOP/s per GPU (recomputation included), as Megatron-LM reports it."""
    mfu: float
    """Model FLOPs (3 x forward, no recomputation) per second over peak FLOP/s."""
    gpu_util: float
    peak_flops: float
    world_size: int
    critical_stage: int
    effective_bandwidth_bytes_per_s: dict[str, float] = field(default_factory=dict)
    """The C of each axis (seed method) or the mean busbw of its ops (refined)."""
    optimizer_s: float = 0.0
    """Optimizer step on the stage whose end of iteration is last (compute model only)."""
    hidden_s: dict[str, float] = field(default_factory=dict)
    """Communication per axis that overlaps compute and so costs no time (the ``*_s`` terms are exposed time)."""
    compute_breakdown_s: dict[str, float] = field(default_factory=dict)
    """The critical stage's compute per iteration by kind: gemm, attention, memory_bound, recompute, optimizer."""
    compute_model: str = "flops"
    """``gpu`` (per-kernel compute model of :mod:`commscope.estimate.compute`) or ``flops`` (FLOP / (u x peak))."""
    micro_batch_s: float = 0.0
    """Time of one micro-batch on the critical stage, exposed pipeline communication included: the unit of the
    pipeline's steady state (the bubble is the fill and drain through the other stages, at most (p - 1) / v of it)."""
    stage_micro_batch_s: tuple[float, ...] = ()
    """``micro_batch_s`` of every pipeline stage (the critical one is the largest): what the fill and the drain
    pass through, and what :func:`commscope.estimate.schedule.schedule_for` times each stage of the timeline with."""
    tail_s: float = 0.0
    """What runs after the pipeline drains on the stage that ends last: exposed gradient reduction, embedding sync,
    optimizer step, exposed parameter all-gather. The iteration is m micro_batch_s + bubble_s + tail_s."""
    notes: tuple[str, ...] = ()

    @property
    def comm_s(self) -> float:
        """Exposed communication."""
        return self.tp_s + self.pp_s + self.dp_s + self.ep_s + self.cp_s + self.emb_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["comm_s"] = self.comm_s
        return d



def _finish(prediction: JobOf, method: str, u: float, peak: float, *, comp: float, tp: float, pp: float, dp: float,
            ep: float, cp: float, emb: float, bubble: float, stage: int, eff: dict[str, float], notes: list[str],
            optimizer: float = 0.0, hidden: dict[str, float] | None = None, breakdown: dict[str, float] | None = None,
            compute_model: str = "flops", micro_batch: float | None = None, tail: float | None = None,
            stage_micro_batch: Sequence[float] = ()) -> Estimate:
    par = prediction.parallel
    if micro_batch is None:
        micro_batch = (comp + tp + pp + cp + ep) / par.num_micro_batches
    if tail is None:
        tail = dp + emb + optimizer
    return finish_many(prediction.model, method, u, peak, global_batch_size=np.array([par.global_batch_size]),
                       world_size=np.array([par.world_size]), recompute=[par.recompute], comp=np.array([comp]),
                       tp=np.array([tp]), pp=np.array([pp]), dp=np.array([dp]), ep=np.array([ep]), cp=np.array([cp]),
                       emb=np.array([emb]), bubble=np.array([bubble]), optimizer=np.array([optimizer]),
                       micro_batch=np.array([micro_batch]), tail=np.array([tail]), stage=np.array([stage]), eff=[eff],
                       notes=[tuple(notes)], hidden=[dict(hidden or {})], breakdown=[dict(breakdown or {})],
                       compute_model=compute_model, stage_micro_batch=[tuple(float(x) for x in stage_micro_batch)])[0]


def finish_many(model: ModelSpec, method: str, u: Any, peak: float, *, global_batch_size: np.ndarray,
                world_size: np.ndarray, recompute: Sequence[str], comp: np.ndarray, tp: np.ndarray, pp: np.ndarray,
                dp: np.ndarray, ep: np.ndarray, cp: np.ndarray, emb: np.ndarray, bubble: np.ndarray,
                optimizer: np.ndarray, micro_batch: np.ndarray, tail: np.ndarray, stage: np.ndarray,
                eff: Sequence[dict[str, float]], notes: Sequence[tuple[str, ...]], hidden: Sequence[dict[str, float]],
                breakdown: Sequence[dict[str, float]], compute_model: str,
                stage_micro_batch: np.ndarray | Sequence[Sequence[float]]) -> list[Estimate]:
    """The Estimates of configurations from their exposed terms (arrays, one entry per configuration; ``u`` one or
    one each): the total and what follows from it (ratios, throughput, FLOP rates)."""
    n = len(comp)
    per_mb = stage_micro_batch.tolist() if isinstance(stage_micro_batch, np.ndarray) else stage_micro_batch
    if n == 1:  # one configuration: the same arithmetic on numbers (an array's overhead is most of its cost)
        one = [float(x[0]) for x in (comp, tp, pp, dp, ep, cp, emb, bubble, optimizer, micro_batch, tail)]
        c1, tp1, pp1, dp1, ep1, cp1, emb1, bubble1, opt1, mb1, tail1 = one
        world1 = int(world_size[0])
        total1, ratios = _totals(model, peak, recompute[0], int(global_batch_size[0]) * model.seq_len, world1,
                                 c1, tp1, pp1, dp1, ep1, cp1, emb1, bubble1, opt1, pick=_pick_number)
        u1 = float(u) if np.ndim(u) == 0 else float(np.asarray(u).reshape(-1)[0])
        fields1 = (method, total1, c1, tp1, pp1, dp1, ep1, cp1, emb1, bubble1, *ratios, u1, peak, world1,
                   int(np.asarray(stage).reshape(-1)[0]), eff[0], opt1, hidden[0], breakdown[0], compute_model, mb1,
                   tuple(per_mb[0]), tail1, notes[0])
        return [_made(_Unfrozen(*fields1))]
    tokens: Any = np.asarray(global_batch_size, dtype=np.int64) * model.seq_len
    world = np.asarray(world_size, dtype=np.int64)
    total, ratios = _totals(model, peak, recompute, tokens, world, comp, tp, pp, dp, ep, cp, emb, bubble, optimizer,
                            pick=np.where)
    # every argument of Estimate, one list each, in the order of its fields
    values = ([method] * n, total.tolist(), comp.tolist(), tp.tolist(), pp.tolist(), dp.tolist(), ep.tolist(),
              cp.tolist(), emb.tolist(), bubble.tolist(), *(r.tolist() for r in ratios),
              [float(u)] * n if np.ndim(u) == 0 else np.asarray(u, dtype=np.float64).tolist(), [peak] * n, world.tolist(),
              np.asarray(stage).tolist(), eff, optimizer.tolist(), hidden, breakdown, [compute_model] * n,
              micro_batch.tolist(), [tuple(x) for x in per_mb], tail.tolist(), notes)
    return list(map(_made, map(_Unfrozen, *values)))


def _pick_number(cond: bool, x: float, y: float) -> float:
    """np.where of one configuration's numbers."""
    return x if cond else y


def _totals(model: ModelSpec, peak: float, recompute: Any, tokens: Any, world: Any, comp: Any, tp: Any, pp: Any,
            dp: Any, ep: Any, cp: Any, emb: Any, bubble: Any, optimizer: Any, *, pick: Any) -> tuple[Any, list[Any]]:
    """The iteration time and its ratios (communication, bubble, tokens/s, hardware TFLOP/s per GPU, MFU) of
    configurations (arrays, ``pick`` np.where; ``recompute`` one per configuration) or of one (numbers, ``pick``
    :func:`_pick_number`; ``recompute`` its one): one arithmetic for both."""
    total = comp + tp + pp + dp + ep + cp + emb + bubble + optimizer
    kinds = {recompute} if isinstance(recompute, str) else set(recompute)
    model_flops: Any
    hardware: Any
    if len(kinds) == 1:  # one recomputation for all (one configuration, often a group of them)
        fl = iteration_flops(model, tokens, recompute=kinds.pop())
        model_flops, hardware = fl["model"], fl["hardware"]
    else:
        model_flops, hardware = np.zeros(len(total)), np.zeros(len(total))
        rc = np.array(recompute)
        for kind in kinds:
            sel = rc == kind
            fl = iteration_flops(model, tokens[sel], recompute=kind)
            model_flops[sel], hardware[sel] = fl["model"], fl["hardware"]
    nonzero = total != 0
    safe = pick(nonzero, total, 1.0)
    ratios = [pick(nonzero, x, 0.0) for x in ((tp + pp + dp + ep + cp + emb) / safe, bubble / safe, tokens / safe,
                                              hardware / safe / world / 1e12, model_flops / safe / world / peak)]
    return total, ratios


#: Estimate's fields as a plain slotted class (:mod:`commscope.estimate.plain`): Estimate's own constructor sets each
#: of its 28 fields through ``object.__setattr__``, ~4.5 us an Estimate; :func:`finish_many` fills one of these,
#: positionally, and gives it Estimate's class (~1 us).
_Unfrozen = plain_twin(Estimate)


def _made(obj: Any) -> Estimate:
    """``obj`` (an :data:`_Unfrozen`) as the Estimate it holds."""
    return frozen(obj, Estimate)
