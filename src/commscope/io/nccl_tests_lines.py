"""How one line of nccl-tests / rccl-tests output is read: the patterns of its data rows, table headers, parameter,
command and failure lines; the parser's state (a table's columns, a row and its two halves, a run, the problems
found); and the reading of a data row from its tokens, with one regex for the plain rows of a large table.

Private to the nccl-tests parser: :mod:`commscope.io.nccl_tests_reader` reads lines with these, and
:mod:`commscope.io.nccl_tests` turns the state they build into rows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

#: At most this many problems are listed one by one; the rest are counted in one last entry.
MAX_PROBLEMS = 1000


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
    rows: list[Any] = field(default_factory=list)
    """The table's data rows in file order: each a :class:`_RawRow`, or a block of plain rows read at once
    (:class:`~commscope.io.nccl_tests_columns._Block`)."""
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

