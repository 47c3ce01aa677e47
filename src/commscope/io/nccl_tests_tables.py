"""A file of several nccl-tests tables: the hardware each ran on, tables that time what an earlier one times (a
repeat, or two machines' outputs pasted together), how ``commscope fit --run`` picks one machine's tables, and the
tables' meta merged into the file's.

:func:`mixed_hardware`, :func:`describe_tables`, :func:`pick_tables` and :func:`repeated_tables` serve ``commscope
fit`` and ``--bandwidth``; :mod:`commscope.io.nccl_tests` re-exports them, where callers import them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from commscope.io.nccl_tests_columns import QuickRows
from commscope.io.nccl_tests_lines import _Problems
from commscope.io.nccl_tests_rows import BusbwRow



def _hardware(run: dict) -> str:
    """The GPUs and hosts of a run, as a problem line names them ('' when the run lists no devices)."""
    names = Counter(str(d.get("name")) for d in run["devices"])
    gpus = ", ".join(f"{k} x {v}" if v > 1 else k for k, v in sorted(names.items()))
    return f"{gpus} on {', '.join(sorted(run['hosts']))}" if gpus else ""


def _curve(row: BusbwRow) -> tuple:
    """What one fitted curve or bandwidth table holds: one op over one group size and placement, in one type,
    reduction op and root (rows that differ in any of these are never pooled: fit and --bandwidth keep them apart
    or refuse them, see :func:`commscope.estimate.fitted.mixed_variants`)."""
    return row.op, row.group_size, row.intra_node, row.dtype, row.redop, row.root


def _curve_tables(rows: Iterable[Any]) -> dict[tuple, list[int]]:
    """Each curve of ``rows`` (:func:`_curve`) and the tables that time it, in the order they first come."""
    if isinstance(rows, QuickRows):
        return rows.curve_tables()
    tables: dict[tuple, list[int]] = {}
    for r in rows:
        seen = tables.setdefault(_curve(r), [])
        if r.table not in seen:
            seen.append(r.table)
    return tables


def mixed_hardware(rows: Iterable[Any], runs: list[dict]) -> tuple[str, int | None, list[dict]] | None:
    """The first curve of ``rows`` (one op over one group size and placement, in one type, reduction op and root)
    timed in tables of other hardware, their device lists naming other GPUs or hosts (two machines' outputs pasted
    into one file): (op, group size, the meta of those tables in file order); None when each curve's tables ran on
    one machine or do not say on which. ``runs`` is ``meta["runs"]`` of the result ``rows`` come from. Pooled, such
    rows would make one curve of two machines; one taken, the other would vanish: fit and --bandwidth refuse them
    until ``commscope fit --run`` picks tables (:func:`pick_tables` says how)."""
    for (op, n, *_), numbers in _curve_tables(rows).items():
        if len({runs[t - 1].get("hardware") for t in numbers} - {None}) > 1:
            return op, n, [runs[t - 1] for t in sorted(numbers)]
    return None


def describe_tables(runs: list[dict]) -> str:
    """``table 1 (from line 18: NVIDIA A100-SXM4-80GB x 8 on dkh) and table 2 (from line 69: ...)``."""
    parts = [f"table {r['table']} (from line {r['first_line']}: {r.get('hardware') or 'devices not listed'})"
             for r in runs]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def pick_tables(runs: list[dict]) -> str:
    """How ``commscope fit --run`` picks one machine's tables of ``runs``: ``--run 1,3 or --run 2``."""
    by_hardware: dict[str | None, list[int]] = {}
    for r in runs:
        by_hardware.setdefault(r.get("hardware"), []).append(r["table"])
    return " or ".join(f"--run {','.join(map(str, t))}" for t in by_hardware.values())


#: How a problem line names two tables that time the same thing; :func:`repeated_tables` reads the pair back from
#: it, so the text is written (in _check_repeats) and read from this one constant.
_REPEAT_HEAD = "the tables from line {} and from line {} both time "
_REPEAT_RE = re.compile(r":\d{1,12}: " + re.escape(_REPEAT_HEAD).replace(r"\{\}", r"(\d{1,12})"))


def repeated_tables(problem: str, runs: list[dict]) -> tuple[int, int] | None:
    """The two tables (numbers from 1) a problem line of :func:`parse_nccl_tests` says time the same thing (a repeat,
    or two machines' outputs); None for any other problem."""
    m = _REPEAT_RE.search(problem)
    if m is None:
        return None
    table = {r["first_line"]: r["table"] for r in runs}
    a, b = table.get(int(m[1])), table.get(int(m[2]))
    return (a, b) if a is not None and b is not None else None


def _check_repeats(runs: list[dict], rows: Iterable[Any], problems: _Problems) -> None:
    """Tables that time what an earlier table of the file times (one op over one group size and placement, in one
    type, reduction op and root) are said, once each. On one machine (or where a table lists no devices) they are
    a repeat: a fit and a bandwidth table pool their rows, each size's median, and a summary counts them all. On
    other hardware (their device lists name other GPUs or hosts: two logs pasted together) their rows are never
    pooled: fit and --bandwidth refuse them together until ``fit --run`` picks one machine's tables. Tables of
    other roots (``-r 0``, then ``-r 1``), types or reduction ops are no repeat: each row keeps its own, and fit
    and ``--bandwidth`` take one at a time."""
    curves: dict[int, set[tuple]] = {}
    for curve, numbers in _curve_tables(rows).items():
        for t in numbers:
            curves.setdefault(t, set()).add(curve)
    earlier: list[dict] = []
    for run in runs:
        mine = curves.get(run["table"], set())
        same = [r for r in earlier if curves.get(r["table"], set()) & mine]
        earlier.append(run)
        if not same:
            continue
        b = run["hardware"]  # (None where the table lists no devices)
        other = [r for r in same if r["hardware"] and b and r["hardware"] != b]
        alike = [r for r in same if r not in other]
        for first in (alike[:1] + other[:1]):  # a repeat of this machine's, and another machine's table: each said
            a = first["hardware"]
            both = sorted({c[5] for c in curves[first["table"]] & mine if c[5] is not None})
            at = f" from root{'s' if len(both) > 1 else ''} {', '.join(map(str, both))}" if both else ""
            what = (_REPEAT_HEAD.format(first["first_line"], run["first_line"])
                    + f"{run['op']} over {run['nranks'] or '?'} ranks{at}")
            if first in other:
                problems.add(run["first_line"], f"{what} but on other hardware ({a}; then {b}): their rows are not "
                                                f"pooled (fit and --bandwidth refuse them together; fit --run "
                                                f"{first['table']} or --run {run['table']} takes one machine's tables)")
            else:
                problems.add(run["first_line"], f"{what}: their rows are pooled as one measurement, each size's "
                                                f"median (a run repeated, or one output pasted twice?)")


def _merge_meta(runs: list[dict], versions: dict[str, str], json_output: str | None) -> dict[str, Any]:
    keys = ("op", "nranks", "num_nodes", "hosts", "params", "command", "args", "avg_busbw_GBps", "algbw_convention",
            "roots")
    meta: dict[str, Any] = {}
    for key in keys:
        vals = [r[key] for r in runs]
        meta[key] = vals[0] if all(v == vals[0] for v in vals) else None
    # The same GPUs in every run (process ids aside): list them once.
    same = [[{k: v for k, v in d.items() if k != "pid"} for d in r["devices"]] for r in runs]
    meta["devices"] = runs[0]["devices"] if all(x == same[0] for x in same) else None
    oob = [r["out_of_bounds"] for r in runs]
    meta["out_of_bounds"] = sum(oob) if all(v is not None for v in oob) else None
    meta["ops"] = list(dict.fromkeys(r["op"] for r in runs))
    for key in ("nccl_version", "nccl_tests_version", "rccl_version", "rccl_tests_version", "hip_version",
                "rocm_version"):
        meta[key] = versions.get(key)
    if json_output:
        meta["json_output"] = json_output
    meta["runs"] = runs
    return meta

