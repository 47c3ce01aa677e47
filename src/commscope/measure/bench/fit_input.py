"""What ``commscope fit`` reads: the rows of a bench JSON or of nccl-tests / rccl-tests output, as columns.

:func:`load_rows` tells the two apart (and names another tool's records given by mistake), then reads every row
into :class:`FitRows`, columns of (curve, size, time): a file of a million rows is checked on all rows at once, with
the outcome of checking them one by one (:func:`load_points` gives the same rows as :class:`FitPoint` objects). A
damaged row (a value no measurement has) is skipped and
named in one line; a row that contradicts a flag, failed its data check, or mixes what one fitted curve cannot hold
(several types, reduction ops or roots, several machines' tables) refuses the whole input with a ConfigError that
says which flag picks one. The fit itself is :mod:`commscope.measure.bench.fit`.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from commscope.estimate.fitted import (
    BUSBW_OPS,
    VARIANTS,
    canonical_op,
    mixed_variants,
    root_variant,
    row_variants,
)
from commscope.errors import ConfigError
from commscope.commop import MAX_MESSAGE_BYTES
from commscope.io.nccl_tests_columns import QuickRows

__all__ = ["FIT_OPS", "FitPoint", "FitRows", "check_op", "load_points", "load_rows", "problem_lines"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FitPoint:
    """One measured row: ``op`` over ``group_size`` ranks moved ``size_bytes`` in ``time_s``."""

    op: str
    group_size: int
    size_bytes: int
    time_s: float
    intra_node: bool | None = None
    noisy: bool = False
    """The measurement flagged this row noisy (commscope bench: coefficient of variation above its threshold)."""


#: A curve and what keeps its rows apart from another's: (op, group size, intra_node, type, reduction op, root).
CurveKey = tuple[str, int, bool | None, str | None, str | None, str | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class FitRows:
    """Measured rows as columns, in the order they were read: row i is ``curves[curve[i]]`` (op, group size,
    intra_node, type, reduction op, root) moving ``size_bytes[i]`` in ``time_s[i]``, ``noisy[i]`` where the
    measurement flagged it. What :func:`load_rows` gives and :func:`commscope.measure.bench.fit.fit` takes: a million
    rows without a million objects."""

    curves: tuple[CurveKey, ...]
    curve: np.ndarray
    size_bytes: np.ndarray
    time_s: np.ndarray
    noisy: np.ndarray

    def __len__(self) -> int:
        return len(self.curve)

    @classmethod
    def of_points(cls, points: Iterable[FitPoint]) -> FitRows:
        """FitPoints as columns (no type, reduction op or root: a FitPoint has none)."""
        keys: dict[CurveKey, int] = {}
        curve, size, time, noisy = [], [], [], []
        for p in points:
            curve.append(keys.setdefault((p.op, p.group_size, p.intra_node, None, None, None), len(keys)))
            size.append(p.size_bytes)
            time.append(p.time_s)
            noisy.append(p.noisy)
        return cls(curves=tuple(keys), curve=np.array(curve, dtype=np.int64), size_bytes=np.array(size, dtype=np.int64),
                   time_s=np.array(time, dtype=float), noisy=np.array(noisy, dtype=bool))

    def points(self) -> list[FitPoint]:
        """The rows as FitPoints."""
        return [FitPoint(op=op, group_size=n, size_bytes=size, time_s=t, intra_node=intra, noisy=noisy)
                for (op, n, intra, *_), size, t, noisy in zip(
                    [self.curves[c] for c in self.curve.tolist()], self.size_bytes.tolist(), self.time_s.tolist(),
                    self.noisy.tolist(), strict=True)]

    def take(self, mask: np.ndarray) -> FitRows:
        return FitRows(curves=self.curves, curve=self.curve[mask], size_bytes=self.size_bytes[mask],
                       time_s=self.time_s[mask], noisy=self.noisy[mask])

    def first_curves(self) -> list[int]:
        """The curves the rows hold, in the order each first comes."""
        ids, first = np.unique(self.curve, return_index=True)
        return ids[np.argsort(first, kind="stable")].tolist()


#: The ops a row to fit may measure: those with an nccl-tests bus-bandwidth factor.
FIT_OPS = BUSBW_OPS

#: Damaged rows are said one line each, up to this many (then a count): a whole broken file is one refusal.
_MAX_PROBLEMS = 10


def _known_op(name: Any) -> str | None:
    """The canonical name of ``name`` if fit knows its bus-bandwidth factor, else None."""
    op = canonical_op(str(name))
    return op if op in FIT_OPS else None


def check_op(op: str | None) -> str | None:
    """``--op`` as a canonical collective; ConfigError naming the valid ones."""
    if op is None:
        return None
    known = _known_op(op)
    if known is None:
        raise ConfigError("op", op, f"expected one of {', '.join(FIT_OPS)} (nccl-tests' names such as allreduce or "
                                    "all_reduce_perf work too)")
    return known


def _damage(row: dict, i: int, source: str) -> str | None:
    """Why bench-JSON row ``i`` is damaged (a value no measurement has), naming the row, field and value; else None
    (the rules every reader applies: :func:`commscope.io.checks.bench_row_problem`)."""
    from commscope.io.checks import bench_row_problem

    if _known_op(row["op"]) is None:
        return f"{source} rows[{i}].op={row['op']!r}: not a collective fit knows ({', '.join(FIT_OPS)})"
    why = bench_row_problem(row)
    return None if why is None else f"{source} rows[{i}].{why}"


def _points_from_bench(data: dict, source: str, *, group_size: int | None = None, op: str | None = None,
                       dtype: str | None = None, redop: str | None = None, root: int | None = None,
                       ) -> tuple[list[FitPoint], dict[str, Any]]:
    """:func:`_rows_from_bench` as FitPoints."""
    rows, info = _rows_from_bench(data, source, group_size=group_size, op=op, dtype=dtype, redop=redop, root=root)
    return rows.points(), info


#: What a row of bench JSON becomes: (op, group size, intra_node, noisy, (type, reduction op, root)).
_Key = tuple[str, int, bool | None, bool, tuple[str | None, str | None, str | None]]


def _rows_from_bench(data: dict, source: str, *, group_size: int | None = None, op: str | None = None,
                     dtype: str | None = None, redop: str | None = None, root: int | None = None,
                     ) -> tuple[FitRows, dict[str, Any]]:
    """The rows of bench JSON. Rows that failed the data check are refused (the run is not to be trusted);
    damaged rows (an unknown op, a size, group size or time no measurement has) are skipped, each named in
    ``info["problems"]``. ``group_size`` and ``op`` (the flags for nccl-tests output that does not say) must agree
    with every row: bench JSON names each row's own. Rows of several types, reduction ops or roots (sweeps merged)
    must be picked from with ``dtype`` / ``redop`` / ``root``."""
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ConfigError("rows", source, "no rows: expected {\"meta\": ..., \"rows\": [...]} from `commscope bench`")
    problems: list[str] = []
    read = _bench_at_once(rows, source, group_size, op, problems)
    if read is None:  # rows of other shapes: one by one
        problems.clear()
        read = _bench_one_by_one(rows, source, group_size, op, problems)
    keys, key_of, size, time = read
    if not len(key_of):
        raise ConfigError("input", source, f"has no usable rows: {'; '.join(problems[:3])}")
    curves: dict[CurveKey, int] = {}
    curve_of_key = [curves.setdefault((k[0], k[1], k[2], *k[4]), len(curves)) for k in keys]
    noisy_of_key = np.array([k[3] for k in keys], dtype=bool)
    found = FitRows(curves=tuple(curves), curve=np.array(curve_of_key, dtype=np.int64)[key_of], size_bytes=size,
                    time_s=time, noisy=noisy_of_key[key_of])
    chosen_rows, chosen = _select_variants(found, source, dtype=dtype, redop=redop, root=root)
    meta = data.get("meta", {}) if isinstance(data.get("meta"), dict) else {}
    return chosen_rows, {"time_kind": "median", "backend": meta.get("backend"), "problems": problems, "notes": [],
                         "chosen": chosen}


def _kind(row: Any) -> tuple[Any, ...]:
    """What a bench row shares with the rows of its kind: its op, group size, placement, type, reduction op, root and
    flags (a file of a million rows holds a few kinds)."""
    return (row["op"], row["group_size"], row.get("intra_node"), row.get("dtype"), row.get("redop"), row.get("root"),
            row.get("noisy"), row.get("wrong"))


def _checked_row(row: Any, i: int, source: str, group_size: int | None, op: str | None,
                 problems: list[str]) -> tuple[_Key, int, float] | None:
    """Bench row ``i`` (from 1) checked in full: (what it becomes, its size, its time); None for a damaged row (named
    in ``problems``); a ConfigError for a row that refuses the input."""
    if not isinstance(row, dict):
        raise ConfigError(f"rows[{i}]", row, "must be an object", source=source)
    missing = [k for k in ("op", "group_size", "size_bytes", "time_s") if k not in row]
    if missing:
        raise ConfigError(f"rows[{i}]", {k: row[k] for k in list(row)[:4]}, f"lacks {', '.join(missing)}",
                          source=source)
    if row.get("wrong"):
        raise ConfigError(f"rows[{i}].wrong", row["wrong"],
                          f"{row['op']} at {row['size_bytes']} B had wrong results; refit from a clean run",
                          source=source)
    why = _damage(row, i, source)
    if why is not None:
        problems.append(f"{why}: row skipped")
        return None
    size, t, n, row_op = int(row["size_bytes"]), float(row["time_s"]), int(row["group_size"]), canonical_op(row["op"])
    if group_size is not None and n != group_size:
        raise ConfigError("group_size", group_size, f"{source} rows[{i}] ran on {n} ranks: bench JSON names each "
                                                    "row's group size (--group-size is for nccl-tests output that "
                                                    "does not say); leave it out")
    if op is not None and row_op != op:
        raise ConfigError("op", op, f"{source} rows[{i}] measures {row_op}: bench JSON names each row's op (--op is "
                                    "for nccl-tests output whose header does not); leave it out")
    intra = row.get("intra_node")
    return ((row_op, n, intra if isinstance(intra, bool) else None, bool(row.get("noisy")), row_variants(row)), size,
            t)


_Read = tuple[list[_Key], np.ndarray, np.ndarray, np.ndarray]
"""Bench rows read: the distinct keys, each kept row's key (an index), size and time."""


def _bench_one_by_one(rows: list, source: str, group_size: int | None, op: str | None, problems: list[str]) -> _Read:
    """The rows of bench JSON, one by one. Each kind of row (:func:`_kind`) is checked in full and named by the first
    row of it that passes every check; later rows of a known kind whose numbers are plainly valid
    (:func:`_plain_numbers`) take its key without the checks again; anything else is checked in full."""
    kinds: dict[tuple[Any, ...], _Key] = {}
    keys: dict[_Key, int] = {}
    key_of: list[int] = []
    sizes: list[int] = []
    times: list[float] = []
    for i, row in enumerate(rows, start=1):
        kind: tuple[Any, ...] | None
        try:
            kind = _kind(row)
            known = kinds.get(kind)
        except (TypeError, KeyError, AttributeError):  # no object, a field missing, a value of no plain kind
            kind, known = None, None
        if known is not None and _plain_numbers(row):
            key, size, t = known, row["size_bytes"], float(row["time_s"])
        else:
            got = _checked_row(row, i, source, group_size, op, problems)
            if got is None:
                continue
            key, size, t = got
            if kind is not None:
                kinds[kind] = key
        key_of.append(keys.setdefault(key, len(keys)))
        sizes.append(size)
        times.append(t)
    return list(keys), np.array(key_of, dtype=np.int64), np.array(sizes, dtype=np.int64), np.array(times, dtype=float)


def _bench_at_once(rows: list, source: str, group_size: int | None, op: str | None,
                   problems: list[str]) -> _Read | None:
    """:func:`_bench_one_by_one`'s result, the checks of plainly valid numbers made on every row at once: the same
    keys, points and problems (the rows that need the full checks are checked in the same order). None where the rows
    are not all objects with every field, of plain types (then they are read one by one)."""
    try:
        need = {key: list(map(operator.getitem, rows, itertools.repeat(key)))
                for key in ("op", "group_size", "size_bytes", "time_s")}
        fields = [need["op"], need["group_size"], *(list(map(dict.get, rows, itertools.repeat(key))) for key in (
            "intra_node", "dtype", "redop", "root", "noisy", "wrong"))]
        if all(f.count(f[0]) == len(f) for f in fields):  # one kind of row (a sweep of one collective)
            distinct = list(dict.fromkeys([tuple(f[0] for f in fields)]))
            kind_of = np.zeros(len(rows), dtype=np.int64)
        else:
            kinds = list(zip(*fields, strict=True))
            distinct = list(dict.fromkeys(kinds))
            number = {k: j for j, k in enumerate(distinct)}
            kind_of = np.fromiter(map(number.__getitem__, kinds), np.int64, len(rows))
    except (TypeError, KeyError, AttributeError):
        return None
    # _plain_numbers on all rows at once: where size is an int, time a float and each bus bandwidth a float or
    # absent, the numbers are checked as arrays; any other row as _plain_numbers checks it
    k = len(rows)

    def of_type(values: list, kind: type) -> np.ndarray:
        return np.fromiter(map(operator.is_, map(type, values), itertools.repeat(kind)), bool, k)

    def floats(values: list, where: np.ndarray, kind: type = float) -> np.ndarray:
        out: np.ndarray = np.zeros(k, dtype=kind)
        out[where] = np.fromiter(values, object, k)[where].astype(kind)
        return out

    busbw = [list(map(dict.get, rows, itertools.repeat(key))) for key in ("busbw_bytes_per_s", "busbw_GBps")]
    usual = of_type(need["size_bytes"], int) & of_type(need["time_s"], float)
    for values in busbw:
        usual &= of_type(values, type(None)) | of_type(values, float)
    try:
        size = floats(need["size_bytes"], usual, np.int64)
    except OverflowError:  # an int beyond 64 bits: row by row
        return None
    time = floats(need["time_s"], usual)
    plain = usual & (size >= 1) & (size <= MAX_MESSAGE_BYTES) & (time > 0) & (time < math.inf)
    for values in busbw:
        given = usual & ~of_type(values, type(None))
        b = floats(values, given)
        plain &= ~given | ((b > 0) & (b < math.inf))
    for i in np.flatnonzero(~usual).tolist():
        plain[i] = _plain_numbers(rows[i])
    # the rows checked in full, in row order: those of numbers not plainly valid, and each kind's rows up to the
    # first that passes (a kind is known from it on)
    order = np.argsort(kind_of, kind="stable")
    starts = np.searchsorted(kind_of[order], np.arange(len(distinct) + 1))
    rank = np.empty(len(rows), dtype=np.int64)
    rank[order] = np.arange(len(rows)) - np.repeat(starts[:-1], np.diff(starts))  # each row's place in its kind
    queue = sorted(set(np.flatnonzero(~plain).tolist()) | set(order[starts[:-1]].tolist()))
    heapq.heapify(queue)
    known: dict[int, tuple[int, _Key]] = {}
    checked: dict[int, tuple[_Key, int, float] | None] = {}
    while queue:
        i = heapq.heappop(queue)
        j = int(kind_of[i])
        got = checked[i] = _checked_row(rows[i], i + 1, source, group_size, op, problems)
        if got is not None:
            if j not in known:
                known[j] = (i, got[0])
            elif known[j][1] != got[0]:  # a later row of the kind names it otherwise (True where 1 was): one by one
                return None
        elif j not in known:  # the kind's next row is checked in full too
            r = int(rank[i]) + 1
            if starts[j] + r < starts[j + 1]:
                nxt = int(order[starts[j] + r])
                if plain[nxt]:
                    heapq.heappush(queue, nxt)
    keys: dict[_Key, int] = {}
    key_of_kind = np.array([keys.setdefault(known[j][1], len(keys)) if j in known else -1
                            for j in range(len(distinct))], dtype=np.int64)
    first_known = np.array([known[j][0] if j in known else len(rows) for j in range(len(distinct))], dtype=np.int64)
    key_of = key_of_kind[kind_of]
    fast = plain & (np.arange(len(rows)) > first_known[kind_of])
    if checked:
        at = np.fromiter(checked, np.int64, len(checked))
        fast[at] = False
        for i, got in checked.items():
            if got is None:
                key_of[i] = -1
            else:
                key_of[i] = keys.setdefault(got[0], len(keys))
                size[i], time[i] = got[1], got[2]
        keep = fast.copy()
        keep[[i for i, got in checked.items() if got is not None]] = True
    else:
        keep = fast
    assert keep.sum() + sum(got is None for got in checked.values()) == len(rows)  # every row read once
    return list(keys), key_of[keep], size[keep], time[keep]


def _plain_numbers(row: dict) -> bool:
    """Whether a bench row's size, time and bus bandwidths plainly pass :func:`commscope.io.checks.bench_row_problem`:
    an int size of 1 B to 1 TiB, a float or int time finite and > 0, each bandwidth absent or a finite float > 0
    (anything else is checked in full)."""
    size, t = row["size_bytes"], row["time_s"]
    if type(size) is not int or not 1 <= size <= MAX_MESSAGE_BYTES or type(t) not in (float, int) or not 0 < t < math.inf:
        return False
    for key in ("busbw_bytes_per_s", "busbw_GBps"):
        b = row.get(key)
        if b is not None and (type(b) not in (float, int) or not 0 < b < math.inf):
            return False
    return True


def _canonical_dtype(name: str) -> str:
    from commscope.io.nccl_tests import _canonical_dtype as canon

    return canon(str(name).strip())


def _select_variants(rows: FitRows, source: str, *, dtype: str | None, redop: str | None, root: int | None = None,
                     ) -> tuple[FitRows, str | None]:
    """The rows of the type ``dtype``, reduction op ``redop`` and root ``root`` (a row that has none, such as
    all_gather's redop or all_reduce's root, passes), and what was chosen. A curve (op, group size) timed in several
    types, reduction ops or roots (nccl-tests ``-r -1``) with no flag to pick one is refused, naming them: pooled, the
    fit would mix what the measurement kept apart; one of them taken, the others would vanish."""
    chosen = []
    for i, (given, (label, _, flag, _, _)) in enumerate(zip((dtype, redop, root), VARIANTS, strict=True)):
        if given is None:
            continue
        want = _canonical_dtype(str(given)) if i == 0 else str(given).strip().lower()
        have = [v for v in dict.fromkeys(rows.curves[c][3 + i] for c in rows.first_curves()) if isinstance(v, str)]
        if not have:
            raise ConfigError(flag.lstrip("-"), given, f"{source} names no {label} of its rows; leave {flag} out")
        if want not in have:
            raise ConfigError(flag.lstrip("-"), given, f"{source} has no rows of that {label}; its rows are "
                                                       f"{', '.join(have)}")
        passes = np.array([c[3 + i] in (None, want) for c in rows.curves], dtype=bool)
        rows = rows.take(passes[rows.curve])
        chosen.append(f"{label} {want}")
    # each curve's variants in the order they come (a million rows hold a few distinct ones)
    mixed = mixed_variants(rows.curves[c] for c in rows.first_curves())
    if mixed is not None:
        op, n, what, pick, opts = mixed
        raise ConfigError("input", source, f"times {op} over {n} ranks {what}, as nccl-tests {opts} does; one "
                                           f"fitted curve holds one of each: pick with {pick} (or another of those)")
    return rows, ", ".join(chosen) or None


def _line_of(problem: str, name: str) -> int | None:
    """The line number of a reader's problem ``name:LINE: ...``; None for one about the whole file."""
    head = f"{name}:"
    if not problem.startswith(head):
        return None
    number = problem[len(head):].split(":", 1)[0]
    return int(number) if number.isdigit() else None


def _keep_tables(result: Any, keep: set[int], name: str) -> tuple[QuickRows, list[str]]:
    """The rows of the tables numbered ``keep`` (from 1, in file order) and the reader's problems about those tables
    (and about the file), less what it said of a repeat between a kept table and one left out (nothing of theirs is
    pooled now)."""
    from commscope.io.nccl_tests import repeated_tables

    runs = result.meta.get("runs", [])
    starts = [min(x for x in (r.get("op_named_line"), r.get("first_line")) if x) for r in runs]
    spans = [(lo, (starts[i + 1] - 1) if i + 1 < len(runs) else math.inf) for i, lo in enumerate(starts)]
    keep_spans = [span for i, span in enumerate(spans, start=1) if i in keep]
    drop_spans = [span for i, span in enumerate(spans, start=1) if i not in keep]

    def kept(problem: str) -> bool:
        pair = repeated_tables(problem, runs)
        if pair is not None:
            return all(t in keep for t in pair)
        ln = _line_of(problem, name)
        return ln is None or any(lo <= ln <= hi for lo, hi in keep_spans) or not any(
            lo <= ln <= hi for lo, hi in drop_spans)

    rows = cast(QuickRows, result.rows)
    return rows.take(np.isin(rows.table, sorted(keep))), [p for p in result.problems if kept(p)]


def _tables_arg(run: str | Sequence[int] | None, runs: list[dict], name: str) -> list[int] | None:
    """``--run 1,3`` as table numbers, each checked against the file's tables."""
    if run is None:
        return None
    text = run if isinstance(run, str) else ",".join(map(str, run))
    valid = (f"table numbers from 1 to {len(runs)} (file order), comma-separated: --run 1"
             + (" or --run 1,2" if len(runs) > 1 else ""))
    numbers = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= len(runs):
            raise ConfigError("run", text, f"{name} has {len(runs)} table{'s' if len(runs) > 1 else ''}: give "
                                           f"{valid}")
        numbers.append(int(part))
    return sorted(set(numbers))

def _rows_from_nccl_tests(path: Path, text: str, group_size: int | None, op: str | None = None, *,
                          dtype: str | None = None, redop: str | None = None, root: int | None = None,
                          run: str | Sequence[int] | None = None) -> tuple[FitRows, dict[str, Any]]:
    """The rows of nccl-tests output, one per table line (its out-of-place half, as nccl-tests' summaries use).
    Lines the reader could not read, and lines whose out-of-place time is no measurement (<= 0), are skipped and
    named in ``info["problems"]``, with everything else the reader found wrong with the output. ``group_size`` and
    ``op`` fill in what the output does not say; where it says otherwise, they are refused. In a log of several
    collectives (nccl-tests run once per test binary, the outputs pasted together), ``op`` picks one of them.
    ``dtype``, ``redop`` and ``root`` pick one type, reduction op and root of a table that times several (``-d all``,
    ``-o all``, ``-r -1``). Tables that time one curve on one machine (a run repeated) are pooled, each size's
    median; tables of other machines (outputs pasted together) are refused together until ``run`` picks one
    machine's tables (their numbers from 1 in file order, ``"1,3"``). ``text``: the output, as read once from
    ``path``."""
    rows, problems, notes, file_ops = _tables_to_fit(path, text, op, run)
    found, one_rank = _lines_to_fit(rows, path.name, file_ops, group_size, op, problems)
    if not len(found) and one_rank == len(rows):
        raise ConfigError("input", path.name, "the rows ran on 1 rank: nothing crossed a link (busbw is 0 by "
                                              "definition), so there is no bandwidth to fit; measure over 2 ranks or "
                                              "more")
    if one_rank:
        notes.append(f"{one_rank} rows ran on 1 rank (nothing crossed a link, busbw 0 by definition): skipped")
    chosen_rows, chosen = _select_variants(found, path.name, dtype=dtype, redop=redop, root=root)
    if not len(chosen_rows):
        raise ConfigError("input", path.name, "has no usable nccl-tests rows (size > 0, a time, >= 2 ranks)"
                          + (f": {'; '.join(problems[:3])}" if problems else ""))
    return chosen_rows, {"time_kind": "mean", "backend": "nccl-tests", "problems": problems, "notes": notes,
                         "chosen": chosen}


def _tables_to_fit(path: Path, text: str, op: str | None, run: str | Sequence[int] | None,
                   ) -> tuple[QuickRows, list[str], list[str], list[str]]:
    """The rows of the tables of ``path`` to fit, the reader's problems about them, notes on the tables left out,
    and the file's collectives. ``op`` picks one collective of a log of several, or takes the rows of output that
    names none as its own; ``run`` picks tables by number; tables of other machines left together are refused."""
    from commscope.io.nccl_tests import describe_tables, mixed_hardware, parse_nccl_tests_text, pick_tables

    try:  # (the text load_rows read: the file is read once)
        result = parse_nccl_tests_text(text, name=path.name, quick=True)  # the rows as columns, faster to make
    except ValueError as exc:
        raise ConfigError("input", path.name, str(exc)) from None
    runs = result.meta.get("runs", [])
    file_ops = list(dict.fromkeys(r["op"] for r in runs))
    notes: list[str] = []
    keep = set(range(1, len(runs) + 1))
    if op is not None and len(file_ops) > 1:  # --op picks one collective of several
        if op not in file_ops:
            raise ConfigError("op", op, f"{path.name} holds the tables of {', '.join(file_ops)}; --op picks one of "
                                        "them")
        keep = {i for i in keep if runs[i - 1]["op"] == op}
        quick = cast(QuickRows, result.rows)
        failed = {quick.tables[t][0] for t in set(quick.table[quick.failed_check].tolist())} - {op}
        left = ", ".join(f"{o} (failed its data check)" if o in failed else o for o in file_ops if o != op)
        notes.append(f"fitted {op} only (--op): left out the file's other collectives, {left}")
    elif op is not None:
        for r in runs:
            named = r.get("op_named")
            if named is not None and named != op:
                raise ConfigError("op", op, f"{path.name} line {r.get('op_named_line')} names the test {named}; "
                                            "leave --op out (it is for output that does not name it)")
        result = parse_nccl_tests_text(text, name=path.name, op=op, quick=True)  # the rows taken as op's
        runs = result.meta.get("runs", [])
    tables = _tables_arg(run, runs, path.name)
    if tables is not None:  # --run picks tables
        other = [t for t in tables if t not in keep]
        if other:
            raise ConfigError("run", run, f"table {other[0]} of {path.name} times {runs[other[0] - 1]['op']}; --op "
                                          f"{op} picks the tables of {op} (table{'s' if len(keep) > 1 else ''} "
                                          f"{', '.join(map(str, sorted(keep)))})")
        left_out = [r for r in runs if r["table"] in keep and r["table"] not in tables]
        keep = set(tables)
        if left_out:
            notes.append(f"fitted table{'s' if len(tables) > 1 else ''} {', '.join(map(str, tables))} only (--run): "
                         f"left out {describe_tables(left_out)}")
    if len(keep) < len(runs):
        rows, problems = _keep_tables(result, keep, path.name)
    else:
        rows, problems = cast(QuickRows, result.rows), list(result.problems)
    mixed = mixed_hardware(rows, runs)
    if mixed is not None:
        mixed_op, n, where = mixed
        raise ConfigError("input", path.name, f"times {mixed_op} over {n or '?'} ranks on other hardware, outputs "
                                              f"pasted together: {describe_tables(where)}; one fitted curve holds one "
                                              f"machine's tables: pick with {pick_tables(where)}")
    return rows, problems, notes, file_ops


def _lines_to_fit(rows: QuickRows, name: str, file_ops: Sequence[str], group_size: int | None, op: str | None,
                  problems: list[str]) -> tuple[FitRows, int]:
    """The table lines of ``rows`` to fit, each its out-of-place half, and how many rows ran on one rank (not kept). A
    line whose out-of-place time is no measurement is skipped and named in ``problems``; a row of no known
    collective, of a group size other than ``group_size``, or that failed its data check is refused. A table's op,
    group size and placement are its rows', so they are checked once a table, in file order."""
    from commscope.io.checks import row_time_problem

    table = rows.table
    keep = np.zeros(len(rows), dtype=bool)
    n_of: dict[int, int] = {}
    one_rank = 0
    tables, starts = np.unique(table, return_index=True)
    for t, start in sorted(zip(tables.tolist(), starts.tolist()), key=lambda ts: ts[1]):
        mine = table == t
        row_op, said, _ = rows.tables[t]
        source = f"{name}:{int(rows.line[start])}"
        if row_op == "unknown":  # no header names the test and the rows fit no collective's arithmetic
            raise ConfigError("input", name, f"{source}: the collective of these rows cannot be told (no "
                                             "command line names the test binary and the rows fit none); give "
                                             "it with --op all_reduce (or all_gather, ...)")
        if canonical_op(row_op) not in FIT_OPS:
            raise ConfigError("op", row_op, f"{name} measures {row_op}, which has no nccl-tests bus-bandwidth "
                                            f"factor; fit knows {', '.join(FIT_OPS)}")
        if group_size is not None and said is not None and said != group_size:
            raise ConfigError("group_size", group_size, f"{name} says its rows ran on {said} ranks (its '# Using "
                                                        "devices' or NCCL nranks lines); leave --group-size out (it is "
                                                        "for output that does not say)")
        n = said or group_size
        if not n:
            raise ConfigError("group_size", None, f"{name} does not say how many ranks ran; give --group-size N",
                              source=name)
        if n < 2:
            one_rank += int(mine.sum())
            continue  # one rank: busbw is 0 by definition, nothing crosses a link
        failed = np.flatnonzero(mine & rows.failed_check)
        if len(failed):
            j = int(failed[0])
            others = [o for o in file_ops if o != row_op]
            hint = (f", or give --op to fit one of the file's other collectives ({', '.join(others)})"
                    if others and op is None else "")
            wrong = rows.wrong[[j]].tolist()[0]  # (as Python's int)
            raise ConfigError("data check", wrong if wrong is not None else rows.max_error[j],
                              f"{row_op} at {int(rows.size_bytes[j])} B failed nccl-tests' data check "
                              f"({name}:{int(rows.line[j])}); refit from a clean run{hint}", source=name)
        keep |= mine
        n_of[t] = n
    # zero-byte rows say nothing about alpha and beta; a line whose out-of-place time is no measurement is skipped
    # whole (its in-place half is not used); else each line is its out-of-place half, as nccl-tests' summaries use
    size = rows.size_bytes
    time = rows.time_s
    out = keep & ~rows.in_place & (size > 0)
    bad = out & ~((time > 0) & (time < math.inf))
    for j in np.flatnonzero(bad).tolist():
        row_op = rows.tables[int(table[j])][0]
        why = row_time_problem(row_op, int(size[j]), float(time[j]))
        problems.append(f"{name}:{int(rows.line[j])}: {why}: row skipped")
    out &= ~bad
    index = np.flatnonzero(out)
    pairs, place = rows.pairs(index)  # each line's (table, variant): its curve
    curves: dict[CurveKey, int] = {}
    code = np.array([curves.setdefault((canonical_op(rows.tables[t][0]), int(n_of[t]), rows.tables[t][2], d, r,
                                        root_variant(rt)), len(curves))
                     for t, v in pairs for d, r, rt in (rows.variants[v],)], dtype=np.int64)
    curve = code[place]
    return FitRows(curves=tuple(curves), curve=curve, size_bytes=size[index],
                   time_s=time[index], noisy=np.zeros(len(index), dtype=bool)), one_rank


#: What other tools' records are, for an input of theirs given to fit: (what it is, the commands that read it).
_OTHER_FORMATS = {
    "kineto": "a PyTorch profiler (Kineto) trace",
    "deepspeed": "DeepSpeed comms-logger output",
    "jsonl": "a commscope op log (`commscope record`)",
    "flight_recorder": "a PyTorch Flight Recorder dump",
    "nccl_debug": "an NCCL_DEBUG=INFO log",
}


def _refuse_other_format(name: str, data: bytes) -> None:
    """A ConfigError naming what ``data`` is when it is another tool's records, which fit does not take."""
    from commscope.io.importers import _detect

    try:
        fmt = _detect(name, data)
    except ValueError:
        return
    what = _OTHER_FORMATS.get(fmt)
    if what is not None:
        raise ConfigError("input", name, f"is {what}; fit takes `commscope bench --out` JSON "
                                         f"or nccl-tests / rccl-tests output; `commscope summarize {name}` (and "
                                         "compare, report) read this format")


_NOT_JSON = object()


def _starts_with(data: bytes, prefixes: tuple[str, ...]) -> bool:
    """Whether the text of ``data`` starts with one of ``prefixes`` after blanks, decoding only its head where the
    head says (a 100 MB nccl-tests table is not decoded for its first character)."""
    head = data[:1 << 16].decode("utf-8-sig", errors="replace").lstrip()
    if len(head) < 2 and len(data) > 1 << 16:  # blanks only, or a character cut at the head's end: all of it
        head = data.decode("utf-8-sig", errors="replace").lstrip()
    return head.startswith(prefixes)


def load_points(path: Path, *, group_size: int | None = None, op: str | None = None, dtype: str | None = None,
                redop: str | None = None, root: int | None = None, run: str | Sequence[int] | None = None,
                ) -> tuple[list[FitPoint], dict[str, Any]]:
    """:func:`load_rows` as FitPoints."""
    rows, info = load_rows(path, group_size=group_size, op=op, dtype=dtype, redop=redop, root=root, run=run)
    return rows.points(), info


def load_rows(path: Path, *, group_size: int | None = None, op: str | None = None, dtype: str | None = None,
              redop: str | None = None, root: int | None = None, run: str | Sequence[int] | None = None,
              ) -> tuple[FitRows, dict[str, Any]]:
    """Rows of ``path`` (bench JSON or nccl-tests stdout) as :class:`FitRows`, with ``time_kind``, ``backend``,
    ``problems`` (one line per damaged row skipped, naming file, row or line, field and value), ``notes`` (what was
    left out on purpose, and why) and ``chosen`` (the type, reduction op and root ``dtype``/``redop``/``root``
    picked, or None).
    ``group_size`` and ``op`` say what nccl-tests output does not (ranks, the collective), or ``op`` picks one
    collective of a log of several; a value the file contradicts is refused. ``dtype``, ``redop`` and ``root`` pick
    one type, reduction op and root where the rows time several (nccl-tests ``-d all`` / ``-o all`` / ``-r -1``),
    which must be picked. ``run`` picks tables of nccl-tests output by number (from 1 in file order, ``"1,3"``): the
    tables of one machine where the file holds several machines' outputs, which are never pooled."""
    from commscope.io.import_base import read_input

    path = Path(path)
    op = check_op(op)
    if path.is_dir() or not path.exists():
        raise ConfigError("input", str(path), "is a directory; give a file" if path.is_dir() else "no such file")
    try:
        name, data = read_input(path)  # .gz too; a pipe or a device refused (it would be read twice)
    except ValueError as exc:
        raise ConfigError("input", str(path), str(exc).removeprefix(f"{path}: ").removeprefix(f"{path.name}: ")) \
            from None
    parsed: Any = _NOT_JSON
    if path.suffix.lower() == ".json":
        try:
            parsed = json.loads(data.decode("utf-8-sig", errors="replace"))
        except json.JSONDecodeError as exc:
            _refuse_other_format(name, data)
            raise ConfigError("input", path.name, f"is not valid JSON: {exc}") from None
    elif _starts_with(data, ("{", "[")):  # JSON under another name, or output whose first line is a
        try:  # launcher's warning ("[1732812345.1] [host:1:0] ucp_context.c:1104 UCX WARN ...") above a table
            parsed = json.loads(data.decode("utf-8-sig", errors="replace"))
        except json.JSONDecodeError:
            parsed = _NOT_JSON
    if parsed is not _NOT_JSON:
        if not (isinstance(parsed, dict) and "rows" in parsed):
            _refuse_other_format(name, data)
        if not isinstance(parsed, dict):
            raise ConfigError("input", path.name, "expected a JSON object with \"rows\" (commscope bench --out)")
        if run is not None:
            raise ConfigError("run", run, f"{path.name} is bench JSON, one sweep: --run picks tables of nccl-tests "
                                          "output; leave it out")
        return _rows_from_bench(parsed, path.name, group_size=group_size, op=op, dtype=dtype, redop=redop, root=root)
    _refuse_other_format(name, data)
    return _rows_from_nccl_tests(path, data.decode("utf-8", errors="replace"), group_size, op, dtype=dtype,
                                 redop=redop, root=root, run=run)


def problem_lines(problems: Sequence[str], limit: int = _MAX_PROBLEMS) -> list[str]:
    """``problems`` as at most ``limit`` lines, the last saying how many more there are."""
    if len(problems) <= limit:
        return list(problems)
    return [*problems[:limit - 1], f"... and {len(problems) - limit + 1} more problems"]
