"""The selection rule: which backend runs an op of a given size on a group of a given size.

A pure function of (table, op, size_bytes, group size, device), so every rank that holds the same table
routes every op the same way, which the mixed runtime's deadlock freedom rests on:

1. **Group size.** Use the measurements of the measured group size m nearest to the group's size n in
   log2 distance (``|log2 m - log2 n|``); at equal distance the larger m. (n = 3 with 2 and 4 measured
   uses 4.) Sizes outside the measured range are not covered: the runtime refuses them unless told to
   apply the table anyway (:func:`commscope.measure.tune.table.uncovered_group_size`).
2. **Candidates.** Those measured on the tensor's device that can run on n ranks (recursive doubling
   all_gather and recursive halving reduce_scatter need a power of two), and, at run time, that this
   job has (``usable``).
3. **Winner at each measured size.** The default is the candidate listed first in the table whose row passed
   its data check (native backends first, then the algorithms in registry order). Another candidate can win
   only if its median time beats the default's by more than ``tie_tolerance`` (default 5%) *and* by more than
   the two rows' measured spread, each row's standard deviation (cv x time) added: a difference the noise
   could make keeps the default (:func:`selection_notes` says where, and when a sweep was too noisy to choose).
   Among the candidates that beat the default so, the fastest wins; those within ``tie_tolerance`` of it are
   tied, and a tie goes to the one listed first. Worked example: gloo 200 us (cv 0.5), ring 150 us (cv 0.2):
   the 50 us gained is less than the spread 100 + 30 us, so gloo stays; at cv 0.05 and 0.02 (10 + 3 us) ring
   wins.
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

from commscope.measure.tune.table import Candidate, Measurement, TuningTable
from commscope.units import format_bytes

__all__ = ["OpSelection", "Segment", "beats", "nearest_group_size", "select_backend", "selection_for", "selection_notes",
           "selection_summary", "spread_s", "winner"]


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


def spread_s(row: Measurement) -> float:
    """A row's measured spread: the standard deviation of its per-iteration times (cv x time)."""
    return row.cv * row.time_s


def beats(row: Measurement, default: Measurement, tie_tolerance: float) -> bool:
    """Whether ``row`` is faster than ``default`` by more than ``tie_tolerance`` and than both rows' spread."""
    gain_s = default.time_s - row.time_s
    return gain_s > tie_tolerance * default.time_s and gain_s > spread_s(row) + spread_s(default)


def _default_row(rows: Sequence[Measurement], order: Sequence[str]) -> Measurement | None:
    ok = {m.backend: m for m in rows if not m.wrong and m.backend in order}
    return next((ok[name] for name in order if name in ok), None)


def winner(rows: Sequence[Measurement], order: Sequence[str], tie_tolerance: float) -> str | None:
    """Rule 3: the winner among ``rows`` (one size): the first of ``order`` measured, unless another beats it by
    more than ``tie_tolerance`` and the rows' spread (then the fastest of those; ties go to the first in ``order``)."""
    default = _default_row(rows, order)
    if default is None:
        return None
    ok = [m for m in rows if not m.wrong and m.backend in order
          and (m.backend == default.backend or beats(m, default, tie_tolerance))]
    best = min(m.time_s for m in ok)
    tied = {m.backend for m in ok if m.time_s <= best * (1.0 + tie_tolerance)}
    return next(name for name in order if name in tied)


def _runs_on(candidate: Candidate, op: str, group_size: int) -> bool:
    if candidate.kind == "native":
        return True
    from commscope.measure.tune.algorithms import ALGORITHMS

    algorithm = ALGORITHMS.get(op, {}).get(candidate.name)
    return algorithm is not None and algorithm.applies_to(group_size)


def selection_for(table: TuningTable, op: str, group_size: int, device: str = "cpu",
                  usable: Collection[str] | None = None) -> OpSelection:
    """Rules 1-4 for one op on a group of ``group_size`` ranks with tensors on ``device`` (``cpu`` or ``cuda``)."""
    measured = table.group_sizes_of(op)
    if not measured or group_size <= 1:
        return OpSelection(op=op, group_size=group_size, measured_group_size=None, device=device, segments=())
    m = nearest_group_size(measured, group_size)
    order = _order(table, op, group_size, device, usable)
    by_size = _rows_by_size(table, op, m)
    points = [(s, w) for s in sorted(by_size) if (w := winner(by_size[s], order, table.tie_tolerance)) is not None]
    segments: list[Segment] = []
    for i, (size, name) in enumerate(points):
        last = i == len(points) - 1
        if not last and points[i + 1][1] == name:
            continue
        bound = None if last else math.isqrt(size * points[i + 1][0])
        segments.append(Segment(backend=name, max_size_bytes=bound))
    return OpSelection(op=op, group_size=group_size, measured_group_size=m, device=device, segments=tuple(segments))


def _order(table: TuningTable, op: str, group_size: int, device: str, usable: Collection[str] | None) -> list[str]:
    """Rule 2: the candidates, in the table's order."""
    return [c.name for c in table.candidates
            if c.device == device and (usable is None or c.name in usable) and _runs_on(c, op, group_size)]


def _rows_by_size(table: TuningTable, op: str, group_size: int) -> dict[int, list[Measurement]]:
    by_size: dict[int, list[Measurement]] = {}
    for row in table.measurements:
        if row.op == op and row.group_size == group_size:
            by_size.setdefault(row.size_bytes, []).append(row)
    return by_size


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


def selection_notes(table: TuningTable) -> list[str]:
    """Where the noise decided, per measured op, group size and device: the sizes at which another backend's
    median was faster than the default's, but by less than the rows' spread (the default kept), and a sweep too
    noisy to choose (most rows flagged noisy), with what to do about it."""
    out = []
    devices = sorted({c.device for c in table.candidates})
    for op in table.ops:
        for g in table.group_sizes_of(op):
            by_size = _rows_by_size(table, op, g)
            for device in devices:
                order = _order(table, op, g, device, None)
                rows = [m for ms in by_size.values() for m in ms if m.backend in order]
                if not rows:
                    continue
                kept: dict[str, list[int]] = {}
                for size, ms in sorted(by_size.items()):
                    default = _default_row(ms, order)
                    ok = [m for m in ms if not m.wrong and m.backend in order]
                    if default is None or winner(ms, order, table.tie_tolerance) != default.backend:
                        continue
                    fastest = min(ok, key=lambda m: m.time_s)
                    if fastest.time_s < default.time_s * (1.0 - table.tie_tolerance):
                        kept.setdefault(default.backend, []).append(size)
                where = f"{op} n={g}" + (f" ({device})" if len(devices) > 1 else "")
                for backend, sizes in kept.items():
                    out.append(f"{where}: {backend} kept at {len(sizes)} of {len(by_size)} sizes where another "
                               f"backend's median was faster by less than the rows' spread (cv x time): "
                               + ", ".join(format_bytes(s) for s in sizes[:6]) + (" ..." if len(sizes) > 6 else ""))
                noisy = sum(m.noisy for m in rows)
                if noisy * 2 > len(rows):
                    out.append(f"{where}: too noisy to choose: {noisy} of {len(rows)} rows flagged noisy; the "
                               f"default keeps every size another backend does not beat beyond the noise; measure "
                               "again with more iterations (-n, --time-budget) or on a quieter machine")
    return out
