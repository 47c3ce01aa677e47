"""Reading nccl-tests / rccl-tests stdout into bus-bandwidth rows that can be trusted.

nccl-tests (NVIDIA/nccl-tests) and rccl-tests (ROCm/rccl-tests) print one table per run::

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
         1048576        262144     float     sum      -1    67.31   15.58   27.26      0    65.27   16.07   28.11      0

The left half is the out-of-place run, the right half the in-place run. Units: ``size`` in bytes (for all_gather
and reduce_scatter the *total* size, n x the per-rank buffer; :class:`~commscope.commop.CommOp` uses the same
convention), ``time`` in microseconds, bandwidths in GB/s with GB = 1e9 bytes [nccl-tests-perf].
Everything is converted to SI here: :attr:`BusbwRow.time_s`, :attr:`BusbwRow.busbw_bytes_per_s`.

Real outputs are messier than that, and the parser reads them as they are:

- ``NCCL INFO`` / ``WARN`` lines interleaved anywhere, even between the header and the rows, or glued to the end of a
  half-printed row whose numbers follow on a later line (the row is put back together);
- launcher prefixes: mpirun ``[1,0]<stdout>:``, ``srun -l`` ``0:``, a host or timestamp before the row;
- every format since 2019: the old ``error`` column (max error, a float) instead of ``#wrong``, tables without
  ``redop`` and/or ``root``, ``N/A`` for unchecked halves (``-c 0``, in-place all_to_all and sendrecv), the newest
  per-iteration (``i_min ... i_cv%``) and ``timestamp`` columns, ``%g`` counts such as ``1.04858e+06``;
- numbers wider than their column, which shift everything after them (rows are split on whitespace, never by
  column position);
- several runs in one file (each with its own parameter line, device list, table and summary);
- a rooted collective (broadcast, reduce, gather, scatter) run with ``-r -1``: one table that times every size once
  per root, root 0 first, the ``root`` column holding each row's root rank. Each row keeps its root
  (:attr:`BusbwRow.root`, ``meta["runs"][i]["roots"]``): a fit or a bandwidth table takes one root at a time.

Nothing odd is dropped silently: every line that looks like a data row but cannot be read, every row whose data
check failed (``#wrong`` > 0, an old ``error`` above nccl-tests' bound, an rccl ``*``), every failure or abort
message, a run that stops before its summary, and every disagreement between what the log says and what its rows
show is listed in :attr:`NcclTestsResult.problems` with its line number.

Which collective a table holds is read from the test binary's name (``all_reduce_perf`` in a command line or in
``# Collective test starting:``) and checked against the rows themselves: whether they carry a reduction op and a
root, how ``size`` relates to ``count`` and the element size, and whether busbw/algbw equals the factor of
:func:`busbw_factor` for the group size. A name that the rows contradict (someone pasted alltoall output under an
all_reduce command) is overruled and reported; without a name the rows decide, and an ambiguity is reported.

This module holds what a reader gets (:class:`BusbwRow`, :class:`QuickRow`, :class:`NcclTestsResult`), the entry
point :func:`parse_nccl_tests` and the step from a run's raw rows to rows, and is where callers import from. The
parts it is built from have modules of their own: :mod:`~commscope.io.nccl_tests_terms` (names and bandwidth
formulas), :mod:`~commscope.io.nccl_tests_lines` (one line's patterns and the parser's state),
:mod:`~commscope.io.nccl_tests_reader` (the walk through the lines), :mod:`~commscope.io.nccl_tests_collective`
(which collective a table holds) and :mod:`~commscope.io.nccl_tests_tables` (several tables in one file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commscope.commop import MAX_MESSAGE_BYTES
import numpy as np

from commscope.io.nccl_tests_collective import _Timed, _group_size, _resolve_op
from commscope.io.nccl_tests_columns import _FIELDS, QuickRows, _Columns
from commscope.io.nccl_tests_lines import _Problems, _Run
from commscope.io.nccl_tests_reader import _Reader
from commscope.io.nccl_tests_rows import BusbwRow, QuickRow
from commscope.io.nccl_tests_tables import _check_repeats, _hardware, _merge_meta
from commscope.io.nccl_tests_terms import (
    _DTYPE_BYTES,
    _canonical_dtype,
    _error_bound,
    algbw,
    busbw_factor,
    canonical_op,
)
from commscope.spec.cluster import LINK_BANDWIDTH_RANGE_BYTES_PER_S
from commscope.units import GB, US

# Importable from here, where callers import them (commscope fit and --bandwidth, the tests)
from commscope.io.nccl_tests_lines import MAX_PROBLEMS  # noqa: F401
from commscope.io.nccl_tests_tables import describe_tables, mixed_hardware, pick_tables, repeated_tables  # noqa: F401

__all__ = [
    "BusbwRow",
    "NcclTestsResult",
    "QuickRow",
    "algbw",
    "busbw_factor",
    "canonical_op",
    "parse_nccl_tests",
]

_EXAMPLE_ROW = "  1048576  262144  float  sum  -1  ..."


# --------------------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsResult:
    """What a nccl-tests / rccl-tests output holds."""

    rows: list[BusbwRow]
    """Out-of-place and in-place rows, in the order of the file (in-place only where its numbers were printed);
    with ``quick=True`` the same rows as :class:`QuickRows` (columns)."""
    meta: dict[str, Any]
    """What the log says about the runs: ``op``, ``ops``, ``nranks``, ``num_nodes``, ``hosts``, ``devices``,
    ``nccl_version`` / ``nccl_tests_version`` / ``rccl_version`` / ``rccl_tests_version`` / ``hip_version`` /
    ``rocm_version``, ``avg_busbw_GBps``, ``out_of_bounds``, ``algbw_convention``, ``params`` (the ``# nThread ...``
    line), ``command`` and
    ``args`` (``{"b": "8", "e": "8G", "f": "2", "g": "1"}``) where a command line was printed, and ``runs`` (one dict
    per table with these keys, and ``op_named``/``op_named_line``: the collective the table's header or command line
    names and its line, None where none does, whatever ``op=`` said; ``roots``: the root ranks its rows time, sorted,
    empty for collectives without a root, several for a broadcast / reduce run with ``-r -1``, which times every size
    once per root; ``table``: its number, from 1 in file order, as :attr:`BusbwRow.table` and ``fit --run`` give it;
    ``hardware``: its GPUs and hosts, ``NVIDIA A100-SXM4-80GB x 8 on dkh``, None where it lists no devices). With
    several runs, a top-level key holds the value the runs share, else None
    (``out_of_bounds``: their sum)."""
    problems: list[str]
    """``file:line: what`` for every unreadable row-like line, failed data check, failure message or inconsistency."""

    @property
    def ok(self) -> bool:
        """True when nothing was found wrong."""
        return not self.problems


# --------------------------------------------------------------------------------------------------------------------
# From a run's raw rows to BusbwRows
# --------------------------------------------------------------------------------------------------------------------


def _finish_run(run: _Run, name: str, override: str | None, problems: _Problems, table: int = 1,
                ) -> tuple[QuickRows, dict]:
    """A run's halves as :class:`QuickRows` (the rows of a size no message has left out) and its meta; every check
    of a row on all rows at once, each problem said at its row's line as the rows come."""
    cols = _Columns(run.rows)
    first_line, last = int(cols.line[0]), int(cols.line[-1])
    n = _group_size(run, problems)
    if n is None:
        problems.add(first_line, "no '# Using devices' rank lines and no NCCL 'nranks': group size unknown")
    timed = _Timed.of(cols)
    op = _resolve_op(run, n, override, problems, timed, cols)
    hosts = list(dict.fromkeys(d["host"] for d in run.devices))
    num_nodes = len(hosts) if hosts else None
    intra = None if num_nodes is None else num_nodes == 1
    # each variant (type, reduction op, root) as a row has it: the type canonical, no 'none' op, no negative root
    variants = [(_canonical_dtype(t), None if r in (None, "none") else r, None if o is None or o < 0 else o)
                for t, r, o in cols.variants]
    unknown_types = {t for (t, _, _), (d, _, _) in zip(cols.variants, variants, strict=True) if d not in _DTYPE_BYTES}
    too_large = np.flatnonzero(cols.size > MAX_MESSAGE_BYTES).tolist()
    # per half: its row's variant; what the data check and the link limit say of it
    variant = cols.variant[cols.row]
    failed = cols.wrong_positive.copy()
    for j in cols.with_max_error:  # old tables' error column: above nccl-tests' bound for the type
        failed[j] |= cols.max_error[j] > _error_bound(variants[variant[j]][0], n)  # type: ignore[operator]
    fastest = np.maximum(cols.algbw_GBps * GB, cols.busbw_GBps * GB)
    said = failed | cols.starred | (fastest > LINK_BANDWIDTH_RANGE_BYTES_PER_S[1])
    skipped = np.zeros(len(cols.size), dtype=bool)
    skipped[too_large] = True
    kept = ~skipped[cols.row]
    lines = cols.line.tolist()
    bounds = np.searchsorted(cols.row, np.arange(len(cols.size) + 1)).tolist()  # row i's halves: bounds[i]:[i + 1]
    for i in sorted(set(cols.row[said & kept].tolist()) | set(too_large)):
        r_line, size = lines[i], int(cols.size[i])
        if skipped[i]:
            problems.add(r_line, f"size {size} B is larger than any real message (> 1 TiB): row skipped")
            continue
        for j in range(bounds[i], bounds[i + 1]):
            where = f"{op} {size} B {'in-place' if cols.in_place[j] else 'out-of-place'}"
            w = cols.wrong[j]
            if w is not None and w > 0:
                problems.add(r_line, f"{where}: #wrong = {w} (the data check found wrong elements)")
            elif failed[j]:
                dtype = variants[variant[j]][0]
                problems.add(r_line, f"{where}: max error {cols.max_error[j]:g} exceeds nccl-tests' bound "
                                     f"{_error_bound(dtype, n):.2g} for {dtype} over {n or '?'} ranks")
            elif cols.starred[j]:
                problems.add(r_line, f"{where}: the error is marked '*' (above rccl-tests' threshold)")
            if fastest[j] > LINK_BANDWIDTH_RANGE_BYTES_PER_S[1]:
                limit = LINK_BANDWIDTH_RANGE_BYTES_PER_S[1] / GB
                problems.add(r_line, f"{where}: time {cols.time_us[j]:g} us gives {fastest[j] / GB:,.2f} GB/s, above "
                                     f"any real link ({limit:,.0f} GB/s): a time too short to have moved the data, not "
                                     "a measurement")
    for t in sorted(unknown_types):
        problems.add(first_line, f"unknown element type {t!r}; kept as is")
    outside = cols.first_row([c for c, (_, _, o) in enumerate(cols.variants) if o is not None and o >= (n or math.inf)])
    if outside is not None and n:  # a traffic matrix could not place it: it starts a rooted op at the group's rank 0
        root = cols.variants[cols.variant[outside]][2]
        problems.add(lines[outside], f"root {root} is not a rank of the {n}-rank group (0 to {n - 1}): a traffic "
                                     "matrix takes rank 0 for it")
    if not run.summary_line:
        problems.add(last, "the table stops without nccl-tests' summary ('# Avg bus bandwidth'): the run did not "
                           "finish or its output was cut")
    _check_sizes(run, n, problems, int(cols.size.min()), int(cols.size.max()))
    algbw_convention = None
    if timed.fits(1.0, "algbw").all():
        algbw_convention = "size/time"
    elif n and timed.fits((n - 1) / n, "algbw").all():
        algbw_convention = "size*(n-1)/n/time"  # nccl-tests before 2019, all_gather and reduce_scatter
    index = np.flatnonzero(kept)
    rows = QuickRows(name, {table: (op, n, intra)}, variants, {
        "size_bytes": cols.size[cols.row[index]].astype(np.int64), "count": cols.count[cols.row[index]],
        "variant": variant[index], "time_s": cols.time_us[index] * US,
        "algbw_bytes_per_s": cols.algbw_GBps[index] * GB, "busbw_bytes_per_s": cols.busbw_GBps[index] * GB,
        "wrong": cols.wrong[index], "in_place": cols.in_place[index],
        "max_error": list(map(cols.max_error.__getitem__, index.tolist())), "line": cols.line[cols.row[index]],
        "table": np.full(len(index), table, dtype=np.int64), "failed_check": failed[index]})
    meta = {
        "op": op,
        "nranks": n,
        "num_nodes": num_nodes,
        "hosts": hosts,
        "devices": [dict(d) for d in run.devices],
        "params": dict(run.params) if run.params else None,
        "command": run.command,
        "args": dict(run.args) if run.args else None,
        "avg_busbw_GBps": run.avg_busbw_GBps,
        "out_of_bounds": run.out_of_bounds,
        "num_rows": len(rows),
        "first_line": first_line,
        "last_line": last,
        "complete": bool(run.summary_line),
        "algbw_convention": algbw_convention,
        "op_named": run.op_hint,
        "op_named_line": run.op_hint_line or None,
        "roots": sorted({variants[v][2] for v in set(rows.variant.tolist())} - {None}),
        "table": table,
    }
    meta["hardware"] = _hardware(meta) or None
    return rows, meta


def _check_sizes(run: _Run, n: int | None, problems: _Problems, lo: int, hi: int) -> None:
    """The rows' smallest and largest size, ``lo`` and ``hi``, against the run's parameter line."""
    p = run.params
    if not p or "min_bytes" not in p or "max_bytes" not in p:
        return
    max_bytes = run.reduced_max_bytes if run.reduced_max_bytes is not None else p["max_bytes"]
    slack = 8 * (n or 1)  # gathered sizes are rounded down to whole elements per rank
    if hi > max_bytes or lo + slack < p["min_bytes"]:
        problems.add(run.params_line, f"the rows span {lo}-{hi} B but this parameter line says minBytes "
                                      f"{p['min_bytes']} maxBytes {max_bytes}: it may belong to another run")


# --------------------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------------------


def _read_source(source: str | Path) -> tuple[str, str]:
    """(display name, text) of a path or of the output itself."""
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and "\r" not in source):
        from commscope.io.import_base import read_input

        if not Path(source).exists():
            raise ValueError(f"{source}: no such file (pass a path to nccl-tests output, or the output itself)")
        name, data = read_input(source)
        return name, data.decode("utf-8", errors="replace")
    if not isinstance(source, str):
        raise ValueError(f"expected a path or the text of nccl-tests output, got {type(source).__name__}")
    return "<text>", source


def parse_nccl_tests(source: str | Path, *, op: str | None = None, quick: bool = False) -> NcclTestsResult:
    """Read nccl-tests / rccl-tests stdout from a path (``.gz`` too) or from the text itself.

    ``op`` names the collective when the output does not (any name :func:`canonical_op` knows); the rows are still
    checked against it. ``quick``: the rows as :class:`~commscope.io.nccl_tests_columns.QuickRows`, columns that
    iterate as :class:`QuickRow` (the same fields), for a reader of a million rows that checks them all at once.
    Raises ValueError when nothing in the output is a data row, or the file cannot be read.
    """
    name, text = _read_source(source)
    return parse_nccl_tests_text(text, name=name, op=op, quick=quick)


def parse_nccl_tests_text(text: str, *, name: str, op: str | None = None, quick: bool = False) -> NcclTestsResult:
    """:func:`parse_nccl_tests` of output already read (``name``: the file it came from, as problems name it): a
    caller that has read the file to learn what it is parses those bytes, not the file read again (which may have
    changed in between)."""
    override = canonical_op(op) if op is not None else None
    reader = _Reader(name)
    reader.feed_lines(text.splitlines())
    reader.finish()
    runs = [r for r in reader.runs if r.rows]
    if not runs:
        why = [p for p in reader.problems.render()]
        hint = f"; the output reports: {' | '.join(why[:5])}" if why else ""
        raise ValueError(f"{name}: no nccl-tests data rows found (expected lines like '{_EXAMPLE_ROW}'){hint}")
    parts: list[QuickRows] = []
    run_meta: list[dict] = []
    for table, run in enumerate(runs, start=1):
        r, m = _finish_run(run, name, override, reader.problems, table)
        parts.append(r)
        run_meta.append(m)
    quick_rows = QuickRows.concat(name, parts)
    _check_repeats(run_meta, quick_rows, reader.problems)
    rows: Any = quick_rows if quick else [BusbwRow(**dict(zip(_FIELDS, t, strict=True))) for t in quick_rows.tuples()]
    meta = _merge_meta(run_meta, reader.versions, reader.json_output)
    return NcclTestsResult(rows=rows, meta=meta, problems=reader.problems.render())
