"""The physical rules every reader applies to a number it reads, in one place, so that ``fit``, ``--bandwidth``,
``summarize``, ``compare`` and ``report`` come to the same verdict on the same file.

- a message size is a whole number of bytes, at most :data:`~commscope.commop.MAX_MESSAGE_BYTES` (1 TiB: no
  collective of a real job moves more in one call; a Kineto trace once held an op of 4e29 bytes);
- a measured time is a finite number of seconds > 0 (a negative, zero or NaN time is no measurement);
- a bus bandwidth is a finite number > 0;
- a file says what it is: a document of another format, or of a newer version of this one, is refused naming
  the file (:func:`format_problem`), never read as if it were one this version knows.

A reader skips a damaged row with a warning naming the file and the row or line, and refuses a file with no usable
row. :func:`bench_row_problem` is the whole rule for a row of ``commscope bench`` JSON (and of a measured
bandwidth table), used by ``fit``, ``--bandwidth`` and ``report --bench`` alike; :func:`read_json_document`
reads such a file, or says in one line why it cannot.

Standard library only (the readers of the analytical core use it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.commop import MAX_MESSAGE_BYTES, MAX_RANKS

__all__ = ["bench_row_problem", "format_problem", "read_json_document", "row_time_problem", "size_problem",
           "time_problem"]


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number a file can hold (a bool is none), else None."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def size_problem(value: Any, field: str = "size_bytes", *, minimum: int = 0) -> str | None:
    """What is wrong with a message size read from a file (``field=value: why``), or None."""
    number = _number(value)
    if number is None:
        return f"{field}={value!r}: not a number"
    if not math.isfinite(number) or number != int(number):
        return f"{field}={value!r}: not a whole number of bytes"
    if number < minimum:
        return f"{field}={value!r}: must be >= {minimum}"
    if number > MAX_MESSAGE_BYTES:
        return f"{field}={value!r}: larger than any real message (> 1 TiB)"
    return None


def time_problem(value: Any, field: str = "time_s") -> str | None:
    """What is wrong with a measured time read from a file, or None: it must be a finite number > 0."""
    number = _number(value)
    if number is None:
        return f"{field}={value!r}: not a number"
    if not math.isfinite(number):
        return f"{field}={value!r}: not a finite number"
    if not number > 0:
        return f"{field}={value!r}: not a measured time (must be > 0)"
    return None


def row_time_problem(op: str, size_bytes: int, time_s: Any, *, half: str = "out-of-place") -> str | None:
    """What is wrong with the time of one half (``out-of-place``, ``in-place``) of an nccl-tests line (``all_reduce
    65536 B out-of-place time=0.00 us is no measurement (must be > 0)``), or None."""
    if time_problem(time_s) is None:
        return None
    number = _number(time_s)
    shown = f"{number * 1e6:.2f} us" if number is not None else repr(time_s)
    return f"{op} {size_bytes} B {half} time={shown} is no measurement (must be > 0)"


def _whole_problem(value: Any, field: str, minimum: int, maximum: int | None = None) -> str | None:
    number = _number(value)
    if number is None:
        return f"{field}={value!r}: not a number"
    if not math.isfinite(number) or number != int(number):
        return f"{field}={value!r}: not a whole finite number"
    if number < minimum:
        return f"{field}={value!r}: must be >= {minimum}"
    if maximum is not None and number > maximum:
        return f"{field}={number:.3g}: more ranks than any cluster (at most {maximum:,})"
    return None


#: The most ranks a measured group can have (:data:`commscope.commop.MAX_RANKS`, the bound ``plan`` and ``traffic``
#: apply to a job).
MAX_GROUP_RANKS = MAX_RANKS


def bench_row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with the numbers of one row of ``commscope bench`` JSON or of a measured bandwidth table
    (``field=value: why``), or None (the reader checks the op, against the collectives it knows). Checked where the
    row has them: ``size_bytes`` (whole, 1 B to 1 TiB), ``group_size`` (whole, >= 2: one rank moves nothing, and
    at most :data:`MAX_GROUP_RANKS`),
    ``time_s`` (finite, > 0), the bus bandwidth (``busbw_bytes_per_s`` or ``busbw_GBps``: finite, > 0)."""
    why = size_problem(row.get("size_bytes"), minimum=1)
    if why is None:
        why = _whole_problem(row.get("group_size"), "group_size", 2, MAX_GROUP_RANKS)
        if why is not None and _number(row.get("group_size")) is not None and why.endswith(">= 2"):
            why += " (one rank moves nothing)"
    if why is None and row.get("time_s") is not None:
        why = time_problem(row["time_s"])
    for key in ("busbw_bytes_per_s", "busbw_GBps"):
        if why is None and row.get(key) not in (None, ""):
            number = _number(row[key])
            if number is None or not math.isfinite(number) or not number > 0:
                why = f"{key}={row[key]!r}: not a bandwidth (must be a finite number > 0)"
    return why


def format_problem(header: dict[str, Any], *, formats: Collection[str], version: int,
                   version_key: str = "format_version") -> str | None:
    """What makes a document's ``header`` one this version of commscope cannot read, or None: a ``format`` that is
    not one of ``formats``, or a version above ``version`` (a newer commscope wrote it; its fields may mean other
    things). A header that names neither is taken as the known format (older files wrote none)."""
    name = header.get("format")
    if name is not None and name not in formats:
        return f"format={name!r}: not a format this reader knows ({', '.join(sorted(formats))})"
    number = header.get(version_key)
    if number is None:
        return None
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        return f"{version_key}={number!r}: expected a version number >= 1"
    if number > version:
        return (f"{version_key}={number}: written by a newer commscope (this one reads up to version {version}); "
                "upgrade commscope to read it")
    return None


def read_json_document(path: str | Path, field: str, *, what: str) -> Any:
    """The parsed JSON of the file ``path``; a ConfigError naming ``field`` and the path when it is missing, a folder,
    a pipe or a device, unreadable, not text (a binary file) or not valid JSON (with the line). ``what`` says what was expected
    (``a tuning table that `commscope tune --out` wrote``)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(field, str(p), f"is a directory; give {what}")
    if p.exists() and not p.is_file():  # a pipe would block the read, a device never end it
        raise ConfigError(field, str(p), f"is not a regular file (a pipe or a device?); give {what}")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(field, str(p), f"no such file; give {what}") from None
    except OSError as exc:
        raise ConfigError(field, str(p), f"cannot read it ({exc.strerror or exc}); give {what}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, str(p), f"is not a text file (byte {exc.start} is no UTF-8: a binary file?); give "
                                         f"{what}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(field, str(p), f"is not valid JSON (line {exc.lineno}: {exc.msg}); give {what}") from None
