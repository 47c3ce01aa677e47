"""What a sweep gives back: its rows, their statistics, and nccl-tests' table of them.

:class:`BenchRow` is one measured (op, group size, size); :func:`row_stats` and :func:`make_row` turn the
per-iteration times of every rank into one row (median, percentiles, algbw and busbw); :func:`format_header`,
:func:`format_row`, :func:`format_footer` and :func:`format_table` print rows as nccl-tests does, with the columns
commscope adds. Nothing here imports torch: a saved sweep is read, printed and plotted without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from commscope.estimate.bandwidth import busbw_factor
from commscope.measure.bench.sweep_config import _REDUCING, _ROOTED, AVERAGE_MODES, DTYPES, backend_op
from commscope.units import GB, US

__all__ = ["FULL_ROW_WIDTH", "BenchRow", "SweepResult", "WrongResultsError", "format_footer", "format_header",
           "format_row", "format_table", "make_row", "row_stats"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One measured (op, group size, message size), in nccl-tests' terms; times in s, bandwidths in bytes/s."""

    op: str
    """Logical collective (one of :data:`OPS`)."""
    group_size: int
    """n: ranks in each group the op ran on (busbw uses f(op, n))."""
    size_bytes: int
    """nccl-tests' size (see the module docstring)."""
    count: int
    """nccl-tests' count column: elements in the count argument (per rank for all_gather, reduce_scatter, all_to_all)."""
    dtype: str
    redop: str
    """Reduction, or ``none`` for ops without one (as nccl-tests prints)."""
    root: int
    """Root index in the group, -1 for ops without one."""
    time_s: float
    """Median per-iteration time (each iteration: the ``-a`` combination over ranks)."""
    mean_time_s: float
    """nccl-tests' time: the ``-a`` combination over ranks of each rank's average iteration time."""
    p50_s: float
    p95_s: float
    p99_s: float
    cv: float
    """Coefficient of variation (std / mean) of the per-iteration times."""
    iters: int
    """Timed iterations per rank."""
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    wrong: int | None
    """Wrong elements summed over ranks (``-c``); None when not checked."""
    backend: str
    backend_op: str
    """What the backend executed (gloo runs reduce_scatter as all_reduce)."""
    num_groups: int = 1
    """Groups of ``group_size`` measured (concurrently or one by one: the sweep's meta says which)."""
    in_place: bool = False
    """True where torch's API works in place (all_reduce, broadcast, reduce)."""
    noisy: bool = False
    """cv above the sweep's ``noisy_cv``: more iterations or a quieter machine would help."""
    intra_node: bool | None = None
    """True when every group sat on one host, False when every group spanned hosts, None if mixed/unknown."""

    @property
    def busbw_GBps(self) -> float:
        return self.busbw_bytes_per_s / GB

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchRow:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Rows in measurement order, and what they were measured on (``meta``: backend, world size, hosts...)."""

    rows: tuple[BenchRow, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_wrong(self) -> int:
        return sum(r.wrong or 0 for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "rows": [r.to_dict() for r in self.rows]}


class WrongResultsError(RuntimeError):
    """``-c`` found wrong elements; ``result`` holds every row (``wrong`` per row)."""

    def __init__(self, result: SweepResult) -> None:
        bad = [r for r in result.rows if r.wrong]
        where = "; ".join(f"{r.op} n={r.group_size} {r.size_bytes} B: {r.wrong} wrong" for r in bad[:5])
        more = f" (and {len(bad) - 5} more rows)" if len(bad) > 5 else ""
        super().__init__(f"{result.num_wrong} wrong elements in {len(bad)} of {len(result.rows)} rows: {where}{more}")
        self.result = result



def _combine(values: np.ndarray, average: int, axis: int = 0) -> np.ndarray:
    """Combine per-rank values (ranks along ``axis``) as nccl-tests' ``-a`` does."""
    mode = AVERAGE_MODES[average]
    if mode == "rank0":
        return np.take(values, 0, axis=axis)
    reducers: dict[str, Callable[..., Any]] = {"avg": np.mean, "min": np.min, "max": np.max}
    return reducers[mode](values, axis=axis)


def row_stats(laps_by_group: Sequence[np.ndarray], average: int = 3) -> dict[str, float]:
    """Statistics of one row from per-iteration times, one ``(ranks, iters)`` array per group.

    Each iteration's time is the ``-a`` combination over the group's ranks; the groups' iterations are
    pooled. Returns time_s (median), p50_s, p95_s, p99_s, cv and mean_time_s (nccl-tests' number).
    """
    per_iter = np.concatenate([_combine(np.asarray(g, dtype=float), average, axis=0) for g in laps_by_group])
    rank_means = np.concatenate([np.asarray(g, dtype=float).mean(axis=1) for g in laps_by_group])
    p50, p95, p99 = np.percentile(per_iter, [50, 95, 99])
    mean = float(per_iter.mean())
    return {"time_s": float(p50), "p50_s": float(p50), "p95_s": float(p95), "p99_s": float(p99),
            "cv": float(per_iter.std() / mean) if mean > 0 else 0.0,
            "mean_time_s": float(_combine(rank_means, average))}


def make_row(*, op: str, n: int, size_bytes: int, count: int, dtype: str, redop: str, root: int, backend: str,
             stats: dict[str, float], iters: int, wrong: int | None, noisy_cv: float, num_groups: int = 1,
             intra_node: bool | None = None) -> BenchRow:
    """A BenchRow from statistics: algbw = size / time_s, busbw = algbw x f(op, n)."""
    t = stats["time_s"]
    algbw = size_bytes / t if t > 0 else 0.0
    return BenchRow(op=op, group_size=n, size_bytes=size_bytes, count=count, dtype=dtype,
                    redop=redop if op in _REDUCING else "none", root=root if op in _ROOTED else -1,
                    time_s=t, mean_time_s=stats["mean_time_s"], p50_s=stats["p50_s"], p95_s=stats["p95_s"],
                    p99_s=stats["p99_s"], cv=stats["cv"], iters=iters, algbw_bytes_per_s=algbw,
                    busbw_bytes_per_s=algbw * busbw_factor(op, n), wrong=wrong, backend=backend,
                    backend_op=backend_op(backend, op), num_groups=num_groups,
                    in_place=op in ("all_reduce", "broadcast", "reduce"), noisy=stats["cv"] > noisy_cv,
                    intra_node=intra_node)


def _time_text(time_s: float) -> str:
    us = time_s / US
    return f"{us:7.2f}" if us < 10_000 else f"{us:7.0f}"


def format_header(op: str, n: int, num_groups: int, *, backend: str, group_mode: str, dtype: str,
                  redop: str, iters_text: str, average: int = 3, short: bool = False) -> str:
    """nccl-tests' block header for one op and group size, with what commscope adds (p95, cv). ``short``: the
    columns of :func:`format_row`'s short form, for a narrow terminal."""
    runs = backend_op(backend, op)
    executes = f"; {backend} executes it as {runs}" if runs != op else ""
    groups = f"{num_groups} groups of {n} ranks ({group_mode})" if num_groups > 1 else f"1 group of {n} ranks"
    head = [f"# {op}: {groups}, backend {backend}{executes}",
            f"# type {DTYPES[dtype]}, redop {redop if op in _REDUCING else 'none'}, {iters_text}",
            (f"# time = median over iterations ({AVERAGE_MODES[average]} over ranks per iteration); busbw = algbw x "
             f"{busbw_factor(op, n):.4g} (nccl-tests' factor for n={n})"), "#"]
    if short:
        root = (f"  {'root':>6}", f"  {'':>6}") if op in _ROOTED else ("", "")
        return "\n".join([*head, (f"#{'size':>11}{root[0]}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}  "
                                   f"{'p95':>7}  {'cv':>5}"),
                           f"#{'(B)':>11}{root[1]}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}  {'(us)':>7}"])
    return "\n".join([
        *head,
        (f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  {'algbw':>6}  "
        f"{'busbw':>6}  {'#wrong':>6}  {'p95':>7}  {'cv':>5}"),
        (f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  "
        f"{'(GB/s)':>6}  {'':>6}  {'(us)':>7}"),
    ])


#: Width of :func:`format_row`'s nccl-tests line (``noisy`` included); a terminal narrower gets the short form.
FULL_ROW_WIDTH = 126


def format_row(row: BenchRow, *, short: bool = False) -> str:
    """One table line, in nccl-tests' column order; ``noisy`` appended when flagged. ``short``: without the
    columns the block's header states (count, type, redop; root but for broadcast and reduce), 70 columns."""
    wrong = "N/A" if row.wrong is None else str(row.wrong)
    if short:
        root = f"  {row.root:>6}" if row.op in _ROOTED else ""
        line = (f"{row.size_bytes:>12}{root}  {_time_text(row.time_s)}  {row.algbw_bytes_per_s / GB:>6.2f}  "
                f"{row.busbw_bytes_per_s / GB:>6.2f}  {wrong:>6}  {_time_text(row.p95_s)}  {row.cv:>5.2f}")
    else:
        line = (f"{row.size_bytes:>12}  {row.count:>12}  {DTYPES.get(row.dtype, row.dtype):>8}  {row.redop:>6}  "
                f"{row.root:>6}  {_time_text(row.time_s)}  {row.algbw_bytes_per_s / GB:>6.2f}  "
                f"{row.busbw_bytes_per_s / GB:>6.2f}  {wrong:>6}  {_time_text(row.p95_s)}  {row.cv:>5.2f}")
    return line + ("  noisy" if row.noisy else "")


def format_footer(rows: Sequence[BenchRow], noisy_cv: float, *, short: bool = False) -> str:
    """nccl-tests' closing lines: out-of-bounds count and average bus bandwidth; plus the noisy rows."""
    wrong = sum(r.wrong or 0 for r in rows)
    avg = float(np.mean([r.busbw_bytes_per_s for r in rows])) / GB if rows else 0.0
    noisy = sum(r.noisy for r in rows)
    narrow = ["# count, type, redop: in each header; --wide for nccl-tests' columns"] if short else []
    return "\n".join([f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
                      f"# Avg bus bandwidth    : {avg:.6g} ",
                      f"# Noisy rows (cv > {noisy_cv:g}): {noisy} of {len(rows)}", *narrow, "#"])


def format_table(result: SweepResult) -> str:
    """The whole sweep as nccl-tests-style text (a block per op and group size)."""
    meta = result.meta
    lines: list[str] = []
    key = None
    for row in result.rows:
        if (row.op, row.group_size) != key:
            key = (row.op, row.group_size)
            if lines:
                lines.append("#")
            lines.append(format_header(row.op, row.group_size, row.num_groups, backend=row.backend,
                                       group_mode=meta.get("group_mode", "concurrent"), dtype=row.dtype,
                                       redop=row.redop, iters_text=meta.get("iters_text", ""),
                                       average={v: k for k, v in AVERAGE_MODES.items()}.get(str(meta.get("average")), 3)))
        lines.append(format_row(row))
    lines.append(format_footer(result.rows, meta.get("noisy_cv", 0.2)))
    return "\n".join(lines)
