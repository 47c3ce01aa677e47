"""Fit measured collective times into the bandwidth model the estimator uses (``commscope fit``).

Input: commscope's bench JSON (median times) or nccl-tests / rccl-tests stdout (nccl-tests prints mean times;
the out-of-place rows are used). Per (op, group size n), with S the size and t the time of each row:

    t = alpha + beta S,    beta = f(op, n) / busbw      (Hockney [thakur-2005]; f from nccl-tests [nccl-tests-perf])

fitted by least squares on the *relative* residual (t_fit - t) / t, i.e. weights 1/t. Plain least squares
on t would let the largest message own the fit (its time is 10^4-10^6 x the smallest) and make alpha
meaningless. alpha >= 0 and beta >= 0 are enforced (a two-variable non-negative least squares). Where one
line misses some row by more than ``tolerance``, the sizes are split into up to ``max_pieces`` contiguous
ranges, each with its own line, at the breakpoints that minimise the total squared relative error
(dynamic programming over all splits, at least 3 sizes per piece); the fewest pieces that meet the
tolerance win, else the best ``max_pieces`` fit. Every row's relative error is reported.

Worked example (nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt, all_reduce over 8 A100s, 8 B-128 MiB):
one line (alpha 37.9 us, busbw 153.5 GB/s) misses 1 MiB by 26%; two pieces by at most 15%; three pieces
(8 B-512 KiB: 36.1 us, 46.3 GB/s; 1-16 MiB: 53.5 us, 135.0 GB/s; 32-128 MiB: 144.8 us, 210.9 GB/s) by
at most 4.4%, within the default tolerance of 10%.

Reading the input is :mod:`commscope.measure.bench.fit_input`, the piecewise least squares
:mod:`commscope.measure.bench.piecewise`; their names are importable from here too.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, overload

import numpy as np

from commscope.errors import ConfigError
from commscope.measure.bench.fit_input import (
    FIT_OPS,
    FitPoint,
    FitRows,
    _points_from_bench,  # noqa: F401  (commscope.cli.calibrate_cmd and the tests read bench JSON rows through it)
    check_op,
    load_points,
    load_rows,
    problem_lines,
)
from commscope.estimate.fitted import FITTED_KIND, Curve, FittedModel, Segment, _factor
from commscope.measure.bench.piecewise import EXHAUSTIVE_SIZES, fit_curve
from commscope.spec.cluster import implausible_link
from commscope.units import GB, US

__all__ = ["EXHAUSTIVE_SIZES", "FIT_OPS", "FitPoint", "FitResult", "FitRows", "Residual", "Residuals", "check_op",
           "fit", "fit_curve", "load_points", "load_rows", "problem_lines", "to_toml"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Residual:
    """How well the fit reproduces one measured row: rel_error = (fitted - measured) / measured."""

    op: str
    group_size: int
    size_bytes: int
    measured_time_s: float
    fitted_time_s: float

    @property
    def rel_error(self) -> float:
        return (self.fitted_time_s - self.measured_time_s) / self.measured_time_s


class Residuals(Sequence[Residual]):
    """Each fitted row's residual, as columns: per curve (op, group size, its sizes, measured and fitted times).
    A sequence of :class:`Residual` (made as they are read: a sweep of a million sizes has a million of them)."""

    def __init__(self, parts: Sequence[tuple[str, int, np.ndarray, np.ndarray, np.ndarray]] = ()) -> None:
        self.parts = list(parts)

    @classmethod
    def of(cls, residuals: Sequence[Residual]) -> Residuals:
        if isinstance(residuals, Residuals):
            return residuals
        return cls([(r.op, r.group_size, np.array([r.size_bytes], dtype=np.int64), np.array([r.measured_time_s]),
                     np.array([r.fitted_time_s])) for r in residuals])

    def __len__(self) -> int:
        return sum(len(p[2]) for p in self.parts)

    def __iter__(self) -> Iterator[Residual]:
        for op, n, sizes, measured, fitted in self.parts:
            for s, m, f in zip(sizes.tolist(), measured.tolist(), fitted.tolist(), strict=True):
                yield Residual(op=op, group_size=n, size_bytes=s, measured_time_s=m, fitted_time_s=f)

    @overload
    def __getitem__(self, i: int) -> Residual: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Residual]: ...
    def __getitem__(self, i: int | slice) -> Residual | Sequence[Residual]:
        return tuple(self)[i]

    def max_abs_rel_error(self, op: str, group_size: int) -> float:
        """The largest |rel_error| of the rows of ``op`` over ``group_size`` ranks; 0 where there are none."""
        worst = [float(np.max(np.abs((f - m) / m))) for o, n, _, m, f in self.parts
                 if o == op and n == group_size and len(m)]
        return max(worst) if worst else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """Fitted curves, each row's residual, and where the data came from."""

    curves: tuple[Curve, ...]
    residuals: Sequence[Residual]
    """Each row's residual (:class:`Residuals`, or any sequence of them)."""
    source: str
    time_kind: str
    """``median`` (commscope bench) or ``mean`` (nccl-tests prints averages)."""
    backend: str | None = None
    tolerance: float = 0.1
    max_pieces: int = 3
    unreliable: dict[tuple[str, int, bool | None], str] = field(default_factory=dict)
    """Why a curve (op, group size, intra_node) means nothing physically: a bus bandwidth outside any real
    link's range (infinite: time did not grow with size). Such curves are left out of ``estimate --bandwidth``."""
    noisy: dict[tuple[str, int, bool | None], str] = field(default_factory=dict)
    """Curves fitted mostly to rows the measurement flagged noisy (``7 of 7 rows``): used, with a note."""
    merged: tuple[str, ...] = ()
    """Rows whose own line had a bus bandwidth no link has, named, and the plausible piece that took them in."""

    def model(self, **kwargs: Any) -> FittedModel:
        return FittedModel(curves=list(self.curves), source=self.source, **kwargs)

    def why_unreliable(self, curve: Curve) -> str | None:
        return self.unreliable.get((curve.op, curve.group_size, curve.intra_node))

    def noisy_rows(self, curve: Curve) -> str | None:
        return self.noisy.get((curve.op, curve.group_size, curve.intra_node))

    def max_rel_error(self, op: str, group_size: int) -> float:
        return Residuals.of(self.residuals).max_abs_rel_error(op, group_size)


# --- fitting ----------------------------------------------------------------------------------------------

def fit(points: Iterable[FitPoint] | FitRows, *, source: str = "measurements", time_kind: str = "median",
        backend: str | None = None, tolerance: float = 0.1, max_pieces: int = 3) -> FitResult:
    """Fit every (op, group size, intra_node) of ``points`` (FitPoints, or the columns :func:`load_rows` reads);
    ConfigError if any has fewer than 2 sizes. Repeated sizes are fitted as their median time."""
    if not 0 < tolerance:
        raise ConfigError("tolerance", tolerance, "must be > 0")
    if max_pieces < 1:
        raise ConfigError("max_pieces", max_pieces, "must be >= 1")
    rows = points if isinstance(points, FitRows) else FitRows.of_points(points)
    if not len(rows):
        raise ConfigError("input", source, "has no rows to fit")
    groups: dict[tuple[str, int, bool | None], int] = {}
    group_of_curve = np.array([groups.setdefault((op, n, intra), len(groups)) for op, n, intra, *_ in rows.curves],
                              dtype=np.int64)
    group = group_of_curve[rows.curve]
    used = set(np.unique(group).tolist())
    curves: list[Curve] = []
    residuals: list[tuple[str, int, np.ndarray, np.ndarray, np.ndarray]] = []
    unreliable: dict[tuple[str, int, bool | None], str] = {}
    noisy_rows: dict[tuple[str, int, bool | None], str] = {}
    merged: list[str] = []
    for (op, n, intra), g in sorted(((k, g) for k, g in groups.items() if g in used),
                                    key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        mine = group == g
        sizes, times, first = _medians(rows.size_bytes[mine], rows.time_s[mine])
        if len(sizes) < 2:
            raise ConfigError(f"{op} over {n} ranks", f"{len(sizes)} size ({first} B)",
                              "need at least 2 message sizes to fit latency and bandwidth", source=source)
        f = _factor(op, n)
        pieces = _physical(sizes, times, f, f"{op} over {n} ranks", merged, tolerance=tolerance,
                           max_pieces=max_pieces)
        segs = tuple(Segment(size_min_bytes=int(sizes[s]), size_max_bytes=int(sizes[e]), alpha_s=a,
                             busbw_bytes_per_s=f / b if b > 0 else math.inf) for s, e, a, b in pieces)
        curve = Curve(op=op, group_size=n, segments=segs, intra_node=intra)
        curves.append(curve)
        why = _unreliable(segs[-1])
        if why is not None:
            unreliable[(op, n, intra)] = why
        flags = int(rows.noisy[mine].sum())
        if flags * 2 > int(mine.sum()):
            noisy_rows[(op, n, intra)] = f"{flags} of {int(mine.sum())}"
        # Curve.time_s's segment for each size (Segment.time_s, on all sizes at once)
        bounds = [math.sqrt(a.size_max_bytes * b.size_min_bytes) for a, b in itertools.pairwise(segs)]
        x = np.array(sizes, dtype=float)
        j = np.searchsorted(np.array(bounds, dtype=float), x, side="left")  # the first bound >= size
        alpha = np.array([seg.alpha_s for seg in segs])[j]
        busbw = np.array([seg.busbw_bytes_per_s for seg in segs])[j]
        residuals.append((op, n, np.array(sizes, dtype=np.int64), np.array(times), alpha * 1.0 + x * f / busbw))
    return FitResult(curves=tuple(curves), residuals=Residuals(residuals), source=source, time_kind=time_kind,
                     backend=backend, tolerance=tolerance, max_pieces=max_pieces, unreliable=unreliable, noisy=noisy_rows,
                     merged=tuple(merged))


def _medians(size_bytes: np.ndarray, time_s: np.ndarray) -> tuple[list[int], list[float], int]:
    """The distinct sizes ascending, each one's median time (the middle one, or the mean of the two middle ones, as
    :func:`statistics.median` gives it), and the first size read."""
    order = np.lexsort((time_s, size_bytes))
    s, t = size_bytes[order], time_s[order]
    sizes, start, count = np.unique(s, return_index=True, return_counts=True)
    mid = start + count // 2
    median = t[mid]
    even = count % 2 == 0
    median[even] = (t[mid[even] - 1] + t[mid[even]]) / 2
    return sizes.tolist(), median.tolist(), int(size_bytes[0])


def _physical(sizes: Sequence[int], times: Sequence[float], factor: float, curve: str, said: list[str], *,
              tolerance: float, max_pieces: int) -> list[tuple[int, int, float, float]]:
    """:func:`fit_curve`'s pieces, none with a bus bandwidth no link has: where the best split holds such a piece
    (a line through a few noisy small-message times can rise by microseconds over tens of bytes, a bus bandwidth
    of kB/s that would time a real message of that size wrongly), the curve is split again among plausible pieces
    only, and ``said`` names the rows. A flat piece (infinite bus bandwidth: latency-bound messages) is plausible;
    one piece over every size is always kept (then the curve itself may be unreliable, see :func:`_unreliable`)."""

    def why(beta: float) -> str | None:
        return None if beta <= 0 else implausible_link(factor / beta)

    pieces = fit_curve(sizes, times, tolerance=tolerance, max_pieces=max_pieces)
    bad = [p for p in pieces if why(p[3])]
    if not bad or len(pieces) == 1:
        return pieces
    kept = fit_curve(sizes, times, tolerance=tolerance, max_pieces=max_pieces, plausible=lambda b: why(b) is None)
    for s, e, _, beta in bad:
        into = next(p for p in kept if p[0] <= s <= p[1])
        rows = ", ".join(f"{int(sizes[i]):,}" for i in range(s, e + 1))
        said.append(f"{curve}: the rows of {rows} B alone give a line whose bus bandwidth {why(beta)}: fitted "
                    f"within {int(sizes[into[0]]):,}-{int(sizes[into[1]]):,} B instead")
    return kept


def _unreliable(largest: Segment) -> str | None:
    """Why a fitted curve means nothing physically, judged on the segment of its largest messages (where bus
    bandwidth, not latency, sets the time: a small-message segment may rightly be flat)."""
    if math.isinf(largest.busbw_bytes_per_s):
        return (f"infinite bus bandwidth: the time did not grow with size up to {largest.size_max_bytes:,} B "
                "(measure larger messages)")
    why = implausible_link(largest.busbw_bytes_per_s)
    return None if why is None else f"bus bandwidth {why}"


# --- output -----------------------------------------------------------------------------------------------

def _toml_float(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return repr(float(f"{value:.6g}"))


def _toml_floats(values: np.ndarray) -> list[str]:
    """:func:`_toml_float` of each value: the 6 significant digits ``format`` gives are already the float's repr
    (``.0`` added where there is no point), except where ``repr`` writes otherwise (a large exponent, ``inf``,
    ``nan``, a subnormal): those the long way."""
    listed = values.tolist()
    out = [s if "." in s or "e" in s else s + ".0" for s in map(format, listed, itertools.repeat(".6g"))]
    with np.errstate(invalid="ignore"):
        size = np.abs(values)
        plain = (size < 999_999.0) & (size > 1e-290)  # no exponent above 5 or of 3 digits; not inf, nan or 0
    for i in np.flatnonzero(~plain).tolist():
        out[i] = _toml_float(listed[i])
    return out


def _toml_str(text: str) -> str:
    return json.dumps(str(text))  # a JSON string is a valid TOML basic string


def to_toml(result: FitResult, *, command: str | None = None, table_prefix: str = "") -> str:
    """The fitted model as TOML for ``commscope estimate --bandwidth``, with each row's error in ``[fit]``.

    ``table_prefix`` (``"collectives."``) nests the tables in another file (``commscope calibrate``'s cluster file).
    """
    out = [
        f"# commscope bandwidth model, fitted by `commscope fit` from {result.source}",
        "# Per op and group size n: time_s = alpha_us x 1e-6 + size_bytes x f(op, n) / (busbw_GBps x 1e9),",
        "# piecewise in size (segments); f is nccl-tests' bus-bandwidth factor (all_reduce 2(n-1)/n;",
        "# all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, sendrecv 1).",
        (f"# Fitted on {result.time_kind} times, least squares on relative error, "
        f"tolerance {result.tolerance:g}, at most {result.max_pieces} segments."),
        "# Use: commscope estimate ... --bandwidth THIS_FILE",
        "",
        f"[{table_prefix}model]",
        f"kind = {_toml_str(FITTED_KIND)}",
        "version = 1",
        f"source = {_toml_str(result.source)}",
        f"time = {_toml_str(result.time_kind)}",
    ]
    if result.backend:
        out.append(f"backend = {_toml_str(result.backend)}")
    out.append(f"created = {_toml_str(datetime.now(UTC).isoformat(timespec='seconds'))}")
    if command:
        out.append(f"command = {_toml_str(command)}")
    out.append(f"tolerance = {_toml_float(result.tolerance)}")
    for c in result.curves:
        out += ["", f"[[{table_prefix}curves]]", f"op = {_toml_str(c.op)}", f"group_size = {c.group_size}"]
        if c.intra_node is not None:
            out.append(f"intra_node = {'true' if c.intra_node else 'false'}")
        out.append(f"max_rel_error = {_toml_float(result.max_rel_error(c.op, c.group_size))}")
        why = result.why_unreliable(c)
        if why is not None:  # read back, the curve is left out of the model (and the estimate says so)
            out.append(f"unreliable = {_toml_str(why)}")
        noisy = result.noisy_rows(c)
        if noisy is not None:  # read back, a note in the estimate
            out.append(f"noisy_rows = {_toml_str(noisy)}")
        # an unreliable curve's lines are no link's: kept as a comment, never as a model a reader could use
        lead = "# " if why is not None else ""
        if why is not None:
            out += ["segments = []", "# what the rows fitted, not a link's bandwidth:"]
        out.append(f"{lead}segments = [")
        for s in c.segments:
            out.append(f"{lead}  {{ size_min_bytes = {s.size_min_bytes}, size_max_bytes = {s.size_max_bytes}, "
                       f"alpha_us = {_toml_float(s.alpha_s / US)}, busbw_GBps = {_toml_float(s.busbw_bytes_per_s / GB)} }},")
        out.append(f"{lead}]")
    out += ["", "# Each measured row against the fit: rel_error = (fitted - measured) / measured.", f"[{table_prefix}fit]",
            'columns = ["op", "group_size", "size_bytes", "measured_us", "fitted_us", "rel_error"]', "rows = ["]
    for op, n, sizes, measured, fitted in Residuals.of(result.residuals).parts:
        head = f"  [{_toml_str(op)}, {n}, "
        out += [f"{head}{s}, {m}, {f}, {e}],"
                for s, m, f, e in zip(sizes.tolist(), _toml_floats(measured / US), _toml_floats(fitted / US),
                                      _toml_floats((fitted - measured) / measured), strict=True)]
    out += ["]", ""]
    return "\n".join(out)
