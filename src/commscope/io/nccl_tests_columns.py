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
    size: np.ndarray
    count: np.ndarray
    variant: np.ndarray
    """Each row's (type, reduction op, root): an index into ``variants``."""
    variants: list[tuple[str, str | None, int | None]]
    time_us: np.ndarray
    """(2, k): time of each half, microseconds; likewise ``algbw_GBps``, ``busbw_GBps``, ``wrong``."""
    algbw_GBps: np.ndarray
    busbw_GBps: np.ndarray
    wrong: np.ndarray
    dt: np.ndarray
    """(3, 2, k): half of the last printed digit of time, algbw and busbw
    (:func:`~commscope.io.nccl_tests_lines._half_unit`)."""

    def __len__(self) -> int:
        return len(self.size)


def _codes(col: list[str]) -> tuple[np.ndarray, list[str]]:
    """Each token of ``col`` as the index of its value in the distinct values (in the order they come)."""
    index = {t: i for i, t in enumerate(dict.fromkeys(col))}
    return np.fromiter(map(index.__getitem__, col), np.int64, len(col)), list(index)


#: Most digits a token may have for :func:`_digits` to give its exact value (int64 holds 18; a float, 15 and a point).
_EXACT_DIGITS = 15


def _digits(joined: bytes, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` tokens of ``joined`` (digits and points, one blank between tokens): each one's length, the place of
    its first point (-1: none) and, where it has no more than 18 digits, the whole number its digits make (the point
    left out), all on the bytes at once. Where a token has two points, its point is -2."""
    chars = np.frombuffer(joined, dtype=np.uint8)
    blanks = np.flatnonzero(chars == ord(" "))
    starts = np.concatenate([[0], blanks + 1])
    lens = np.concatenate([blanks, [len(joined)]]) - starts
    points = np.flatnonzero(chars == ord("."))
    token = np.searchsorted(blanks, points)  # the token each point is in (ascending)
    dots = np.full(k, -1, dtype=np.int64)
    dots[token] = points - starts[token]
    count = np.bincount(token, minlength=k)
    dots[count > 1] = -2  # a token with two points or more
    digits = lens - count
    value = np.zeros(k, dtype=np.int64)
    if k and digits.min() >= 1 and digits.max() <= _MAX_INT_DIGITS:
        d = (chars[(chars != ord(" ")) & (chars != ord("."))] - ord("0")).astype(np.int64)
        first = np.concatenate([[0], np.cumsum(digits)[:-1]])
        after = np.repeat(first + digits - 1, digits) - np.arange(len(d))  # digits after each one in its token
        value = np.add.reduceat(d * _POW10[after], first)
    return lens, dots, value


_POW10 = 10 ** np.arange(19, dtype=np.int64)


def _whole(col: list[str]) -> np.ndarray | None:
    """The tokens of ``col`` as int64 when each is 1-18 digits, else None."""
    joined = " ".join(col).encode("ascii")
    if joined.translate(None, b"0123456789 "):
        return None
    lens, _, value = _digits(joined, len(col))
    return value if lens.max() <= _MAX_INT_DIGITS else None


def _decimal(col: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, half units) of ``col`` when each token is a plain decimal of the fast row (digits, at most one point
    with digits on both sides, at most 30 digits each side), else None. Each token's length, point and digits are
    read on the bytes of the whole column at once; its value is its digits' whole number over a power of ten (both
    exact in a float up to 15 digits: the quotient is the decimal correctly rounded, as float() gives it)."""
    joined = " ".join(col).encode("ascii")
    if joined.translate(None, b"0123456789. "):
        return None
    lens, dots, value = _digits(joined, len(col))
    has = dots >= 0
    frac = np.where(has, lens - dots - 1, 0)
    whole = np.where(has, dots, lens)
    if ((dots == -2).any() or (whole < 1).any() or (whole > _MAX_DIGITS).any() or (has & (frac < 1)).any()
            or (frac > _MAX_DIGITS).any()):
        return None
    if (lens - has).max() <= _EXACT_DIGITS:
        values = value / 10.0 ** frac
    else:
        values = np.fromiter(map(float, col), np.float64, len(col))
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
    if not text.isascii() or text.encode("ascii").translate(None, _PLAIN_BYTES) or text.count("|") != k - 1:
        return None  # (every '|' one between two lines: a token of its own)
    toks = text.split()
    if len(toks) != k * (ncol + 1) - 1 or toks[ncol::ncol + 1].count("|") != k - 1:
        return None  # a line of another number of columns, or a blank one
    cols = [toks[c::ncol + 1] for c in range(ncol)]
    size, count = _whole(cols[0]), _whole(cols[1])
    if size is None or count is None or not all(t.lower() in _FAST_TYPES for t in set(cols[2])):
        return None
    # type, reduction op, root: each row's code and the distinct values; then each row's (type, op, root) as one code
    parts: list[tuple[np.ndarray, list[Any]]] = [_codes(cols[2])]
    for name, col in zip(names, cols[3:3 + len(names)], strict=True):
        if name == "redop" and not set(col) <= _FAST_REDOPS:
            return None
        if name == "root" and not all(_INT_RE.fullmatch(t) for t in set(col)):
            return None
        parts.append(_codes(col))
    if "root" not in names:
        parts.append((np.zeros(k, dtype=np.int64), [None]))
    (tc, types), (rc, redops), (oc, roots) = parts
    code = (tc * len(redops) + rc) * len(roots) + oc
    distinct, first_at, variant = np.unique(code, return_index=True, return_inverse=True)
    order = np.argsort(first_at)  # codes in the order they first come
    renumber = np.empty(len(order), dtype=np.int64)
    renumber[order] = np.arange(len(order))
    triples = [(types[c // (len(redops) * len(roots))], redops[c // len(roots) % len(redops)],
                None if roots[c % len(roots)] is None else int(roots[c % len(roots)]))
               for c in distinct[order].tolist()]
    values: list[list[np.ndarray]] = [[], [], []]  # time, algbw, busbw: out-of-place, in-place
    units: list[list[np.ndarray]] = [[], [], []]
    wrong: list[np.ndarray] = []
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
    return _Block(first_line=start + 1, size=size, count=count, variant=renumber[variant.ravel()], variants=triples,
                  time_us=np.stack(values[0]), algbw_GBps=np.stack(values[1]), busbw_GBps=np.stack(values[2]),
                  wrong=np.stack(wrong), dt=np.stack([np.stack(u) for u in units]))


class _Columns:
    """A run's rows (from :class:`_Block` and :class:`~commscope.io.nccl_tests_lines._RawRow` alike, in file order)
    as columns: one entry per row (``line``, ``size``, ``count``, and ``variant``: an index into ``variants``, the
    distinct (type name, reduction op, root) of the rows, in the order they come) and one per half
    of a row, out-of-place then in-place (``row``: its row's index; ``in_place``, ``time_us``, ``algbw_GBps``,
    ``busbw_GBps``, ``wrong``, ``max_error``, ``starred`` and the half units ``dt`` of time, algbw, busbw)."""

    def __init__(self, items: Sequence[_RawRow | _Block]) -> None:
        from commscope.io.nccl_tests_collective import _half_units

        line: list[np.ndarray] = []
        size: list[np.ndarray | list[int]] = []
        count: list[np.ndarray | list[int]] = []
        wrong: list[np.ndarray | list[int | None]] = []
        variant: list[np.ndarray | list[int]] = []
        index: dict[tuple[str, str | None, int | None], int] = {}
        self.max_error: list[float | None] = []
        half: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "in_place", "time_us", "algbw_GBps", "busbw_GBps",
                                                             "starred", "dt_time", "dt_algbw", "dt_busbw")}
        raw: list[_RawRow] = []
        wrong_positive: list[np.ndarray] = []
        with_max_error: list[int] = []
        rows = 0

        def flush() -> None:  # rows read one by one, as columns
            if not raw:
                return
            base = rows - len(raw)
            hs = [(base + i, h) for i, r in enumerate(raw) for h in r.halves]
            line.append(np.array([r.line for r in raw], dtype=np.int64))
            size.append([r.size for r in raw])
            variant.append([index.setdefault((r.type_name, r.redop, r.root), len(index)) for r in raw])
            count.append([r.count for r in raw])
            half["row"].append(np.array([i for i, _ in hs], dtype=np.int64))
            half["in_place"].append(np.array([h.in_place for _, h in hs], dtype=bool))
            for key in ("time_us", "algbw_GBps", "busbw_GBps"):
                half[key].append(np.array([getattr(h, key) for _, h in hs], dtype=float))
            half["starred"].append(np.array([h.starred for _, h in hs], dtype=bool))
            for key, tok in (("dt_time", "time_tok"), ("dt_algbw", "algbw_tok"), ("dt_busbw", "busbw_tok")):
                half[key].append(_half_units([getattr(h, tok) for _, h in hs]))
            wrong.append([h.wrong for _, h in hs])
            wrong_positive.append(np.array([h.wrong is not None and h.wrong > 0 for _, h in hs], dtype=bool))
            with_max_error.extend(len(self.max_error) + j for j, (_, h) in enumerate(hs) if h.max_error is not None)
            self.max_error.extend(h.max_error for _, h in hs)
            raw.clear()

        for item in items:
            if isinstance(item, _RawRow):
                raw.append(item)
                rows += 1
                continue
            flush()
            k = len(item)
            line.append(np.arange(item.first_line, item.first_line + k, dtype=np.int64))
            size.append(item.size)
            count.append(item.count)
            variant.append(np.array([index.setdefault(v, len(index)) for v in item.variants], dtype=np.int64)[
                item.variant])
            half["row"].append(np.repeat(np.arange(rows, rows + k, dtype=np.int64), 2))
            rows += k
            half["in_place"].append(np.tile(np.array([False, True]), k))
            half["time_us"].append(item.time_us.T.ravel())
            half["algbw_GBps"].append(item.algbw_GBps.T.ravel())
            half["busbw_GBps"].append(item.busbw_GBps.T.ravel())
            half["starred"].append(np.zeros(2 * k, dtype=bool))
            for j, key in enumerate(("dt_time", "dt_algbw", "dt_busbw")):
                half[key].append(item.dt[j].T.ravel())
            wrong.append(item.wrong.T.ravel())
            wrong_positive.append(item.wrong.T.ravel() > 0)
            self.max_error.extend([None] * (2 * k))
        flush()
        self.line: np.ndarray = np.concatenate(line)
        self.variant: np.ndarray = np.concatenate([np.asarray(v, dtype=np.int64) for v in variant])
        self.variants: list[tuple[str, str | None, int | None]] = list(index)
        self.size: np.ndarray = _whole_column(size)
        """Each row's size (int64; Python ints where one is beyond 64 bits)."""
        self.count: np.ndarray = _whole_column(count)
        self.wrong: np.ndarray = _whole_column(wrong)
        """Per half: ``#wrong`` (int64; Python ints or None where the column is ``N/A`` or an old error value)."""
        self.wrong_positive: np.ndarray = np.concatenate(wrong_positive)
        """Per half: ``#wrong`` > 0 (the data check found wrong elements)."""
        self.with_max_error: list[int] = with_max_error
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
        return self.size.astype(float)

    def first(self, field: int) -> Any:
        """The first row's value of ``field`` (1: reduction op, 2: root) that is not None, or None."""
        at = self.first_row([c for c, v in enumerate(self.variants) if v[field] is not None])
        return None if at is None else self.variants[int(self.variant[at])][field]

    def first_row(self, codes: Sequence[int]) -> int | None:
        """The first row whose variant is one of ``codes``, or None."""
        if not codes:
            return None
        at = np.flatnonzero(np.isin(self.variant, list(codes)))
        return int(at[0]) if len(at) else None


def _whole_column(parts: Sequence[Any]) -> np.ndarray:
    """Parts of a column of whole numbers as one array: int64 where every value is one, else Python objects."""
    if all(isinstance(p, np.ndarray) or all(type(v) is int and -2**62 < v < 2**62 for v in p) for p in parts):
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    out[:] = list(itertools.chain.from_iterable(p.tolist() if isinstance(p, np.ndarray) else p for p in parts))
    return out


#: QuickRow's fields, in order.
_FIELDS = QuickRow._fields


class QuickRows:
    """The halves of a file's data rows as columns, in file order (out-of-place, then in-place): what
    ``parse_nccl_tests(..., quick=True)`` gives a reader of a million rows (``commscope fit``). Iterated, each half is
    a :class:`~commscope.io.nccl_tests_rows.QuickRow`, the same fields as :class:`~commscope.io.nccl_tests.BusbwRow`;
    the columns (``size_bytes``, ``time_s``, ``in_place``, ``failed_check``, ``line``, ``table``, ...) let such a reader
    check every row at once. ``op``, ``group_size`` and ``intra_node`` are one per table (``tables[table]``); each
    half's (dtype, redop, root) is ``variants[variant[i]]`` (the same values may stand at several indices)."""

    def __init__(self, name: str, tables: dict[int, tuple[str, int | None, bool | None]],
                 variants: list[tuple[str, str | None, int | None]], cols: dict[str, Any]) -> None:
        self.name = name
        self.tables = tables
        self.variants = variants
        self.cols = cols

    @classmethod
    def concat(cls, name: str, parts: Sequence[QuickRows]) -> QuickRows:
        tables = {t: v for p in parts for t, v in p.tables.items()}
        variants = [v for p in parts for v in p.variants]
        offsets = np.cumsum([0] + [len(p.variants) for p in parts])
        keys = parts[0].cols.keys() if parts else ()
        cols: dict[str, Any] = {}
        for key in keys:
            values = [p.cols[key] + offsets[i] if key == "variant" else p.cols[key] for i, p in enumerate(parts)]
            cols[key] = (np.concatenate(values) if isinstance(values[0], np.ndarray)
                         else list(itertools.chain.from_iterable(values)))
        return cls(name, tables, variants, cols)

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
        return QuickRows(self.name, {t: v for t, v in self.tables.items() if t in left}, self.variants, cols)

    def tuples(self) -> Iterator[tuple[Any, ...]]:
        """Each half's fields, in :class:`~commscope.io.nccl_tests_rows.QuickRow`'s order."""
        c = self.cols
        table = c["table"].tolist()
        per_table = [self.tables[t] for t in table]
        variant = [self.variants[v] for v in c["variant"].tolist()]
        lines = c["line"].tolist()
        yield from zip([t[0] for t in per_table], c["size_bytes"].tolist(), c["count"].tolist(),
                       [v[0] for v in variant], [v[1] for v in variant], [v[2] for v in variant],
                       [t[1] for t in per_table], c["time_s"].tolist(), c["algbw_bytes_per_s"].tolist(),
                       c["busbw_bytes_per_s"].tolist(), c["wrong"].tolist(), c["in_place"].tolist(),
                       [f"{self.name}:{ln}" for ln in lines], c["max_error"], [t[2] for t in per_table], table,
                       strict=True)

    def __iter__(self) -> Iterator[QuickRow]:
        return map(QuickRow._make, self.tuples())

    def pairs(self, index: np.ndarray | None = None) -> tuple[list[tuple[int, int]], np.ndarray]:
        """The distinct (table, variant) of the halves (of those at ``index``), in the order they first come, and
        each half's place among them."""
        table, variant = self.cols["table"], self.cols["variant"]
        if index is not None:
            table, variant = table[index], variant[index]
        code = table * max(1, len(self.variants)) + variant
        distinct, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        order = np.argsort(first)
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        pairs = [(int(c) // max(1, len(self.variants)), int(c) % max(1, len(self.variants)))
                 for c in distinct[order].tolist()]
        return pairs, place[inverse.ravel()]

    def curve_tables(self) -> dict[tuple, list[int]]:
        """Each curve (op, group size, intra-node, type, reduction op, root: what one fitted curve holds) and the
        tables that time it, in the order they first come."""
        out: dict[tuple, list[int]] = {}
        for table, v in self.pairs()[0]:
            op, n, intra = self.tables[table]
            seen = out.setdefault((op, n, intra, *self.variants[v]), [])
            if table not in seen:
                seen.append(table)
        return out
