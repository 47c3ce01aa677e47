"""The selection rule: which backend runs an op of a given size on a group of a given size.

A pure function of (table, op, size_bytes, group size, device), so every rank that holds the same table
routes every op the same way, which the mixed runtime's deadlock freedom rests on:

1. **Group size.** Use the measurements of the measured group size m nearest to the group's size n in
   log2 distance (``|log2 m - log2 n|``); at equal distance the larger m. (n = 3 with 2 and 4 measured
   uses 4.) Sizes outside the measured range are not covered: the runtime refuses them unless told to
   apply the table anyway (:func:`commscope.tune.table.uncovered_group_size`).
2. **Candidates.** Those measured on the tensor's device that can run on n ranks (recursive doubling
   all_gather and recursive halving reduce_scatter need a power of two), and, at run time, that this
   job has (``usable``).
3. **Winner at each measured size.** The fastest median time among rows whose data check passed; every
   candidate within ``tie_tolerance`` of it (default 5%) counts as tied, and a tie goes to the candidate
   listed first in the table (native backends first, then the algorithms in registry order): a
   point-to-point algorithm must beat the native backend by more than the noise to be chosen.
4. **Between measured sizes.** Adjacent sizes s_i < s_(i+1) with different winners have their crossover
   at the geometric mean ``floor(sqrt(s_i s_(i+1)))``: sizes up to and including it take s_i's winner,
   larger ones s_(i+1)'s. Below the smallest measured size the first winner holds, above the largest the
   last. Worked example: gloo wins at 4 KiB, ring at 8 KiB -> crossover 5792 B; a 5 KiB all_reduce goes to
   gloo, a 6 KiB one to ring.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from commscope.tune.table import Candidate, Measurement, TuningTable

__all__ = ["OpSelection", "Segment", "nearest_group_size", "select_backend", "selection_for", "selection_summary", "winner"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """A range of message sizes with one winner."""

    backend: str
    max_size_bytes: int | None
    """Largest size (inclusive) that goes to ``backend``; None: no limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSelection:
    """The winners of one op on groups of ``group_size`` ranks, by size range."""

    op: str
    group_size: int
    """n: the group's size."""
    measured_group_size: int | None
    """m: the measured size whose rows decide (None: nothing measured for this op)."""
    device: str
    segments: tuple[Segment, ...]
    """In increasing size; empty when no candidate fits (the runtime then uses the native backend)."""

    @property
    def crossovers_bytes(self) -> tuple[int, ...]:
        """The sizes after which the winner changes."""
        return tuple(s.max_size_bytes for s in self.segments[:-1] if s.max_size_bytes is not None)

    def backend_for(self, size_bytes: int) -> str | None:
        """The winner for a message of ``size_bytes`` (None when there are no segments)."""
        if not self.segments:
            return None
        return self.segments[bisect.bisect_left(self.crossovers_bytes, size_bytes)].backend


def nearest_group_size(measured: Sequence[int], group_size: int) -> int:
    """Rule 1: the measured group size nearest to ``group_size`` in log2 distance, the larger on a tie."""
    if not measured:
        raise ValueError("no measured group sizes")
    return min(measured, key=lambda m: (abs(math.log2(m) - math.log2(group_size)), -m))


def winner(rows: Sequence[Measurement], order: Sequence[str], tie_tolerance: float) -> str | None:
    """Rule 3: the winner among ``rows`` (one size); ties within ``tie_tolerance`` go to the first in ``order``."""
    ok = [m for m in rows if not m.wrong and m.backend in order]
    if not ok:
        return None
    best = min(m.time_s for m in ok)
    tied = {m.backend for m in ok if m.time_s <= best * (1.0 + tie_tolerance)}
    return next(name for name in order if name in tied)


def _runs_on(candidate: Candidate, op: str, group_size: int) -> bool:
    if candidate.kind == "native":
        return True
    from commscope.tune.algorithms import ALGORITHMS

    algorithm = ALGORITHMS.get(op, {}).get(candidate.name)
    return algorithm is not None and algorithm.applies_to(group_size)


def selection_for(table: TuningTable, op: str, group_size: int, device: str = "cpu",
                  usable: Collection[str] | None = None) -> OpSelection:
    """Rules 1-4 for one op on a group of ``group_size`` ranks with tensors on ``device`` (``cpu`` or ``cuda``)."""
    measured = table.group_sizes_of(op)
    if not measured or group_size <= 1:
        return OpSelection(op=op, group_size=group_size, measured_group_size=None, device=device, segments=())
    m = nearest_group_size(measured, group_size)
    order = [c.name for c in table.candidates
             if c.device == device and (usable is None or c.name in usable) and _runs_on(c, op, group_size)]
    by_size: dict[int, list[Measurement]] = {}
    for row in table.measurements:
        if row.op == op and row.group_size == m:
            by_size.setdefault(row.size_bytes, []).append(row)
    points = [(s, w) for s in sorted(by_size) if (w := winner(by_size[s], order, table.tie_tolerance)) is not None]
    segments: list[Segment] = []
    for i, (size, name) in enumerate(points):
        last = i == len(points) - 1
        if not last and points[i + 1][1] == name:
            continue
        bound = None if last else math.isqrt(size * points[i + 1][0])
        segments.append(Segment(backend=name, max_size_bytes=bound))
    return OpSelection(op=op, group_size=group_size, measured_group_size=m, device=device, segments=tuple(segments))


def select_backend(table: TuningTable, op: str, size_bytes: int, group_size: int, device: str = "cpu",
                   usable: Collection[str] | None = None) -> str | None:
    """The backend for one op (None: no candidate fits; use the device's native backend)."""
    return selection_for(table, op, group_size, device, usable).backend_for(size_bytes)


def selection_summary(table: TuningTable) -> list[dict[str, Any]]:
    """The selection at every measured (op, group size, device), as the table file shows it."""
    out = []
    devices = sorted({c.device for c in table.candidates})
    for op in table.ops:
        for g in table.group_sizes_of(op):
            for device in devices:
                sel = selection_for(table, op, g, device)
                if not sel.segments:
                    continue
                out.append({"op": op, "group_size": g, "device": device,
                            "segments": [{"backend": s.backend, "max_size_bytes": s.max_size_bytes}
                                         for s in sel.segments],
                            "crossovers_bytes": list(sel.crossovers_bytes)})
    return out
