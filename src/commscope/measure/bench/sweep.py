"""Collective micro-benchmarks through torch.distributed, with nccl-tests' semantics, flags and output.

One sweep measures each op over a range of message sizes on groups of ranks, the way NVIDIA's nccl-tests
(``all_reduce_perf -b 8 -e 64M -f 2 ...``) does, but through PyTorch, so it measures whatever backend the
user's training runs on (NCCL on GPUs, gloo on CPUs) [nccl-tests-perf].

Sizes (as nccl-tests prints them, ``n`` = ranks in the group, ``c`` = ``size // dtype bytes``):

    op              size_bytes is                count (printed, = the count argument of the call)
    all_reduce      the buffer                   c
    all_gather      the gathered output          c // n        size rounded down to a multiple of n elements
    reduce_scatter  the input                    c // n        (same)
    all_to_all      the whole send buffer        c // n        (same)
    sendrecv        the message                  c             rank i sends to i+1, receives from i-1
    broadcast       the buffer                   c             root = -r (index in the group)
    reduce          the buffer                   c

Sizes whose count is 0 (e.g. 8 B all_gather over 4 ranks of fp32) are skipped; nccl-tests prints them as
zero-byte rows.

Time: for each size, ``-w`` warm-ups, a barrier, then ``-n`` iterations timed one by one without
synchronising between them (as nccl-tests' loop: host clock on CPU backends, CUDA events on the stream on
GPUs). Per iteration, the ranks' times are combined as ``-a`` says (default max: an op is done when its
slowest rank is done; nccl-tests' default ``-a 1`` averages ranks). ``time_s`` is the median of those
per-iteration times, with p50/p95/p99 and the coefficient of variation ``cv`` beside it; ``mean_time_s``
is nccl-tests' own number (the ``-a`` reduction over ranks of each rank's average). Then

    algbw = size_bytes / time_s,   busbw = algbw x f(op, n)    (f from :func:`commscope.estimate.bandwidth.busbw_factor`)

Worked example (nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt): all_reduce of 134217728 B over
8 ranks in 1295.41 us -> algbw 103.61 GB/s, busbw 103.61 x 2 x 7/8 = 181.32 GB/s.

Iterations: ``-n`` fixed, or by default a time budget per size (``time_budget_s``, clamped to
``[min_iters, max_iters]``) from the warm-ups' time, agreed by the group (max over its ranks), so small
messages get hundreds of iterations and 64 MiB a handful. Rows with ``cv > noisy_cv`` are flagged
``noisy`` and kept.

Correctness (``-c``, on by default as in nccl-tests): after timing, every input is refilled with a
pattern that depends on the rank and the element index, the op runs once more, and every rank compares
its whole output with the exact expected result (values are chosen so that sums and products are exact
in the dtype; ``avg`` gets a tolerance of a few ulps). ``wrong`` is the number of wrong elements summed
over ranks; any wrong row makes :func:`run_sweep` raise :class:`WrongResultsError` after the sweep
(the rows, wrong counts included, travel with the error).

Groups (``group_sizes``, the communication scale): the world is cut into consecutive groups of g ranks
(``[0..g-1], [g..2g-1], ...``, each a ``new_group``); g must divide the world size. ``concurrent``
(default): all groups of that size run at once, started together after a world barrier, as the TP or
DP groups of a training job do (so links they share are contended); the row pools their iterations.
``sequential``: one group at a time while the others wait, each group's links to itself.

gloo executes reduce_scatter as a full all_reduce of the input followed by a local copy of this rank's
chunk (ProcessGroupGloo::reduce_scatter_tensor_coalesced, pytorch/pytorch#118911), so its wire traffic is
an all_reduce's: such rows say ``backend_op = "all_reduce"``; their busbw still uses reduce_scatter's
factor, as the logical op is what a training job asks for.

The row type, the size arithmetic, the table and the statistics import no torch; running a sweep does.
"""

from __future__ import annotations

import math
import platform
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, UTC
from typing import Any, Literal

import numpy as np

from commscope.estimate.bandwidth import busbw_factor
from commscope.errors import ConfigError
from commscope.units import GB, MiB, US, canonical_dtype, dtype_bytes, format_bytes, parse_size_bytes

__all__ = [
    "AVERAGE_MODES",
    "DTYPES",
    "FULL_ROW_WIDTH",
    "MAX_ITERS",
    "OPS",
    "REDOPS",
    "BenchRow",
    "GroupBackend",
    "SweepConfig",
    "SweepResult",
    "WrongResultsError",
    "available_memory_bytes",
    "backend_op",
    "buffer_bytes",
    "check_measurable",
    "check_memory",
    "check_world",
    "format_header",
    "format_row",
    "format_table",
    "message_sizes",
    "op_count",
    "parse_dtype",
    "row_stats",
    "run_sweep",
    "smallest_size_bytes",
]

#: The collectives a sweep can measure, with nccl-tests' meaning.
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv", "broadcast", "reduce")
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")
#: Reduction ops (``-o``); ``avg`` needs NCCL.
REDOPS: tuple[str, ...] = ("sum", "prod", "min", "max", "avg")
#: nccl-tests' ``-a``: how per-rank times combine (0 rank 0, 1 average, 2 min, 3 max).
AVERAGE_MODES: dict[int, str] = {0: "rank0", 1: "avg", 2: "min", 3: "max"}
#: dtypes a sweep accepts, by commscope's canonical name -> nccl-tests' type name (the table's ``type``).
DTYPES: dict[str, str] = {"fp32": "float", "fp16": "half", "bf16": "bfloat16", "fp64": "double",
                          "int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64"}
_NCCL_TYPE_ALIASES = {"float": "fp32", "half": "fp16", "double": "fp64", "bfloat16": "bf16", "int": "int32",
                      "char": "int8"}
#: Most timed (``-n``) or warm-up (``-w``) iterations per size: nccl-tests' default is 20, and 100,000 of the
#: smallest gloo message (~30 us) already take 3 s per size; more is a typo that would run for hours.
MAX_ITERS = 100_000
#: Largest integer each dtype holds exactly (for check patterns whose reductions must be exact).
_EXACT_MAX = {"fp32": 2 ** 24, "fp16": 2048, "bf16": 256, "fp64": 2 ** 53, "int8": 127, "uint8": 255,
              "int32": 2 ** 31 - 1, "int64": 2 ** 62}


def parse_dtype(name: str) -> str:
    """commscope's canonical dtype from an nccl-tests (``float``, ``half``) or torch (``bfloat16``) name."""
    key = str(name).strip().lower()
    key = _NCCL_TYPE_ALIASES.get(key, key)
    try:
        canon = canonical_dtype(key)
    except ValueError:
        canon = None
    if canon not in DTYPES:
        raise ConfigError("dtype", name, f"expected one of {', '.join(DTYPES.values())} (nccl-tests' names) "
                                         f"or {', '.join(DTYPES)}")
    return canon


def backend_op(backend: str, op: str) -> str:
    """The collective ``backend`` actually executes for ``op`` (gloo: reduce_scatter is an all_reduce)."""
    if "gloo" in backend and op == "reduce_scatter":
        return "all_reduce"
    return op


def op_count(op: str, size_bytes: int, n: int, element_bytes: int) -> tuple[int, int]:
    """(count, size_bytes) nccl-tests prints for a requested ``size_bytes`` of ``op`` over ``n`` ranks.

    ``op_count('all_gather', 64, 12, 4) == (1, 48)``: 16 floats, 1 per rank, 48 bytes gathered (as in the
    V100 x12 all_gather log). count is the count argument of the NCCL call (per rank for all_gather,
    reduce_scatter, all_to_all).
    """
    if op not in OPS:
        raise ConfigError("op", op, f"expected one of {', '.join(OPS)}")
    c = size_bytes // element_bytes
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        per_rank = c // n
        return per_rank, per_rank * n * element_bytes
    return c, c * element_bytes


def message_sizes(min_bytes: int, max_bytes: int, step_factor: float = 2.0, step_bytes: int = MiB) -> list[int]:
    """nccl-tests' size loop: ``min, min*f, ...`` up to ``max`` (``-f``), or ``min, min+i, ...`` when f == 1 (``-i``)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ConfigError("sizes", f"-b {min_bytes} -e {max_bytes}", "need 1 <= minbytes (-b) <= maxbytes (-e)")
    if step_factor < 1 or (step_factor == 1 and step_bytes < 1):
        raise ConfigError("step", f"-f {step_factor} -i {step_bytes}", "need -f > 1, or -f 1 with -i >= 1")
    sizes: list[int] = []
    size: float = min_bytes
    while size <= max_bytes:
        sizes.append(int(size))
        size = size * step_factor if step_factor > 1 else size + step_bytes
    return sizes


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepConfig:
    """What to measure; defaults follow nccl-tests where it has one (sizes: 8 B to 64 MiB, factor 2)."""

    ops: tuple[str, ...] = OPS
    """Collectives to measure, in order."""
    min_bytes: int = 8
    """``-b``: smallest size."""
    max_bytes: int = 64 * MiB
    """``-e``: largest size."""
    step_factor: float = 2.0
    """``-f``: multiply the size by this; 1 means add ``step_bytes``."""
    step_bytes: int = MiB
    """``-i``: size increment when ``step_factor`` is 1."""
    iters: int | None = None
    """``-n``: timed iterations per size; None: by ``time_budget_s``."""
    warmup_iters: int = 5
    """``-w``: untimed iterations before each size."""
    time_budget_s: float = 0.2
    """Timed seconds per size when ``iters`` is None (clamped to ``min_iters``..``max_iters`` iterations)."""
    min_iters: int = 10
    max_iters: int = 1000
    check: bool = True
    """``-c``: verify every result on every rank."""
    dtype: str = "fp32"
    """``-d``: element type (commscope's names; nccl-tests' ``float``, ``half`` ... are accepted)."""
    redop: str = "sum"
    """``-o``: reduction of all_reduce, reduce_scatter, reduce."""
    root: int = 0
    """``-r``: root of broadcast and reduce, as an index in the group."""
    average: int = 3
    """``-a``: how ranks' times combine: 0 rank 0, 1 average (nccl-tests' default), 2 min, 3 max (default)."""
    group_sizes: tuple[int, ...] | None = None
    """``--groups``: sizes of the subgroups to measure on; None: the whole world."""
    group_mode: Literal["concurrent", "sequential"] = "concurrent"
    """Whether the groups of one size run at once or one after another (see the module docstring)."""
    noisy_cv: float = 0.2
    """Rows whose coefficient of variation exceeds this are flagged ``noisy``."""
    inject_error_rank: int | None = None
    """For tests: this global rank corrupts one element of its checked output, so ``check`` must fail."""

    def __post_init__(self) -> None:
        bad = [op for op in self.ops if op not in OPS]
        if bad or not self.ops:
            raise ConfigError("ops", ",".join(self.ops), f"expected a comma-separated subset of {', '.join(OPS)}")
        message_sizes(self.min_bytes, self.max_bytes, self.step_factor, self.step_bytes)
        if self.iters is not None and not 1 <= self.iters <= MAX_ITERS:
            raise ConfigError("iters", self.iters, f"-n must be 1-{MAX_ITERS:,} timed iterations per size (nccl-tests' "
                                                   "default is 20; without -n, --time-budget picks 10-1000)")
        if not 0 <= self.warmup_iters <= MAX_ITERS:
            raise ConfigError("warmup_iters", self.warmup_iters, f"-w must be 0-{MAX_ITERS:,} warm-up iterations "
                                                                 "per size (default 5)")
        if not 1 <= self.min_iters <= self.max_iters <= MAX_ITERS:
            raise ConfigError("min_iters", (self.min_iters, self.max_iters),
                              f"need 1 <= min_iters <= max_iters <= {MAX_ITERS:,}")
        if not self.time_budget_s > 0:
            raise ConfigError("time_budget_s", self.time_budget_s, "must be > 0")
        if not self.noisy_cv > 0:
            raise ConfigError("noisy_cv", self.noisy_cv, "--noisy-cv must be > 0: rows whose coefficient of variation "
                                                         "(std / mean of the iteration times) exceeds it are flagged "
                                                         "noisy (default 0.2)")
        if self.redop not in REDOPS:
            raise ConfigError("redop", self.redop, f"-o expects one of {', '.join(REDOPS)}")
        if self.average not in AVERAGE_MODES:
            raise ConfigError("average", self.average, "-a expects 0 (rank 0), 1 (avg), 2 (min) or 3 (max)")
        if self.group_mode not in ("concurrent", "sequential"):
            raise ConfigError("group_mode", self.group_mode, "expected concurrent or sequential")
        if self.root < 0:
            raise ConfigError("root", self.root, "-r must be >= 0")
        if self.group_sizes is not None and (not self.group_sizes or min(self.group_sizes) < 2):
            raise ConfigError("groups", self.group_sizes, "group sizes must be >= 2")
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))

    @property
    def sizes(self) -> list[int]:
        return message_sizes(self.min_bytes, self.max_bytes, self.step_factor, self.step_bytes)


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


# --- statistics and formatting (no torch) -------------------------------------------------------------------

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


# --- running (torch) ----------------------------------------------------------------------------------------

def _torch_dtype(dtype: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
            "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64}[dtype]


def _reduce_op(redop: str):
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}[redop]


@dataclass(frozen=True, slots=True)
class _Pattern:
    """Check data: the value rank r (index in its group) puts at element i, chosen so results are exact.

    sum: values 0..3, or 0/1 with few ones per element when n is large; prod: 1/2 with few twos (each element
    gets a 2 from every k-th rank, so the product is an exact power of two); min/max
    and the non-reducing ops: (13 r + i) mod 97 (distinct per rank, so a misplaced block shows).
    """

    kind: Literal["small", "sparse", "prod", "spread"]
    k: int = 1

    @classmethod
    def for_op(cls, op: str, redop: str, n: int, dtype: str) -> _Pattern:
        limit = _EXACT_MAX[dtype]
        if op not in _REDUCING or redop in ("min", "max"):
            return cls("spread")
        if redop == "prod":
            twos = max(1, int(math.log2(limit)))
            return cls("prod", k=max(2, math.ceil(n / twos)))  # k >= 2: ranks differ
        if 3 * n <= limit:
            return cls("small")
        return cls("sparse", k=max(1, math.ceil(n / limit)))

    def values(self, r, idx):
        """Values of group rank r (an int, or a tensor like ``idx``) at the int64 indices ``idx``, as int64."""
        if self.kind == "small":
            return (idx + r) % 4
        if self.kind == "sparse":
            return ((idx + r) % self.k == 0).long()
        if self.kind == "prod":
            return 1 + ((idx + r) % self.k == 0).long()
        return (13 * r + idx) % 97


def _reduce_values(redop: str, parts: list, n: int, dtype):
    import torch

    acc = parts[0].clone()
    for p in parts[1:]:
        if redop in ("sum", "avg"):
            acc += p
        elif redop == "prod":
            acc *= p
        elif redop == "min":
            acc = torch.minimum(acc, p)
        else:
            acc = torch.maximum(acc, p)
    if redop == "avg":
        return (acc.double() / n).to(dtype)
    return acc.to(dtype)


_CHECK_CHUNK = 1 << 20  # elements compared at a time, to bound the check's memory


def _expected(op: str, redop: str, pattern: _Pattern, r: int, n: int, c: int, root: int, idx, dtype):
    """Expected output elements ``idx`` on group rank r (c: nccl-tests' count)."""
    if op in ("all_reduce", "reduce"):
        return _reduce_values(redop, [pattern.values(q, idx) for q in range(n)], n, dtype)
    if op == "reduce_scatter":
        return _reduce_values(redop, [pattern.values(q, r * c + idx) for q in range(n)], n, dtype)
    if op in ("all_gather", "all_to_all"):
        # output element o comes from rank o // c: its element o % c (all_gather) or r*c + o % c (all_to_all)
        src_idx = idx % c + (r * c if op == "all_to_all" else 0)
        return pattern.values(idx // c, src_idx).to(dtype)
    if op == "sendrecv":
        return pattern.values((r - 1) % n, idx).to(dtype)
    if op == "broadcast":
        return pattern.values(root, idx).to(dtype)
    raise AssertionError(op)


def _count_wrong(out, expected, redop: str, n: int, dtype: str) -> int:
    import torch

    if redop == "avg" and dtype in ("fp32", "fp16", "bf16", "fp64"):
        eps = torch.finfo(out.dtype).eps
        tol = eps * (n + 2) * torch.clamp(expected.double().abs(), min=1.0)
        return int(((out.double() - expected.double()).abs() > tol).sum())
    return int((out != expected).sum())


@dataclass(slots=True)
class _Case:
    """Buffers and the call of one (op, size) on one rank."""

    run: Callable[[], None]
    inputs: list
    output: Any
    check_output: bool


def _make_case(op: str, count: int, n: int, group, group_ranks: Sequence[int], me: int, root: int, redop: str,
               dtype, device) -> _Case:
    import torch
    import torch.distributed as dist

    def buf(num: int):
        return torch.zeros(num, dtype=dtype, device=device)

    rop = _reduce_op(redop)
    # torch 2.13 renamed reduce_scatter_tensor / all_gather_into_tensor to *_single (the old names warn)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if op == "all_reduce":
        b = buf(count)
        return _Case(lambda: dist.all_reduce(b, op=rop, group=group), [b], b, True)
    if op == "all_gather":
        i, o = buf(count), buf(count * n)
        return _Case(lambda: all_gather(o, i, group=group), [i], o, True)
    if op == "reduce_scatter":
        i, o = buf(count * n), buf(count)
        return _Case(lambda: reduce_scatter(o, i, op=rop, group=group), [i], o, True)
    if op == "all_to_all":
        i, o = buf(count * n), buf(count * n)
        return _Case(lambda: dist.all_to_all_single(o, i, group=group), [i], o, True)
    if op == "sendrecv":
        s, rcv = buf(count), buf(count)
        nxt, prv = group_ranks[(me + 1) % n], group_ranks[(me - 1) % n]

        def sendrecv() -> None:
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt, group=group),
                                           dist.P2POp(dist.irecv, rcv, prv, group=group)])
            for req in reqs:
                req.wait()

        return _Case(sendrecv, [s], rcv, True)
    if op == "broadcast":
        b = buf(count)
        src = group_ranks[root]
        return _Case(lambda: dist.broadcast(b, src=src, group=group), [b], b, True)
    if op == "reduce":
        b = buf(count)
        dst = group_ranks[root]
        return _Case(lambda: dist.reduce(b, dst=dst, op=rop, group=group), [b], b, me == root)
    raise AssertionError(op)


def _fill(case: _Case, pattern: _Pattern, me: int) -> None:
    import torch

    for t in case.inputs:
        for lo in range(0, t.numel(), _CHECK_CHUNK):
            hi = min(t.numel(), lo + _CHECK_CHUNK)
            idx = torch.arange(lo, hi, dtype=torch.int64, device=t.device)
            t[lo:hi] = pattern.values(me, idx).to(t.dtype)


def _check(case: _Case, op: str, redop: str, pattern: _Pattern, me: int, n: int, count: int, root: int,
           dtype: str) -> int:
    import torch

    if not case.check_output:
        return 0
    out = case.output
    wrong = 0
    for lo in range(0, out.numel(), _CHECK_CHUNK):
        hi = min(out.numel(), lo + _CHECK_CHUNK)
        idx = torch.arange(lo, hi, dtype=torch.int64, device=out.device)
        exp = _expected(op, redop, pattern, me, n, count, root, idx, out.dtype)
        wrong += _count_wrong(out[lo:hi], exp, redop, n, dtype)
    return wrong


def _timed_laps(case: _Case, iters: int, device) -> list[float]:
    """Per-iteration seconds of ``iters`` back-to-back calls (CUDA events on GPUs, the host clock on CPUs)."""
    import torch

    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record()
        for i in range(iters):
            case.run()
            events[i + 1].record()
        torch.cuda.synchronize(device)
        return [events[i].elapsed_time(events[i + 1]) * 1e-3 for i in range(iters)]
    stamps = [time.perf_counter()]
    for _ in range(iters):
        case.run()
        stamps.append(time.perf_counter())
    return list(np.diff(stamps))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(cfg: SweepConfig, case: _Case, group, device) -> list[float]:
    """Warm up, agree on the iteration count within the group, then time."""
    import torch
    import torch.distributed as dist

    warm = cfg.warmup_iters if cfg.iters is not None else max(1, cfg.warmup_iters)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(warm):
        case.run()
    _sync(device)
    if cfg.iters is not None:
        iters = cfg.iters
    else:
        estimate = torch.tensor([(time.perf_counter() - t0) / warm], dtype=torch.float64, device=device)
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX, group=group)
        per_op = max(float(estimate[0]), 1e-7)
        iters = int(min(cfg.max_iters, max(cfg.min_iters, math.ceil(cfg.time_budget_s / per_op))))
    dist.barrier(group=group)
    return _timed_laps(case, iters, device)


def _groups_of(world: int, g: int) -> list[tuple[int, ...]]:
    return [tuple(range(start, start + g)) for start in range(0, world, g)]


def _device_for(backend: str):
    import torch

    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _intra_node(groups: Sequence[Sequence[int]], hosts: Sequence[str]) -> bool | None:
    inside = {len({hosts[r] for r in grp}) == 1 for grp in groups}
    return inside.pop() if len(inside) == 1 else None


def check_world(cfg: SweepConfig, world: int, backend: str) -> tuple[int, ...]:
    """The group sizes ``cfg`` measures on ``world`` ranks of ``backend``; ConfigError where it cannot run."""
    sizes_g = cfg.group_sizes or (world,)
    for g in sizes_g:
        if g < 2 or g > world or world % g:
            raise ConfigError("groups", g, f"group sizes must be >= 2 and divide the number of ranks, {world}")
    if cfg.root >= min(sizes_g) and any(op in _ROOTED for op in cfg.ops):
        raise ConfigError("root", cfg.root, f"-r must be < the smallest group size, {min(sizes_g)}")
    if cfg.redop == "avg" and "nccl" not in backend and any(op in _REDUCING for op in cfg.ops):
        raise ConfigError("redop", "avg", f"needs NCCL; backend {backend} supports sum, prod, min, max")
    check_measurable(cfg, tuple(sizes_g))
    return tuple(sizes_g)


def buffer_bytes(op: str, size_bytes: int, n: int, element_bytes: int) -> int:
    """Bytes of the buffers one rank allocates to run ``op`` at nccl-tests' ``size_bytes`` over ``n`` ranks, as the
    sweep allocates them: all_reduce, broadcast, reduce work in place (one buffer of the size); all_gather holds its
    input (1/n) and the gathered output, reduce_scatter the input and its 1/n output, all_to_all and sendrecv a send
    and a receive buffer. ``buffer_bytes('all_gather', 1024, 4, 4) == 1280``."""
    count, size = op_count(op, size_bytes, n, element_bytes)
    if op in ("all_gather", "reduce_scatter"):
        return size + count * element_bytes
    if op in ("all_to_all", "sendrecv"):
        return 2 * size
    return size


def available_memory_bytes() -> int | None:
    """Memory this machine can still give without swapping (Linux ``MemAvailable``), else its free pages; None
    when neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(cfg: SweepConfig, group_sizes: Sequence[int], ranks_here: int, backend: str,
                 available_bytes: int | None = None) -> None:
    """ConfigError, before any rank starts, when the largest row's buffers on every rank of this host together
    exceed the memory this machine has available (``available_bytes``, default :func:`available_memory_bytes`):
    the kernel would kill a rank (SIGKILL) mid-sweep. Buffers in host memory only: NCCL's are on the GPUs."""
    if "nccl" in backend:
        return
    available = available_memory_bytes() if available_bytes is None else available_bytes
    if available is None:
        return
    element_bytes = dtype_bytes(cfg.dtype)
    largest = cfg.sizes[-1]
    per_rank, op, n = max((buffer_bytes(op, largest, n, element_bytes), op, n) for op in cfg.ops for n in group_sizes)
    need = per_rank * ranks_here
    if need > available:
        raise ConfigError("maxbytes", cfg.max_bytes,
                          f"the sweep's largest size, {format_bytes(largest)}: {op} over {n} ranks needs "
                          f"{format_bytes(per_rank)} of buffers per rank (input and output) x {ranks_here} ranks on this "
                          f"host = {format_bytes(need)}, but this machine has {format_bytes(available)} available; give "
                          "a smaller -e")


def smallest_size_bytes(op: str, n: int, element_bytes: int) -> int:
    """The smallest message ``op`` over ``n`` ranks can move: one element (per rank where the buffer is split
    among the ranks: all_gather, reduce_scatter, all_to_all). ``smallest_size_bytes('all_gather', 4, 4) == 16``."""
    return element_bytes * (n if op in ("all_gather", "reduce_scatter", "all_to_all") else 1)


def check_measurable(cfg: SweepConfig, group_sizes: Sequence[int]) -> None:
    """ConfigError when some op and group size of ``cfg`` has no size in -b..-e that holds one element (nccl-tests
    prints such sizes as zero-byte rows; a sweep of only those measures nothing)."""
    element_bytes = dtype_bytes(cfg.dtype)
    sizes = cfg.sizes
    for op in cfg.ops:
        for n in group_sizes:
            if all(op_count(op, size, n, element_bytes)[0] == 0 for size in sizes):
                need = smallest_size_bytes(op, n, element_bytes)
                per_rank = " per rank" if need > element_bytes else ""
                span = f"{sizes[0]} B" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]} B"
                raise ConfigError("sizes", f"-b {cfg.min_bytes} -e {cfg.max_bytes}",
                                  f"{op} of {DTYPES[cfg.dtype]} over {n} ranks needs messages of at least {need} B "
                                  f"(one {element_bytes}-byte element{per_rank}); {span} holds none, so nothing would "
                                  f"be measured: give -b and -e of at least {need}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupBackend:
    """A backend measured on groups it makes itself rather than on the default group's (``commscope tune``)."""

    name: str
    """The rows' ``backend``."""
    new_group: Callable[[list[int]], Any]
    """Makes the group of these global ranks (every group, the whole world included); every rank calls it for
    every group, in the same order, as ``torch.distributed.new_group``."""


def run_sweep(cfg: SweepConfig, *, emit: Callable[[str], None] | None = None, command: str | None = None,
              group_backend: GroupBackend | None = None,
              progress: Callable[[int, int], None] | None = None, short: bool = False) -> SweepResult:
    """Measure ``cfg`` on the current default process group; every rank calls it and gets the same result.

    ``group_backend``: measure on the groups it makes instead (the default group still synchronises).
    ``emit`` (rank 0 only) receives the table line by line as rows are measured (``short``: the narrow form of
    :func:`format_row`, for a terminal narrower than nccl-tests' lines); ``progress`` (rank 0 only) is
    called as ``progress(done, total)`` after each (op, group size, size). Raises ConfigError for a
    configuration the world cannot run, WrongResultsError (after the whole sweep) when ``cfg.check`` found
    wrong elements.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ConfigError("process group", "not initialised",
                          "call torch.distributed.init_process_group first (or use commscope.measure.launch.spawn)")
    world, me = dist.get_world_size(), dist.get_rank()
    backend = group_backend.name if group_backend is not None else str(dist.get_backend())
    sizes_g = check_world(cfg, world, backend)
    device = _device_for(backend)
    dtype = _torch_dtype(cfg.dtype)
    element_bytes = dtype_bytes(cfg.dtype)
    say = emit if (emit is not None and me == 0) else None

    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    # every rank creates every subgroup, in the same order (torch.distributed requires it)
    layouts: dict[int, tuple[list[tuple[int, ...]], Any, int]] = {}
    for g in sizes_g:
        groups = _groups_of(world, g)
        mine, index = None, -1
        for gi, ranks in enumerate(groups):
            if group_backend is not None:
                pg = group_backend.new_group(list(ranks))
            else:
                pg = None if g == world else dist.new_group(list(ranks))
            if me in ranks:
                mine, index = pg, gi
        layouts[g] = (groups, mine, index)

    iters_text = (f"{cfg.iters} iterations, {cfg.warmup_iters} warm-ups" if cfg.iters is not None else
                  f"iterations for {cfg.time_budget_s:g} s per size ({cfg.min_iters}-{cfg.max_iters}), "
                  f"{max(1, cfg.warmup_iters)} warm-ups")
    meta: dict[str, Any] = {
        "tool": "commscope bench", "backend": backend, "world_size": world, "hostname": socket.gethostname(),
        "hosts": hosts, "num_hosts": len(set(hosts)), "torch_version": torch.__version__,
        "python_version": platform.python_version(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join(sys.argv), "device": _device_name(device),
        "group_mode": cfg.group_mode, "group_sizes": list(sizes_g), "dtype": cfg.dtype, "redop": cfg.redop,
        "iters": cfg.iters, "warmup_iters": cfg.warmup_iters, "time_budget_s": cfg.time_budget_s,
        "average": AVERAGE_MODES[cfg.average], "check": cfg.check, "noisy_cv": cfg.noisy_cv,
        "iters_text": iters_text,
        "time_definition": "time_s: median over iterations of the per-iteration time combined over ranks "
                           f"({AVERAGE_MODES[cfg.average]}); mean_time_s: nccl-tests' time",
    }
    rows: list[BenchRow] = []
    report = progress if me == 0 else None
    total, done = len(cfg.ops) * len(sizes_g) * len(cfg.sizes), 0
    for op in cfg.ops:
        for g in sizes_g:
            groups, group, gi = layouts[g]
            if say:
                say(format_header(op, g, len(groups), backend=backend, group_mode=cfg.group_mode, dtype=cfg.dtype,
                                  redop=cfg.redop, iters_text=iters_text, average=cfg.average, short=short))
            local = groups[gi].index(me)
            for size in cfg.sizes:
                done += 1
                if report:
                    report(done - 1, total)
                count, size_bytes = op_count(op, size, g, element_bytes)
                if count == 0:
                    continue
                row = _one_row(cfg, op, g, groups, group, gi, local, count, size_bytes, dtype, device, backend,
                               _intra_node(groups, hosts))
                rows.append(row)
                if say:
                    say(format_row(row, short=short))
    result = SweepResult(rows=tuple(rows), meta=meta)
    if report:
        report(total, total)
    if say:
        say(format_footer(rows, cfg.noisy_cv, short=short))
    if cfg.check and result.num_wrong:
        raise WrongResultsError(result)
    return result


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def _one_row(cfg: SweepConfig, op: str, g: int, groups, group, gi: int, local: int, count: int, size_bytes: int,
             dtype, device, backend: str, intra_node: bool | None) -> BenchRow:
    import torch.distributed as dist

    me = dist.get_rank()
    case = _make_case(op, count, g, group, groups[gi], local, cfg.root, cfg.redop, dtype, device)
    pattern = _Pattern.for_op(op, cfg.redop, g, cfg.dtype)
    _fill(case, pattern, local)  # timing runs on real data too (in-place ops let it grow; speed is unaffected)
    laps: list[float] = []
    wrong: int | None = None
    turns = [gi] if cfg.group_mode == "concurrent" else list(range(len(groups)))
    dist.barrier()
    for turn in turns:
        if turn == gi:
            laps = _measure(cfg, case, group, device)
            if cfg.check:
                _fill(case, pattern, local)
                dist.barrier(group=group)
                case.run()
                _sync(device)
                if cfg.inject_error_rank == me and case.check_output:
                    case.output.view(-1)[0] += 1  # the test hook: one wrong element on this rank
                wrong = _check(case, op, cfg.redop, pattern, local, g, count, cfg.root, cfg.dtype)
        if cfg.group_mode == "sequential":
            dist.barrier()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (gi, laps, wrong))
    by_group: dict[int, list[list[float]]] = {}
    for g_index, rank_laps, _ in gathered:
        by_group.setdefault(g_index, []).append(rank_laps)
    stats = row_stats([np.array(v) for _, v in sorted(by_group.items())], cfg.average)
    total_wrong = sum(w for _, _, w in gathered if w is not None) if cfg.check else None
    iters = max(len(v) for _, v, _ in gathered)
    return make_row(op=op, n=g, size_bytes=size_bytes, count=count, dtype=cfg.dtype, redop=cfg.redop, root=cfg.root,
                    backend=backend, stats=stats, iters=iters, wrong=total_wrong, noisy_cv=cfg.noisy_cv,
                    num_groups=len(groups), intra_node=intra_node)


def parse_sizes_arg(text: str | int) -> int:
    """``-b``/``-e``/``-i`` values: bytes with K/M/G suffixes (binary, as nccl-tests)."""
    try:
        return parse_size_bytes(text)
    except ValueError as exc:
        raise ConfigError("size", text, str(exc).split(": ", 1)[-1]) from None
