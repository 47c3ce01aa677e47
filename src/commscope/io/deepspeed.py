"""DeepSpeed comms-logger output as CommOps.

DeepSpeed's communication logger (``"comms_logger": {"enabled": true}`` in the DeepSpeed config;
``deepspeed/utils/comms_logging.py``) prints two things, both read here:

- the **summary table** of ``deepspeed.comm.log_summary()``: one line per op name (with ``debug`` on, followed by
  `` | [Caller Func: <function>]``), then one row per distinct message size, every field padded to 20 columns::

      Comm. Op            Message Size        Count               Total Latency(ms)   Avg Latency(ms)     tput_avg (Gbps)     busbw_avg (Gbps)
      all_gather_base
                          6.0 MB              219                 16.63               0.07                1401.24             1313.66

  Each row becomes one aggregated CommOp with ``count`` = Count, and as ``extra`` (SI units):
  ``total_latency_s``, ``avg_latency_s`` (DeepSpeed's 10%-trimmed mean, so not total / count),
  ``tput_avg_bytes_per_s`` and ``busbw_avg_bytes_per_s`` (trimmed means of the per-op values; DeepSpeed's
  "tput" of an all_reduce is 2 x size / time, not nccl-tests' algbw), ``msg_size_bytes`` and ``msg_size_text``
  (the size as printed), ``op_name`` (DeepSpeed's) and ``caller``. The tables are cumulative, so when a log
  holds several, only the last is imported (and that is said in ``problems``).
- the **verbose lines**, one per op as it completes (``"verbose": true``)::

      [2022-06-26 01:39:55,722] [INFO] [logging.py:69:log_dist] [Rank 0] rank=0 | comm op: reduce_scatter_base | time (ms): 9.46 | msg size: 678.86 MB | algbw (Gbps): 1204.52  | busbw (Gbps): 1129.23

  Each becomes one CommOp with ``rank``, ``t_end_ns`` = the line's timestamp (written right after the op
  completed; millisecond resolution; the host's local time, read as UTC because the log gives no zone) and
  ``t_start_ns`` = ``t_end_ns`` - the op's time; ``extra`` as above, per op (``latency_s``,
  ``algbw_bytes_per_s``, ``busbw_bytes_per_s``).

A file with both (verbose on for the whole run, then a summary) gives the verbose ops; ``part="summary"``
chooses the table instead.

Sizes. DeepSpeed logs the size of the call's ``tensor`` argument (``get_msg_size_from_args``): the buffer of
all_reduce / broadcast / send / recv, the whole input of reduce_scatter (nccl-tests' size), the send buffer
of all_to_all_single -- but for all_gather the *per-rank input*. nccl-tests' size of an all_gather is the
gathered output, ``n`` times that, where ``n`` is the world size DeepSpeed itself uses for its bandwidths
(``dist.get_world_size()``; the group is not logged). ``n`` is ``world_size=`` when given, else read from the
log: for all_gather, reduce_scatter, all_to_all and all_reduce DeepSpeed prints busbw = tput x (n-1)/n, so
every row with a large enough tput pins ``n`` (16 in the DeepSpeed tutorial's logs). Without ``n`` all_gather
sizes stay the per-rank input, marked ``extra["size_convention"] = "per_rank_input"``, with a problem.
Printed sizes are rounded to two decimals of their unit (``6.31 KB``), so ``size_bytes`` is exact only to
that; two rows that print the same size are two different true sizes and stay two ops.

What the logger cannot give: ``axis``, ``group`` (neither its ranks nor its size), ``peer``, ``dtype``,
``splits``, ``phase``, ``micro_batch``, ``layer``; a summary also no ``rank`` and no times.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, UTC
from pathlib import Path
from typing import Any, Literal

from commscope.io.import_base import UNKNOWN_DTYPE, ImportResult, Problems, freeze_extra, missing_fields, read_input
from commscope.commop import MAX_MESSAGE_BYTES, CommOp
from commscope.spec.cluster import LINK_BANDWIDTH_RANGE_BYTES_PER_S
from commscope.units import GBIT, KiB

__all__ = ["OP_NAMES", "import_deepspeed_comms", "parse_deepspeed_size"]

#: DeepSpeed op names (``log_name`` of ``deepspeed.comm``) -> CommOp op.
OP_NAMES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "inference_all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "allgather_fn": "all_gather",
    "all_gather_coalesced": "all_gather",
    "all_gather_single": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_fn": "reduce_scatter",
    "reduce_scatter_coalesced": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "isend": "send",
    "recv": "recv",
    "irecv": "recv",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "log_summary_barrier": "barrier",
}
#: busbw / tput = (n-1)/n for these (DeepSpeed's calc_bw_log); 1 for the others.
_RATIO_OPS = frozenset({"all_gather", "reduce_scatter", "all_to_all", "all_reduce"})
#: Largest difference between a bandwidth and its printed two-decimal value (0.005 each, two values), Gbps.
_BW_TOL = 0.0101
#: A row that leaves more than this many world sizes possible is no evidence.
_MAX_SPAN = 4
#: DeepSpeed prints times in milliseconds (divided, not multiplied by 1e-3, so that 1.55 ms is 0.00155 s exactly).
_MS_PER_S = 1000
_UNITS = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+|inf|nan)"
_SIZE = r"\d+(?:\.\d+)?\s?(?:[KMGTPEZY]?B)"
_HEADER_RE = re.compile(r"Comm\. Op\s+Message Size\s+Count\s+Total Latency\(ms\)\s+Avg Latency\(ms\)"
                        r"\s+tput_avg \(Gbps\)\s+busbw_avg \(Gbps\)")
_ROW_RE = re.compile(rf"^\s+(?P<size>{_SIZE})\s+(?P<count>\d+)\s+(?P<total>{_NUM})\s+(?P<avg>{_NUM})"
                     rf"\s+(?P<tput>{_NUM})\s+(?P<busbw>{_NUM})\s*$")
_PARTIAL_ROW_RE = re.compile(rf"^\s+{_SIZE}(?:\s|$)")
_OPNAME_RE = re.compile(r"^(?P<op>[A-Za-z_][A-Za-z0-9_.]*)(?:\s*\|\s*\[Caller Func:\s*(?P<caller>[^\]]*)\])?\s*$")
_VERBOSE_RE = re.compile(
    rf"comm op:\s*(?P<op>[A-Za-z_][A-Za-z0-9_.]*)(?:\s*\|\s*\[Caller Func:\s*(?P<caller>[^\]]*)\])?"
    rf"\s*\|\s*time \(ms\):\s*(?P<time>{_NUM})\s*\|\s*msg size:\s*(?P<size>{_SIZE})"
    rf"\s*\|\s*algbw \(Gbps\):\s*(?P<algbw>{_NUM})\s*\|\s*busbw \(Gbps\):\s*(?P<busbw>{_NUM})"
)
_VERBOSE_HINT_RE = re.compile(r"comm op:")
#: The logger's timestamp, wherever it stands before "comm op:": launchers put a prefix in front of every line
#: (torchrun --tee's ``[default0]:``, ``srun -l``'s ``0: ``, mpirun's ``[1,0]<stdout>:``).
_TIMESTAMP_RE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[,.](\d{1,6}))?\]")
#: A summary row with its leading whitespace lost (a log shipper or a copy that strips lines).
_BARE_ROW_RE = re.compile(rf"^\s*{_SIZE}\s+\d+\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_NUM}\s*$")
#: What ``errors="replace"`` makes of a byte that is no UTF-8.
_STRAY = "\ufffd"
_RANK_RE = re.compile(r"\brank=(\d{1,9})\b|\[Rank (\d{1,9})\]")


def parse_deepspeed_size(text: str) -> int:
    """Bytes of a size as DeepSpeed's ``convert_size`` prints it (binary units): ``'6.31 KB'`` -> 6461.

    ``convert_size`` rounds to two decimals, so the result is the nearest whole byte to what was printed.
    Raises ValueError for text that is no such size.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s?([KMGTPEZY]?B)\s*", text)
    value = float(m.group(1)) * KiB ** _UNITS.index(m.group(2)) if m else math.nan
    if not math.isfinite(value):
        raise ValueError(f"cannot read DeepSpeed message size {text!r}; expected e.g. '0B', '128.0 B', '6.31 KB'")
    if value > MAX_MESSAGE_BYTES:
        raise ValueError(f"DeepSpeed message size {text!r} is larger than any real message (> 1 TiB)")
    return round(value)


def _float(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else math.nan


def _impossible(times: dict[str, str], rates: dict[str, str]) -> str | None:
    """Why a row's printed times (ms) or bandwidths (Gbps) are no measurement of real hardware: negative, not a
    number, or a bandwidth above any link's (:data:`~commscope.spec.cluster.LINK_BANDWIDTH_RANGE_BYTES_PER_S`)."""
    for label, text in times.items():
        if not _float(text) >= 0:
            return f"{label}={text}: not a duration (must be a finite number >= 0)"
    hi = LINK_BANDWIDTH_RANGE_BYTES_PER_S[1]
    for label, text in rates.items():
        value = _float(text)
        if not value >= 0:
            return f"{label}={text}: not a bandwidth (must be a finite number >= 0)"
        if value * GBIT > hi:
            return f"{label}={text}: above any real link ({hi / GBIT:,.0f} Gbps)"
    return None


def import_deepspeed_comms(path: str | Path, *, world_size: int | None = None,
                           part: Literal["auto", "summary", "verbose"] = "auto",
                           strict: bool = False) -> ImportResult:
    """Read DeepSpeed comms-logger output (a log file holding the summary table and/or verbose lines).

    ``world_size`` is the ``n`` that turns DeepSpeed's per-rank all_gather size into nccl-tests' gathered size
    (read from the log's bandwidths when not given; see the module docstring). ``part`` picks the summary
    table or the verbose lines when a file has both (``auto``: the verbose lines). Lines that look like part of
    the table or a verbose line but cannot be read are listed in ``problems`` as ``<file> line <n>: ...`` and
    skipped (``strict=True`` raises instead). Raises ValueError naming the file when it holds neither a
    summary table nor a verbose line.
    """
    if part not in ("auto", "summary", "verbose"):
        raise ValueError(f"part={part!r}: valid values are auto, summary, verbose")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size={world_size!r}: must be an integer >= 1")
    name, data = read_input(path)
    problems = Problems(name, strict=strict)
    lines = data.decode("utf-8", errors="replace").splitlines()
    tables = _read_tables(lines, problems)
    verbose = _read_verbose(lines, problems)
    if not tables and not verbose:
        raise ValueError(f"{name}: no DeepSpeed comms-logger output found: expected a summary table (a line "
                         f"'Comm. Op  Message Size  Count  Total Latency(ms) ...') or verbose lines "
                         f"('comm op: <op> | time (ms): ... | msg size: ... | algbw (Gbps): ...')")
    if part == "summary" and not tables:
        raise ValueError(f"{name}: part='summary' but the file holds no summary table")
    if part == "verbose" and not verbose:
        raise ValueError(f"{name}: part='verbose' but the file holds no verbose lines")
    use_verbose = part == "verbose" or (part == "auto" and bool(verbose))
    if use_verbose and tables:
        problems.note(f"line {tables[-1]['line']}", "the file also holds a summary table of the same ops; imported "
                                                    "the verbose lines (part='summary' for the table)")
    if not use_verbose and len(tables) > 1:
        problems.note(f"line {tables[-1]['line']}",
                      f"{len(tables)} summary tables (at lines {', '.join(str(t['line']) for t in tables)}); "
                      f"DeepSpeed's tables are cumulative, so only the last is imported")
    records = verbose if use_verbose else tables[-1]["rows"]
    if not records:
        what = "verbose lines" if use_verbose else f"summary table at line {tables[-1]['line']}"
        found = problems.finish()
        if not use_verbose and tables[-1].get("rows_after"):
            found.insert(0, _ended(tables[-1]))
        raise ValueError(f"{name}: nothing importable: the {what} gave no op"
                         + (f" ({'; '.join(found[:3])})" if found else " (no row under the header)"))

    n, how = _world_size(records, world_size, problems)
    ops: list[CommOp] = []
    per_rank_gather = False
    for rec in records:
        op = rec["op"]
        size = rec["msg_size_bytes"]
        convention = None
        if op == "all_gather":
            if n is not None:
                size *= n
            else:
                convention = "per_rank_input"
                per_rank_gather = per_rank_gather or size > 0
        extra = dict(rec["extra"])
        extra["size_convention"] = convention
        extra["world_size"] = n if op == "all_gather" else None
        ops.append(CommOp(op=op, axis="other", group=(), size_bytes=size, dtype=UNKNOWN_DTYPE, rank=rec.get("rank"),
                          count=rec.get("count", 1), name=rec.get("caller") or "", t_start_ns=rec.get("t_start_ns"),
                          t_end_ns=rec.get("t_end_ns"), extra=freeze_extra(extra)))
    if per_rank_gather:
        problems.add(None, "world size unknown (pass world_size=): all_gather sizes are DeepSpeed's per-rank "
                           "input, not nccl-tests' gathered output")
    meta = {
        "part": "verbose" if use_verbose else "summary",
        "world_size": n,
        "world_size_from": how,
        "num_summary_tables": len(tables),
        "num_verbose_lines": len(verbose),
    }
    always: tuple[str, ...] = ("axis", "group", "dtype", "peer", "splits", "phase", "micro_batch", "layer")
    if not use_verbose:
        always += ("rank", "t_start_ns", "t_end_ns")
    return ImportResult(ops=ops, source=str(path), format="deepspeed", missing_fields=missing_fields(ops, always),
                        problems=problems.finish(), meta=meta)


def _read_tables(lines: list[str], problems: Problems) -> list[dict[str, Any]]:
    tables: list[dict[str, Any]] = []
    table: dict[str, Any] | None = None
    prefix = ""
    op: str | None = None
    op_raw = ""
    op_line = 0
    op_rows = 0
    caller: str | None = None

    def close_op(end_of_file: bool = False) -> None:
        if table is not None and op is not None and op_rows == 0:
            why = "the table stops there (cut short?)" if end_of_file else "no rows follow"
            problems.add(f"line {op_line}", f"op {op_raw!r} has no rows: {why}")

    ended: dict[str, Any] | None = None  # the table a line that is neither op name nor row ended, while rows follow

    for ln, raw in enumerate(lines, start=1):
        stray = _STRAY in raw  # a byte that is no UTF-8 (decoded as U+FFFD): read as a space between columns,
        name_line = raw.replace(_STRAY, "") if stray else raw  # and as nothing in an op name ('\xe9broadcast')
        if stray:
            raw = raw.replace(_STRAY, " ")
        header = _HEADER_RE.search(raw)
        if header:
            close_op()
            prefix = raw[:header.start()]
            table = {"line": ln, "rows": [], "bare_rows": 0}
            tables.append(table)
            op, op_raw, op_rows, caller = None, "", 0, None
            ended = None
            if stray:
                problems.note(f"line {ln}", "bytes that are not UTF-8 in the table's header, read as spaces")
            continue
        if table is None:
            if ended is not None and (_ROW_RE.match(raw[len(prefix):] if prefix else raw) or _BARE_ROW_RE.match(raw)):
                ended["rows_after"] += 1
            continue
        line = raw[len(prefix):] if prefix and raw.startswith(prefix) else raw
        if not line.strip():
            continue
        if stray and _OPNAME_RE.match(name_line[len(prefix):] if prefix else name_line):
            line = name_line[len(prefix):] if prefix else name_line  # an op name, not a row behind a space
        if line[0] not in " \t" and _BARE_ROW_RE.match(line):
            if not table["bare_rows"]:
                problems.note(f"line {ln}", "summary rows without their leading whitespace (stripped by a log "
                                            "shipper or a copy?); read as rows")
            table["bare_rows"] += 1
            line = " " + line
        if line[0] in " \t":
            m = _ROW_RE.match(line)
            if m is None:
                if _PARTIAL_ROW_RE.match(line) and len(line.split()) < 7:
                    problems.add(f"line {ln}", f"row cut short ({line.strip()!r}: size only or missing columns); "
                                               f"the table is truncated here, row skipped")
                else:
                    problems.add(f"line {ln}", f"unreadable summary row {line.strip()[:80]!r}, skipped")
                continue
            op_rows += 1
            if not op_raw:
                problems.add(f"line {ln}", "summary row before any op name, skipped")
                continue
            if op is None:
                if op_rows == 1:
                    problems.add(f"line {op_line}", f"unknown DeepSpeed op {op_raw!r}; its rows are skipped (known: "
                                                    f"{', '.join(sorted(OP_NAMES))})")
                continue
            try:
                msg = parse_deepspeed_size(m.group("size"))
            except ValueError as exc:  # a number too large for a float
                problems.add(f"line {ln}", f"{exc}, skipped")
                continue
            count = int(m.group("count"))
            if count < 1:
                problems.add(f"line {ln}", f"Count={count}: a logged op has count >= 1, row skipped")
                continue
            tput, busbw = _float(m.group("tput")), _float(m.group("busbw"))
            why = _impossible({"Total Latency(ms)": m.group("total"), "Avg Latency(ms)": m.group("avg")},
                              {"tput_avg (Gbps)": m.group("tput"), "busbw_avg (Gbps)": m.group("busbw")})
            if why is not None:  # the op was logged: its count and size stay; its times and rates are not used
                problems.add(f"line {ln}", f"{why}; the row's count and size kept, its times not to be trusted")
            table["rows"].append({
                "op": op, "msg_size_bytes": msg, "count": count, "caller": caller, "line": ln,
                "tput": tput, "busbw": busbw,
                "extra": {
                    "op_name": op_raw, "caller": caller, "msg_size_text": m.group("size"), "msg_size_bytes": msg,
                    "total_latency_s": _float(m.group("total")) / _MS_PER_S,
                    "avg_latency_s": _float(m.group("avg")) / _MS_PER_S,
                    "tput_avg_bytes_per_s": tput * GBIT, "busbw_avg_bytes_per_s": busbw * GBIT, "line": ln,
                },
            })
            continue
        m = _OPNAME_RE.match(line)
        if m is None:
            close_op()  # anything else ends the table (other log lines follow it)
            table["ended_by"] = (ln, line.strip()[:80], stray)
            ended, table["rows_after"] = table, 0
            table, op, op_raw, op_rows = None, None, "", 0
            continue
        close_op()
        op_raw, op_line, op_rows = m.group("op"), ln, 0
        caller = m.group("caller").strip() if m.group("caller") else None
        op = OP_NAMES.get(op_raw.lower())  # an unknown name is reported with its first row
        if stray:
            problems.note(f"line {ln}", f"bytes that are not UTF-8 beside the op name, read as {op_raw!r}")
    close_op(end_of_file=True)
    for t in tables:  # rows that a line no table has cut off from their table: said, not lost silently
        if t.get("rows_after") and t["rows"]:
            problems.add(None, f"{_ended(t)}: those rows are not read")
    return tables


def _ended(table: dict[str, Any]) -> str:
    """What ended ``table`` early (a line neither op name nor row), and how many row-like lines follow it."""
    ln, text, stray = table["ended_by"]
    num = table["rows_after"]
    return (f"line {ln} ({text!r}) is neither an op name nor a row and ended the table"
            + (" (it holds bytes that are not UTF-8)" if stray else "")
            + f"; {num} row-like line{'s' if num != 1 else ''} follow{'s' if num == 1 else ''} it")


def _read_verbose(lines: list[str], problems: Problems) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ln, raw in enumerate(lines, start=1):
        if not _VERBOSE_HINT_RE.search(raw):
            continue
        m = _VERBOSE_RE.search(raw)
        if m is None and _STRAY in raw:  # a byte that is no UTF-8: read as a space, or inside a name as nothing
            m = _VERBOSE_RE.search(raw.replace(_STRAY, " ")) or _VERBOSE_RE.search(raw.replace(_STRAY, ""))
            if m is not None:
                raw = m.string
                problems.note(f"line {ln}", "bytes that are not UTF-8 in a 'comm op:' line, read without them")
        if m is None:
            problems.add(f"line {ln}", f"a 'comm op:' line that cannot be read ({raw.strip()[:100]!r}), skipped")
            continue
        op_raw = m.group("op")
        op = OP_NAMES.get(op_raw.lower())
        if op is None:
            problems.add(f"line {ln}", f"unknown DeepSpeed op {op_raw!r}, skipped")
            continue
        try:
            msg = parse_deepspeed_size(m.group("size"))
        except ValueError as exc:
            problems.add(f"line {ln}", f"{exc}, skipped")
            continue
        latency_s = _float(m.group("time")) / _MS_PER_S
        rank_m = _RANK_RE.search(raw[:m.start()])
        rank = int(rank_m.group(1) or rank_m.group(2)) if rank_m else None
        t_end = t_start = None
        ts = _TIMESTAMP_RE.search(raw, 0, m.start())
        if ts is None:
            problems.note(f"line {ln}", "no [YYYY-MM-DD HH:MM:SS,mmm] timestamp before 'comm op:'; times left empty")
        if ts:
            try:
                when = datetime.strptime(ts.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            except ValueError:
                problems.add(f"line {ln}", f"timestamp {ts.group(1)!r} is no valid date; times left empty")
            else:
                frac = ts.group(2) or ""
                t_end = int(when.timestamp()) * 1_000_000_000 + (int(frac.ljust(9, "0")) if frac else 0)
                why = _impossible({"time (ms)": m.group("time")},
                                  {"algbw (Gbps)": m.group("algbw"), "busbw (Gbps)": m.group("busbw")})
                if why is None:
                    t_start = t_end - round(latency_s * 1e9)
                else:  # the op was logged; a duration no hardware has must not reach the timing comparison
                    problems.add(f"line {ln}", f"{why}; the op kept without its duration")
        caller = m.group("caller").strip() if m.group("caller") else None
        algbw, busbw = _float(m.group("algbw")), _float(m.group("busbw"))
        out.append({
            "op": op, "msg_size_bytes": msg, "rank": rank, "caller": caller, "line": ln, "tput": algbw,
            "busbw": busbw, "t_start_ns": t_start, "t_end_ns": t_end,
            "extra": {
                "op_name": op_raw, "caller": caller, "msg_size_text": m.group("size"), "msg_size_bytes": msg,
                "latency_s": latency_s, "algbw_bytes_per_s": algbw * GBIT, "busbw_bytes_per_s": busbw * GBIT,
                "line": ln,
            },
        })
    return out


def _world_size(records: list[dict[str, Any]], given: int | None,
                problems: Problems) -> tuple[int | None, str | None]:
    """The world size n from busbw = tput x (n-1)/n, checked against ``given``.

    Both columns are printed with two decimals, so a row says ``|tput (n-1)/n - busbw| <= 0.01``, that is
    ``tput / (tput - busbw + 0.01) <= n <= tput / (tput - busbw - 0.01)``; the rows' intervals are intersected.
    Worked number (the tutorial's all_gather_base 6.25 MB row): tput 15263.03, busbw 14309.09 -> n in [16, 16].
    Rows whose interval holds more than :data:`_MAX_SPAN` integers (small or equal bandwidths) say nothing. Where
    the rows disagree (a damaged copy: a digit changed), the one n that more than half of them (and at least two)
    allow is taken, and the rows that say otherwise are named; else none is.
    """
    intervals: list[tuple[int, int, Any]] = []  # (lo, hi, line) of each row that pins n
    for rec in records:
        tput, busbw = rec["tput"], rec["busbw"]
        if rec["op"] not in _RATIO_OPS or not (math.isfinite(tput) and math.isfinite(busbw)) or tput <= 0:
            continue
        gap = tput - busbw
        if gap - _BW_TOL <= 0:
            continue  # (n-1)/n indistinguishable from 1
        lo, hi = math.ceil(tput / (gap + _BW_TOL) - 1e-9), math.floor(tput / (gap - _BW_TOL) + 1e-9)
        if hi - lo > _MAX_SPAN:
            continue
        intervals.append((max(lo, 2), hi, rec.get("line")))
    evidence = len(intervals)
    lo_all = max([2, *(lo for lo, _, _ in intervals)])
    hi_all = min(hi for _, hi, _ in intervals) if intervals else None
    found = lo_all if hi_all is not None and lo_all == hi_all else None
    if found is None and hi_all is not None and lo_all > hi_all:  # the rows disagree: the n most of them allow
        votes = {n: sum(lo <= n <= hi for lo, hi, _ in intervals) for lo, hi, _ in intervals for n in range(lo, hi + 1)}
        best = max(votes.values(), default=0)
        winners = [n for n, v in votes.items() if v == best]
        if len(winners) == 1 and best >= 2 and 2 * best > evidence:
            found = winners[0]
            odd = [line for lo, hi, line in intervals if not lo <= found <= hi]
            problems.add(None, f"the logged bandwidths of {best} of {evidence} rows say world size {found} "
                               f"(busbw = tput x (n-1)/n); the rows at line(s) {', '.join(map(str, odd[:8]))} say "
                               "otherwise (damaged?) and were not used for it")
            return (found, "bandwidths") if given is None else _given_world(given, found, problems)
    if given is not None:
        return _given_world(given, found, problems)
    if found is not None:
        return found, "bandwidths"
    if hi_all is not None and lo_all > hi_all:
        problems.add(None, f"the logged bandwidths of {evidence} rows agree on no single world size; "
                           f"pass world_size=")
    return None, None


def _given_world(given: int, found: int | None, problems: Problems) -> tuple[int, str]:
    if found is not None and found != given:
        problems.add(None, f"world_size={given} was given, but the logged bandwidths say {found} "
                           f"(busbw = tput x (n-1)/n); using {given}")
    return given, "given"
