"""Pipeline schedules of one iteration: which stage runs which micro-batch's forward or backward when.

Three schedules, each as a fixed order of work per stage, timed as-soon-as-possible by following the data
dependencies between stages (a stage runs its list in order; a forward waits for the previous stage's
forward of the same micro-batch, a backward for the next stage's backward):

``gpipe`` [gpipe-2019]
    every stage runs the forwards of all m micro-batches, then their backwards.
``1f1b`` (PipeDream-flush) [megatron-sc21]
    stage s runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. Same bubble as GPipe, at most p micro-batches in flight.
``interleaved`` (interleaved 1F1B) [megatron-sc21]
    each stage holds v model chunks (virtual stages ``chunk * p + stage``); Megatron-core's order: virtual
    micro-batch k is micro-batch ``(k // (p v)) p + k % p`` of chunk ``(k // p) % v`` (backwards run the
    chunks in reverse), with ``2 (p - s - 1) + (v - 1) p`` warm-up forwards (all of them when m = p).
    Needs m to be a multiple of p.

With equal stage times t_f + t_b per micro-batch, the idle time of every stage (the bubble) is
(p - 1)(t_f + t_b) for GPipe and 1F1B and (p - 1)(t_f + t_b)/v interleaved, so the idle fraction is

    1F1B:         (p - 1) / (m + p - 1)            e.g. p = 4, m = 16: 3/19 = 15.8 %
    interleaved:  (p - 1) / (v m + p - 1)          p = 4, m = 16, v = 2: 3/35 = 8.6 %

which is the seed talk's R_bubble ~= (p-1)/(p-1+m) [seed-talk]. Stage times may differ per stage (and per
chunk); then the slowest stage sets the pace and the others idle more. Times are seconds; nothing here
needs more than the standard library and numpy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from commscope.errors import ConfigError, check

ScheduleName = Literal["1f1b", "interleaved", "gpipe"]
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")
Kind = Literal["fwd", "bwd"]

#: Share of a micro-batch's time spent in the forward pass, by recomputation: the backward pass costs
#: twice the forward's FLOPs (6 = 2 + 4 FLOP per parameter and token), and full recomputation replays the
#: forward inside the backward (8 = 2 + 2 + 4) [megatron-sc21]; selective recomputation adds only the
#: attention core, which this split neglects.
FORWARD_SHARE: dict[str, float] = {"none": 1 / 3, "selective": 1 / 3, "full": 1 / 4}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSlot:
    """One forward or backward pass of one micro-batch through one model chunk on one pipeline stage."""

    stage: int
    micro_batch: int
    chunk: int
    """Model chunk on this stage (0 unless interleaved); virtual stage = chunk * pp + stage."""
    kind: Kind
    t_start_s: float
    t_end_s: float

    @property
    def duration_s(self) -> float:
        return self.t_end_s - self.t_start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSchedule:
    """A timed schedule of one iteration; the gaps between a stage's slots are its bubbles."""

    name: str
    pp: int
    num_micro_batches: int
    virtual_pipeline_size: int
    slots: tuple[ScheduleSlot, ...]
    """In stage order, and in execution order within a stage."""

    @property
    def makespan_s(self) -> float:
        """From the first forward to the last backward of any stage."""
        return max((s.t_end_s for s in self.slots), default=0.0)

    def busy_s(self) -> np.ndarray:
        """Seconds each stage computes, shape (pp,)."""
        out = np.zeros(self.pp)
        for s in self.slots:
            out[s.stage] += s.duration_s
        return out

    def idle_s(self) -> np.ndarray:
        """Seconds each stage waits within the makespan (its bubble), shape (pp,)."""
        return self.makespan_s - self.busy_s()

    @property
    def idle_fraction(self) -> float:
        """Idle stage-seconds over all stage-seconds of the makespan: (p-1)/(m+p-1) for equal-time 1F1B."""
        span = self.makespan_s
        return float(self.idle_s().sum() / (self.pp * span)) if span > 0 else 0.0

    def bubbles(self) -> list[tuple[int, float, float]]:
        """(stage, t_start_s, t_end_s) of every gap, the one before a stage's first slot and after its last included."""
        out: list[tuple[int, float, float]] = []
        end = self.makespan_s
        by_stage: list[list[ScheduleSlot]] = [[] for _ in range(self.pp)]
        for s in self.slots:
            by_stage[s.stage].append(s)
        for stage, slots in enumerate(by_stage):
            t = 0.0
            for s in sorted(slots, key=lambda x: x.t_start_s):
                if s.t_start_s > t + 1e-12 * max(end, 1.0):
                    out.append((stage, t, s.t_start_s))
                t = max(t, s.t_end_s)
            if end > t + 1e-12 * max(end, 1.0):
                out.append((stage, t, end))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, columnar: one list per field of :class:`ScheduleSlot`."""
        return {
            "name": self.name, "pp": self.pp, "num_micro_batches": self.num_micro_batches,
            "virtual_pipeline_size": self.virtual_pipeline_size, "makespan_s": self.makespan_s,
            "idle_fraction": self.idle_fraction, "idle_s": self.idle_s().tolist(),
            "slots": {
                "stage": [s.stage for s in self.slots], "micro_batch": [s.micro_batch for s in self.slots],
                "chunk": [s.chunk for s in self.slots], "kind": [s.kind for s in self.slots],
                "t_start_s": [s.t_start_s for s in self.slots], "t_end_s": [s.t_end_s for s in self.slots],
            },
            "bubbles": [list(b) for b in self.bubbles()],
        }


# ----------------------------------------------------------------------------------------------- orders


def stage_order(name: str, pp: int, num_micro_batches: int, stage: int,
                virtual_pipeline_size: int = 1) -> list[tuple[Kind, int, int]]:
    """The (kind, micro_batch, chunk) work list of ``stage`` under schedule ``name``, in execution order."""
    p, m, v = pp, num_micro_batches, virtual_pipeline_size
    if name == "gpipe":
        return [("fwd", mb, 0) for mb in range(m)] + [("bwd", mb, 0) for mb in range(m)]
    if name == "1f1b":
        warmup = min(p - stage - 1, m)
        order: list[tuple[Kind, int, int]] = [("fwd", mb, 0) for mb in range(warmup)]
        for i in range(m - warmup):
            order += [("fwd", warmup + i, 0), ("bwd", i, 0)]
        return order + [("bwd", mb, 0) for mb in range(m - warmup, m)]
    # interleaved: Megatron-core's forward_backward_pipelining_with_interleaving
    total = m * v

    def virtual(k: int, kind: Kind) -> tuple[Kind, int, int]:
        chunk = (k % (p * v)) // p
        if kind == "bwd":
            chunk = v - 1 - chunk
        return kind, (k // (p * v)) * p + k % p, chunk

    warmup = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)
    order = [virtual(k, "fwd") for k in range(warmup)]
    for k in range(total - warmup):
        order += [virtual(warmup + k, "fwd"), virtual(k, "bwd")]
    return order + [virtual(k, "bwd") for k in range(total - warmup, total)]


def _per_stage_chunk(value: Any, pp: int, v: int, what: str) -> np.ndarray:
    """Broadcast a scalar, (pp,) or (pp, v) array of seconds to (pp, v)."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 1 and arr.shape[0] == pp:
        arr = arr[:, None]
    try:
        arr = np.broadcast_to(arr, (pp, v))
    except ValueError:
        raise ConfigError(what, arr.shape, f"must be a number, one per stage ({pp},) or per stage and chunk ({pp}, {v})") from None
    check(bool(np.all(np.isfinite(arr)) and np.all(arr >= 0)), what, value, "must be finite seconds >= 0")
    return arr


def pipeline_schedule(name: str, *, pp: int, num_micro_batches: int, fwd_s: Any, bwd_s: Any,
                      virtual_pipeline_size: int = 1, p2p_s: float = 0.0) -> PipelineSchedule:
    """Time schedule ``name`` (``1f1b``, ``interleaved``, ``gpipe``) for ``pp`` stages and ``num_micro_batches``.

    ``fwd_s`` and ``bwd_s`` are the seconds of one micro-batch's forward (backward) pass through one model
    chunk: a number, one per stage ``(pp,)``, or one per stage and chunk ``(pp, v)``. ``p2p_s`` delays every
    hand-over between stages (0: communication is inside the stage times). Worked example: p = 4, m = 8,
    t_f = 1, t_b = 2 under 1F1B takes (m + p - 1)(t_f + t_b) = 33 s, each stage idle 9 s: 27 %.
    """
    p, m, v = pp, num_micro_batches, virtual_pipeline_size
    check(name in SCHEDULES, "schedule", name, f"valid: {', '.join(SCHEDULES)}")
    for field_name, value in (("pp", p), ("num_micro_batches", m), ("virtual_pipeline_size", v)):
        check(isinstance(value, (int, np.integer)) and value >= 1, field_name, value, "must be a positive integer")
    if name == "interleaved":
        check(v > 1 and p > 1, "virtual_pipeline_size", v, "the interleaved schedule needs pp > 1 and virtual_pipeline_size > 1")
        check(m % p == 0, "num_micro_batches", m, f"the interleaved schedule needs a multiple of pp={p}")
    else:
        check(v == 1, "virtual_pipeline_size", v, f"{name} runs one model chunk per stage; use 'interleaved' for v > 1")
    check(p2p_s >= 0, "p2p_s", p2p_s, "must be seconds >= 0")
    fwd = _per_stage_chunk(fwd_s, p, v, "fwd_s")
    bwd = _per_stage_chunk(bwd_s, p, v, "bwd_s")

    orders = [stage_order(name, p, m, s, v) for s in range(p)]
    done: dict[tuple[str, int, int, int], float] = {}  # (kind, stage, micro_batch, chunk) -> end time
    free = [0.0] * p
    pos = [0] * p
    timed: list[list[ScheduleSlot]] = [[] for _ in range(p)]

    def dependency(kind: str, stage: int, mb: int, chunk: int) -> tuple[tuple[str, int, int, int] | None, float]:
        """The slot this one waits for on another stage (or its own last forward), and the hand-over delay."""
        if kind == "fwd":
            if stage > 0:
                return ("fwd", stage - 1, mb, chunk), p2p_s
            return (("fwd", p - 1, mb, chunk - 1), p2p_s) if chunk > 0 else (None, 0.0)
        if stage < p - 1:
            return ("bwd", stage + 1, mb, chunk), p2p_s
        if chunk < v - 1:
            return ("bwd", 0, mb, chunk + 1), p2p_s
        return ("fwd", stage, mb, chunk), 0.0

    queue = deque(range(p))
    queued = [True] * p
    while queue:
        stage = queue.popleft()
        queued[stage] = False
        advanced = False
        while pos[stage] < len(orders[stage]):
            kind, mb, chunk = orders[stage][pos[stage]]
            dep, delay = dependency(kind, stage, mb, chunk)
            if dep is not None and dep not in done:
                break
            start = max(free[stage], done[dep] + delay if dep is not None else 0.0)
            end = start + float((fwd if kind == "fwd" else bwd)[stage, chunk])
            done[(kind, stage, mb, chunk)] = end
            timed[stage].append(ScheduleSlot(stage=stage, micro_batch=mb, chunk=chunk, kind=kind,
                                             t_start_s=start, t_end_s=end))
            free[stage] = end
            pos[stage] += 1
            advanced = True
        if advanced:
            for other in {stage - 1, stage + 1, 0, p - 1}:
                if 0 <= other < p and other != stage and not queued[other] and pos[other] < len(orders[other]):
                    queue.append(other)
                    queued[other] = True
    assert all(pos[s] == len(orders[s]) for s in range(p)), f"schedule {name} deadlocked at {pos}"
    return PipelineSchedule(name=name, pp=p, num_micro_batches=m, virtual_pipeline_size=v,
                            slots=tuple(s for stage_slots in timed for s in stage_slots))


def stage_micro_batch_times_s(estimate: Any, parallel: Any) -> np.ndarray:
    """Seconds one micro-batch spends on each stage (the estimate's ``stage_micro_batch_s``; every stage at the
    critical stage's :func:`micro_batch_time_s` for estimates without it, e.g. the seed method's)."""
    per_stage = getattr(estimate, "stage_micro_batch_s", ())
    if len(per_stage) == parallel.pp:
        return np.asarray(per_stage, dtype=float)
    return np.full(parallel.pp, micro_batch_time_s(estimate, parallel))


def micro_batch_time_s(estimate: Any, parallel: Any) -> float:
    """Seconds one micro-batch spends on the critical stage of an :class:`~commscope.estimate.Estimate` (its
    ``micro_batch_s``: compute and the exposed pipeline communication), the time whose (p-1)/v multiple is its
    bubble."""
    e = estimate
    if getattr(e, "micro_batch_s", 0.0):
        return float(e.micro_batch_s)
    return (e.compute_s + e.tp_s + e.pp_s + e.cp_s + e.ep_s) / parallel.num_micro_batches


def schedule_for(parallel: Any, estimate: Any, name: str | None = None) -> PipelineSchedule:
    """The schedule of one iteration of ``parallel`` with every stage taking its own time from the estimate.

    ``name`` defaults to the configured schedule (``interleaved`` when virtual_pipeline_size > 1). Each
    micro-batch's time on a chunk of stage s is :func:`stage_micro_batch_times_s` [s] / v, split into forward and
    backward by :data:`FORWARD_SHARE`; so, when the critical stage is the last one (the logits) or the stages are
    even, the makespan of 1F1B plus the estimate's end-of-iteration terms (what DP, the embedding sync and the
    optimizer step leave exposed) is the estimate's iteration time.
    """
    v = parallel.virtual_pipeline_size
    if name is None:
        name = "interleaved" if v > 1 else parallel.schedule
    chunks = v if name == "interleaved" else 1
    t_chunk = stage_micro_batch_times_s(estimate, parallel) / chunks
    share = FORWARD_SHARE[parallel.recompute]
    return pipeline_schedule(name, pp=parallel.pp, num_micro_batches=parallel.num_micro_batches,
                             virtual_pipeline_size=chunks, fwd_s=share * t_chunk, bwd_s=(1 - share) * t_chunk)


__all__ = [
    "FORWARD_SHARE",
    "SCHEDULES",
    "PipelineSchedule",
    "ScheduleSlot",
    "micro_batch_time_s",
    "pipeline_schedule",
    "schedule_for",
    "stage_micro_batch_times_s",
    "stage_order",
]
