"""Reading nccl-tests / rccl-tests stdout into bus-bandwidth rows that can be trusted.

nccl-tests (NVIDIA/nccl-tests) and rccl-tests (ROCm/rccl-tests) print one table per run::

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
         1048576        262144     float     sum      -1    67.31   15.58   27.26      0    65.27   16.07   28.11      0

The left half is the out-of-place run, the right half the in-place run. Units: ``size`` in bytes (for all_gather
and reduce_scatter the *total* size, n x the per-rank buffer; :class:`~commscope.commop.CommOp` uses the same
convention), ``time`` in microseconds, bandwidths in GB/s with GB = 1e9 bytes [nccl-tests-perf].
Everything is converted to SI here: :attr:`BusbwRow.time_s`, :attr:`BusbwRow.busbw_bytes_per_s`.

Real outputs are messier than that, and the parser reads them as they are:

- ``NCCL INFO`` / ``WARN`` lines interleaved anywhere, even between the header and the rows, or glued to the end of a
  half-printed row whose numbers follow on a later line (the row is put back together);
- launcher prefixes: mpirun ``[1,0]<stdout>:``, ``srun -l`` ``0:``, a host or timestamp before the row;
- every format since 2019: the old ``error`` column (max error, a float) instead of ``#wrong``, tables without
  ``redop`` and/or ``root``, ``N/A`` for unchecked halves (``-c 0``, in-place all_to_all and sendrecv), the newest
  per-iteration (``i_min ... i_cv%``) and ``timestamp`` columns, ``%g`` counts such as ``1.04858e+06``;
- numbers wider than their column, which shift everything after them (rows are split on whitespace, never by
  column position);
- several runs in one file (each with its own parameter line, device list, table and summary);
- a rooted collective (broadcast, reduce, gather, scatter) run with ``-r -1``: one table that times every size once
  per root, root 0 first, the ``root`` column holding each row's root rank. Each row keeps its root
  (:attr:`BusbwRow.root`, ``meta["runs"][i]["roots"]``): a fit or a bandwidth table takes one root at a time.

Nothing odd is dropped silently: every line that looks like a data row but cannot be read, every row whose data
check failed (``#wrong`` > 0, an old ``error`` above nccl-tests' bound, an rccl ``*``), every failure or abort
message, a run that stops before its summary, and every disagreement between what the log says and what its rows
show is listed in :attr:`NcclTestsResult.problems` with its line number.

Which collective a table holds is read from the test binary's name (``all_reduce_perf`` in a command line or in
``# Collective test starting:``) and checked against the rows themselves: whether they carry a reduction op and a
root, how ``size`` relates to ``count`` and the element size, and whether busbw/algbw equals the factor of
:func:`busbw_factor` for the group size. A name that the rows contradict (someone pasted alltoall output under an
all_reduce command) is overruled and reported; without a name the rows decide, and an ambiguity is reported.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from commscope.commop import MAX_MESSAGE_BYTES
from commscope.spec.cluster import LINK_BANDWIDTH_RANGE_BYTES_PER_S
from commscope.units import GB, US

__all__ = [
    "BusbwRow",
    "NcclTestsResult",
    "QuickRow",
    "algbw",
    "busbw_factor",
    "canonical_op",
    "parse_nccl_tests",
]

#: At most this many problems are listed one by one; the rest are counted in one last entry.
MAX_PROBLEMS = 1000

_EXAMPLE_ROW = "  1048576  262144  float  sum  -1  ..."

# --------------------------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------------------------

#: nccl-tests binary / collective names (lower case, without ``_``, ``_perf``, ``_mpi``) -> commscope op names.
_OP_NAMES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all_v",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "sendrecv",
    "gather": "gather",
    "scatter": "scatter",
    "hypercube": "hypercube",
}

#: nccl-tests / rccl-tests type names -> canonical commscope dtype names.
_DTYPES: dict[str, str] = {
    "float": "fp32",
    "float32": "fp32",
    "fp32": "fp32",
    "half": "fp16",
    "float16": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "double": "fp64",
    "float64": "fp64",
    "fp64": "fp64",
    "int8": "int8",
    "char": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "int": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "f8e4m3": "fp8_e4m3",
    "fp8e4m3": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "float8e4m3": "fp8_e4m3",
    "f8e5m2": "fp8_e5m2",
    "fp8e5m2": "fp8_e5m2",
    "fp8_e5m2": "fp8_e5m2",
    "float8e5m2": "fp8_e5m2",
}

#: Bytes per element of the canonical dtypes above.
_DTYPE_BYTES: dict[str, int] = {
    "fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8,
    "uint64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1,
}

#: Largest max-error the old ``error`` column may show before nccl-tests counts the row as out of bounds
#: (``DeltaMaxValue`` in nccl-tests' common.cu, 2017-2022; multiplied there by n-1 in later versions).
_ERROR_BOUND: dict[str, float] = {"fp16": 1e-2, "bf16": 1e-2, "fp32": 1e-5, "fp64": 1e-12}
_INT_ERROR_BOUND = 1e-200

_REDOPS = frozenset({"sum", "prod", "max", "min", "avg", "mulsum", "premulsum"})


def canonical_op(name: str) -> str:
    """The commscope name of an nccl-tests collective: ``all_reduce_perf``, ``AllReduce`` -> ``all_reduce``.

    Raises ValueError for a name that is no nccl-tests collective.
    """
    key = str(name).strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"(\.exe)$", "", key)
    key = re.sub(r"_?perf(_?mpi)?$", "", key)
    key = re.sub(r"[^a-z0-9]", "", key)
    if key in _OP_NAMES:
        return _OP_NAMES[key]
    known = ", ".join(sorted(set(_OP_NAMES.values())))
    raise ValueError(f"unknown nccl-tests collective {name!r}; known: {known}")


@functools.lru_cache(maxsize=4096)  # a million rows name a few types
def _canonical_dtype(name: str) -> str:
    return _DTYPES.get(name.lower(), name.lower())


# --------------------------------------------------------------------------------------------------------------------
# Formulas
# --------------------------------------------------------------------------------------------------------------------


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor f(op, n): busbw = algbw x f [nccl-tests-perf].

    ==============================================================  ============
    op                                                              f
    ==============================================================  ============
    all_reduce                                                      2(n-1)/n
    reduce_scatter, all_gather, all_to_all (and -v), gather,
    scatter, hypercube                                              (n-1)/n
    broadcast, reduce, sendrecv                                     1
    ==============================================================  ============

    These are the ``GetBw`` functions of nccl-tests' ``src/*.cu``, which doc/PERFORMANCE.md derives: an all_reduce
    moves every byte 2(n-1) times over n links, an all_gather or reduce_scatter (n-1) times, while a broadcast or
    reduce is limited by the root's one link. Worked number: ``busbw_factor('all_reduce', 8) == 1.75``, so an
    all_reduce of 1 GB in 10 ms (algbw 100 GB/s) shows busbw 175 GB/s. ``op`` may be any name
    :func:`canonical_op` knows (``AllReduce``, ``all_reduce_perf``). Raises ValueError for n < 1 or an unknown op.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"group size n={n!r} must be an integer >= 1")
    name = canonical_op(op)
    if name == "all_reduce":
        return 2 * (n - 1) / n
    if name in ("reduce_scatter", "all_gather", "all_to_all", "all_to_all_v", "gather", "scatter", "hypercube"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, sendrecv


def algbw(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s: size / time [nccl-tests-perf]. ``algbw(1e9, 0.01) == 1e11`` (100 GB/s)."""
    if not time_s > 0 or not math.isfinite(time_s):
        raise ValueError(f"time_s={time_s!r} must be a positive, finite number of seconds")
    if not size_bytes >= 0:
        raise ValueError(f"size_bytes={size_bytes!r} must be >= 0")
    return size_bytes / time_s


def _error_bound(dtype: str, n: int | None) -> float:
    return _ERROR_BOUND.get(dtype, _INT_ERROR_BOUND) * max(1, (n or 1) - 1)


# --------------------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BusbwRow:
    """One half (out-of-place or in-place) of one nccl-tests data row, in SI units."""

    op: str
    """commscope op name: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ..."""
    size_bytes: int
    """nccl-tests' ``size`` column: for all_gather, reduce_scatter, all_to_all the total over the group."""
    count: int
    """nccl-tests' ``count`` column (elements; per rank for all_gather / reduce_scatter, per peer for all_to_all)."""
    dtype: str
    """Canonical element type (``fp32``, ``fp16``, ``bf16``, ``int8``, ...); unknown names kept in lower case."""
    redop: str | None
    """Reduction op (``sum``, ``max``, ...); None for collectives that do not reduce or tables without the column."""
    root: int | None
    """Root rank of broadcast / reduce (gather, scatter): the row's own under ``-r -1``, which times every root; None
    where nccl-tests prints -1 (collectives without a root) or has no ``root`` column."""
    group_size: int | None
    """Number of ranks in the communicator, from the ``# Using devices`` lines (or NCCL's ``nranks``)."""
    time_s: float
    """Average time of one operation, seconds."""
    algbw_bytes_per_s: float
    """Algorithm bandwidth as printed, bytes per second: size / time, except that nccl-tests before 2019 printed
    size (n-1)/n / time for all_gather and reduce_scatter (``meta["runs"][i]["algbw_convention"]`` says which)."""
    busbw_bytes_per_s: float
    """Bus bandwidth, algbw x :func:`busbw_factor`, bytes per second."""
    wrong: int | None
    """Wrong elements found by the data check (``#wrong``); None for ``N/A`` and for the old ``error`` column."""
    in_place: bool
    """True for the right (in-place) half of the row."""
    source: str
    """``file:line`` of the row."""
    max_error: float | None = None
    """Old formats (before 2022): the ``error`` column, the largest absolute error the data check found."""
    intra_node: bool | None = None
    """True when every rank ran on one host, False for several hosts, None when the log does not say."""
    table: int = 1
    """Which table of the file the row is in, counting from 1 in file order (``meta["runs"][table - 1]``): the
    number ``commscope fit --run`` picks tables by."""

    @property
    def failed_check(self) -> bool:
        """True when nccl-tests' data check failed for this half (``#wrong`` > 0 or ``error`` above its bound)."""
        return _failed_check(self)

    @property
    def busbw_GBps(self) -> float:
        """Bus bandwidth in GB/s (1e9 bytes/s), as nccl-tests prints it."""
        return self.busbw_bytes_per_s / GB


def _failed_check(row: Any) -> bool:
    if row.wrong is not None and row.wrong > 0:
        return True
    return row.max_error is not None and row.max_error > _error_bound(row.dtype, row.group_size)


class QuickRow(NamedTuple):
    """A :class:`BusbwRow` as a named tuple: the same fields, read the same way, made ten times faster (a frozen
    dataclass of 16 fields costs ~3.5 us to build, two per line of a million-line table). What ``parse_nccl_tests(...,
    quick=True)`` gives, for a reader that only reads the rows (``commscope fit``)."""

    op: str
    size_bytes: int
    count: int  # type: ignore[assignment]  # the field, as BusbwRow's, over tuple.count
    dtype: str
    redop: str | None
    root: int | None
    group_size: int | None
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    wrong: int | None
    in_place: bool
    source: str
    max_error: float | None = None
    intra_node: bool | None = None
    table: int = 1

    @property
    def failed_check(self) -> bool:
        return _failed_check(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsResult:
    """What a nccl-tests / rccl-tests output holds."""

    rows: list[BusbwRow]
    """Out-of-place and in-place rows, in the order of the file (in-place only where its numbers were printed)."""
    meta: dict[str, Any]
    """What the log says about the runs: ``op``, ``ops``, ``nranks``, ``num_nodes``, ``hosts``, ``devices``,
    ``nccl_version`` / ``nccl_tests_version`` / ``rccl_version`` / ``rccl_tests_version`` / ``hip_version`` /
    ``rocm_version``, ``avg_busbw_GBps``, ``out_of_bounds``, ``algbw_convention``, ``params`` (the ``# nThread ...``
    line), ``command`` and
    ``args`` (``{"b": "8", "e": "8G", "f": "2", "g": "1"}``) where a command line was printed, and ``runs`` (one dict
    per table with these keys, and ``op_named``/``op_named_line``: the collective the table's header or command line
    names and its line, None where none does, whatever ``op=`` said; ``roots``: the root ranks its rows time, sorted,
    empty for collectives without a root, several for a broadcast / reduce run with ``-r -1``, which times every size
    once per root; ``table``: its number, from 1 in file order, as :attr:`BusbwRow.table` and ``fit --run`` give it;
    ``hardware``: its GPUs and hosts, ``NVIDIA A100-SXM4-80GB x 8 on dkh``, None where it lists no devices). With
    several runs, a top-level key holds the value the runs share, else None
    (``out_of_bounds``: their sum)."""
    problems: list[str]
    """``file:line: what`` for every unreadable row-like line, failed data check, failure message or inconsistency."""

    @property
    def ok(self) -> bool:
        """True when nothing was found wrong."""
        return not self.problems


# --------------------------------------------------------------------------------------------------------------------
# Lexing
# --------------------------------------------------------------------------------------------------------------------

_NUM_RE = re.compile(r"[+-]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:[eE][+-]?\d{1,4})?")
_UINT_RE = re.compile(r"\d{1,20}")
_INT_RE = re.compile(r"-?\d{1,12}")
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_MPI_PREFIX_RE = re.compile(r"^\[(\d{1,9}),(\d{1,9})\]<(?:stdout|stderr)>:")
_LABEL_PREFIX_RE = re.compile(r"^\s*(?:\d{1,6}:\s|\d{4}-\d\d-\d\d[T ][0-9:.,]+Z?\s+)")  # srun -l, timestamps
_GENERIC_PREFIX_RE = re.compile(r"^(?:\d{4}-\d\d-\d\d[T ][0-9:.,]+Z?\s+|\S{1,200}?:\s*)")
_NCCL_LOG_RE = re.compile(r"\b[NR]CCL (INFO|WARN|TRACE|ABORT)\b")
_NCCL_LOG_START_RE = re.compile(r"\S*:\d{1,12}:\d{1,12}\s+\[\d{1,6}\]\s+[NR]CCL\s+(?:INFO|WARN|TRACE|ABORT)\b")
_NRANKS_RE = re.compile(r"\bnranks (\d{1,9})\b")
_RANK_LINE_RE = re.compile(
    r"^#\s*Rank\s+(\d{1,9})\s+(?:Group\s+(\d{1,9})\s+)?Pid\s+(\d{1,12})\s+on\s+(\S+)\s+device\s+(\d{1,9})"
    r"\s+\[([^\]]{0,64})\]\s*(.*)$"
)
_PARAMS_RE = re.compile(r"^#\s*nThread\s+\d")
_PARAM_ITEMS = (
    ("nthreads", r"nThread\s+(\d{1,9})"),
    ("ngpus", r"nGpus\s+(\d{1,9})"),
    ("min_bytes", r"minBytes\s+(\d{1,20})"),
    ("max_bytes", r"maxBytes\s+(\d{1,20})"),
    ("warmup_iters", r"warmup iters:\s*(\d{1,9})"),
    ("iters", r"(?<!warmup )(?<!agg )iters:\s*(\d{1,9})"),
    ("agg_iters", r"agg iters:\s*(\d{1,9})"),
    ("validation", r"validation:\s*(\d{1,9})"),
    ("graph", r"graph:\s*(\d{1,9})"),
    ("unalign", r"unalign:\s*(\d{1,9})"),
)
_STEP_RE = re.compile(r"step:\s*(\d{1,20})\((factor|bytes)\)")
_PERF_BINARY_RE = re.compile(r"([A-Za-z0-9_]{1,64}?)_perf(?:_mpi)?(?:\.exe)?")
_FAILURE_RES = (
    re.compile(r"Test (?:NCCL |CUDA |HIP |RCCL )?failure|Test timeout"),
    re.compile(r"MPI_ABORT|mpirun noticed|mpirun has exited|prterun noticed|exited on signal|Primary job\s+terminated"
               r"|ORTE has lost|ORTE_ERROR"),
    re.compile(r"Segmentation fault|core dumped|Bus error|\bAborted\b|Process received signal|terminate called"
               r"|\bKilled\b|Floating point exception|Illegal instruction"),
    re.compile(r"srun: error|slurmstepd: error|CANCELLED AT|DUE TO TIME LIMIT|OUT_OF_MEMORY"),
    re.compile(r"Invalid number of GPUs|invalid size specified|invalid sizes for|invalid option"),
    re.compile(r"error while loading shared libraries|cannot open shared object|command not found"
               r"|No such file or directory|Connection refused|Connection timed out|Could not resolve hostname"),
    re.compile(r"\bout of memory\b|\bcuda(?:Error|Malloc failed)|\bhipError|\bCUDA error\b|\bHIP error\b", re.IGNORECASE),
)


def _num(tok: str) -> float | None:
    return float(tok) if _NUM_RE.fullmatch(tok) else None


def _half_unit(tok: str) -> float:
    """Half of the last printed digit of ``tok`` (``'67.31'`` -> 0.005, ``'13744'`` -> 0.5, ``'1e+06'`` -> 5e5)."""
    if "e" not in tok and "E" not in tok:  # nearly every token: a plain decimal
        dot = tok.find(".")
        return 0.5 if dot < 0 else _HALF_UNITS[len(tok) - dot - 1] if len(tok) - dot - 1 < len(_HALF_UNITS) else \
            0.5 * 10.0 ** (dot + 1 - len(tok))
    mant, _, exp = tok.lower().partition("e")
    decimals = len(mant.partition(".")[2])
    e = int(exp) if exp else 0
    return 0.5 * 10.0 ** (e - decimals)


_HALF_UNITS = tuple(0.5 * 10.0 ** -d for d in range(12))


def _is_number(tok: str) -> bool:
    return _NUM_RE.fullmatch(tok) is not None


def _is_cont_token(tok: str) -> bool:
    t = tok.rstrip("*")
    return t == "N/A" or _is_number(t)


# --------------------------------------------------------------------------------------------------------------------
# Parser state (private: built while reading, frozen into results at the end)
# --------------------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Schema:
    head: int = 5
    """Number of columns before the first ``time``: size, count, type, [redop], [root]."""
    head_names: tuple[str, ...] = ("size", "count", "type", "redop", "root")
    half: int = 4
    """Columns per half: time, algbw, busbw, #wrong (+ i_min, i_max, i_p99, i_cv% with per-iteration timing)."""
    timestamp: bool = False
    error_column: bool | None = None
    """True: the old ``error`` column (max error); False: ``#wrong``; None: unknown (no header seen)."""
    line: int = 0


@dataclass(slots=True)
class _Half:
    in_place: bool
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int | None
    max_error: float | None
    starred: bool
    time_tok: str
    algbw_tok: str
    busbw_tok: str


@dataclass(slots=True)
class _RawRow:
    line: int
    mpi_rank: str | None
    size: int
    count: int
    type_name: str
    redop: str | None
    root: int | None
    halves: list[_Half]


@dataclass(slots=True)
class _Run:
    start_line: int
    op_hint: str | None = None
    op_hint_line: int = 0
    op_hint_raw: str | None = None
    command: str | None = None
    args: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    params_line: int = 0
    devices: list[dict[str, Any]] = field(default_factory=list)
    devices_line: int = 0
    nccl_nranks: set[int] = field(default_factory=set)
    schema: _Schema | None = None
    rows: list[_RawRow] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg_busbw_GBps: float | None = None
    summary_line: int = 0
    reduced_max_bytes: int | None = None
    rows_after_summary: bool = False


class _Problems:
    def __init__(self, name: str) -> None:
        self.name = name
        self.items: list[tuple[int, str]] = []

    def add(self, line: int, msg: str) -> None:
        self.items.append((line, msg))

    def render(self) -> list[str]:
        items = sorted(self.items, key=lambda t: t[0])
        out = [f"{self.name}:{ln}: {msg}" if ln else f"{self.name}: {msg}" for ln, msg in items[:MAX_PROBLEMS]]
        if len(items) > MAX_PROBLEMS:
            out.append(f"{self.name}: ... and {len(items) - MAX_PROBLEMS} more problems")
        return out


def _clip(text: str, limit: int = 120) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------------------------------
# Row reading
# --------------------------------------------------------------------------------------------------------------------


class _RowError(Exception):
    """A row-like line that cannot be read; the message says why."""


def _parse_half(toks: list[str], in_place: bool, schema: _Schema) -> _Half:
    """The first ``schema.half`` tokens of ``toks`` as one half; raises _RowError."""
    if len(toks) < 4:
        raise _RowError(f"expected time, algbw, busbw and #wrong, got {' '.join(toks) or 'nothing'}")
    t, a, b = (_num(x) for x in toks[:3])
    if t is None or a is None or b is None:
        raise _RowError(f"time/algbw/busbw {' '.join(toks[:3])!r} are not all numbers")
    if not all(math.isfinite(v) and v >= 0 for v in (t, a, b)):
        raise _RowError(f"time/algbw/busbw {' '.join(toks[:3])!r} must be finite and >= 0")
    wtok = toks[3]
    starred = wtok.endswith("*")
    wtok = wtok.rstrip("*")
    wrong: int | None = None
    max_error: float | None = None
    if wtok != "N/A":
        w = _num(wtok)
        if w is None or not math.isfinite(w) or w < 0:
            raise _RowError(f"#wrong/error {toks[3]!r} is neither a count, an error value nor N/A")
        error_column = schema.error_column
        if error_column is None:  # no header: the old '%5.0le' error column looks like '2e-07'
            error_column = re.fullmatch(r"\de[+-]\d\d", wtok) is not None
        if error_column:
            max_error = w
        else:
            if w != int(w) and "e" not in wtok.lower():
                raise _RowError(f"#wrong {toks[3]!r} is not a whole number")
            wrong = round(w)
    for extra in toks[4 : schema.half]:
        if _num(extra) is None:
            raise _RowError(f"per-iteration column {extra!r} is not a number")
    if len(toks) < schema.half:
        raise _RowError(f"expected {schema.half} columns per half, got {len(toks)}")
    return _Half(in_place, t, a, b, wrong, max_error, starred, toks[0], toks[1], toks[2])


#: Element types and reduction ops a data row may name on the fast path (any other goes the whole way, and is said).
_FAST_TYPES = frozenset({"float", "half", "double", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64",
                         "fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2", "float32", "float16", "float64"})
_FAST_REDOPS = frozenset({"sum", "prod", "max", "min", "avg", "premulsum", "mulsum", "none"})
_FAST_ROWS: dict[tuple[tuple[str, ...], int, bool, bool | None], re.Pattern[str] | None] = {}
_FAST_NUM = r"\s+(\d{1,30}(?:\.\d{1,30})?)"


def _fast_row(schema: _Schema) -> re.Pattern[str] | None:
    """One regex for a whole plain data row of ``schema``'s table (size, count, type, its redop / root columns, two
    halves of time, algbw, busbw and a #wrong count, no prefix), or None where the table has other columns. A line it
    matches is the row :func:`_parse_row` reads from it (its first reading succeeds), without the searches for
    launcher prefixes, NCCL lines and failure messages, none of which such a line can hold."""
    key = (schema.head_names, schema.half, schema.timestamp, schema.error_column)
    if key in _FAST_ROWS:
        return _FAST_ROWS[key]
    names = schema.head_names
    pattern: re.Pattern[str] | None = None
    if (schema.half == 4 and not schema.timestamp and schema.error_column is False and names[:3] == ("size", "count",
                                                                                                       "type")
            and all(n in ("redop", "root") for n in names[3:]) and len(set(names[3:])) == len(names[3:])):
        mid = "".join(r"\s+(?P<redop>[a-z]{1,16})" if n == "redop" else r"\s+(?P<root>-?\d{1,12})" for n in names[3:])
        if "redop" not in names:
            mid += "(?P<redop>)?"
        if "root" not in names:
            mid += "(?P<root>)?"
        half = _FAST_NUM * 3 + r"\s+(\d{1,20})"
        pattern = re.compile(r"\s*(\d{1,20})\s+(\d{1,20})\s+(?P<type>[A-Za-z][A-Za-z0-9_]{0,31})" + mid + half + half
                             + r"\s*$")
    _FAST_ROWS[key] = pattern
    return pattern


def _row_from_match(m: re.Match[str], line: int) -> _RawRow:
    """The row of a line :func:`_fast_row`'s regex matched (as :func:`_parse_row` and :func:`_make_row` read it)."""
    g = m.groups()
    halves = [_Half(in_place, float(g[k]), float(g[k + 1]), float(g[k + 2]), int(g[k + 3]), None, False, g[k], g[k + 1],
                    g[k + 2]) for in_place, k in ((False, len(g) - 8), (True, len(g) - 4))]
    root = m["root"]
    return _RawRow(line, None, int(g[0]), int(g[1]), m["type"], m["redop"] or None, None if not root else int(root),
                   halves)


def _middle_ok(mid: list[str]) -> bool:
    if len(mid) == 0:
        return True
    if len(mid) == 1:
        tok = mid[0]
        return (_WORD_RE.fullmatch(tok) is not None) or (_INT_RE.fullmatch(tok) is not None)
    if len(mid) == 2:
        return _WORD_RE.fullmatch(mid[0]) is not None and _INT_RE.fullmatch(mid[1]) is not None
    return False


def _parse_row(tokens: list[str], schema: _Schema, line: int, mpi_rank: str | None) -> tuple[_RawRow, str | None]:
    """A data row from whitespace-split tokens; returns (row, note about an unreadable in-place half)."""
    if schema.timestamp and len(tokens) >= 2 and re.fullmatch(r"\d{4}-\d\d-\d\d", tokens[-2]):
        tokens = tokens[:-2]
    if len(tokens) < 3:
        raise _RowError("too few columns")
    if not _UINT_RE.fullmatch(tokens[0]):
        raise _RowError(f"size {tokens[0]!r} is not a whole number of bytes")
    if not _UINT_RE.fullmatch(tokens[1]):
        raise _RowError(f"count {tokens[1]!r} is not a whole number of elements")
    if not _WORD_RE.fullmatch(tokens[2]):
        raise _RowError(f"type {tokens[2]!r} is not a type name")
    w = schema.half
    order = [schema.head] + [h for h in (5, 4, 3) if h != schema.head]
    partial: tuple[int, _Half] | None = None
    first_error: str | None = None
    for h in order:
        if len(tokens) < h or not _middle_ok(tokens[3:h]):
            continue
        try:
            oop = _parse_half(tokens[h : h + w], False, schema)
        except _RowError as exc:
            first_error = first_error or str(exc)
            continue
        if len(tokens) == h + 2 * w:
            try:
                ip = _parse_half(tokens[h + w :], True, schema)
            except _RowError as exc:
                first_error = first_error or str(exc)
                if partial is None:
                    partial = (h, oop)
                continue
            return _make_row(tokens, h, [oop, ip], line, mpi_rank), None
        if partial is None:
            partial = (h, oop)
    if partial is None:
        raise _RowError(first_error or f"expected {schema.head + 2 * w} columns, got {len(tokens)}")
    h, oop = partial
    rest = tokens[h + w :]
    note = ("the in-place half is missing" if not rest
            else f"the in-place half {_clip(' '.join(rest), 60)!r} cannot be read")
    return _make_row(tokens, h, [oop], line, mpi_rank), note


def _make_row(tokens: list[str], h: int, halves: list[_Half], line: int, mpi_rank: str | None) -> _RawRow:
    redop: str | None = None
    root: int | None = None
    for tok in tokens[3:h]:
        if _INT_RE.fullmatch(tok):
            root = int(tok)
        else:
            redop = tok.lower()
    return _RawRow(line, mpi_rank, int(tokens[0]), int(tokens[1]), tokens[2], redop, root, halves)


def _parse_header(s: str, line: int) -> _Schema | None:
    toks = s.lstrip("#").split()
    low = [t.lower() for t in toks]
    if not ({"size", "count", "type", "busbw"} <= set(low)) or not ({"time", "cputime"} & set(low)):
        return None
    first_time = next(i for i, t in enumerate(low) if t in ("time", "cputime"))
    if first_time < 3:
        return None  # not nccl-tests' layout: size, count and type always come first
    second = next((i for i in range(first_time + 1, len(low)) if low[i] in ("time", "cputime")), None)
    half_names = low[first_time:second] if second is not None else low[first_time:]
    half_names = [t for t in half_names if t != "timestamp"]
    return _Schema(
        head=first_time,
        head_names=tuple(low[:first_time]),
        half=max(4, len(half_names)),
        timestamp="timestamp" in low,
        error_column="error" in half_names,
        line=line,
    )


def _perf_binary(s: str) -> tuple[str, int] | None:
    """(name, token index) of the first ``*_perf`` token of a command line."""
    toks = s.split()
    for i, tok in enumerate(toks):
        base = tok.rsplit("/", 1)[-1].strip("'\"`;")
        if _PERF_BINARY_RE.fullmatch(base):
            return base, i
    return None


def _command_args(toks: list[str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok in ("|", ">", ">>", "2>&1", "&&", ";", "|&", "2>"):
            break
        if tok.startswith("-") and len(tok) > 1 and not _is_number(tok):
            key, eq, val = tok.lstrip("-").partition("=")
            if eq:
                args[key] = val
            elif i + 1 < len(toks) and (not toks[i + 1].startswith("-") or _is_number(toks[i + 1])):
                args[key] = toks[i + 1]
                i += 1
            else:
                args[key] = True
        i += 1
    return args


def _version_from_code(code: int) -> str:
    if code >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


# --------------------------------------------------------------------------------------------------------------------
# The reader
# --------------------------------------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, name: str) -> None:
        self.name = name
        self.problems = _Problems(name)
        self.runs: list[_Run] = []
        self.cur = _Run(start_line=1)
        self.versions: dict[str, str] = {}
        self.json_output: str | None = None
        self.pending: tuple[int, list[str], str | None] | None = None
        self.row_lines: dict[str, int] = {}

    # -- runs --------------------------------------------------------------------------------------------------------

    def _new_run(self, line: int, *, inherit: bool = False) -> None:
        old = self.cur
        self.runs.append(old)
        self.cur = _Run(start_line=line)
        if inherit:
            self.cur.devices = list(old.devices)
            self.cur.devices_line = old.devices_line
            self.cur.params = old.params
            self.cur.params_line = old.params_line
            self.cur.op_hint, self.cur.op_hint_line = old.op_hint, old.op_hint_line
            self.cur.op_hint_raw = old.op_hint_raw
            self.cur.command, self.cur.args = old.command, old.args
            self.cur.nccl_nranks = set(old.nccl_nranks)

    def _started(self) -> bool:
        return bool(self.cur.rows) or self.cur.schema is not None or self.cur.summary_line > 0

    # -- lines -------------------------------------------------------------------------------------------------------

    def feed(self, ln: int, raw: str) -> None:
        schema = self.cur.schema
        if schema is not None and self.pending is None:  # nearly every line of a large table: one regex, no search
            fast = _fast_row(schema)
            m = fast.match(raw) if fast is not None else None
            if m is not None and m["type"].lower() in _FAST_TYPES and (m["redop"] is None or m["redop"] in _FAST_REDOPS):
                self._take_row(_row_from_match(m, ln), ln, None)
                return
        line = raw.replace("\x00", "")
        mpi_rank = None
        m = _MPI_PREFIX_RE.match(line)
        if m:
            mpi_rank = f"[{m.group(1)},{m.group(2)}]"
            line = line[m.end():]
        m = _LABEL_PREFIX_RE.match(line)
        if m:
            line = line[m.end():]
        s = line.strip()
        if not s:
            return
        if self.pending is not None:
            toks = s.split()
            if all(_is_cont_token(t) for t in toks) and not _NCCL_LOG_RE.search(s):
                pln, ptoks, prank = self.pending
                self.pending = None
                self._row(pln, ptoks + toks, prank, joined_line=ln)
                return
            if not _NCCL_LOG_RE.search(s):
                self._flush_pending()
        if s.startswith("#"):
            self._comment(ln, s)
            return
        log = _NCCL_LOG_RE.search(s)
        if log:
            start = _NCCL_LOG_START_RE.search(s)
            head = s[: start.start()] if start else ""
            if head.strip() and self._row_text(head.strip()) is not None:
                self._nccl_log(ln, s[start.start():] if start else s)
                self._row_candidate(ln, head.strip(), mpi_rank, allow_pending=True)
            else:
                self._nccl_log(ln, s)
            return
        if self._versions(ln, s):
            return
        for rx in _FAILURE_RES:
            m = rx.search(s)
            if m:
                self.problems.add(ln, f"the output reports a failure: {_clip(s, 200)}")
                # A failure message can follow the half-printed row of the size that failed.
                toks = s[: m.start()].split()
                if toks and toks[-1].endswith(":"):
                    toks = toks[:-1]  # the host name nccl-tests puts before its message
                if toks and self._row_text(" ".join(toks)) is not None:
                    self._row_candidate(ln, " ".join(toks), mpi_rank, allow_pending=False)
                return
        perf = _perf_binary(s)
        if perf is not None and self._row_text(s) is None:
            self._op_hint(ln, perf[0], s, command=True, args=_command_args(s.split()[perf[1] + 1 :]))
            return
        self._row_candidate(ln, s, mpi_rank)

    def _row_text(self, s: str) -> str | None:
        """The row part of a line that looks like a data row (first token a number), else None."""
        first = s.split(None, 1)[0]
        if _is_number(first):
            return s
        m = _GENERIC_PREFIX_RE.match(s)
        if m and m.end() < len(s):
            rest = s[m.end():].strip()
            if rest and _is_number(rest.split(None, 1)[0]) and len(rest.split()) >= 3:
                return rest
        return None

    def _row_candidate(self, ln: int, s: str, mpi_rank: str | None, *, allow_pending: bool = True) -> None:
        text = self._row_text(s)
        if text is None:
            return
        toks = text.split()
        schema = self.cur.schema or _Schema()
        if (allow_pending and len(toks) < schema.head + 4 and len(toks) >= 3 and _UINT_RE.fullmatch(toks[0])
                and _UINT_RE.fullmatch(toks[1]) and _WORD_RE.fullmatch(toks[2]) and _middle_ok(toks[3:])):
            # Only the head of a row: its numbers may follow on a later line (an NCCL INFO line cut in).
            self.pending = (ln, toks, mpi_rank)
            return
        self._row(ln, toks, mpi_rank)

    def _flush_pending(self) -> None:
        if self.pending is None:
            return
        pln, ptoks, _ = self.pending
        self.pending = None
        self.problems.add(pln, f"data row without its numbers: {_clip(' '.join(ptoks))!r}")

    def _row(self, ln: int, toks: list[str], mpi_rank: str | None, *, joined_line: int | None = None) -> None:
        schema = self.cur.schema or _Schema()
        try:
            row, note = _parse_row(toks, schema, ln, mpi_rank)
        except _RowError as exc:
            self.problems.add(ln, f"cannot read data row {_clip(' '.join(toks))!r}: {exc}: row skipped")
            return
        if joined_line is not None:
            self.problems.add(ln, f"data row split by other output; its numbers are on line {joined_line}")
        if note:
            self.problems.add(ln, f"data row {_clip(' '.join(toks))!r}: {note}; kept the out-of-place half only")
        self._take_row(row, ln, mpi_rank)

    def _take_row(self, row: _RawRow, ln: int, mpi_rank: str | None) -> None:
        if self.cur.summary_line and not self.cur.rows_after_summary:
            self.cur.rows_after_summary = True
            self.problems.add(ln, f"data row after the summary at line {self.cur.summary_line} of the same table")
        if mpi_rank is not None:
            self.row_lines.setdefault(mpi_rank, ln)
        self.cur.rows.append(row)

    def _comment(self, ln: int, s: str) -> None:
        body = s.lstrip("#").strip()
        if _PARAMS_RE.match(s):
            if self._started():
                self._new_run(ln)
            elif self.cur.params is not None and self.cur.params_line:
                self.problems.add(ln, f"a second parameter line; the one at line {self.cur.params_line} has no table "
                                      "of its own (pasted from another run?) and is ignored")
            self.cur.params = self._params(s)
            self.cur.params_line = ln
            return
        m = re.match(r"Collective test starting:\s*(\S+)", body)
        if m:
            if self._started():
                self._new_run(ln)
            self._op_hint(ln, m.group(1), s, command=False, args=None)
            return
        if body.startswith("Collective test concluded"):
            return
        # "# nccl-tests version 2.19.4 nccl-headers=21903 nccl-library=21903", and rccl-tests' own form
        # "# rccl-tests version 2.17.9-develop:2596ca5f71 rccl-headers=22803 rccl-library=22707"
        m = re.match(r"([nr])ccl-tests version\s+(\S+)(?:.*?[nr]ccl-library=(\d{1,9}))?", body)
        if m:
            lib = "rccl" if m.group(1) == "r" else "nccl"
            self.versions.setdefault(f"{lib}_tests_version", m.group(2))
            if m.group(3):
                self.versions.setdefault(f"{lib}_version", _version_from_code(int(m.group(3))))
            return
        if body.startswith("Using devices"):
            if self.cur.rows:
                self._new_run(ln)
            self.cur.devices = []
            self.cur.devices_line = ln
            return
        m = _RANK_LINE_RE.match(s)
        if m:
            rank, group, pid, host, dev, bus, name = m.groups()
            self.cur.devices.append({
                "rank": int(rank), "group": int(group) if group is not None else None, "pid": int(pid),
                "host": host, "device": int(dev), "bus_id": bus, "name": name.strip(),
            })
            if not self.cur.devices_line:
                self.cur.devices_line = ln
            return
        schema = _parse_header(s, ln)
        if schema is not None:
            if self.cur.rows or self.cur.summary_line:
                self._new_run(ln, inherit=True)
            self.cur.schema = schema
            return
        m = re.match(r"Out of bounds values\s*:\s*(\d{1,12})\s*(\S*)", body)
        if m:
            self.cur.out_of_bounds = int(m.group(1))
            if int(m.group(1)) > 0 or m.group(2).upper() == "FAILED":
                self.problems.add(ln, f"nccl-tests reports {m.group(1)} out-of-bounds values (data check FAILED)")
            return
        m = re.match(r"Avg bus bandwidth\s*:\s*(\S+)\s*(\S*)", body)
        if m:
            v = _num(m.group(1))
            if v is None or not math.isfinite(v):
                self.problems.add(ln, f"cannot read the average bus bandwidth {m.group(1)!r}")
            else:
                self.cur.avg_busbw_GBps = v
            if m.group(2).upper() == "FAILED":
                self.problems.add(ln, "nccl-tests reports the average bus bandwidth below NCCL_TESTS_MIN_BW (FAILED)")
            self.cur.summary_line = ln
            return
        m = re.match(r"Reducing maxBytes to (\d{1,20})", body)
        if m:
            self.cur.reduced_max_bytes = int(m.group(1))
            return
        m = re.match(r"Writing JSON output to (.*)$", body)
        if m:
            self.json_output = m.group(1).strip()
            return
        if re.match(r"error\s*:", body, re.IGNORECASE):
            self.problems.add(ln, f"the output reports an error: {_clip(body, 200)}")
            return
        if body.startswith(("Blocking Enabled", "Parallel Init")):
            return

    def _params(self, s: str) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for key, rx in _PARAM_ITEMS:
            m = re.search(rx, s)
            if m:
                params[key] = int(m.group(1))
        m = _STEP_RE.search(s)
        if m:
            params["step_factor" if m.group(2) == "factor" else "step_bytes"] = int(m.group(1))
        return params

    def _op_hint(self, ln: int, name: str, text: str, *, command: bool, args: dict[str, Any] | None) -> None:
        if self._started():
            self._new_run(ln)
        try:
            op = canonical_op(name)
        except ValueError:
            self.problems.add(ln, f"unknown test binary {name!r}; the collective is read from the rows")
            op = None
        self.cur.op_hint, self.cur.op_hint_line, self.cur.op_hint_raw = op, ln, name
        if command:
            self.cur.command = _clip(text, 1000)
            self.cur.args = args

    def _nccl_log(self, ln: int, s: str) -> None:
        m = _NRANKS_RE.search(s)
        if m:
            self.cur.nccl_nranks.add(int(m.group(1)))
        m = re.search(r"NCCL version (\S+)", s)
        if m:
            self.versions.setdefault("nccl_version", m.group(1))
        m = re.search(r"RCCL version (\S+)", s)
        if m:
            self.versions.setdefault("rccl_version", m.group(1))
        if re.search(r"\b[NR]CCL (?:WARN|ABORT)\b", s):
            self.problems.add(ln, f"NCCL warning: {_clip(s, 200)}")

    def _versions(self, ln: int, s: str) -> bool:
        for key, rx in (
            ("rccl_tests_version", r"^rccl-tests:\s*Version\s+(\S+)"),
            ("rccl_version", r"^RCCL version\s*:?\s*(\S+)"),
            ("nccl_version", r"^NCCL version\s*:?\s*(\S+)"),
            ("hip_version", r"^HIP version\s*:\s*(\S+)"),
            ("rocm_version", r"^ROCm version\s*:\s*(\S+)"),
        ):
            m = re.match(rx, s)
            if m:
                self.versions.setdefault(key, m.group(1))
                return True
        return bool(re.match(r"^(Hostname|Librccl path)\s*:", s))

    def finish(self) -> None:
        self._flush_pending()
        self.runs.append(self.cur)
        if len(self.row_lines) > 1:
            first = ", ".join(f"{r} (line {ln})" for r, ln in sorted(self.row_lines.items(), key=lambda t: t[1]))
            self.problems.add(min(self.row_lines.values()),
                              f"data rows come from several MPI processes: {first}; nccl-tests prints rows only from "
                              "rank 0, so these are probably independent single-process runs (built without MPI=1?)")


# --------------------------------------------------------------------------------------------------------------------
# From a run's raw rows to BusbwRows
# --------------------------------------------------------------------------------------------------------------------

#: What each collective's rows look like in nccl-tests: (reduces, rooted, size = count x element size x n).
_SIGNATURES: dict[str, tuple[bool, bool, bool]] = {
    "all_reduce": (True, False, False),
    "all_gather": (False, False, True),
    "reduce_scatter": (True, False, True),
    "broadcast": (False, True, False),
    "reduce": (True, True, False),
    "all_to_all": (False, False, True),
    "sendrecv": (False, False, False),
    "gather": (False, True, True),
    "scatter": (False, True, True),
}
#: Ops whose in-place half nccl-tests does not check (``N/A``).
_UNCHECKED_IN_PLACE = ("all_to_all", "sendrecv")


def _group_size(run: _Run, problems: _Problems) -> int | None:
    n_dev: int | None = None
    if run.devices:
        ranks = [d["rank"] for d in run.devices]
        if len(set(ranks)) != len(ranks):
            problems.add(run.devices_line, "the device list names the same rank more than once: several independent "
                                           "runs (nccl-tests built without MPI=1?)")
        groups = {d["group"] for d in run.devices}
        if len(groups) > 1:
            g0 = min(run.devices, key=lambda d: d["rank"])["group"]
            n_dev = len({d["rank"] for d in run.devices if d["group"] == g0})
        else:
            n_dev = len(set(ranks))
    n_nccl = max(run.nccl_nranks) if run.nccl_nranks else None
    if n_dev is not None and n_nccl is not None and n_dev != n_nccl:
        problems.add(run.devices_line, f"the device list has {n_dev} ranks but NCCL reports nranks {n_nccl}; "
                                       f"using {n_nccl}")
        return n_nccl
    return n_dev if n_dev is not None else n_nccl


def _half_units(tokens: list[str]) -> np.ndarray:
    """:func:`_half_unit` of each token, as an array (a plain decimal from its length and dot; the rare exponent one by
    one)."""
    count = len(tokens)
    lens = np.fromiter(map(len, tokens), np.int64, count)
    dots = np.fromiter((t.find(".") for t in tokens), np.int64, count)
    out: np.ndarray = 0.5 * 10.0 ** -np.where(dots < 0, 0, lens - dots - 1).astype(float)
    for i in [i for i, t in enumerate(tokens) if "e" in t or "E" in t]:
        out[i] = _half_unit(tokens[i])
    return out


class _Timed:
    """The halves of a run's rows that carry a time (> 0: a time printed as 0.00, damaged or below the printed
    resolution, says nothing of the op's arithmetic), as arrays: every candidate collective's arithmetic is checked
    on all of them at once, not row by row (a table of a million rows in a fraction of a second)."""

    def __init__(self, run: _Run) -> None:
        self.pairs = [(r.size, h) for r in run.rows for h in r.halves if h.time_us > 0]
        halves = [h for _, h in self.pairs]
        self.size = np.array([s for s, _ in self.pairs], dtype=float)
        self.time_us = np.array([h.time_us for h in halves], dtype=float)
        self.dt = _half_units([h.time_tok for h in halves])
        self.values = {"busbw": (np.array([h.busbw_GBps for h in halves], dtype=float),
                                 _half_units([h.busbw_tok for h in halves])),
                       "algbw": (np.array([h.algbw_GBps for h in halves], dtype=float),
                                 _half_units([h.algbw_tok for h in halves]))}

    def fits(self, f: float, which: str = "busbw") -> np.ndarray:
        """Per half: the printed busbw (or algbw) == size / time x f, within what the printed digits allow.

        size / time rather than the printed algbw: nccl-tests before 2019 printed algbw = size (n-1)/n / time for
        all_gather and reduce_scatter (with busbw = algbw), so only busbw means the same in every version.
        """
        value, dv = self.values[which]
        t_hi, t_lo = self.time_us + self.dt, self.time_us - self.dt
        gb_per_s_us = self.size * f / GB / US  # (bytes / GB) per microsecond -> GB/s
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = np.where(t_hi > 0, gb_per_s_us / t_hi - dv, -dv)
            hi = np.where(t_lo > 0, gb_per_s_us / t_lo + dv, np.inf)
        ok: np.ndarray = (lo * (1 - 1e-9) - 1e-12 <= value) & (value <= hi * (1 + 1e-9) + 1e-12)
        return ok


def _evidence(run: _Run, n: int | None) -> dict[str, Any]:
    redops = {r.redop for r in run.rows if r.redop is not None}
    reduces = None
    if redops & _REDOPS:
        reduces = True
    elif redops and redops <= {"none"}:
        reduces = False
    roots = {r.root for r in run.rows if r.root is not None}
    rooted = None
    if roots:
        rooted = any(x >= 0 for x in roots)
    mults: set[float] = set()
    for r in run.rows:
        ts = _DTYPE_BYTES.get(_canonical_dtype(r.type_name))
        if ts and r.count > 0:
            mults.add(r.size / (r.count * ts))
    size_mult = mults.pop() if len(mults) == 1 else None
    unchecked = any(
        len(r.halves) == 2 and r.halves[0].wrong is not None and r.halves[1].wrong is None
        and r.halves[1].max_error is None for r in run.rows
    )
    return {"reduces": reduces, "rooted": rooted, "size_mult": size_mult, "unchecked_in_place": unchecked}


def _fits(op: str, ev: dict[str, Any], run: _Run, n: int | None, timed: _Timed) -> list[str]:
    """Why the rows are not ``op`` output (empty when they could be)."""
    reasons: list[str] = []
    sig = _SIGNATURES.get(op)
    if sig is None:
        return reasons
    reduces, rooted, times_n = sig
    if ev["reduces"] is not None and ev["reduces"] != reduces:
        redop = next((r.redop for r in run.rows if r.redop is not None), None)
        reasons.append(f"redop is {redop!r} ({op} {'reduces' if reduces else 'does not reduce'})")
    if ev["rooted"] is not None and ev["rooted"] != rooted:
        root = next((r.root for r in run.rows if r.root is not None), None)
        reasons.append(f"root is {root} ({op} {'has a root' if rooted else 'has no root'})")
    mult = ev["size_mult"]
    if mult is not None and n is not None:
        want = n if times_n else 1
        if abs(mult - want) > 1e-9:
            reasons.append(f"size = {mult:g} x count x element size ({op} over {n} ranks: {want})")
    if n is not None:
        f = busbw_factor(op, n)
        bad = ~timed.fits(f)
        if bad.any():  # the first of the halves whose size / time is largest
            i = int(np.argmax(np.where(bad, timed.size / np.maximum(timed.time_us, 1e-12), -np.inf)))
            size, h = timed.pairs[i]
            ratio = h.busbw_GBps / (size / GB / (h.time_us * US)) if size and h.time_us else float("nan")
            reasons.append(f"busbw / (size/time) = {ratio:.4g} ({op} over {n} ranks: {f:.4g})")
    return reasons


def _resolve_op(run: _Run, n: int | None, override: str | None, problems: _Problems, timed: _Timed) -> str:
    ln = run.rows[0].line
    ev = _evidence(run, n)
    candidates = [op for op in _SIGNATURES if not _fits(op, ev, run, n, timed)]
    if ev["unchecked_in_place"]:
        candidates.sort(key=lambda op: op not in _UNCHECKED_IN_PLACE)
    named = override or run.op_hint
    if named is not None:
        reasons = _fits(named, ev, run, n, timed)
        if not reasons:
            return named
        if override is not None:
            problems.add(ln, f"the rows do not look like {named} output ({'; '.join(reasons)}); kept op={named} "
                             "as asked")
            return named
        where = f"line {run.op_hint_line} names {run.op_hint_raw}"
        if candidates:
            problems.add(ln, f"{where}, but the rows are not {named} output ({'; '.join(reasons)}); "
                             f"reading them as {candidates[0]}")
            return candidates[0]
        problems.add(ln, f"{where}, but the rows do not fit it ({'; '.join(reasons)}); kept {named}")
        return named
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        problems.add(ln, "the rows fit no nccl-tests collective and no command line names the test binary; "
                         "op is 'unknown' (pass op= to parse_nccl_tests)")
        return "unknown"
    if n == 1 or not ev["unchecked_in_place"] or len([c for c in candidates if c in _UNCHECKED_IN_PLACE]) != 1:
        alts = " or ".join(candidates)
        more = " with 1 rank" if n == 1 else ""
        problems.add(ln, f"no command line names the test binary and the rows{more} could be {alts}; "
                         f"assuming {candidates[0]} (pass op= to parse_nccl_tests to say)")
    return candidates[0]


def _finish_run(run: _Run, name: str, override: str | None, problems: _Problems, table: int = 1,
                row_type: Any = None) -> tuple[list[BusbwRow], dict]:
    n = _group_size(run, problems)
    if n is None:
        problems.add(run.rows[0].line, "no '# Using devices' rank lines and no NCCL 'nranks': group size unknown")
    timed = _Timed(run)
    op = _resolve_op(run, n, override, problems, timed)
    hosts = list(dict.fromkeys(d["host"] for d in run.devices))
    num_nodes = len(hosts) if hosts else None
    intra = None if num_nodes is None else num_nodes == 1
    rows: list[BusbwRow] = []
    unknown_types: set[str] = set()
    for r in run.rows:
        dtype = _canonical_dtype(r.type_name)
        if dtype not in _DTYPE_BYTES:
            unknown_types.add(r.type_name)
        redop = None if r.redop in (None, "none") else r.redop
        root = None if r.root is None or r.root < 0 else r.root
        if r.size > MAX_MESSAGE_BYTES:
            problems.add(r.line, f"size {r.size} B is larger than any real message (> 1 TiB): row skipped")
            continue
        for h in r.halves:
            row = (row_type or BusbwRow)(
                op=op, size_bytes=r.size, count=r.count, dtype=dtype, redop=redop, root=root, group_size=n,
                time_s=h.time_us * US, algbw_bytes_per_s=h.algbw_GBps * GB, busbw_bytes_per_s=h.busbw_GBps * GB,
                wrong=h.wrong, in_place=h.in_place, source=f"{name}:{r.line}", max_error=h.max_error, intra_node=intra,
                table=table,
            )
            rows.append(row)
            where = f"{op} {r.size} B {'in-place' if h.in_place else 'out-of-place'}"
            if h.wrong is not None and h.wrong > 0:
                problems.add(r.line, f"{where}: #wrong = {h.wrong} (the data check found wrong elements)")
            elif row.failed_check:
                problems.add(r.line, f"{where}: max error {h.max_error:g} exceeds nccl-tests' bound "
                                     f"{_error_bound(dtype, n):.2g} for {dtype} over {n or '?'} ranks")
            elif h.starred:
                problems.add(r.line, f"{where}: the error is marked '*' (above rccl-tests' threshold)")
            fastest = max(row.algbw_bytes_per_s, row.busbw_bytes_per_s)
            if fastest > LINK_BANDWIDTH_RANGE_BYTES_PER_S[1]:
                problems.add(r.line, f"{where}: time {h.time_us:g} us gives {fastest / GB:,.2f} GB/s, above any real "
                                     f"link ({LINK_BANDWIDTH_RANGE_BYTES_PER_S[1] / GB:,.0f} GB/s): a time too short "
                                     f"to have moved the data, not a measurement")
    for t in sorted(unknown_types):
        problems.add(run.rows[0].line, f"unknown element type {t!r}; kept as is")
    outside = next((r for r in run.rows if r.root is not None and r.root >= (n or math.inf)), None)
    if outside is not None and n:  # a traffic matrix could not place it: it starts a rooted op at the group's rank 0
        problems.add(outside.line, f"root {outside.root} is not a rank of the {n}-rank group (0 to {n - 1}): a "
                                   f"traffic matrix takes rank 0 for it")
    last = run.rows[-1].line
    if not run.summary_line:
        problems.add(last, "the table stops without nccl-tests' summary ('# Avg bus bandwidth'): the run did not "
                           "finish or its output was cut")
    _check_sizes(run, n, problems)
    algbw_convention = None
    if timed.fits(1.0, "algbw").all():
        algbw_convention = "size/time"
    elif n and timed.fits((n - 1) / n, "algbw").all():
        algbw_convention = "size*(n-1)/n/time"  # nccl-tests before 2019, all_gather and reduce_scatter
    meta = {
        "op": op,
        "nranks": n,
        "num_nodes": num_nodes,
        "hosts": hosts,
        "devices": [dict(d) for d in run.devices],
        "params": dict(run.params) if run.params else None,
        "command": run.command,
        "args": dict(run.args) if run.args else None,
        "avg_busbw_GBps": run.avg_busbw_GBps,
        "out_of_bounds": run.out_of_bounds,
        "num_rows": len(rows),
        "first_line": run.rows[0].line,
        "last_line": last,
        "complete": bool(run.summary_line),
        "algbw_convention": algbw_convention,
        "op_named": run.op_hint,
        "op_named_line": run.op_hint_line or None,
        "roots": sorted({r.root for r in rows if r.root is not None}),
        "table": table,
    }
    meta["hardware"] = _hardware(meta) or None
    return rows, meta


def _check_sizes(run: _Run, n: int | None, problems: _Problems) -> None:
    p = run.params
    if not p or "min_bytes" not in p or "max_bytes" not in p:
        return
    sizes = [r.size for r in run.rows]
    max_bytes = run.reduced_max_bytes if run.reduced_max_bytes is not None else p["max_bytes"]
    slack = 8 * (n or 1)  # gathered sizes are rounded down to whole elements per rank
    lo, hi = min(sizes), max(sizes)
    if hi > max_bytes or lo + slack < p["min_bytes"]:
        problems.add(run.params_line, f"the rows span {lo}-{hi} B but this parameter line says minBytes "
                                      f"{p['min_bytes']} maxBytes {max_bytes}: it may belong to another run")


def _hardware(run: dict) -> str:
    """The GPUs and hosts of a run, as a problem line names them ('' when the run lists no devices)."""
    names = Counter(str(d.get("name")) for d in run["devices"])
    gpus = ", ".join(f"{k} x {v}" if v > 1 else k for k, v in sorted(names.items()))
    return f"{gpus} on {', '.join(sorted(run['hosts']))}" if gpus else ""


def _curve(row: BusbwRow) -> tuple:
    """What one fitted curve or bandwidth table holds: one op over one group size and placement, in one type,
    reduction op and root (rows that differ in any of these are never pooled: fit and --bandwidth keep them apart
    or refuse them, see :func:`commscope.measure.bench.fitted.mixed_variants`)."""
    return row.op, row.group_size, row.intra_node, row.dtype, row.redop, row.root


def mixed_hardware(rows: Iterable[BusbwRow], runs: list[dict]) -> tuple[str, int | None, list[dict]] | None:
    """The first curve of ``rows`` (one op over one group size and placement, in one type, reduction op and root)
    timed in tables of other hardware, their device lists naming other GPUs or hosts (two machines' outputs pasted
    into one file): (op, group size, the meta of those tables in file order); None when each curve's tables ran on
    one machine or do not say on which. ``runs`` is ``meta["runs"]`` of the result ``rows`` come from. Pooled, such
    rows would make one curve of two machines; one taken, the other would vanish: fit and --bandwidth refuse them
    until ``commscope fit --run`` picks tables (:func:`pick_tables` says how)."""
    tables: dict[tuple, list[int]] = {}
    for r in rows:
        seen = tables.setdefault(_curve(r), [])
        if r.table not in seen:
            seen.append(r.table)
    for (op, n, *_), numbers in tables.items():
        if len({runs[t - 1].get("hardware") for t in numbers} - {None}) > 1:
            return op, n, [runs[t - 1] for t in sorted(numbers)]
    return None


def describe_tables(runs: list[dict]) -> str:
    """``table 1 (from line 18: NVIDIA A100-SXM4-80GB x 8 on dkh) and table 2 (from line 69: ...)``."""
    parts = [f"table {r['table']} (from line {r['first_line']}: {r.get('hardware') or 'devices not listed'})"
             for r in runs]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def pick_tables(runs: list[dict]) -> str:
    """How ``commscope fit --run`` picks one machine's tables of ``runs``: ``--run 1,3 or --run 2``."""
    by_hardware: dict[str | None, list[int]] = {}
    for r in runs:
        by_hardware.setdefault(r.get("hardware"), []).append(r["table"])
    return " or ".join(f"--run {','.join(map(str, t))}" for t in by_hardware.values())


#: How a problem line names two tables that time the same thing; :func:`repeated_tables` reads the pair back from
#: it, so the text is written (in _check_repeats) and read from this one constant.
_REPEAT_HEAD = "the tables from line {} and from line {} both time "
_REPEAT_RE = re.compile(r":\d{1,12}: " + re.escape(_REPEAT_HEAD).replace(r"\{\}", r"(\d{1,12})"))


def repeated_tables(problem: str, runs: list[dict]) -> tuple[int, int] | None:
    """The two tables (numbers from 1) a problem line of :func:`parse_nccl_tests` says time the same thing (a repeat,
    or two machines' outputs); None for any other problem."""
    m = _REPEAT_RE.search(problem)
    if m is None:
        return None
    table = {r["first_line"]: r["table"] for r in runs}
    a, b = table.get(int(m[1])), table.get(int(m[2]))
    return (a, b) if a is not None and b is not None else None


def _check_repeats(runs: list[dict], rows: list[BusbwRow], problems: _Problems) -> None:
    """Tables that time what an earlier table of the file times (one op over one group size and placement, in one
    type, reduction op and root) are said, once each. On one machine (or where a table lists no devices) they are
    a repeat: a fit and a bandwidth table pool their rows, each size's median, and a summary counts them all. On
    other hardware (their device lists name other GPUs or hosts: two logs pasted together) their rows are never
    pooled: fit and --bandwidth refuse them together until ``fit --run`` picks one machine's tables. Tables of
    other roots (``-r 0``, then ``-r 1``), types or reduction ops are no repeat: each row keeps its own, and fit
    and ``--bandwidth`` take one at a time."""
    curves: dict[int, set[tuple]] = {}
    for row in rows:
        curves.setdefault(row.table, set()).add(_curve(row))
    earlier: list[dict] = []
    for run in runs:
        mine = curves.get(run["table"], set())
        same = [r for r in earlier if curves.get(r["table"], set()) & mine]
        earlier.append(run)
        if not same:
            continue
        b = run["hardware"]  # (None where the table lists no devices)
        other = [r for r in same if r["hardware"] and b and r["hardware"] != b]
        alike = [r for r in same if r not in other]
        for first in (alike[:1] + other[:1]):  # a repeat of this machine's, and another machine's table: each said
            a = first["hardware"]
            both = sorted({c[5] for c in curves[first["table"]] & mine if c[5] is not None})
            at = f" from root{'s' if len(both) > 1 else ''} {', '.join(map(str, both))}" if both else ""
            what = (_REPEAT_HEAD.format(first["first_line"], run["first_line"])
                    + f"{run['op']} over {run['nranks'] or '?'} ranks{at}")
            if first in other:
                problems.add(run["first_line"], f"{what} but on other hardware ({a}; then {b}): their rows are not "
                                                f"pooled (fit and --bandwidth refuse them together; fit --run "
                                                f"{first['table']} or --run {run['table']} takes one machine's tables)")
            else:
                problems.add(run["first_line"], f"{what}: their rows are pooled as one measurement, each size's "
                                                f"median (a run repeated, or one output pasted twice?)")


def _merge_meta(runs: list[dict], versions: dict[str, str], json_output: str | None) -> dict[str, Any]:
    keys = ("op", "nranks", "num_nodes", "hosts", "params", "command", "args", "avg_busbw_GBps", "algbw_convention",
            "roots")
    meta: dict[str, Any] = {}
    for key in keys:
        vals = [r[key] for r in runs]
        meta[key] = vals[0] if all(v == vals[0] for v in vals) else None
    # The same GPUs in every run (process ids aside): list them once.
    same = [[{k: v for k, v in d.items() if k != "pid"} for d in r["devices"]] for r in runs]
    meta["devices"] = runs[0]["devices"] if all(x == same[0] for x in same) else None
    oob = [r["out_of_bounds"] for r in runs]
    meta["out_of_bounds"] = sum(oob) if all(v is not None for v in oob) else None
    meta["ops"] = list(dict.fromkeys(r["op"] for r in runs))
    for key in ("nccl_version", "nccl_tests_version", "rccl_version", "rccl_tests_version", "hip_version",
                "rocm_version"):
        meta[key] = versions.get(key)
    if json_output:
        meta["json_output"] = json_output
    meta["runs"] = runs
    return meta


# --------------------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------------------


def _read_source(source: str | Path) -> tuple[str, str]:
    """(display name, text) of a path or of the output itself."""
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and "\r" not in source):
        from commscope.io.import_base import read_input

        if not Path(source).exists():
            raise ValueError(f"{source}: no such file (pass a path to nccl-tests output, or the output itself)")
        name, data = read_input(source)
        return name, data.decode("utf-8", errors="replace")
    if not isinstance(source, str):
        raise ValueError(f"expected a path or the text of nccl-tests output, got {type(source).__name__}")
    return "<text>", source


def parse_nccl_tests(source: str | Path, *, op: str | None = None, quick: bool = False) -> NcclTestsResult:
    """Read nccl-tests / rccl-tests stdout from a path (``.gz`` too) or from the text itself.

    ``op`` names the collective when the output does not (any name :func:`canonical_op` knows); the rows are still
    checked against it. ``quick``: the rows as :class:`QuickRow` (the same fields, faster to make, for a reader of a
    million rows). Raises ValueError when nothing in the output is a data row, or the file cannot be read.
    """
    override = canonical_op(op) if op is not None else None
    name, text = _read_source(source)
    reader = _Reader(name)
    lines = text.splitlines()
    for ln, raw in enumerate(lines, start=1):
        reader.feed(ln, raw)
    reader.finish()
    runs = [r for r in reader.runs if r.rows]
    if not runs:
        why = [p for p in reader.problems.render()]
        hint = f"; the output reports: {' | '.join(why[:5])}" if why else ""
        raise ValueError(f"{name}: no nccl-tests data rows found (expected lines like '{_EXAMPLE_ROW}'){hint}")
    rows: list[BusbwRow] = []
    run_meta: list[dict] = []
    for table, run in enumerate(runs, start=1):
        r, m = _finish_run(run, name, override, reader.problems, table, row_type=QuickRow if quick else None)
        rows.extend(r)
        run_meta.append(m)
    _check_repeats(run_meta, rows, reader.problems)
    meta = _merge_meta(run_meta, reader.versions, reader.json_output)
    return NcclTestsResult(rows=rows, meta=meta, problems=reader.problems.render())
