"""Op logs as CSV (``.csv``, ``.csv.gz``), for spreadsheets and pandas: one row per op with the columns of
:data:`CSV_COLUMNS`; ``group`` and ``splits`` are ranks (bytes) joined by spaces, an empty cell is ``None``. CSV does
not carry :attr:`CommOp.extra <commscope.commop.CommOp.extra>` (JSON Lines, :mod:`commscope.io.oplog`, does).

:mod:`commscope.io.oplog` re-exports :func:`write_ops_csv`, :func:`read_ops_csv` and :data:`CSV_COLUMNS`, where
callers import them.
"""

from __future__ import annotations

import csv
import io
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from commscope.commop import CommOp
from commscope.io.oplog_base import _BATCH, OpLog, _gc_paused, _open_binary_read, _open_text_write, _Problems
from commscope.io.oplog_checks import check_op

#: Columns of an op-log CSV, in order.
CSV_COLUMNS: tuple[str, ...] = (
    "op", "axis", "name", "group", "rank", "peer", "size_bytes", "dtype", "phase", "micro_batch", "layer",
    "count", "splits", "t_start_ns", "t_end_ns", "backend_op",
)
_CSV_REQUIRED = ("op", "axis", "group", "size_bytes")
_CSV_OPTIONAL_INT = ("rank", "peer", "micro_batch", "layer", "t_start_ns", "t_end_ns")


def _join(values: tuple[int, ...] | None) -> str:
    return "" if values is None else " ".join(map(str, values))


def _csv_row(op: CommOp) -> tuple[Any, ...]:
    def opt(value: Any) -> Any:
        return "" if value is None else value

    return (op.op, op.axis, op.name, _join(op.group), opt(op.rank), opt(op.peer), op.size_bytes, op.dtype,
            opt(op.phase), opt(op.micro_batch), opt(op.layer), op.count, _join(op.splits), opt(op.t_start_ns),
            opt(op.t_end_ns), opt(op.backend_op))


def write_ops_csv(path: str | Path, ops: Iterable[CommOp]) -> int:
    """Write ``ops`` to ``path`` as CSV with the columns :data:`CSV_COLUMNS`; returns the number of rows.

    ``group`` and ``splits`` are space-joined; ``None`` is an empty cell; ``extra`` is not written.
    A path ending in ``.gz`` is gzip-compressed.
    """
    path = Path(path)
    written = 0
    with _open_text_write(path) as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        batch: list[tuple[Any, ...]] = []
        for op in ops:
            batch.append(_csv_row(op))
            if len(batch) >= _BATCH:
                writer.writerows(batch)
                written += len(batch)
                batch = []
        writer.writerows(batch)
        written += len(batch)
    return written


def _ints(cell: str, column: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in cell.split())
    except ValueError:
        raise ValueError(f"{column}={cell!r}: expected integers separated by spaces") from None


def _int(cell: str, column: str) -> int:
    try:
        return int(cell)
    except ValueError:
        raise ValueError(f"{column}={cell!r}: expected an integer") from None


def _op_from_row(row: list[str], index: dict[str, int]) -> CommOp:
    def cell(column: str) -> str:
        k = index.get(column)
        return "" if k is None else row[k].strip()

    kwargs: dict[str, Any] = {"op": cell("op"), "axis": cell("axis"), "group": _ints(cell("group"), "group"),
                              "size_bytes": _int(cell("size_bytes"), "size_bytes")}
    for column in _CSV_OPTIONAL_INT:
        text = cell(column)
        if text:
            kwargs[column] = _int(text, column)
    for column in ("dtype", "phase", "backend_op", "name"):
        text = cell(column)
        if text:
            kwargs[column] = text
    if text := cell("count"):
        kwargs["count"] = _int(text, "count")
    if text := cell("splits"):
        kwargs["splits"] = _ints(text, "splits")
    return CommOp(**kwargs)


class _LineTracker:
    """Feeds text lines to csv.reader and remembers whether the last one had its newline."""

    def __init__(self, fh: Iterable[str]) -> None:
        self._fh = fh
        self.last_complete = True

    def __iter__(self) -> Iterator[str]:
        for line in self._fh:
            self.last_complete = line.endswith("\n")
            yield line


def read_ops_csv(path: str | Path) -> OpLog:
    """Read an op-log CSV written by :func:`write_ops_csv` (columns may come in any order).

    The columns ``op``, ``axis``, ``group`` and ``size_bytes`` are required; other known columns are optional
    and unknown ones are reported and ignored. A bad row is reported in :attr:`OpLog.problems` with its line
    number and skipped. Raises ``ValueError`` naming the file when it is missing, has no header, lacks a
    required column, or has data rows none of which is valid (a header alone is an empty log).
    """
    path = Path(path)
    name = path.name
    problems = _Problems()
    ops: list[CommOp] = []
    with _open_binary_read(path) as raw, _gc_paused():
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        tracker = _LineTracker(text)
        reader = csv.reader(tracker)
        try:
            columns = [c.strip() for c in next(reader)]
        except StopIteration:
            raise ValueError(f"{path}: empty file, expected a CSV header {','.join(CSV_COLUMNS)}") from None
        missing = [c for c in _CSV_REQUIRED if c not in columns]
        if missing:
            raise ValueError(f"{path} line 1: missing column(s) {', '.join(missing)}; "
                             f"expected a header {','.join(CSV_COLUMNS)}")
        unknown = [c for c in columns if c not in CSV_COLUMNS]
        if unknown:
            problems.append(f"{name} line 1: unknown column(s) {', '.join(unknown)}, ignored")
        index = {c: k for k, c in enumerate(columns) if c in CSV_COLUMNS}
        num_rows = 0
        try:
            for row in reader:
                lineno = reader.line_num
                if not row or not any(c.strip() for c in row):
                    continue
                num_rows += 1
                if len(row) != len(columns):
                    why = "truncated row" if not tracker.last_complete else "wrong number of fields"
                    problems.append(f"{name} line {lineno}: {why} ({len(row)} fields, expected {len(columns)}), skipped")
                    continue
                try:
                    op = _op_from_row(row, index)
                except (TypeError, ValueError) as exc:
                    problems.append(f"{name} line {lineno}: {exc}, skipped")
                    continue
                bad = check_op(op)
                if bad:
                    problems.append(f"{name} line {lineno}: {bad}, skipped")
                    continue
                ops.append(op)
        except csv.Error as exc:
            problems.append(f"{name} line {reader.line_num}: unreadable CSV ({exc}); stopped reading")
        except (EOFError, OSError, zlib.error) as exc:
            problems.append(f"{name} line {reader.line_num + 1}: compressed stream ends early or is corrupt ({exc}); "
                            f"kept the rows before it")
    if not ops and num_rows:
        found = "; ".join(problems[:3])
        raise ValueError(f"{path}: no valid row in {num_rows} rows" + (f" ({found})" if found else ""))
    return OpLog(ops=ops, header={}, problems=problems.finish())

