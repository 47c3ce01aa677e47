"""Other tools' records in commscope's form: one entry point, :func:`import_records`, for every format.

==============  ======================================================  =========================================
format          what it reads                                           reader
==============  ======================================================  =========================================
``kineto``      PyTorch profiler (Kineto) trace, ``.json(.gz)``, with   :func:`commscope.io.kineto.import_kineto`
                ``record_param_comms`` events (NCCL runs)
``deepspeed``   DeepSpeed comms-logger output: the ``log_summary()``    :mod:`commscope.io.deepspeed`
                table or the per-op verbose lines
``nccl_tests``  nccl-tests / rccl-tests stdout                          :func:`import_nccl_tests`
``jsonl``       commscope's own op log (JSON Lines, ``.jsonl.gz`` too)  :func:`commscope.io.oplog.read_ops_jsonl`
``flight_       PyTorch Flight Recorder dump (pickle, read without     :mod:`commscope.io.flight_recorder`
recorder``      unpickling any class; or its JSON form)
``nccl_debug``  ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`` log lines    :mod:`commscope.io.nccl_debug`
==============  ======================================================  =========================================

Every importer returns an :class:`ImportResult`: the :class:`~commscope.commop.CommOp` records, the
``missing_fields`` that the format could not give (attribution to a parallelism axis always comes later,
from a layout, so ``axis`` is ``"other"`` and listed there), and ``problems``: one line per event, row or
line that was odd or skipped, with its event index or line number. ``size_bytes`` always follows nccl-tests'
convention (see :mod:`commscope.commop`), converted from whatever the tool printed.

Input that cannot be read at all (not the format, invalid JSON, a broken gzip stream, no op in it) raises a
``ValueError`` that names the file and, where it can, the line or event; single bad events or rows are
skipped and listed in ``problems``, or raise with ``strict=True``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import cast

from commscope.io.import_base import (
    FORMATS,
    Format,
    ImportResult,
    Problems,
    freeze_extra,
    missing_fields,
    read_input,
)
from commscope.commop import OP_NAMES, CommOp, OpName

__all__ = [
    "FORMATS",
    "ImportResult",
    "detect_format",
    "import_nccl_tests",
    "import_records",
]

# ----------------------------------------------------------------------------------------------- nccl-tests

#: nccl-tests op names without a CommOp form (a ring of sends, a hypercube exchange): reported and skipped.
_NCCL_TESTS_NO_COMMOP = frozenset({"sendrecv", "hypercube"})
_NCCL_TESTS_OP = {"all_to_all_v": "all_to_all"}


def import_nccl_tests(path: str | Path, *, op: str | None = None, strict: bool = False) -> ImportResult:
    """nccl-tests / rccl-tests stdout as CommOps: one per half row (out-of-place and in-place) of each table.

    A thin converter over :func:`commscope.io.nccl_tests.parse_nccl_tests`, which does the reading and checks.
    Each op has ``size_bytes`` from the ``size`` column (nccl-tests' convention is commscope's), the element type,
    ``group = (0, ..., n-1)`` where the log gives the number of ranks n, ``count`` = iterations x aggregated
    iterations of the timed loop where the parameter line gives them (else 1), ``rank=None`` (a row describes
    the whole group), and as ``extra`` the row's time and bandwidths in SI units, ``in_place``, ``wrong`` or
    ``max_error``, and ``source`` (``file:line``). all_to_all rows get even ``splits`` (nccl-tests sends
    ``count`` elements to every peer). ``sendrecv`` and ``hypercube`` rows have no CommOp form and are skipped
    with a problem. The parser's own problems (failed data checks, cut tables, ...) come first in ``problems``.
    """
    from commscope.io.checks import row_time_problem
    from commscope.io.nccl_tests import parse_nccl_tests

    name = Path(path).name
    problems = Problems(name, strict=strict)
    result = parse_nccl_tests(path, op=op)

    def said(text: str) -> None:  # (a line that names its own file and line)
        problems.items.append(text)
        if strict:
            raise ValueError(text)

    for text in result.problems:
        said(text)
    runs = result.meta.get("runs") or []
    ops: list[CommOp] = []
    skipped: dict[str, int] = {}
    row_index = 0
    for run in runs:
        params = run.get("params") or {}
        iters = params.get("iters")
        agg = params.get("agg_iters") or 1
        count = iters * agg if isinstance(iters, int) and iters > 0 else 1
        n = run.get("nranks")
        for row in result.rows[row_index:row_index + run["num_rows"]]:
            op_name = _NCCL_TESTS_OP.get(row.op, row.op)
            if row.op in _NCCL_TESTS_NO_COMMOP or op_name not in OP_NAMES:
                skipped[row.op] = skipped.get(row.op, 0) + 1
                continue
            # a half whose time is no measurement (0.00 us: a damaged line) is skipped and said, as fit and
            # estimate --bandwidth skip it: its op count and bytes would be counted as measured
            why = row_time_problem(row.op, row.size_bytes, row.time_s, half="in-place" if row.in_place else "out-of-place")
            if why is not None:
                said(f"{row.source}: {why}; skipped")
                continue
            group = tuple(range(n)) if isinstance(n, int) and n > 0 else ()
            splits = None
            if op_name == "all_to_all" and row.op == "all_to_all" and group and row.size_bytes % len(group) == 0:
                splits = (row.size_bytes // len(group),) * len(group)
            extra = {
                "time_s": row.time_s,
                "algbw_bytes_per_s": row.algbw_bytes_per_s,
                "busbw_bytes_per_s": row.busbw_bytes_per_s,
                "in_place": row.in_place,
                "wrong": row.wrong,
                "max_error": row.max_error,
                "failed_check": row.failed_check or None,
                "redop": row.redop,
                "root": row.root,
                "count_elements": row.count,
                "intra_node": row.intra_node,
                "source": row.source,
            }
            ops.append(CommOp(op=cast(OpName, op_name), axis="other", group=group, size_bytes=row.size_bytes, dtype=row.dtype,
                              splits=splits, count=count, name="nccl-tests", extra=freeze_extra(extra),
                              backend_op=row.op if op_name != row.op else None))
        row_index += run["num_rows"]
    for kind, num in sorted(skipped.items()):
        why = ("the collective is unknown: keep the test's command line above its output to name it" if kind not in _NCCL_TESTS_NO_COMMOP
               else "not one collective on one group")
        problems.add(None, f"{num} {kind} rows have no CommOp form ({why}); skipped")
    meta = {k: v for k, v in result.meta.items() if k != "runs"}
    meta["runs"] = [{k: v for k, v in r.items() if k != "devices"} for r in runs]
    if not ops:
        raise ValueError(f"{name}: no nccl-tests row could be converted to a CommOp"
                         + (f" ({'; '.join(problems.finish()[:3])})" if problems.items else ""))
    return ImportResult(ops=ops, source=str(path), format="nccl_tests",
                        missing_fields=missing_fields(ops, ("axis", "rank", "phase", "micro_batch", "layer",
                                                            "t_start_ns", "t_end_ns")),
                        problems=problems.finish(), meta=meta)


# ----------------------------------------------------------------------------------------------- commscope JSONL


def _import_jsonl(path: str | Path) -> ImportResult:
    from commscope.io.oplog import read_ops_jsonl

    log = read_ops_jsonl(path)
    return ImportResult(ops=log.ops, source=str(path), format="jsonl", missing_fields=missing_fields(log.ops),
                        problems=list(log.problems), meta={"header": dict(log.header)})


# ----------------------------------------------------------------------------------------------- detection

# (\ufffd: a byte that is no UTF-8 between the columns, as the DeepSpeed reader reads it)
_DEEPSPEED_RE = re.compile(r"Comm\. Op[\s\ufffd]+Message Size[\s\ufffd]+Count|comm op:\s*\S.*\|\s*time \(ms\):")
# (not anchored at the line's start: mpirun's ``[1,0]<stdout>:``, ``srun -l``'s ``0:`` or a timestamp come before the
# '#' on every line, and an output cut before its '# Avg bus bandwidth' has only its header lines to go by)
_NCCL_TESTS_RE = re.compile(
    r"#\s*nThread\s+\d+\s+nGpus\s+\d|#\s*Avg bus bandwidth|[A-Za-z0-9_]_perf(?:_mpi)?\b|#\s+size\s+count\s+type"
    r"|#\s*Collective test starting|rccl-tests:|# [nr]ccl-tests version",
    re.MULTILINE,
)
_HEAD_BYTES = 1 << 16


def detect_format(path: str | Path) -> Format:
    """The format of a file, from its content (not its name). Raises ValueError when it is none of :data:`FORMATS`."""
    name, data = read_input(path)
    return _detect(name, data)


def _detect(name: str, data: bytes) -> Format:
    head = data[:_HEAD_BYTES].decode("utf-8", errors="replace")
    stripped = head.lstrip("\ufeff \t\r\n")
    if not stripped:
        raise ValueError(f"{name}: empty file, expected a Kineto trace, DeepSpeed comms log, nccl-tests output "
                         f"or a commscope JSONL op log")
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "flight_recorder"  # a pickle: PyTorch's Flight Recorder writes one (read without unpickling classes)
    if stripped[0] == "{" and '"entries"' in head and ('"pg_config"' in head or '"profiling_name"' in head):
        return "flight_recorder"
    if stripped[0] == "{" or re.match(r"\[\s*[{\]]", stripped):  # a JSON object or a JSON array of objects
        first = stripped.split("\n", 1)[0].strip()
        try:
            obj = json.loads(first)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and ("commscope_header" in obj or {"op", "size_bytes"} <= obj.keys()):
            return "jsonl"
        if stripped[0] == "[" or any(k in head for k in ('"traceEvents"', '"schemaVersion"', '"deviceProperties"',
                                                            '"displayTimeUnit"', '"ph"')):
            return "kineto"
    text = data.decode("utf-8", errors="replace")
    # the regex only where its literal words are (a plain search: a 100 MB nccl-tests table in a tenth of a second)
    if ("Comm. Op" in text or "comm op:" in text) and _DEEPSPEED_RE.search(text):
        return "deepspeed"
    if _NCCL_TESTS_RE.search(text):
        return "nccl_tests"
    from commscope.io.nccl_debug import looks_like_nccl_debug

    if looks_like_nccl_debug(text):
        return "nccl_debug"
    raise ValueError(f"{name}: cannot tell the format from the content; expected a PyTorch profiler (Kineto) "
                     f"JSON trace, DeepSpeed comms-logger output ('Comm. Op  Message Size ...' table or "
                     f"'comm op: ... | time (ms): ...' lines), nccl-tests output, a PyTorch Flight Recorder dump, "
                     f"NCCL_DEBUG=INFO collective lines or a commscope JSONL op log; "
                     f"from Python, import_records(path, format=...) reads it as one of {', '.join(FORMATS)}")


def import_records(path: str | Path, format: str = "auto", *, strict: bool = False) -> ImportResult:
    """Read another tool's communication records (or commscope's own op log) into CommOps.

    ``format`` is ``auto`` (decided from the content, see :func:`detect_format`) or one of :data:`FORMATS`.
    ``strict=True`` raises a ValueError at the first skipped event, row or line instead of listing it in
    ``problems``. Raises ValueError, naming the file, for input that cannot be read as the format at all.
    """
    if format not in ("auto", *FORMATS):
        raise ValueError(f"format={format!r}: valid formats are auto, {', '.join(FORMATS)}")
    fmt = _detect(*read_input(path)) if format == "auto" else format
    if fmt == "kineto":
        from commscope.io.kineto import import_kineto

        return import_kineto(path, strict=strict)
    if fmt == "deepspeed":
        from commscope.io.deepspeed import import_deepspeed_comms

        return import_deepspeed_comms(path, strict=strict)
    if fmt == "nccl_tests":
        return import_nccl_tests(path, strict=strict)
    if fmt == "flight_recorder":
        from commscope.io.flight_recorder import import_flight_recorder

        return import_flight_recorder(path, strict=strict)
    if fmt == "nccl_debug":
        from commscope.io.nccl_debug import import_nccl_debug

        return import_nccl_debug(path, strict=strict)
    result = _import_jsonl(path)
    if strict and result.problems:
        raise ValueError(result.problems[0])
    return result
