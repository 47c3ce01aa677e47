"""What op-log readers and writers of both formats (JSON Lines and CSV) share: the :class:`OpLog` a reader returns,
files opened the same way (gzip for ``.gz``, writes through a temporary file renamed over the target), lines
numbered as problem lines name them, a problem list that stops growing, and the garbage collector paused while a
million small records are built.

:mod:`commscope.io.oplog` (JSON Lines) and :mod:`commscope.io.oplog_csv` import this module; it imports neither.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from commscope.commop import CommOp

#: At most this many problems are listed one by one; the rest are counted in one last entry.
MAX_PROBLEMS = 100
_BATCH = 8192


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
