"""What every importer of other tools' records shares: the result type, problem lists, reading a (gzipped) file.

:mod:`commscope.io.importers` (the entry point and the format detection) and the per-format readers
(:mod:`commscope.io.kineto`, :mod:`commscope.io.deepspeed`, :mod:`commscope.io.flight_recorder`,
:mod:`commscope.io.nccl_debug`) import this module; it imports none of them.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from commscope.commop import CommOp
from commscope.units import DTYPE_BYTES

Format = Literal["kineto", "deepspeed", "nccl_tests", "jsonl", "flight_recorder", "nccl_debug"]
#: The formats :func:`commscope.io.importers.import_records` reads.
FORMATS: tuple[str, ...] = ("kineto", "deepspeed", "nccl_tests", "jsonl", "flight_recorder", "nccl_debug")

#: At most this many problems are listed one by one; the rest are counted in one last entry.
MAX_PROBLEMS = 200

#: CommOp fields an importer may be unable to give, in CommOp's order, with the ops they apply to (None: all).
_OPTIONAL_FIELDS: tuple[tuple[str, frozenset[str] | None], ...] = (
    ("axis", None),
    ("group", None),
    ("dtype", None),
    ("rank", None),
    ("peer", frozenset({"send", "recv"})),
    ("splits", frozenset({"all_to_all"})),
    ("phase", None),
    ("micro_batch", None),
    ("layer", None),
    ("t_start_ns", None),
    ("t_end_ns", None),
)
_FIELD_ORDER = {name: i for i, (name, _) in enumerate(_OPTIONAL_FIELDS)}
#: The value an importer writes where a field is unknown: ``axis`` is attributed later from a layout.
UNKNOWN_DTYPE = "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    """What an imported file held, in commscope's form."""

    ops: list[CommOp]
    """The records, in time order where the format has times, else in file order."""
    source: str
    """The file they came from (the path as given)."""
    format: Format
    """One of :data:`FORMATS`."""
    missing_fields: tuple[str, ...]
    """CommOp fields this file could not give (``axis`` always: it is attributed later from a layout;
    ``peer`` only where there are point-to-point ops, ``splits`` only where there are all_to_all ops)."""
    problems: list[str] = field(default_factory=list)
    """``<file> event 812: ...`` / ``<file> line 12: ...`` for every skipped or suspicious item."""
    meta: dict[str, Any] = field(default_factory=dict)
    """What the file says beyond the ops (world size, versions, how kernels were paired, ...); format-specific."""

    @property
    def ok(self) -> bool:
        """True when nothing was found wrong."""
        return not self.problems


# ----------------------------------------------------------------------------------------------- shared helpers


class Problems:
    """Problem lines of one file; stops listing after MAX_PROBLEMS, counts the rest; raises when strict."""

    def __init__(self, name: str, *, strict: bool = False) -> None:
        self.name = name
        self.strict = strict
        self.items: list[str] = []
        self.dropped = 0

    def add(self, where: str | None, message: str) -> None:
        """``where`` is ``'line 12'``, ``'event 812'`` or None (the whole file)."""
        text = f"{self.name} {where}: {message}" if where else f"{self.name}: {message}"
        if self.strict:
            raise ValueError(text)
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(text)
        else:
            self.dropped += 1

    def note(self, where: str | None, message: str) -> None:
        """Like :meth:`add`, but never raises: for facts a user must know that are no error in the input."""
        strict, self.strict = self.strict, False
        try:
            self.add(where, message)
        finally:
            self.strict = strict

    def finish(self) -> list[str]:
        out = list(self.items)
        if self.dropped:
            out.append(f"{self.name}: ... and {self.dropped} more problems not listed")
        return out


def read_input(path: str | Path) -> tuple[str, bytes]:
    """(display name, content) of a file, gunzipped when it starts with the gzip magic bytes."""
    p = Path(path)
    name = p.name or str(path)
    try:
        if not p.exists():
            raise ValueError(f"{path}: no such file")
        if p.is_dir():
            raise ValueError(f"{path}: is a directory, expected a file")
        if not p.is_file():  # a pipe (`<(zcat log.gz)`) is read more than once: by format detection, then its reader
            raise ValueError(f"{path}: not a regular file (a pipe or a device?); save the output to a file and give "
                             f"that (.gz is read as it is)")
        data = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{name}: not a valid gzip file, or cut short ({exc})") from None
    return name, data


def missing_fields(ops: list[CommOp], always: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``always`` plus every optional field that no op it applies to has (``axis`` counts as missing when it is
    ``other`` everywhere, ``group`` when empty, ``dtype`` when ``unknown``); in CommOp's field order."""
    out = set(always)
    for name, applies in _OPTIONAL_FIELDS:
        relevant = [op for op in ops if applies is None or op.op in applies]
        if not relevant:
            continue
        if all(_is_unknown(name, getattr(op, name)) for op in relevant):
            out.add(name)
    return tuple(sorted(out, key=lambda n: _FIELD_ORDER.get(n, len(_FIELD_ORDER))))


def note_fields(op: CommOp, relevant: set[str], known: set[str], *, rank: int | None = None) -> None:
    """Add the optional fields that apply to ``op`` to ``relevant`` and those it has to ``known`` (``rank``: the
    rank it is counted under, when not its own): :func:`missing_fields` one record at a time."""
    for name, applies in _OPTIONAL_FIELDS:
        if applies is None or op.op in applies:
            relevant.add(name)
            if not _is_unknown(name, rank if name == "rank" and rank is not None else getattr(op, name)):
                known.add(name)


def missing_of(relevant: set[str], known: set[str], always: tuple[str, ...] = ()) -> tuple[str, ...]:
    """:func:`missing_fields` from what :func:`note_fields` collected."""
    out = set(always) | (relevant - known)
    return tuple(sorted(out, key=lambda n: _FIELD_ORDER.get(n, len(_FIELD_ORDER))))


def _is_unknown(name: str, value: Any) -> bool:
    if name == "axis":
        return value == "other"
    if name == "group":
        return not value
    if name == "dtype":
        return value == UNKNOWN_DTYPE
    return value is None


def freeze_extra(items: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """CommOp.extra from a dict: None values left out, keys sorted (as :meth:`CommOp.from_dict` does)."""
    return tuple(sorted((k, v) for k, v in items.items() if v is not None))

#: dtype names a CommOp may carry: commscope's own, the importers' (c10 ScalarType names mapped), and ``unknown``.
KNOWN_DTYPES: frozenset[str] = frozenset(DTYPE_BYTES) | {
    "bool", "int16", "uint16", "uint32", "uint64", "complex32", "complex64", "complex128", "fp8_e4m3", "fp8_e5m2",
    "fp8_e8m0", UNKNOWN_DTYPE}
