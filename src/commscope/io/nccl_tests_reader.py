"""The walk through nccl-tests output, line by line: launcher prefixes stripped, ``NCCL INFO`` / ``WARN`` lines
and failure messages set aside (a row they cut is put back together), the file split into runs (at each parameter
line, test start or table header), and what each run's comment lines say collected: devices, parameters, command
line, versions, the summary.

Private to :mod:`commscope.io.nccl_tests`, which turns the runs collected here into rows.
"""

from __future__ import annotations

import math
import re
from typing import Any

from commscope.io.nccl_tests_lines import (
    _FAILURE_RES,
    _FAST_REDOPS,
    _FAST_TYPES,
    _GENERIC_PREFIX_RE,
    _LABEL_PREFIX_RE,
    _MPI_PREFIX_RE,
    _NCCL_LOG_RE,
    _NCCL_LOG_START_RE,
    _NRANKS_RE,
    _PARAM_ITEMS,
    _PARAMS_RE,
    _RANK_LINE_RE,
    _STEP_RE,
    _UINT_RE,
    _WORD_RE,
    _clip,
    _command_args,
    _fast_row,
    _is_cont_token,
    _is_number,
    _middle_ok,
    _num,
    _parse_header,
    _parse_row,
    _perf_binary,
    _Problems,
    _RawRow,
    _row_from_match,
    _RowError,
    _Run,
    _Schema,
    _version_from_code,
)
from commscope.io.nccl_tests_columns import _Block, _read_block
from commscope.io.nccl_tests_terms import canonical_op

#: Plain data rows in a row before the reader takes them a block at a time, and the most it takes at once.
_BLOCK_MIN, _BLOCK_MAX = 256, 65536

class _Reader:
    def __init__(self, name: str) -> None:
        self.name = name
        self.problems = _Problems(name)
        self.runs: list[_Run] = []
        self.cur = _Run(start_line=1)
        self.versions: dict[str, str] = {}
        self.json_output: str | None = None
        self.pending: tuple[int, list[str], str | None] | None = None
        self.row_lines: dict[str, int] = {}

    # -- runs --------------------------------------------------------------------------------------------------------

    def _new_run(self, line: int, *, inherit: bool = False) -> None:
        old = self.cur
        self.runs.append(old)
        self.cur = _Run(start_line=line)
        if inherit:
            self.cur.devices = list(old.devices)
            self.cur.devices_line = old.devices_line
            self.cur.params = old.params
            self.cur.params_line = old.params_line
            self.cur.op_hint, self.cur.op_hint_line = old.op_hint, old.op_hint_line
            self.cur.op_hint_raw = old.op_hint_raw
            self.cur.command, self.cur.args = old.command, old.args
            self.cur.nccl_nranks = set(old.nccl_nranks)

    def _started(self) -> bool:
        return bool(self.cur.rows) or self.cur.schema is not None or self.cur.summary_line > 0

    # -- lines -------------------------------------------------------------------------------------------------------

    def feed(self, ln: int, raw: str) -> bool:
        """Read line ``ln``; True when it was a plain data row of the current table (read by one regex)."""
        schema = self.cur.schema
        if schema is not None and self.pending is None:  # nearly every line of a large table: one regex, no search
            fast = _fast_row(schema)
            m = fast.match(raw) if fast is not None else None
            if m is not None and m["type"].lower() in _FAST_TYPES and (m["redop"] is None or m["redop"] in _FAST_REDOPS):
                self._take_row(_row_from_match(m, ln), ln, None)
                return True
        self._feed(ln, raw)
        return False

    def feed_lines(self, lines: list[str]) -> None:
        """Read every line of ``lines``. Inside a long table (after a streak of plain data rows), lines are read a
        block at a time where every line of the block is a plain data row (:func:`_read_block`: the same rows, in
        a fraction of the time); a block that holds anything else is tried smaller, then read line by line."""
        ln, streak, size = 0, 0, _BLOCK_MIN
        while ln < len(lines):
            schema = self.cur.schema
            if streak >= _BLOCK_MIN and schema is not None and self.pending is None:
                stop = min(ln + size, len(lines))
                block = _read_block(lines, ln, stop, schema)
                if block is not None:
                    self._take_block(block)
                    ln, size = stop, min(2 * size, _BLOCK_MAX)
                    continue
                if size > _BLOCK_MIN:
                    size //= 2
                    continue
                streak, size = 0, _BLOCK_MIN
            streak = streak + 1 if self.feed(ln + 1, lines[ln]) else 0
            ln += 1

    def _take_block(self, block: _Block) -> None:
        if self.cur.summary_line and not self.cur.rows_after_summary:
            self.cur.rows_after_summary = True
            self.problems.add(block.first_line, f"data row after the summary at line {self.cur.summary_line} of the "
                                                "same table")
        self.cur.rows.append(block)

    def _feed(self, ln: int, raw: str) -> None:
        line = raw.replace("\x00", "")
        mpi_rank = None
        m = _MPI_PREFIX_RE.match(line)
        if m:
            mpi_rank = f"[{m.group(1)},{m.group(2)}]"
            line = line[m.end():]
        m = _LABEL_PREFIX_RE.match(line)
        if m:
            line = line[m.end():]
        s = line.strip()
        if not s:
            return
        if self.pending is not None:
            toks = s.split()
            if all(_is_cont_token(t) for t in toks) and not _NCCL_LOG_RE.search(s):
                pln, ptoks, prank = self.pending
                self.pending = None
                self._row(pln, ptoks + toks, prank, joined_line=ln)
                return
            if not _NCCL_LOG_RE.search(s):
                self._flush_pending()
        if s.startswith("#"):
            self._comment(ln, s)
            return
        log = _NCCL_LOG_RE.search(s)
        if log:
            start = _NCCL_LOG_START_RE.search(s)
            head = s[: start.start()] if start else ""
            if head.strip() and self._row_text(head.strip()) is not None:
                self._nccl_log(ln, s[start.start():] if start else s)
                self._row_candidate(ln, head.strip(), mpi_rank, allow_pending=True)
            else:
                self._nccl_log(ln, s)
            return
        if self._versions(ln, s):
            return
        for rx in _FAILURE_RES:
            m = rx.search(s)
            if m:
                self.problems.add(ln, f"the output reports a failure: {_clip(s, 200)}")
                # A failure message can follow the half-printed row of the size that failed.
                toks = s[: m.start()].split()
                if toks and toks[-1].endswith(":"):
                    toks = toks[:-1]  # the host name nccl-tests puts before its message
                if toks and self._row_text(" ".join(toks)) is not None:
                    self._row_candidate(ln, " ".join(toks), mpi_rank, allow_pending=False)
                return
        perf = _perf_binary(s)
        if perf is not None and self._row_text(s) is None:
            self._op_hint(ln, perf[0], s, command=True, args=_command_args(s.split()[perf[1] + 1 :]))
            return
        self._row_candidate(ln, s, mpi_rank)

    def _row_text(self, s: str) -> str | None:
        """The row part of a line that looks like a data row (first token a number), else None."""
        first = s.split(None, 1)[0]
        if _is_number(first):
            return s
        m = _GENERIC_PREFIX_RE.match(s)
        if m and m.end() < len(s):
            rest = s[m.end():].strip()
            if rest and _is_number(rest.split(None, 1)[0]) and len(rest.split()) >= 3:
                return rest
        return None

    def _row_candidate(self, ln: int, s: str, mpi_rank: str | None, *, allow_pending: bool = True) -> None:
        text = self._row_text(s)
        if text is None:
            return
        toks = text.split()
        schema = self.cur.schema or _Schema()
        if (allow_pending and len(toks) < schema.head + 4 and len(toks) >= 3 and _UINT_RE.fullmatch(toks[0])
                and _UINT_RE.fullmatch(toks[1]) and _WORD_RE.fullmatch(toks[2]) and _middle_ok(toks[3:])):
            # Only the head of a row: its numbers may follow on a later line (an NCCL INFO line cut in).
            self.pending = (ln, toks, mpi_rank)
            return
        self._row(ln, toks, mpi_rank)

    def _flush_pending(self) -> None:
        if self.pending is None:
            return
        pln, ptoks, _ = self.pending
        self.pending = None
        self.problems.add(pln, f"data row without its numbers: {_clip(' '.join(ptoks))!r}")

    def _row(self, ln: int, toks: list[str], mpi_rank: str | None, *, joined_line: int | None = None) -> None:
        schema = self.cur.schema or _Schema()
        try:
            row, note = _parse_row(toks, schema, ln, mpi_rank)
        except _RowError as exc:
            self.problems.add(ln, f"cannot read data row {_clip(' '.join(toks))!r}: {exc}: row skipped")
            return
        if joined_line is not None:
            self.problems.add(ln, f"data row split by other output; its numbers are on line {joined_line}")
        if note:
            self.problems.add(ln, f"data row {_clip(' '.join(toks))!r}: {note}; kept the out-of-place half only")
        self._take_row(row, ln, mpi_rank)

    def _take_row(self, row: _RawRow, ln: int, mpi_rank: str | None) -> None:
        if self.cur.summary_line and not self.cur.rows_after_summary:
            self.cur.rows_after_summary = True
            self.problems.add(ln, f"data row after the summary at line {self.cur.summary_line} of the same table")
        if mpi_rank is not None:
            self.row_lines.setdefault(mpi_rank, ln)
        self.cur.rows.append(row)

    def _comment(self, ln: int, s: str) -> None:
        body = s.lstrip("#").strip()
        if _PARAMS_RE.match(s):
            if self._started():
                self._new_run(ln)
            elif self.cur.params is not None and self.cur.params_line:
                self.problems.add(ln, f"a second parameter line; the one at line {self.cur.params_line} has no table "
                                      "of its own (pasted from another run?) and is ignored")
            self.cur.params = self._params(s)
            self.cur.params_line = ln
            return
        m = re.match(r"Collective test starting:\s*(\S+)", body)
        if m:
            if self._started():
                self._new_run(ln)
            self._op_hint(ln, m.group(1), s, command=False, args=None)
            return
        if body.startswith("Collective test concluded"):
            return
        # "# nccl-tests version 2.19.4 nccl-headers=21903 nccl-library=21903", and rccl-tests' own form
        # "# rccl-tests version 2.17.9-develop:2596ca5f71 rccl-headers=22803 rccl-library=22707"
        m = re.match(r"([nr])ccl-tests version\s+(\S+)(?:.*?[nr]ccl-library=(\d{1,9}))?", body)
        if m:
            lib = "rccl" if m.group(1) == "r" else "nccl"
            self.versions.setdefault(f"{lib}_tests_version", m.group(2))
            if m.group(3):
                self.versions.setdefault(f"{lib}_version", _version_from_code(int(m.group(3))))
            return
        if body.startswith("Using devices"):
            if self.cur.rows:
                self._new_run(ln)
            self.cur.devices = []
            self.cur.devices_line = ln
            return
        m = _RANK_LINE_RE.match(s)
        if m:
            rank, group, pid, host, dev, bus, name = m.groups()
            self.cur.devices.append({
                "rank": int(rank), "group": int(group) if group is not None else None, "pid": int(pid),
                "host": host, "device": int(dev), "bus_id": bus, "name": name.strip(),
            })
            if not self.cur.devices_line:
                self.cur.devices_line = ln
            return
        schema = _parse_header(s, ln)
        if schema is not None:
            if self.cur.rows or self.cur.summary_line:
                self._new_run(ln, inherit=True)
            self.cur.schema = schema
            return
        m = re.match(r"Out of bounds values\s*:\s*(\d{1,12})\s*(\S*)", body)
        if m:
            self.cur.out_of_bounds = int(m.group(1))
            if int(m.group(1)) > 0 or m.group(2).upper() == "FAILED":
                self.problems.add(ln, f"nccl-tests reports {m.group(1)} out-of-bounds values (data check FAILED)")
            return
        m = re.match(r"Avg bus bandwidth\s*:\s*(\S+)\s*(\S*)", body)
        if m:
            v = _num(m.group(1))
            if v is None or not math.isfinite(v):
                self.problems.add(ln, f"cannot read the average bus bandwidth {m.group(1)!r}")
            else:
                self.cur.avg_busbw_GBps = v
            if m.group(2).upper() == "FAILED":
                self.problems.add(ln, "nccl-tests reports the average bus bandwidth below NCCL_TESTS_MIN_BW (FAILED)")
            self.cur.summary_line = ln
            return
        m = re.match(r"Reducing maxBytes to (\d{1,20})", body)
        if m:
            self.cur.reduced_max_bytes = int(m.group(1))
            return
        m = re.match(r"Writing JSON output to (.*)$", body)
        if m:
            self.json_output = m.group(1).strip()
            return
        if re.match(r"error\s*:", body, re.IGNORECASE):
            self.problems.add(ln, f"the output reports an error: {_clip(body, 200)}")
            return
        if body.startswith(("Blocking Enabled", "Parallel Init")):
            return

    def _params(self, s: str) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for key, rx in _PARAM_ITEMS:
            m = re.search(rx, s)
            if m:
                params[key] = int(m.group(1))
        m = _STEP_RE.search(s)
        if m:
            params["step_factor" if m.group(2) == "factor" else "step_bytes"] = int(m.group(1))
        return params

    def _op_hint(self, ln: int, name: str, text: str, *, command: bool, args: dict[str, Any] | None) -> None:
        if self._started():
            self._new_run(ln)
        try:
            op = canonical_op(name)
        except ValueError:
            self.problems.add(ln, f"unknown test binary {name!r}; the collective is read from the rows")
            op = None
        self.cur.op_hint, self.cur.op_hint_line, self.cur.op_hint_raw = op, ln, name
        if command:
            self.cur.command = _clip(text, 1000)
            self.cur.args = args

    def _nccl_log(self, ln: int, s: str) -> None:
        m = _NRANKS_RE.search(s)
        if m:
            self.cur.nccl_nranks.add(int(m.group(1)))
        m = re.search(r"NCCL version (\S+)", s)
        if m:
            self.versions.setdefault("nccl_version", m.group(1))
        m = re.search(r"RCCL version (\S+)", s)
        if m:
            self.versions.setdefault("rccl_version", m.group(1))
        if re.search(r"\b[NR]CCL (?:WARN|ABORT)\b", s):
            self.problems.add(ln, f"NCCL warning: {_clip(s, 200)}")

    def _versions(self, ln: int, s: str) -> bool:
        for key, rx in (
            ("rccl_tests_version", r"^rccl-tests:\s*Version\s+(\S+)"),
            ("rccl_version", r"^RCCL version\s*:?\s*(\S+)"),
            ("nccl_version", r"^NCCL version\s*:?\s*(\S+)"),
            ("hip_version", r"^HIP version\s*:\s*(\S+)"),
            ("rocm_version", r"^ROCm version\s*:\s*(\S+)"),
        ):
            m = re.match(rx, s)
            if m:
                self.versions.setdefault(key, m.group(1))
                return True
        return bool(re.match(r"^(Hostname|Librccl path)\s*:", s))

    def finish(self) -> None:
        self._flush_pending()
        self.runs.append(self.cur)
        if len(self.row_lines) > 1:
            first = ", ".join(f"{r} (line {ln})" for r, ln in sorted(self.row_lines.items(), key=lambda t: t[1]))
            self.problems.add(min(self.row_lines.values()),
                              f"data rows come from several MPI processes: {first}; nccl-tests prints rows only from "
                              "rank 0, so these are probably independent single-process runs (built without MPI=1?)")

