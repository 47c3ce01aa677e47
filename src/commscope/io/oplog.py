"""Op logs on disk: :class:`~commscope.commop.CommOp` records as JSON Lines or CSV.

JSON Lines (``.jsonl``, or ``.jsonl.gz`` compressed) is the lossless format: one JSON object per line,
exactly :meth:`CommOp.to_dict` (``None`` fields left out), optionally preceded by one header line::

    {"commscope_header": {"format": "commscope.ops", "format_version": 1, "world_size": 32, ...}}
    {"op":"all_reduce","axis":"tp","group":[0,1],"size_bytes":18874368,"dtype":"bf16","phase":"fwd",...}
    {"op":"send","axis":"pp","group":[0,8],"size_bytes":9437184,"dtype":"bf16","rank":0,"peer":8,...}

Readers are forgiving in the way a log reader must be: a truncated or corrupt line (a rank killed while
writing, a disk that filled up) is reported in :attr:`OpLog.problems` with its line number and skipped,
never a reason to lose the rest. Only a missing file, or one without a single valid line, is an error.

CSV (``.csv``, ``.csv.gz``) is for spreadsheets and pandas: one row per op with the columns of
:data:`CSV_COLUMNS`; ``group`` and ``splits`` are ranks (bytes) joined by spaces, an empty cell is ``None``.
CSV does not carry :attr:`CommOp.extra` (use JSON Lines when that matters).

The pieces both formats share are in :mod:`commscope.io.oplog_base`, the checks of a record read in
:mod:`commscope.io.oplog_checks`, the CSV format in :mod:`commscope.io.oplog_csv`; this module holds JSON Lines
and the failure marker, and is where callers import from.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from commscope.commop import CommOp
from commscope.io.oplog_base import _BATCH, OpLog, _gc_paused, _lines, _open_binary_read, _open_text_write, _Problems
from commscope.io.oplog_checks import _consistency_problem, _raw_problem, check_op, is_int
from commscope.io.oplog_csv import CSV_COLUMNS, read_ops_csv, write_ops_csv

# Importable from here, where callers import it (the tests)
from commscope.io.oplog_base import MAX_PROBLEMS  # noqa: F401

#: Key of the optional first line of a JSONL op log.
HEADER_KEY = "commscope_header"
#: Key of a measured log's step line: ``{"commscope_step": {"step": 0, "t_start_ns": ..., "t_end_ns": ...}}``, one
#: per training step a rank marked (:func:`commscope.measure.capture.step`), on that rank's clock (``time.time_ns``).
STEP_KEY = "commscope_step"
#: Value of ``header["format"]`` written by :func:`write_ops_jsonl`.
FORMAT_NAME = "commscope.ops"
#: Bumped when the line format changes incompatibly.
FORMAT_VERSION = 1


# ----------------------------------------------------------------------------------------------- JSONL


_QUOTED: dict[str, str] = {}


def json_quote(text: str) -> str:
    """JSON string literal of ``text`` (memoised: op logs repeat a few dozen distinct strings)."""
    out = _QUOTED.get(text)
    if out is None:
        out = json.dumps(text)
        if len(_QUOTED) < 65536:
            _QUOTED[text] = out
    return out


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (Path, set, frozenset)):
        return str(value) if isinstance(value, Path) else sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _op_line(op: CommOp) -> str:
    """``json.dumps(op.to_dict(), separators=(",", ":"))``, built by hand (about 5x faster)."""
    parts = ['{"op":', json_quote(op.op), ',"axis":', json_quote(op.axis), ',"group":[', ",".join(map(str, op.group)),
             '],"size_bytes":', str(op.size_bytes), ',"dtype":', json_quote(op.dtype)]
    if op.rank is not None:
        parts += (',"rank":', str(op.rank))
    if op.peer is not None:
        parts += (',"peer":', str(op.peer))
    if op.splits is not None:
        parts += (',"splits":[', ",".join(map(str, op.splits)), "]")
    if op.phase is not None:
        parts += (',"phase":', json_quote(op.phase))
    if op.micro_batch is not None:
        parts += (',"micro_batch":', str(op.micro_batch))
    if op.layer is not None:
        parts += (',"layer":', str(op.layer))
    parts += (',"count":', str(op.count))
    if op.name:
        parts += (',"name":', json_quote(op.name))
    if op.t_start_ns is not None:
        parts += (',"t_start_ns":', str(op.t_start_ns))
    if op.t_end_ns is not None:
        parts += (',"t_end_ns":', str(op.t_end_ns))
    if op.backend_op is not None:
        parts += (',"backend_op":', json_quote(op.backend_op))
    if op.extra:
        try:
            extra = json.dumps(dict(op.extra), separators=(",", ":"), default=_json_default)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"CommOp.extra={op.extra!r} cannot be written as JSON: {exc}") from None
        parts += (',"extra":', extra)
    parts.append("}")
    return "".join(parts)


def line_forms(op: str, group: list[int], rank: int, dtype: str, group_name: str, backend: str,
               backend_op: str | None = None) -> tuple[str, ...]:
    """%-format templates of the line of a recorded op of the common shape (no peer, splits or root) of one process
    group, op, dtype and backend op, indexed by ``(t_end_ns given) + 2 * (step given)``; filled with size_bytes,
    t_start_ns, [t_end_ns], seq, bytes_in, bytes_out, [step]. A recording process group keeps them in each record's
    shape (``R_SHAPE[0]``, :mod:`commscope.measure.capture.oprecord`): the recorder's writer
    (``commscope.measure.capture.recorder._line``) then formats the line once instead of assembling ~20 parts (tests hold both to ``json.dumps`` of the record's CommOp dict)."""
    def text(part: str) -> str:
        return part.replace("%", "%%")

    head = (text('{"op":' + json_quote(op) + ',"axis":"other","group":[' + ",".join(map(str, group)) + '],"size_bytes":')
            + "%d" + text(',"dtype":' + json_quote(dtype) + ',"rank":' + str(rank)) + ',"t_start_ns":%d')
    extra = (text(("" if backend_op is None else ',"backend_op":' + json_quote(backend_op)) + ',"extra":{"group_name":'
                  + json_quote(group_name)) + ',"seq":%d,"bytes_in":%d,"bytes_out":%d'
             + text(',"backend":' + json_quote(backend)))
    end, step = ',"t_end_ns":%d', ',"step":%d'
    return head + extra + "}}", head + end + extra + "}}", head + extra + step + "}}", head + end + extra + step + "}}"


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("commscope")
    except ImportError:  # not installed (running from a source tree): PackageNotFoundError is one
        return "unknown"


def write_ops_jsonl(path: str | Path, ops: Iterable[CommOp], *, header: dict[str, Any] | None = None) -> int:
    """Write ``ops`` to ``path`` as JSON Lines, streaming; returns the number of ops written.

    ``header`` (metadata such as ``world_size``, the model and parallel inputs) goes on a first line
    ``{"commscope_header": {...}}``, with ``format``, ``format_version`` and ``commscope_version`` added
    unless given. Without ``header`` the file holds op lines only. A path ending in ``.gz`` is gzip-compressed.
    Each op line is exactly ``json.dumps(op.to_dict(), separators=(",", ":"))``.
    """
    path = Path(path)
    written = 0
    with _open_text_write(path) as fh:
        if header is not None:
            meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "commscope_version": _package_version()}
            meta.update(header)
            try:
                line = json.dumps({HEADER_KEY: meta}, separators=(",", ":"), default=_json_default)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"header for {path} cannot be written as JSON: {exc}") from None
            fh.write(line + "\n")
        batch: list[str] = []
        for op in ops:
            batch.append(_op_line(op))
            if len(batch) >= _BATCH:
                batch.append("")
                fh.write("\n".join(batch))
                written += len(batch) - 1
                batch = []
        if batch:
            batch.append("")
            fh.write("\n".join(batch))
            written += len(batch) - 1
    return written


_FIELDS = frozenset(f.name for f in dataclasses.fields(CommOp))


def _op_from_obj(obj: dict[str, Any]) -> CommOp:
    """``CommOp.from_dict(obj)`` for the common case (no ``extra``), about twice as fast; any oddity goes
    through ``from_dict`` itself, for its error message."""
    if "extra" in obj or not obj.keys() <= _FIELDS:
        return CommOp.from_dict(obj)
    try:
        obj["group"] = tuple(map(int, obj["group"]))
        splits = obj.get("splits")
        if splits is not None:
            obj["splits"] = tuple(map(int, splits))
    except (KeyError, TypeError, ValueError):
        return CommOp.from_dict(obj)
    return CommOp(**obj)


def _why_not_json(raw: bytes, exc: ValueError) -> str:
    """What is wrong with a line json.loads refused: bytes that are not UTF-8 text are said to be so (json.loads
    guesses UTF-16 or UTF-32 from the first bytes of binary data and reports that codec's failure)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"not UTF-8 text: byte 0x{raw[bad.start]:02x} at column {bad.start + 1}; binary data?"
    return f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)


def _parse_line(raw: bytes, lineno: int, name: str, problems: list[str],
                header: dict[str, Any] | None = None) -> tuple[str, Any] | None:
    """One non-blank line of a JSONL op log: ``("op", CommOp)``, ``("header", dict)``, ``("step", dict)``, or None
    when the line is skipped (the reason appended to ``problems``, naming the file and line). ``header``: the
    file's, when read before this line (a record's group is checked against its rank and world size)."""
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        if not raw.endswith(b"\n"):  # only the last line of a file can lack its newline
            problems.append(f"{name} line {lineno}: truncated JSON, skipped")
        else:
            problems.append(f"{name} line {lineno}: invalid JSON ({_why_not_json(raw, exc)}), skipped")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{name} line {lineno}: expected a JSON object, got {type(obj).__name__}, skipped")
        return None
    if HEADER_KEY in obj:
        value = obj[HEADER_KEY]
        if not isinstance(value, dict):
            problems.append(f"{name} line {lineno}: {HEADER_KEY} is not an object, ignored")
            return None
        return ("header", value)
    if STEP_KEY in obj:
        mark = obj[STEP_KEY]
        if isinstance(mark, dict) and all(isinstance(mark.get(k), int) for k in ("step", "t_start_ns", "t_end_ns")):
            return ("step", {k: int(mark[k]) for k in ("step", "t_start_ns", "t_end_ns")})
        problems.append(f"{name} line {lineno}: {STEP_KEY} needs integer step, t_start_ns and t_end_ns, skipped")
        return None
    bad = _raw_problem(obj)
    if bad:
        problems.append(f"{name} line {lineno}: {bad}, skipped")
        return None
    try:
        op = _op_from_obj(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        problems.append(f"{name} line {lineno}: not a valid CommOp ({exc}), skipped")
        return None
    bad = check_op(op) or _consistency_problem(op, header)
    if bad:
        problems.append(f"{name} line {lineno}: {bad}, skipped")
        return None
    return ("op", op)


_NO_RECORD_KEYS = (HEADER_KEY.encode(), STEP_KEY.encode())


def _is_record_line(raw: bytes) -> bool:
    """Whether a skipped line was meant as an op record (not as a header or step line)."""
    return not any(key in raw for key in _NO_RECORD_KEYS)


#: The ``format`` names of commscope's op logs: :func:`write_ops_jsonl`'s and the recorder's rank logs'.
KNOWN_FORMATS = frozenset({FORMAT_NAME, "commscope-ops"})


def _take_header(value: dict[str, Any], header: dict[str, Any] | None, any_op: bool, name: str, lineno: int,
                 problems: list[str]) -> dict[str, Any] | None:
    """The header after a header line: the first one, before any op, counts; another is reported and ignored. A
    first header of another format, or of a newer version of this one, refuses the file (ValueError naming it): its
    lines may mean other things, and are not read as if they were this version's."""
    if header is None and not any_op:
        from commscope.io.checks import format_problem

        why = format_problem(value, formats=KNOWN_FORMATS, version=FORMAT_VERSION)
        if why is not None:
            raise ValueError(f"{name} line {lineno}: {HEADER_KEY} {why}")
        return value
    problems.append(f"{name} line {lineno}: another {HEADER_KEY} (files concatenated?), ignored")
    return header


def _no_valid_line(path: Path, num_lines: int, problems: list[str]) -> ValueError:
    found = "; ".join(problems[:3])
    if num_lines == 0:
        return ValueError(f"{path}: empty file, expected JSON Lines of CommOps")
    return ValueError(f"{path}: no valid line in {num_lines} lines" + (f" ({found})" if found else ""))


def read_ops_jsonl(path: str | Path) -> OpLog:
    """Read a JSON Lines op log written by :func:`write_ops_jsonl` (or any producer of the same lines).

    Blank lines are ignored. A line that is not valid JSON, not an object or not a valid CommOp is skipped
    and reported in :attr:`OpLog.problems` as ``<file> line <n>: <what>, skipped``; a second header (logs
    concatenated with ``cat``) is reported and ignored. Raises ``ValueError`` naming the file when it does
    not exist or holds no valid line at all.
    """
    path = Path(path)
    name = path.name
    problems = _Problems()
    ops: list[CommOp] = []
    steps: list[dict[str, int]] = []
    header: dict[str, Any] | None = None
    num_lines = num_records = 0
    with _open_binary_read(path) as fh, _gc_paused():
        for lineno, raw in _lines(fh, name, problems):
            num_lines = lineno
            if not raw.strip():
                continue
            parsed = _parse_line(raw, lineno, name, problems, header)
            if parsed is None:
                num_records += _is_record_line(raw)
                continue
            kind, value = parsed
            if kind == "op":
                ops.append(value)
                num_records += 1
            elif kind == "step":
                steps.append(value)
            else:
                header = _take_header(value, header, bool(ops), name, lineno, problems)
    if not ops and header is None:
        raise _no_valid_line(path, num_lines, problems)
    return OpLog(ops=ops, header=header or {}, problems=problems.finish(), steps=steps, num_records=num_records)


#: The parts of a recorded line that differ from one record of the same op to the next: its two times (written
#: side by side) and, after them, the group's sequence number; each an integer literal in place (a JSON number
#: that ends at a ``,`` or ``}``). What is left of the line around them names the record's kind.
_TIMES = re.compile(rb',"t_start_ns":(0|[1-9][0-9]*),"t_end_ns":(0|[1-9][0-9]*)(?=[,}])')
_SEQ = re.compile(rb'"seq":(0|[1-9][0-9]*)(?=[,}])')
#: The step a record is tagged with (in ``extra``, after the sequence number): its records are counted per step.
_STEP = re.compile(rb'"step":(0|[1-9][0-9]*)(?=[,}])')
#: Per file, at most this many kinds of line are remembered; past it lines are parsed one by one.
_MAX_KINDS = 1 << 16


def scan_ops_jsonl(path: str | Path, add: Callable[[CommOp, dict[int | None, int], dict[str, Any]], None]) -> OpLog:
    """Read a JSONL op log as :func:`read_ops_jsonl` does, without holding its records: valid records go to
    ``add(op, by_step, header)``, ``by_step[s]`` records equal to ``op`` but for their step ``s`` (None: untagged)
    at once, and the returned OpLog has no ``ops`` (its header, problems, step lines and ``num_records`` as
    :func:`read_ops_jsonl` gives them).

    The records of one op differ from line to line only in their times, sequence number and step: a line equal
    to an earlier one but for those integers is the same record again, counted, not parsed (the first is parsed
    and checked as :func:`read_ops_jsonl` checks every line; a later one whose end time is before its start goes
    through the same checks and is reported). ``add`` gets the first record of each kind with its lines per
    step, after the file is read; records of no repeated kind as they come. ``header`` is the file's (``{}``
    without one). Counts, fields and problems are those :func:`read_ops_jsonl` finds; times are not kept.
    """
    path = Path(path)
    name = path.name
    problems = _Problems()
    steps: list[dict[str, int]] = []
    header: dict[str, Any] | None = None
    num_lines = num_records = 0
    any_op = False
    kinds: dict[tuple[Any, ...], list[Any]] = {}  # what is left of a line -> [op, {step digits: lines}]
    times, seq, step_of = _TIMES.search, _SEQ.search, _STEP.search
    with _open_binary_read(path) as fh, _gc_paused():
        for lineno, raw in _lines(fh, name, problems):
            num_lines = lineno
            m = times(raw)
            at = 0 if m is None else m.end()
            q = seq(raw, at)
            t = step_of(raw, at if q is None else q.end())
            cuts = ([] if m is None else [m.span(1), m.span(2)]) + ([] if q is None else [q.span(1)])
            if t is not None:
                cuts.append(t.span(1))
            key: tuple[Any, ...] = ((m is not None, q is not None, t is not None),)
            begin = 0
            for a, b in cuts:
                key += (raw[begin:a],)
                begin = b
            key += (raw[begin:],)
            kind = kinds.get(key)
            if kind is not None and (m is None or int(m.group(2)) >= int(m.group(1))):
                tag = None if t is None else t.group(1)
                kind[1][tag] = kind[1].get(tag, 0) + 1
                num_records += 1
                continue
            if not raw.strip():
                continue
            parsed = _parse_line(raw, lineno, name, problems, header)
            if parsed is None:
                num_records += _is_record_line(raw)
                continue
            what, value = parsed
            if what == "step":
                steps.append(value)
            elif what == "header":
                header = _take_header(value, header, any_op, name, lineno, problems)
            else:
                any_op = True
                num_records += 1
                if (kind is None and len(kinds) < _MAX_KINDS and (m is None or _times_in_place(raw, m, value))
                        and (t is None or _step_in_place(raw, t, value))):
                    kinds[key] = [value, {None if t is None else t.group(1): 1}]
                else:
                    add(value, {_step(value): 1}, header or {})
    for op, by_tag in kinds.values():
        own = _step(op)
        add(op, {own if tag is None else int(tag): n for tag, n in by_tag.items()}, header or {})
    if not any_op and header is None:
        raise _no_valid_line(path, num_lines, problems)
    return OpLog(ops=[], header=header or {}, problems=problems.finish(), steps=steps, num_records=num_records)


def _step(op: CommOp) -> int | None:
    for key, value in op.extra:
        if key == "step":
            return value if is_int(value) else None
    return None


def _step_in_place(raw: bytes, t: re.Match[bytes], op: CommOp) -> bool:
    """Whether the step :data:`_STEP` found in a parsed line is its record's (named once, in ``extra``)."""
    return raw.count(b'"step"') == 1 and _step(op) == int(t.group(1))


def _times_in_place(raw: bytes, m: re.Match[bytes], op: CommOp) -> bool:
    """Whether the times :data:`_TIMES` found in a parsed line are the record's own (the line names each once):
    else the line is parsed each time it comes, not counted as a kind."""
    return (raw.count(b'"t_start_ns"') == 1 and raw.count(b'"t_end_ns"') == 1
            and int(m.group(1)) == op.t_start_ns and int(m.group(2)) == op.t_end_ns)


#: The marker a launcher leaves in a recording when a rank died: which rank failed first and how
#: (written by :func:`commscope.measure.capture.recorder.write_failure`, read by :func:`read_failure`).
FAILURE_FILE = "failure.json"


def read_failure(logdir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The failure marker of a recording, or None when the run did not fail under a commscope launcher (or the
    marker is unreadable)."""
    try:
        marker = json.loads((Path(logdir) / FAILURE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None

__all__ = [
    "CSV_COLUMNS",
    "FAILURE_FILE",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "OpLog",
    "read_failure",
    "read_ops_csv",
    "read_ops_jsonl",
    "scan_ops_jsonl",
    "write_ops_csv",
    "write_ops_jsonl",
]
