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
"""

from __future__ import annotations

import csv
import contextlib
import dataclasses
import gc
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeGuard

import numpy as np

from commscope.io.import_base import KNOWN_DTYPES
from commscope.commop import MAX_MESSAGE_BYTES, ROOTED_OPS, CommOp

#: Key of the optional first line of a JSONL op log.
HEADER_KEY = "commscope_header"
#: Key of a measured log's step line: ``{"commscope_step": {"step": 0, "t_start_ns": ..., "t_end_ns": ...}}``, one
#: per training step a rank marked (:func:`commscope.measure.capture.step`), on that rank's clock (``time.time_ns``).
STEP_KEY = "commscope_step"
#: Value of ``header["format"]`` written by :func:`write_ops_jsonl`.
FORMAT_NAME = "commscope.ops"
#: Bumped when the line format changes incompatibly.
FORMAT_VERSION = 1
#: Columns of an op-log CSV, in order.
CSV_COLUMNS: tuple[str, ...] = (
    "op", "axis", "name", "group", "rank", "peer", "size_bytes", "dtype", "phase", "micro_batch", "layer",
    "count", "splits", "t_start_ns", "t_end_ns", "backend_op",
)
_CSV_REQUIRED = ("op", "axis", "group", "size_bytes")
_CSV_OPTIONAL_INT = ("rank", "peer", "micro_batch", "layer", "t_start_ns", "t_end_ns")
#: At most this many problems are listed one by one; the rest are counted in one last entry.
MAX_PROBLEMS = 100
_BATCH = 8192
#: dtype names a record may carry (lower case): commscope's, torch's (``float8_e4m3fn``), the importers'.
_KNOWN_DTYPES = frozenset(d.lower() for d in KNOWN_DTYPES) | {
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "complex32", "qint8", "quint8", "qint32"}


@dataclass(frozen=True, slots=True, kw_only=True)
class OpLog:
    """What an op-log file held."""

    ops: list[CommOp]
    """The valid records, in file order."""
    header: dict[str, Any] = field(default_factory=dict)
    """The ``commscope_header`` object of the first line; empty when the file has none."""
    problems: list[str] = field(default_factory=list)
    """One line per skipped line or other oddity: ``ops.jsonl line 812: truncated JSON, skipped``."""
    steps: list[dict[str, int]] = field(default_factory=list)
    """The step lines (:data:`STEP_KEY`) in file order: ``step``, ``t_start_ns``, ``t_end_ns``."""
    num_records: int = 0
    """Op-record lines in the file, valid or skipped (every non-blank line but the header and step lines): what
    a recorder's completion marker (``rank#####.done``) says it wrote."""

    def to_pandas(self) -> Any:
        """The ops as a pandas DataFrame, one row per op (needs pandas; :func:`commscope.io.tables.ops_to_pandas`)."""
        from commscope.io.tables import ops_to_pandas

        return ops_to_pandas(self.ops)

    def to_polars(self) -> Any:
        """The ops as a polars DataFrame (needs polars and pyarrow)."""
        from commscope.io.tables import ops_to_polars

        return ops_to_polars(self.ops)


# ----------------------------------------------------------------------------------------------- files


def _is_gzip(path: Path) -> bool:
    return path.suffix == ".gz"


@contextlib.contextmanager
def _open_text_write(path: Path) -> Iterator[IO[str]]:
    """A text file to write ``path`` through (gzip for ``.gz``): a temporary file renamed over it when complete
    (:func:`commscope.io.atomic.atomic_path`), so a full disk or a kill never leaves a cut log."""
    from commscope.io.atomic import atomic_path

    with atomic_path(path) as tmp:
        if _is_gzip(path):
            with gzip.open(tmp, "wt", encoding="utf-8", newline="\n", compresslevel=6) as fh:
                yield fh
        else:
            with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
                yield fh


def _open_binary_read(path: Path) -> gzip.GzipFile | io.BufferedReader:
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, expected an op-log file")
    if _is_gzip(path):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _lines(fh: Iterable[bytes], name: str, problems: list[str]) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) pairs; a broken compressed stream ends the iteration with a problem."""
    lineno = 0
    try:
        for lineno, raw in enumerate(fh, start=1):
            yield lineno, raw
    except (EOFError, OSError, zlib.error) as exc:
        problems.append(f"{name} line {lineno + 1}: compressed stream ends early or is corrupt ({exc}); "
                        f"kept the {lineno} lines before it")


class _Problems(list):
    """A list of problem lines that stops growing after MAX_PROBLEMS and counts the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def append(self, item: str) -> None:
        if len(self) < MAX_PROBLEMS:
            super().append(item)
        else:
            self.dropped += 1

    def finish(self) -> list[str]:
        out = list(self)
        if self.dropped:
            out.append(f"... and {self.dropped} more problems not listed")
        return out


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a reader builds a million small objects (none cyclic):
    otherwise its repeated full collections cost as much as the parsing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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


def is_int(value: Any) -> TypeGuard[int]:
    """An integer that is not a bool (JSON true/false read as 1/0 is no rank, size or count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _raw_problem(obj: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a record's JSON object that CommOp computes with before :func:`check_op` can
    look at them, or None: a size or count that is no integer (``"4000"``: CommOp would fail comparing it with 0),
    a group or splits that is no list of integers (``int()`` would silently turn ``["1"]`` or ``[0.5]`` into
    ranks). The message names the field, the value and what would be valid, as :func:`check_op`'s do."""
    size = obj.get("size_bytes", 0)
    if not (is_int(size) and size >= 0):
        return f"size_bytes={size!r}: expected a whole number of bytes >= 0"
    count = obj.get("count", 1)
    if not (is_int(count) and count >= 1):
        return f"count={count!r}: expected an integer >= 1"
    group = obj.get("group", [])
    if not (isinstance(group, list) and all(is_int(r) and r >= 0 for r in group)):
        return f"group={group!r}: expected a list of ranks (integers >= 0)"
    splits = obj.get("splits")
    if splits is not None and not (isinstance(splits, list) and all(is_int(b) and b >= 0 for b in splits)):
        return f"splits={splits!r}: expected bytes per peer (integers >= 0)"
    return None


def check_op(op: CommOp) -> str | None:
    """What is wrong with a record read from a file, or None: the checks CommOp leaves to readers, because a file
    can hold what code would never build (a null group, a size of ``1e400`` read as infinity, a size over
    :data:`~commscope.commop.MAX_MESSAGE_BYTES`, NaN times, an unknown dtype, a step that is no integer). The
    message names the field, the value and what would be valid."""
    if not isinstance(op.group, tuple) or not all(is_int(r) and r >= 0 for r in op.group):
        return f"group={op.group!r}: expected a list of ranks (integers >= 0)"
    if not is_int(op.size_bytes):
        return f"size_bytes={op.size_bytes!r}: expected a whole number of bytes >= 0"
    if op.size_bytes > MAX_MESSAGE_BYTES:
        return (f"size_bytes={op.size_bytes} is larger than any real message (> 1 TiB, {MAX_MESSAGE_BYTES} B): "
                f"a damaged record")
    if not is_int(op.count):
        return f"count={op.count!r}: expected an integer >= 1"
    for name in ("rank", "peer", "micro_batch", "layer", "t_start_ns", "t_end_ns"):
        value = getattr(op, name)
        if value is not None and not (is_int(value) and value >= 0):
            return f"{name}={value!r}: expected an integer >= 0 or nothing"
    if op.t_start_ns is not None and op.t_end_ns is not None and op.t_end_ns < op.t_start_ns:
        return f"t_end_ns={op.t_end_ns} is before t_start_ns={op.t_start_ns}"
    if op.splits is not None and not all(is_int(b) and b >= 0 for b in op.splits):
        return f"splits={op.splits!r}: expected bytes per peer (integers >= 0)"
    if not isinstance(op.dtype, str) or op.dtype.lower() not in _KNOWN_DTYPES:
        return f"dtype={op.dtype!r}: unknown; valid: {', '.join(sorted(_KNOWN_DTYPES))}"
    for key, value in op.extra:
        if key == "step" and value is not None and not (is_int(value) and value >= 0):
            return f"step={value!r}: expected a training step (an integer >= 0) or nothing (setup)"
    return None


def _consistency_problem(op: CommOp, header: dict[str, Any] | None) -> str | None:
    """What is wrong with a valid record's rank and process group against each other and the file's header, or
    None. A record in a rank's log is that rank's (the header's ``rank``). Its group is the global ranks of the
    process group it ran on, its own rank among them (a send's and recv's too: their group is the process group's,
    or the pair, and holds the peer, another rank, as well); no rank twice; none at or above the header's world
    size. An all_to_all's splits give the bytes to each member and add up to its size. A record that breaks this
    would add ranks the job never had, count the op on a group its rank is not in, or place bytes nowhere."""
    group = op.group
    if len(set(group)) != len(group):
        twice = sorted({r for r in group if group.count(r) > 1})
        return f"group={list(group)}: rank {', '.join(map(str, twice))} more than once; expected distinct ranks"
    stated = (header or {}).get("rank")
    stated = stated if is_int(stated) and stated >= 0 else None
    if op.rank is not None and stated is not None and op.rank != stated:
        return f"rank={op.rank} in the log of rank {stated} (its header's): expected {stated}"
    rank = op.rank if op.rank is not None else stated
    if group and rank is not None and rank not in group:
        return (f"group={list(group)} does not hold the record's rank {rank}: expected the group the rank ran "
                f"the op on, itself among its members")
    if group and op.op in ("send", "recv"):
        if op.peer is None:
            return (f"op={op.op!r} names no peer: expected the rank it {'sent to' if op.op == 'send' else 'received from'}"
                    f" (peer, a member of group={list(group)})")
        if op.peer == rank:
            return f"peer={op.peer} is the record's own rank: a {op.op} goes to another rank"
    if group and op.peer is not None and op.peer not in group:
        return f"peer={op.peer} is not in group={list(group)}: expected a member of the group it sent or received on"
    if group and op.op in ROOTED_OPS:
        root = dict(op.extra).get("root")
        if root is not None and not (is_int(root) and root in group):
            return (f"root={root!r} is not in group={list(group)}: expected the member of the group the {op.op} "
                    f"{'starts' if op.op in ('broadcast', 'scatter') else 'ends'} at (a global rank)")
    if group and op.op == "all_to_all" and op.splits is not None:
        if len(op.splits) != len(group):
            return (f"splits={list(op.splits)} has {len(op.splits)} entries for group={list(group)}: expected the bytes "
                    f"sent to each of its {len(group)} members, in group order")
        if sum(op.splits) != op.size_bytes:
            return (f"splits={list(op.splits)} sum to {sum(op.splits)} B, size_bytes={op.size_bytes}: expected the "
                    f"whole send buffer split among the group")
    world = (header or {}).get("world_size")
    if is_int(world) and world > 0:
        if group and max(group) >= world:
            return (f"group={list(group)}: rank {max(group)} is not below the header's world_size={world}; "
                    f"expected ranks 0 to {world - 1}")
        for key, value in (("rank", op.rank), ("peer", op.peer)):
            if value is not None and value >= world:
                return (f"{key}={value} is not below the header's world_size={world}; expected a rank 0 to "
                        f"{world - 1}")
    return None


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
            what = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            problems.append(f"{name} line {lineno}: invalid JSON ({what}), skipped")
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


# ----------------------------------------------------------------------------------------------- CSV


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
