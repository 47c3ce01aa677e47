"""A nccl-tests table as columns, for readers of a million rows (``commscope fit``): plain data rows read a block
at a time, a run's rows as arrays, and :class:`QuickRows`, what ``parse_nccl_tests(..., quick=True)`` gives.

:func:`_read_block` reads a block of lines in one pass when every one of them is a plain data row of the table's
layout (the rows :func:`~commscope.io.nccl_tests_lines._fast_row` matches, numbers that fit 64 bits); anything else
(a prefix, an NCCL line cut in, a damaged number, the end of the table) makes it say None, and the reader reads
those lines one by one as before, so the rows and the problems are the same either way. :class:`_Columns` holds a
run's rows as arrays, from such blocks and from rows read one by one alike, for the checks of
:mod:`commscope.io.nccl_tests` and :mod:`commscope.io.nccl_tests_collective` to run on all rows at once.

Private to the nccl-tests parser; :class:`QuickRows` is re-exported by :mod:`commscope.io.nccl_tests`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from commscope.io.nccl_tests_lines import _FAST_REDOPS, _FAST_TYPES, _INT_RE, _RawRow, _Schema, _fast_row
from commscope.io.nccl_tests_rows import QuickRow

__all__ = ["QuickRows"]

#: The bytes a block of plain rows may hold: digits, letters, '_', '.', '-', blanks and the line separator '|'.
_PLAIN_BYTES = bytes(sorted(set(b"0123456789._-| \t" + bytes(range(ord("a"), ord("z") + 1))
                                + bytes(range(ord("A"), ord("Z") + 1)))))
#: Largest whole-number token a block takes (18 digits: a 64-bit integer holds it); longer ones go line by line.
_MAX_INT_DIGITS = 18
#: Most digits before and after the point of a number of a plain row (the fast row's ``\d{1,30}(?:\.\d{1,30})?``).
_MAX_DIGITS = 30


@dataclass(slots=True)
class _Block:
    """Plain data rows of consecutive lines, as columns (two halves each: out-of-place, in-place)."""

    first_line: int
    size: list[int]
    count: list[int]
    type_name: list[str]
    redop: list[str | None]
    root: list[int | None]
    time_us: np.ndarray
    """(2, k): time of each half, microseconds; likewise ``algbw_GBps``, ``busbw_GBps``, ``wrong``."""
    algbw_GBps: np.ndarray
    busbw_GBps: np.ndarray
    wrong: np.ndarray
    dt: np.ndarray
    """(3, 2, k): half of the last printed digit of time, algbw and busbw (:func:`~commscope.io.nccl_tests_lines._half_unit`)."""

    def __len__(self) -> int:
        return len(self.size)


def _whole(col: list[str]) -> list[int] | None:
    """The tokens of ``col`` as ints when each is 1-18 digits, else None."""
    if " ".join(col).encode("ascii").translate(None, b"0123456789 ") or max(map(len, col)) > _MAX_INT_DIGITS:
        return None
    return list(map(int, col))


def _decimal(col: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, half units) of ``col`` when each token is a plain decimal of the fast row (digits, at most one point
    with digits on both sides, at most 30 digits each side), else None."""
    joined = " ".join(col).encode("ascii")
    if joined.translate(None, b"0123456789. "):
        return None
    k = len(col)
    lens = np.fromiter(map(len, col), np.int64, k)
    dots = np.fromiter(map(str.find, col, itertools.repeat(".")), np.int64, k)
    has = dots >= 0
    if int(has.sum()) != joined.count(b"."):  # a token with two points
        return None
    frac = np.where(has, lens - dots - 1, 0)
    whole = np.where(has, dots, lens)
    if (whole < 1).any() or (whole > _MAX_DIGITS).any() or (has & (frac < 1)).any() or (frac > _MAX_DIGITS).any():
        return None
    values = np.fromiter(map(float, col), np.float64, k)
    return values, 0.5 * 10.0 ** -frac.astype(float)


def _read_block(lines: Sequence[str], start: int, stop: int, schema: _Schema) -> _Block | None:
    """``lines[start:stop]`` (the file's lines ``start + 1`` ...) as a block of plain data rows of ``schema``'s
    table, each as the fast row reads it; None unless every line is one (then they are read one by one)."""
    names = schema.head_names[3:]
    if _fast_row(schema) is None or "redop" not in names:  # only where the line-by-line reader's fast row reads them
        return None
    ncol = 3 + len(names) + 8
    k = stop - start
    text = " | ".join(lines[start:stop])
    if not text.isascii() or text.encode("ascii").translate(None, _PLAIN_BYTES):
        return None
    toks = text.split()
    if len(toks) != k * (ncol + 1) - 1 or toks.count("|") != k - 1 or toks[ncol::ncol + 1].count("|") != k - 1:
        return None  # a line of another number of columns, or a blank one
    cols = [toks[c::ncol + 1] for c in range(ncol)]
    size, count = _whole(cols[0]), _whole(cols[1])
    if size is None or count is None or not all(t.lower() in _FAST_TYPES for t in set(cols[2])):
        return None
    redop: list[str | None] = [None] * k
    root: list[int | None] = [None] * k
    for name, col in zip(names, cols[3:3 + len(names)], strict=True):
        if name == "redop":
            if not set(col) <= _FAST_REDOPS:
                return None
            redop = list(col)
        else:
            if not all(_INT_RE.fullmatch(t) for t in set(col)):
                return None
            root = list(map(int, col))
    values: list[list[np.ndarray]] = [[], [], []]  # time, algbw, busbw: out-of-place, in-place
    units: list[list[np.ndarray]] = [[], [], []]
    wrong: list[list[int]] = []
    for h in range(2):
        first = 3 + len(names) + 4 * h
        for j in range(3):
            read = _decimal(cols[first + j])
            if read is None:
                return None
            values[j].append(read[0])
            units[j].append(read[1])
        counts = _whole(cols[first + 3])
        if counts is None:
            return None
        wrong.append(counts)
    return _Block(first_line=start + 1, size=size, count=count, type_name=cols[2], redop=redop, root=root,
                  time_us=np.stack(values[0]), algbw_GBps=np.stack(values[1]), busbw_GBps=np.stack(values[2]),
                  wrong=np.array(wrong, dtype=np.int64), dt=np.stack([np.stack(u) for u in units]))


class _Columns:
    """A run's rows (from :class:`_Block` and :class:`~commscope.io.nccl_tests_lines._RawRow` alike, in file order)
    as columns: one entry per row (``line``, ``size``, ``count``, ``type_name``, ``redop``, ``root``) and one per half
    of a row, out-of-place then in-place (``row``: its row's index; ``in_place``, ``time_us``, ``algbw_GBps``,
    ``busbw_GBps``, ``wrong``, ``max_error``, ``starred`` and the half units ``dt`` of time, algbw, busbw)."""

    def __init__(self, items: Sequence[_RawRow | _Block]) -> None:
        from commscope.io.nccl_tests_collective import _half_units

        line: list[np.ndarray] = []
        self.size: list[int] = []
        self.count: list[int] = []
        self.type_name: list[str] = []
        self.redop: list[str | None] = []
        self.root: list[int | None] = []
        self.wrong: list[int | None] = []
        self.max_error: list[float | None] = []
        half: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "in_place", "time_us", "algbw_GBps", "busbw_GBps",
                                                             "starred", "dt_time", "dt_algbw", "dt_busbw")}
        raw: list[_RawRow] = []
        wrong_positive: list[np.ndarray] = []

        def flush() -> None:  # rows read one by one, as columns
            if not raw:
                return
            base = len(self.size) - len(raw)
            hs = [(base + i, h) for i, r in enumerate(raw) for h in r.halves]
            line.append(np.array([r.line for r in raw], dtype=np.int64))
            half["row"].append(np.array([i for i, _ in hs], dtype=np.int64))
            half["in_place"].append(np.array([h.in_place for _, h in hs], dtype=bool))
            for key in ("time_us", "algbw_GBps", "busbw_GBps"):
                half[key].append(np.array([getattr(h, key) for _, h in hs], dtype=float))
            half["starred"].append(np.array([h.starred for _, h in hs], dtype=bool))
            for key, tok in (("dt_time", "time_tok"), ("dt_algbw", "algbw_tok"), ("dt_busbw", "busbw_tok")):
                half[key].append(_half_units([getattr(h, tok) for _, h in hs]))
            self.wrong.extend(h.wrong for _, h in hs)
            wrong_positive.append(np.array([h.wrong is not None and h.wrong > 0 for _, h in hs], dtype=bool))
            self.max_error.extend(h.max_error for _, h in hs)
            raw.clear()

        for item in items:
            if isinstance(item, _RawRow):
                raw.append(item)
                self.size.append(item.size)
                self.count.append(item.count)
                self.type_name.append(item.type_name)
                self.redop.append(item.redop)
                self.root.append(item.root)
                continue
            flush()
            k = len(item)
            base = len(self.size)
            line.append(np.arange(item.first_line, item.first_line + k, dtype=np.int64))
            self.size.extend(item.size)
            self.count.extend(item.count)
            self.type_name.extend(item.type_name)
            self.redop.extend(item.redop)
            self.root.extend(item.root)
            half["row"].append(np.repeat(np.arange(base, base + k, dtype=np.int64), 2))
            half["in_place"].append(np.tile(np.array([False, True]), k))
            half["time_us"].append(item.time_us.T.ravel())
            half["algbw_GBps"].append(item.algbw_GBps.T.ravel())
            half["busbw_GBps"].append(item.busbw_GBps.T.ravel())
            half["starred"].append(np.zeros(2 * k, dtype=bool))
            for j, key in enumerate(("dt_time", "dt_algbw", "dt_busbw")):
                half[key].append(item.dt[j].T.ravel())
            self.wrong.extend(item.wrong.T.ravel().tolist())
            wrong_positive.append(item.wrong.T.ravel() > 0)
            self.max_error.extend([None] * (2 * k))
        flush()
        self.line: np.ndarray = np.concatenate(line)
        self.wrong_positive: np.ndarray = np.concatenate(wrong_positive)
        """Per half: ``#wrong`` > 0 (the data check found wrong elements)."""
        self.with_max_error: list[int] = [j for j, e in enumerate(self.max_error) if e is not None]
        """The halves with an old ``error`` column's value."""
        arrays = {key: np.concatenate(parts) for key, parts in half.items()}
        self.row: np.ndarray = arrays["row"]
        self.in_place: np.ndarray = arrays["in_place"]
        self.time_us: np.ndarray = arrays["time_us"]
        self.algbw_GBps: np.ndarray = arrays["algbw_GBps"]
        self.busbw_GBps: np.ndarray = arrays["busbw_GBps"]
        self.starred: np.ndarray = arrays["starred"]
        self.dt_time: np.ndarray = arrays["dt_time"]
        self.dt_algbw: np.ndarray = arrays["dt_algbw"]
        self.dt_busbw: np.ndarray = arrays["dt_busbw"]

    def sizes_float(self) -> np.ndarray:
        """Each row's size as a float (as the checks of the printed bandwidths read it)."""
        return np.array(self.size, dtype=float)

    def first(self, values: Sequence[Any]) -> Any:
        """The first of ``values`` (a row column) that is not None, or None."""
        return next((v for v in values if v is not None), None)


#: QuickRow's fields, in order.
_FIELDS = QuickRow._fields


class QuickRows:
    """The halves of a file's data rows as columns, in file order (out-of-place, then in-place): what
    ``parse_nccl_tests(..., quick=True)`` gives a reader of a million rows (``commscope fit``). Iterated, each half is
    a :class:`~commscope.io.nccl_tests_rows.QuickRow`, the same fields as :class:`~commscope.io.nccl_tests.BusbwRow`;
    the columns (``size_bytes``, ``time_s``, ``in_place``, ``failed_check``, ``line``, ``table``, ...) let such a reader
    check every row at once. ``op``, ``group_size`` and ``intra_node`` are one per table (``tables[table]``)."""

    def __init__(self, name: str, tables: dict[int, tuple[str, int | None, bool | None]], cols: dict[str, Any]) -> None:
        self.name = name
        self.tables = tables
        self.cols = cols

    @classmethod
    def concat(cls, name: str, parts: Sequence[QuickRows]) -> QuickRows:
        tables = {t: v for p in parts for t, v in p.tables.items()}
        keys = parts[0].cols.keys() if parts else ()
        cols: dict[str, Any] = {}
        for key in keys:
            values = [p.cols[key] for p in parts]
            cols[key] = (np.concatenate(values) if isinstance(values[0], np.ndarray)
                         else list(itertools.chain.from_iterable(values)))
        return cls(name, tables, cols)

    def __len__(self) -> int:
        return len(self.cols["time_s"]) if self.cols else 0

    def __getattr__(self, key: str) -> Any:
        cols = object.__getattribute__(self, "cols")
        if key in cols:
            return cols[key]
        raise AttributeError(key)

    def take(self, mask: np.ndarray) -> QuickRows:
        """The halves where ``mask`` holds."""
        index = np.flatnonzero(mask)
        cols = {k: v[index] if isinstance(v, np.ndarray) else [v[i] for i in index.tolist()]
                for k, v in self.cols.items()}
        left = set(self.cols["table"][index].tolist())
        return QuickRows(self.name, {t: v for t, v in self.tables.items() if t in left}, cols)

    def tuples(self) -> Iterator[tuple[Any, ...]]:
        """Each half's fields, in :class:`~commscope.io.nccl_tests_rows.QuickRow`'s order."""
        c = self.cols
        table = c["table"].tolist()
        per_table = [self.tables[t] for t in table]
        lines = c["line"].tolist()
        yield from zip([t[0] for t in per_table], c["size_bytes"], c["count"], c["dtype"], c["redop"], c["root"],
                       [t[1] for t in per_table], c["time_s"].tolist(), c["algbw_bytes_per_s"].tolist(),
                       c["busbw_bytes_per_s"].tolist(), c["wrong"], c["in_place"].tolist(),
                       [f"{self.name}:{ln}" for ln in lines], c["max_error"], [t[2] for t in per_table], table,
                       strict=True)

    def __iter__(self) -> Iterator[QuickRow]:
        return map(QuickRow._make, self.tuples())

    def curve_tables(self) -> dict[tuple, list[int]]:
        """Each curve (op, group size, intra-node, type, reduction op, root: what one fitted curve holds) and the
        tables that time it, in the order they first come."""
        out: dict[tuple, list[int]] = {}
        c = self.cols
        for key in dict.fromkeys(zip(c["table"].tolist(), c["dtype"], c["redop"], c["root"], strict=True)):
            table, *variant = key
            op, n, intra = self.tables[table]
            seen = out.setdefault((op, n, intra, *variant), [])
            if table not in seen:
                seen.append(table)
        return out
