"""Fit measured collective times into the bandwidth model the estimator uses (``commscope fit``).

Input: commscope's bench JSON (median times) or nccl-tests / rccl-tests stdout (nccl-tests prints mean times;
the out-of-place rows are used). Per (op, group size n), with S the size and t the time of each row:

    t = alpha + beta S,    beta = f(op, n) / busbw      (Hockney [thakur-2005]; f from nccl-tests [nccl-tests-perf])

fitted by least squares on the *relative* residual (t_fit - t) / t, i.e. weights 1/t. Plain least squares
on t would let the largest message own the fit (its time is 10^4-10^6 x the smallest) and make alpha
meaningless. alpha >= 0 and beta >= 0 are enforced (a two-variable non-negative least squares). Where one
line misses some row by more than ``tolerance``, the sizes are split into up to ``max_pieces`` contiguous
ranges, each with its own line, at the breakpoints that minimise the total squared relative error
(dynamic programming over all splits, at least 3 sizes per piece); the fewest pieces that meet the
tolerance win, else the best ``max_pieces`` fit. Every row's relative error is reported.

Worked example (nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt, all_reduce over 8 A100s, 8 B-128 MiB):
one line (alpha 37.9 us, busbw 153.5 GB/s) misses 1 MiB by 26%; two pieces by at most 15%; three pieces
(8 B-512 KiB: 36.1 us, 46.3 GB/s; 1-16 MiB: 53.5 us, 135.0 GB/s; 32-128 MiB: 144.8 us, 210.9 GB/s) by
at most 4.4%, within the default tolerance of 10%.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from commscope.measure.bench.fitted import (
    BUSBW_OPS,
    FITTED_KIND,
    VARIANTS,
    Curve,
    FittedModel,
    Segment,
    _factor,
    canonical_op,
    mixed_variants,
    root_variant,
    row_variants,
)
from commscope.errors import ConfigError
from commscope.commop import MAX_MESSAGE_BYTES
from commscope.spec.cluster import implausible_link
from commscope.units import GB, US

__all__ = ["FIT_OPS", "FitPoint", "FitResult", "Residual", "check_op", "fit", "fit_curve", "load_points",
           "problem_lines", "to_toml"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FitPoint:
    """One measured row: ``op`` over ``group_size`` ranks moved ``size_bytes`` in ``time_s``."""

    op: str
    group_size: int
    size_bytes: int
    time_s: float
    intra_node: bool | None = None
    noisy: bool = False
    """The measurement flagged this row noisy (commscope bench: coefficient of variation above its threshold)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Residual:
    """How well the fit reproduces one measured row: rel_error = (fitted - measured) / measured."""

    op: str
    group_size: int
    size_bytes: int
    measured_time_s: float
    fitted_time_s: float

    @property
    def rel_error(self) -> float:
        return (self.fitted_time_s - self.measured_time_s) / self.measured_time_s


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """Fitted curves, each row's residual, and where the data came from."""

    curves: tuple[Curve, ...]
    residuals: tuple[Residual, ...]
    source: str
    time_kind: str
    """``median`` (commscope bench) or ``mean`` (nccl-tests prints averages)."""
    backend: str | None = None
    tolerance: float = 0.1
    max_pieces: int = 3
    unreliable: dict[tuple[str, int, bool | None], str] = field(default_factory=dict)
    """Why a curve (op, group size, intra_node) means nothing physically: a bus bandwidth outside any real
    link's range (infinite: time did not grow with size). Such curves are left out of ``estimate --bandwidth``."""
    noisy: dict[tuple[str, int, bool | None], str] = field(default_factory=dict)
    """Curves fitted mostly to rows the measurement flagged noisy (``7 of 7 rows``): used, with a note."""
    merged: tuple[str, ...] = ()
    """Rows whose own line had a bus bandwidth no link has, named, and the plausible piece that took them in."""

    def model(self, **kwargs: Any) -> FittedModel:
        return FittedModel(curves=list(self.curves), source=self.source, **kwargs)

    def why_unreliable(self, curve: Curve) -> str | None:
        return self.unreliable.get((curve.op, curve.group_size, curve.intra_node))

    def noisy_rows(self, curve: Curve) -> str | None:
        return self.noisy.get((curve.op, curve.group_size, curve.intra_node))

    def max_rel_error(self, op: str, group_size: int) -> float:
        errs = [abs(r.rel_error) for r in self.residuals if r.op == op and r.group_size == group_size]
        return max(errs) if errs else 0.0


# --- loading ---------------------------------------------------------------------------------------------

#: The ops a row to fit may measure: those with an nccl-tests bus-bandwidth factor.
FIT_OPS = BUSBW_OPS

#: Damaged rows are said one line each, up to this many (then a count): a whole broken file is one refusal.
_MAX_PROBLEMS = 10


def _known_op(name: Any) -> str | None:
    """The canonical name of ``name`` if fit knows its bus-bandwidth factor, else None."""
    op = canonical_op(str(name))
    return op if op in FIT_OPS else None


def check_op(op: str | None) -> str | None:
    """``--op`` as a canonical collective; ConfigError naming the valid ones."""
    if op is None:
        return None
    known = _known_op(op)
    if known is None:
        raise ConfigError("op", op, f"expected one of {', '.join(FIT_OPS)} (nccl-tests' names such as allreduce or "
                                    "all_reduce_perf work too)")
    return known


def _damage(row: dict, i: int, source: str) -> str | None:
    """Why bench-JSON row ``i`` is damaged (a value no measurement has), naming the row, field and value; else None
    (the rules every reader applies: :func:`commscope.io.checks.bench_row_problem`)."""
    from commscope.io.checks import bench_row_problem

    if _known_op(row["op"]) is None:
        return f"{source} rows[{i}].op={row['op']!r}: not a collective fit knows ({', '.join(FIT_OPS)})"
    why = bench_row_problem(row)
    return None if why is None else f"{source} rows[{i}].{why}"


def _points_from_bench(data: dict, source: str, *, group_size: int | None = None, op: str | None = None,
                       dtype: str | None = None, redop: str | None = None, root: int | None = None,
                       ) -> tuple[list[FitPoint], dict[str, Any]]:
    """FitPoints of bench JSON. Rows that failed the data check are refused (the run is not to be trusted);
    damaged rows (an unknown op, a size, group size or time no measurement has) are skipped, each named in
    ``info["problems"]``. ``group_size`` and ``op`` (the flags for nccl-tests output that does not say) must agree
    with every row: bench JSON names each row's own. Rows of several types, reduction ops or roots (sweeps merged)
    must be picked from with ``dtype`` / ``redop`` / ``root``."""
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ConfigError("rows", source, "no rows: expected {\"meta\": ..., \"rows\": [...]} from `commscope bench`")
    items: list[tuple[FitPoint, str | None, str | None, str | None]] = []
    problems: list[str] = []
    # A file of a million rows holds a few kinds of row (op, group size, type, ...): each kind is checked and named
    # once, by the first row of it that passes every check below, and later rows of a known kind whose numbers are
    # plainly valid (the rules of commscope.io.checks, tested on their types) become points without the checks again.
    # Anything else goes through the checks, as every row once did: the same points and problems, ~5x faster.
    kinds: dict[tuple[Any, ...], tuple[str, int, bool | None, bool, tuple[str | None, str | None, str | None]]] = {}
    for i, row in enumerate(rows, start=1):
        try:
            kind = (row["op"], row["group_size"], row.get("intra_node"), row.get("dtype"), row.get("redop"),
                    row.get("root"), row.get("noisy"), row.get("wrong"))
            known = kinds.get(kind)
        except (TypeError, KeyError, AttributeError):  # no object, a field missing, a value of no plain kind
            kind, known = None, None
        if known is not None and _plain_numbers(row):
            row_op, n, intra, noisy, variants = known
            items.append((FitPoint(op=row_op, group_size=n, size_bytes=row["size_bytes"],
                                   time_s=float(row["time_s"]), intra_node=intra, noisy=noisy), *variants))
            continue
        if not isinstance(row, dict):
            raise ConfigError(f"rows[{i}]", row, "must be an object", source=source)
        missing = [k for k in ("op", "group_size", "size_bytes", "time_s") if k not in row]
        if missing:
            raise ConfigError(f"rows[{i}]", {k: row[k] for k in list(row)[:4]}, f"lacks {', '.join(missing)}",
                              source=source)
        if row.get("wrong"):
            raise ConfigError(f"rows[{i}].wrong", row["wrong"],
                              f"{row['op']} at {row['size_bytes']} B had wrong results; refit from a clean run",
                              source=source)
        why = _damage(row, i, source)
        if why is not None:
            problems.append(f"{why}: row skipped")
            continue
        size, t, n, row_op = int(row["size_bytes"]), float(row["time_s"]), int(row["group_size"]), canonical_op(row["op"])
        if group_size is not None and n != group_size:
            raise ConfigError("group_size", group_size, f"{source} rows[{i}] ran on {n} ranks: bench JSON names each "
                                                        "row's group size (--group-size is for nccl-tests output that "
                                                        "does not say); leave it out")
        if op is not None and row_op != op:
            raise ConfigError("op", op, f"{source} rows[{i}] measures {row_op}: bench JSON names each row's op (--op is "
                                        "for nccl-tests output whose header does not); leave it out")
        intra = row.get("intra_node")
        point = FitPoint(op=row_op, group_size=n, size_bytes=size, time_s=t,
                         intra_node=intra if isinstance(intra, bool) else None, noisy=bool(row.get("noisy")))
        variants = row_variants(row)
        items.append((point, *variants))
        if kind is not None:
            kinds[kind] = (point.op, point.group_size, point.intra_node, point.noisy, variants)
    if not items:
        raise ConfigError("input", source, f"has no usable rows: {'; '.join(problems[:3])}")
    points, chosen = _select_variants(items, source, dtype=dtype, redop=redop, root=root)
    meta = data.get("meta", {}) if isinstance(data.get("meta"), dict) else {}
    return points, {"time_kind": "median", "backend": meta.get("backend"), "problems": problems, "notes": [],
                    "chosen": chosen}


def _plain_numbers(row: dict) -> bool:
    """Whether a bench row's size, time and bus bandwidths plainly pass :func:`commscope.io.checks.bench_row_problem`:
    an int size of 1 B to 1 TiB, a float or int time finite and > 0, each bandwidth absent or a finite float > 0
    (anything else is checked in full)."""
    size, t = row["size_bytes"], row["time_s"]
    if type(size) is not int or not 1 <= size <= MAX_MESSAGE_BYTES or type(t) not in (float, int) or not 0 < t < math.inf:
        return False
    for key in ("busbw_bytes_per_s", "busbw_GBps"):
        b = row.get(key)
        if b is not None and (type(b) not in (float, int) or not 0 < b < math.inf):
            return False
    return True


def _canonical_dtype(name: str) -> str:
    from commscope.io.nccl_tests import _canonical_dtype as canon

    return canon(str(name).strip())


def _select_variants(items: Sequence[tuple[FitPoint, str | None, str | None, str | None]], source: str, *,
                     dtype: str | None, redop: str | None, root: int | None = None) -> tuple[list[FitPoint], str | None]:
    """The points of ``items`` (point, dtype, redop, root) of the type ``dtype``, reduction op ``redop`` and root
    ``root`` (a row that has none, such as all_gather's redop or all_reduce's root, passes), and what was chosen. A
    curve (op, group size) timed in several types, reduction ops or roots (nccl-tests ``-r -1``) with no flag to pick
    one is refused, naming them: pooled, the fit would mix what the measurement kept apart; one of them taken, the
    others would vanish."""
    chosen = []
    for i, (given, (label, _, flag, _, _)) in enumerate(zip((dtype, redop, root), VARIANTS, strict=True)):
        if given is None:
            continue
        want = _canonical_dtype(str(given)) if i == 0 else str(given).strip().lower()
        have = [v for v in dict.fromkeys(it[1 + i] for it in items) if isinstance(v, str)]
        if not have:
            raise ConfigError(flag.lstrip("-"), given, f"{source} names no {label} of its rows; leave {flag} out")
        if want not in have:
            raise ConfigError(flag.lstrip("-"), given, f"{source} has no rows of that {label}; its rows are "
                                                       f"{', '.join(have)}")
        items = [it for it in items if it[1 + i] in (None, want)]
        chosen.append(f"{label} {want}")
    # each curve's variants in the order they come (a million rows hold a few distinct ones)
    mixed = mixed_variants(dict.fromkeys((point.op, point.group_size, point.intra_node, d, r, rt)
                                         for point, d, r, rt in items))
    if mixed is not None:
        op, n, what, pick, opts = mixed
        raise ConfigError("input", source, f"times {op} over {n} ranks {what}, as nccl-tests {opts} does; one "
                                           f"fitted curve holds one of each: pick with {pick} (or another of those)")
    return [it[0] for it in items], ", ".join(chosen) or None


def _line_of(problem: str, name: str) -> int | None:
    """The line number of a reader's problem ``name:LINE: ...``; None for one about the whole file."""
    head = f"{name}:"
    if not problem.startswith(head):
        return None
    number = problem[len(head):].split(":", 1)[0]
    return int(number) if number.isdigit() else None


def _keep_tables(result: Any, keep: set[int], name: str) -> tuple[list[Any], list[str]]:
    """The rows of the tables numbered ``keep`` (from 1, in file order) and the reader's problems about those tables
    (and about the file), less what it said of a repeat between a kept table and one left out (nothing of theirs is
    pooled now)."""
    from commscope.io.nccl_tests import repeated_tables

    runs = result.meta.get("runs", [])
    starts = [min(x for x in (r.get("op_named_line"), r.get("first_line")) if x) for r in runs]
    spans = [(lo, (starts[i + 1] - 1) if i + 1 < len(runs) else math.inf) for i, lo in enumerate(starts)]
    keep_spans = [span for i, span in enumerate(spans, start=1) if i in keep]
    drop_spans = [span for i, span in enumerate(spans, start=1) if i not in keep]

    def kept(problem: str) -> bool:
        pair = repeated_tables(problem, runs)
        if pair is not None:
            return all(t in keep for t in pair)
        ln = _line_of(problem, name)
        return ln is None or any(lo <= ln <= hi for lo, hi in keep_spans) or not any(
            lo <= ln <= hi for lo, hi in drop_spans)

    return [r for r in result.rows if r.table in keep], [p for p in result.problems if kept(p)]


def _tables_arg(run: str | Sequence[int] | None, runs: list[dict], name: str) -> list[int] | None:
    """``--run 1,3`` as table numbers, each checked against the file's tables."""
    if run is None:
        return None
    text = run if isinstance(run, str) else ",".join(map(str, run))
    valid = (f"table numbers from 1 to {len(runs)} (file order), comma-separated: --run 1"
             + (" or --run 1,2" if len(runs) > 1 else ""))
    numbers = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= len(runs):
            raise ConfigError("run", text, f"{name} has {len(runs)} table{'s' if len(runs) > 1 else ''}: give "
                                           f"{valid}")
        numbers.append(int(part))
    return sorted(set(numbers))


def _points_from_nccl_tests(path: Path, group_size: int | None, op: str | None = None, *, dtype: str | None = None,
                            redop: str | None = None, root: int | None = None, run: str | Sequence[int] | None = None,
                            ) -> tuple[list[FitPoint], dict[str, Any]]:
    """FitPoints of nccl-tests output, one per table line (its out-of-place half, as nccl-tests' summaries use).
    Lines the reader could not read, and lines whose out-of-place time is no measurement (<= 0), are skipped and
    named in ``info["problems"]``, with everything else the reader found wrong with the output. ``group_size`` and
    ``op`` fill in what the output does not say; where it says otherwise, they are refused. In a log of several
    collectives (nccl-tests run once per test binary, the outputs pasted together), ``op`` picks one of them.
    ``dtype``, ``redop`` and ``root`` pick one type, reduction op and root of a table that times several (``-d all``,
    ``-o all``, ``-r -1``). Tables that time one curve on one machine (a run repeated) are pooled, each size's
    median; tables of other machines (outputs pasted together) are refused together until ``run`` picks one
    machine's tables (their numbers from 1 in file order, ``"1,3"``)."""
    from commscope.io.checks import row_time_problem
    from commscope.io.nccl_tests import describe_tables, mixed_hardware, parse_nccl_tests, pick_tables

    try:
        result = parse_nccl_tests(path, quick=True)  # the rows only read: as named tuples, faster to make
    except ValueError as exc:
        raise ConfigError("input", path.name, str(exc)) from None
    runs = result.meta.get("runs", [])
    file_ops = list(dict.fromkeys(r["op"] for r in runs))
    notes: list[str] = []
    keep = set(range(1, len(runs) + 1))
    if op is not None and len(file_ops) > 1:  # --op picks one collective of several
        if op not in file_ops:
            raise ConfigError("op", op, f"{path.name} holds the tables of {', '.join(file_ops)}; --op picks one of "
                                        "them")
        keep = {i for i in keep if runs[i - 1]["op"] == op}
        failed = {r.op for r in result.rows if r.op != op and r.failed_check}
        left = ", ".join(f"{o} (failed its data check)" if o in failed else o for o in file_ops if o != op)
        notes.append(f"fitted {op} only (--op): left out the file's other collectives, {left}")
    elif op is not None:
        for r in runs:
            named = r.get("op_named")
            if named is not None and named != op:
                raise ConfigError("op", op, f"{path.name} line {r.get('op_named_line')} names the test {named}; "
                                            "leave --op out (it is for output that does not name it)")
        result = parse_nccl_tests(path, op=op, quick=True)  # read again, the rows taken as op's
        runs = result.meta.get("runs", [])
    tables = _tables_arg(run, runs, path.name)
    if tables is not None:  # --run picks tables
        other = [t for t in tables if t not in keep]
        if other:
            raise ConfigError("run", run, f"table {other[0]} of {path.name} times {runs[other[0] - 1]['op']}; --op "
                                          f"{op} picks the tables of {op} (table{'s' if len(keep) > 1 else ''} "
                                          f"{', '.join(map(str, sorted(keep)))})")
        left_out = [r for r in runs if r["table"] in keep and r["table"] not in tables]
        keep = set(tables)
        if left_out:
            notes.append(f"fitted table{'s' if len(tables) > 1 else ''} {', '.join(map(str, tables))} only (--run): "
                         f"left out {describe_tables(left_out)}")
    if len(keep) < len(runs):
        rows, problems = _keep_tables(result, keep, path.name)
    else:
        rows, problems = result.rows, list(result.problems)
    mixed = mixed_hardware(rows, runs)
    if mixed is not None:
        mixed_op, n, where = mixed
        raise ConfigError("input", path.name, f"times {mixed_op} over {n or '?'} ranks on other hardware, outputs "
                                              f"pasted together: {describe_tables(where)}; one fitted curve holds one "
                                              f"machine's tables: pick with {pick_tables(where)}")
    # (op, n, size, intra-node, type, redop, root, line): every line one point, repeated tables' pooled by fit()
    by_key: dict[tuple[str, int, int, bool | None, str, str | None, int | None, str], Any] = {}
    damaged: set[str] = set()
    one_rank = 0
    for row in rows:
        if row.op == "unknown":  # no header names the test and the rows fit no collective's arithmetic
            raise ConfigError("input", path.name, f"{row.source}: the collective of these rows cannot be told (no "
                                                  "command line names the test binary and the rows fit none); give "
                                                  "it with --op all_reduce (or all_gather, ...)")
        if canonical_op(row.op) not in FIT_OPS:
            raise ConfigError("op", row.op, f"{path.name} measures {row.op}, which has no nccl-tests bus-bandwidth "
                                            f"factor; fit knows {', '.join(FIT_OPS)}")
        said = getattr(row, "group_size", None)
        if group_size is not None and said is not None and said != group_size:
            raise ConfigError("group_size", group_size, f"{path.name} says its rows ran on {said} ranks (its '# Using "
                                                        "devices' or NCCL nranks lines); leave --group-size out (it is "
                                                        "for output that does not say)")
        n = said or group_size
        if not n:
            raise ConfigError("group_size", None, f"{path.name} does not say how many ranks ran; give --group-size N",
                              source=path.name)
        if n < 2:
            one_rank += 1
            continue  # one rank: busbw is 0 by definition, nothing crosses a link
        if row.failed_check:
            others = [o for o in file_ops if o != row.op]
            hint = (f", or give --op to fit one of the file's other collectives ({', '.join(others)})"
                    if others and op is None else "")
            raise ConfigError("data check", row.wrong if row.wrong is not None else row.max_error,
                              f"{row.op} at {row.size_bytes} B failed nccl-tests' data check ({row.source}); "
                              f"refit from a clean run{hint}", source=path.name)
        if row.size_bytes is None or row.size_bytes <= 0 or row.source in damaged:
            continue  # zero-byte rows say nothing about alpha and beta
        t = row.time_s
        why = None if type(t) is float and 0 < t < math.inf else row_time_problem(row.op, row.size_bytes, t)
        if why is not None:
            if not row.in_place:  # the line's measurement is damaged: the line is skipped, not its other half used
                damaged.add(row.source)  # the out-of-place half comes first: the in-place half is not used
                problems.append(f"{row.source}: {why}: row skipped")
            continue
        key = (canonical_op(row.op), int(n), int(row.size_bytes), row.intra_node, row.dtype, row.redop, row.root,
               row.source)
        if key not in by_key or (by_key[key].in_place and not row.in_place):
            by_key[key] = row  # the out-of-place half where there is one, as nccl-tests' summaries use
    if not by_key and one_rank == len(rows):
        raise ConfigError("input", path.name, "the rows ran on 1 rank: nothing crossed a link (busbw is 0 by "
                                              "definition), so there is no bandwidth to fit; measure over 2 ranks or "
                                              "more")
    if one_rank:
        notes.append(f"{one_rank} rows ran on 1 rank (nothing crossed a link, busbw 0 by definition): skipped")
    items = [(FitPoint(op=k[0], group_size=k[1], size_bytes=k[2], time_s=float(r.time_s), intra_node=k[3]), k[4], k[5],
              root_variant(k[6])) for k, r in by_key.items()]
    points, chosen = _select_variants(items, path.name, dtype=dtype, redop=redop, root=root)
    if not points:
        raise ConfigError("input", path.name, "has no usable nccl-tests rows (size > 0, a time, >= 2 ranks)"
                          + (f": {'; '.join(problems[:3])}" if problems else ""))
    return points, {"time_kind": "mean", "backend": "nccl-tests", "problems": problems, "notes": notes,
                    "chosen": chosen}


#: What other tools' records are, for an input of theirs given to fit: (what it is, the commands that read it).
_OTHER_FORMATS = {
    "kineto": "a PyTorch profiler (Kineto) trace",
    "deepspeed": "DeepSpeed comms-logger output",
    "jsonl": "a commscope op log (`commscope record`)",
    "flight_recorder": "a PyTorch Flight Recorder dump",
    "nccl_debug": "an NCCL_DEBUG=INFO log",
}


def _refuse_other_format(name: str, data: bytes) -> None:
    """A ConfigError naming what ``data`` is when it is another tool's records, which fit does not take."""
    from commscope.io.importers import _detect

    try:
        fmt = _detect(name, data)
    except ValueError:
        return
    what = _OTHER_FORMATS.get(fmt)
    if what is not None:
        raise ConfigError("input", name, f"is {what}; fit takes `commscope bench --out` JSON "
                                         f"or nccl-tests / rccl-tests output; `commscope summarize {name}` (and "
                                         "compare, report) read this format")


_NOT_JSON = object()


def load_points(path: Path, *, group_size: int | None = None, op: str | None = None, dtype: str | None = None,
                redop: str | None = None, root: int | None = None, run: str | Sequence[int] | None = None,
                ) -> tuple[list[FitPoint], dict[str, Any]]:
    """Rows of ``path`` (bench JSON or nccl-tests stdout) as FitPoints, with ``time_kind``, ``backend``,
    ``problems`` (one line per damaged row skipped, naming file, row or line, field and value), ``notes`` (what was
    left out on purpose, and why) and ``chosen`` (the type, reduction op and root ``dtype``/``redop``/``root``
    picked, or None).
    ``group_size`` and ``op`` say what nccl-tests output does not (ranks, the collective), or ``op`` picks one
    collective of a log of several; a value the file contradicts is refused. ``dtype``, ``redop`` and ``root`` pick
    one type, reduction op and root where the rows time several (nccl-tests ``-d all`` / ``-o all`` / ``-r -1``),
    which must be picked. ``run`` picks tables of nccl-tests output by number (from 1 in file order, ``"1,3"``): the
    tables of one machine where the file holds several machines' outputs, which are never pooled."""
    from commscope.io.import_base import read_input

    path = Path(path)
    op = check_op(op)
    if path.is_dir() or not path.exists():
        raise ConfigError("input", str(path), "is a directory; give a file" if path.is_dir() else "no such file")
    try:
        name, data = read_input(path)  # .gz too; a pipe or a device refused (it would be read twice)
    except ValueError as exc:
        raise ConfigError("input", str(path), str(exc).removeprefix(f"{path}: ").removeprefix(f"{path.name}: ")) \
            from None
    text = data.decode("utf-8-sig", errors="replace")
    parsed: Any = _NOT_JSON
    if path.suffix.lower() == ".json":
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            _refuse_other_format(name, data)
            raise ConfigError("input", path.name, f"is not valid JSON: {exc}") from None
    elif text.lstrip().startswith(("{", "[")):  # JSON under another name, or output whose first line is a
        try:  # launcher's warning ("[1732812345.1] [host:1:0] ucp_context.c:1104 UCX WARN ...") above a table
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = _NOT_JSON
    if parsed is not _NOT_JSON:
        if not (isinstance(parsed, dict) and "rows" in parsed):
            _refuse_other_format(name, data)
        if not isinstance(parsed, dict):
            raise ConfigError("input", path.name, "expected a JSON object with \"rows\" (commscope bench --out)")
        if run is not None:
            raise ConfigError("run", run, f"{path.name} is bench JSON, one sweep: --run picks tables of nccl-tests "
                                          "output; leave it out")
        return _points_from_bench(parsed, path.name, group_size=group_size, op=op, dtype=dtype, redop=redop,
                                  root=root)
    _refuse_other_format(name, data)
    return _points_from_nccl_tests(path, group_size, op, dtype=dtype, redop=redop, root=root, run=run)


def problem_lines(problems: Sequence[str], limit: int = _MAX_PROBLEMS) -> list[str]:
    """``problems`` as at most ``limit`` lines, the last saying how many more there are."""
    if len(problems) <= limit:
        return list(problems)
    return [*problems[:limit - 1], f"... and {len(problems) - limit + 1} more problems"]


# --- fitting ----------------------------------------------------------------------------------------------

def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(alpha, beta, sse) minimising sum(((alpha + beta x) / y - 1)^2) with alpha, beta >= 0."""
    A = np.stack([1.0 / y, x / y], axis=1)  # (k, 2): residual_i = A_i . (alpha, beta) - 1
    ones = np.ones_like(y)
    cands = []
    sol, *_ = np.linalg.lstsq(A, ones, rcond=None)
    if sol[0] >= 0 and sol[1] >= 0:
        cands.append((float(sol[0]), float(sol[1])))
    c0 = A[:, 0] @ A[:, 0]
    cands.append((float(A[:, 0] @ ones / c0), 0.0))  # beta = 0: constant time
    c1 = A[:, 1] @ A[:, 1]
    cands.append((0.0, float(A[:, 1] @ ones / c1)))  # alpha = 0: through the origin
    best = None
    for a, b in cands:
        sse = float(np.sum((A @ np.array([a, b]) - 1.0) ** 2))
        if best is None or sse < best[2] - 1e-15:
            best = (a, b, sse)
    assert best is not None
    return best


#: Up to this many distinct sizes a curve's pieces may break at any size (every split is tried); beyond it, at
#: this many evenly spread sizes (a sweep of nccl-tests' -f 1 -i 1M, or a million rows of random sizes, would
#: otherwise cost k^2 lines and k^3 splits: a thousand sizes took minutes). Real sweeps (-f 2) have ~30 sizes.
EXHAUSTIVE_SIZES = 64


def _line_from_sums(s00: float, s01: float, s11: float, t0: float, t1: float, n: int) -> tuple[float, float, float]:
    """:func:`_line` from the sums of its normal equations (1/y^2, x/y^2, x^2/y^2, 1/y, x/y over the points, and
    their number): the same three candidates, and the sum of squares expanded from the sums."""
    def sse(a: float, b: float) -> float:
        return max(0.0, a * a * s00 + 2 * a * b * s01 + b * b * s11 - 2 * a * t0 - 2 * b * t1 + n)

    cands = []
    det = s00 * s11 - s01 * s01
    if det > 0:
        a, b = (t0 * s11 - t1 * s01) / det, (t1 * s00 - t0 * s01) / det
        if a >= 0 and b >= 0:
            cands.append((a, b))
    cands.append((t0 / s00, 0.0))  # beta = 0: constant time
    cands.append((0.0, t1 / s11))  # alpha = 0: through the origin
    return min(((a, b, sse(a, b)) for a, b in cands), key=lambda c: c[2])


def _sse_of_sums(s00: np.ndarray, s01: np.ndarray, s11: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                 n: np.ndarray) -> np.ndarray:
    """:func:`_line_from_sums`' sum of squares for arrays of pieces at once."""
    def sse(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, a * a * s00 + 2 * a * b * s01 + b * b * s11 - 2 * a * t0 - 2 * b * t1 + n)

    with np.errstate(divide="ignore", invalid="ignore"):
        det = s00 * s11 - s01 * s01
        a, b = (t0 * s11 - t1 * s01) / det, (t1 * s00 - t0 * s01) / det
        both = np.where((det > 0) & (a >= 0) & (b >= 0), sse(a, b), np.inf)
        zero = np.zeros_like(s00)
        out: np.ndarray = np.minimum(both, np.minimum(sse(t0 / s00, zero), sse(zero, t1 / s11)))
    return out


def _fewest_within(candidates: Iterable[list[tuple[int, int, float, float]]], x: np.ndarray, y: np.ndarray,
                   tolerance: float) -> list[tuple[int, int, float, float]]:
    """The first of ``candidates`` (fits of 1, 2, ... pieces) that misses no point by more than ``tolerance``,
    else the one that misses its worst point least."""
    best = None
    for segs in candidates:
        worst = max(float(np.max(np.abs((a + b * x[s:e + 1]) / y[s:e + 1] - 1))) for s, e, a, b in segs)
        if best is None or worst < best[0] - 1e-12:
            best = (worst, segs)
        if worst <= tolerance:
            return segs
    assert best is not None
    return best[1]


def _grid_pieces(x: np.ndarray, y: np.ndarray, *, max_pieces: int,
                 min_points: int) -> Iterator[list[tuple[int, int, float, float]]]:
    """:func:`fit_curve` for a curve of more than :data:`EXHAUSTIVE_SIZES` sizes: the pieces are chosen breaking
    only at :data:`EXHAUSTIVE_SIZES` evenly spread sizes, then each break is moved to the size between its
    neighbours that fits best (all of them tried at once); each piece's line from prefix sums, O(1) a piece. Yields
    the fit of 1, 2, ... ``max_pieces`` pieces."""
    k = len(x)
    inv = 1.0 / y
    cols = [inv * inv, x * inv * inv, (x * inv) ** 2, inv, x * inv]
    prefix = [np.concatenate([[0.0], np.cumsum(c)]) for c in cols]

    def line(s: int, e: int) -> tuple[float, float, float]:  # points s..e
        s00, s01, s11, t0, t1 = (float(p[e + 1] - p[s]) for p in prefix)
        return _line_from_sums(s00, s01, s11, t0, t1, e - s + 1)

    grid = sorted(set(np.linspace(0, k, EXHAUSTIVE_SIZES + 1).round().astype(int).tolist()))  # piece starts, and k
    g = len(grid) - 1
    m = max(2, min_points)
    for pieces in range(1, max(1, max_pieces) + 1):
        # dp[p][j]: least sse covering points 0..grid[j]-1 with p pieces, each from one grid position to another
        dp = [[math.inf] * (g + 1) for _ in range(pieces + 1)]
        back = [[-1] * (g + 1) for _ in range(pieces + 1)]
        dp[0][0] = 0.0
        for p in range(1, pieces + 1):
            for j in range(1, g + 1):
                for i in range(j):
                    if dp[p - 1][i] < math.inf and (pieces == 1 or grid[j] - grid[i] >= m):
                        v = dp[p - 1][i] + line(grid[i], grid[j] - 1)[2]
                        if v < dp[p][j]:
                            dp[p][j], back[p][j] = v, i
        if dp[pieces][g] == math.inf:
            break
        starts, j = [], g
        for p in range(pieces, 0, -1):
            starts.append(grid[back[p][j]])
            j = back[p][j]
        starts = sorted(starts) + [k]
        for _ in range(3):  # each break to its best place between its neighbours, a few rounds
            for i in range(1, len(starts) - 1):
                lo, hi = starts[i - 1] + m, starts[i + 1] - m
                if hi <= lo:
                    continue
                c = np.arange(lo, hi + 1)
                l00, l01, l11, l0, l1 = (p[c] - p[starts[i - 1]] for p in prefix)
                r00, r01, r11, r0, r1 = (p[starts[i + 1]] - p[c] for p in prefix)
                cost = (_sse_of_sums(l00, l01, l11, l0, l1, c - starts[i - 1])
                        + _sse_of_sums(r00, r01, r11, r0, r1, starts[i + 1] - c))
                starts[i] = int(c[int(np.argmin(cost))])
        yield [(s, e - 1, *line(s, e - 1)[:2]) for s, e in itertools.pairwise(starts)]


def fit_curve(sizes: Sequence[float], times: Sequence[float], *, tolerance: float = 0.1, max_pieces: int = 3,
              min_points: int = 3, plausible: Callable[[float], bool] | None = None) -> list[tuple[int, int, float, float]]:
    """Piecewise fit of one curve: ``[(first_index, last_index, alpha_s, beta_s_per_byte), ...]``.

    ``sizes`` ascending and distinct. With more than one piece, each covers at least ``min_points`` sizes
    (two points always fit a line exactly, so two-point pieces would chase noise) and, given ``plausible``, has
    a slope it accepts (a bus bandwidth some link could have); one piece over every size is always a candidate.
    See the module docstring for the criterion. A curve of more than :data:`EXHAUSTIVE_SIZES` sizes is split as
    :func:`_grid_pieces` says.
    """
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    if len(x) < 2:
        raise ValueError("need at least 2 sizes")
    if len(x) > EXHAUSTIVE_SIZES:
        pieces: Iterator[list[tuple[int, int, float, float]]] = (
            segs for segs in _grid_pieces(x, y, max_pieces=max_pieces, min_points=min_points)
            if plausible is None or len(segs) == 1 or all(plausible(b) for *_, b in segs))
    else:
        pieces = _exhaustive_pieces(x, y, max_pieces=max_pieces, min_points=min_points, plausible=plausible)
    return _fewest_within(pieces, x, y, tolerance)


def _exhaustive_pieces(x: np.ndarray, y: np.ndarray, *, max_pieces: int, min_points: int,
                       plausible: Callable[[float], bool] | None = None) -> Iterator[list[tuple[int, int, float, float]]]:
    """The least-squares fits of 1, 2, ... ``max_pieces`` pieces, every split tried (dynamic programming); with more
    than one piece, only pieces whose slope ``plausible`` accepts."""
    k = len(x)
    cost: dict[tuple[int, int], tuple[float, float, float]] = {}
    split_cost: dict[tuple[int, int], float] = {}  # a piece's error when it is one of several: inf if implausible
    for i in range(k):
        for j in range(i + 1, k):
            cost[i, j] = _line(x[i:j + 1], y[i:j + 1])
            split_cost[i, j] = cost[i, j][2] if plausible is None or plausible(cost[i, j][1]) else math.inf
    m = max(2, min_points)
    for pieces in range(1, max(1, max_pieces) + 1):
        if pieces > 1 and m * pieces > k:
            break
        # dp[p][j]: least sse covering points 0..j with p pieces; back[p][j]: start of the last piece
        dp = [[math.inf] * k for _ in range(pieces + 1)]
        back = [[-1] * k for _ in range(pieces + 1)]
        for j in range(1, k):
            dp[1][j] = cost[0, j][2] if pieces == 1 else split_cost[0, j]
            back[1][j] = 0
        for p in range(2, pieces + 1):
            for j in range(m * p - 1, k):
                for s in range(m * (p - 1), j - m + 2):  # last piece is s..j (>= m points)
                    v = dp[p - 1][s - 1] + split_cost[s, j]
                    if v < dp[p][j]:
                        dp[p][j], back[p][j] = v, s
        if math.isinf(dp[pieces][k - 1]):
            continue  # no split into this many plausible pieces
        segs, j = [], k - 1
        for p in range(pieces, 0, -1):
            s = back[p][j]
            a, b, _ = cost[s, j]
            segs.append((s, j, a, b))
            j = s - 1
        segs.reverse()
        yield segs


def fit(points: Iterable[FitPoint], *, source: str = "measurements", time_kind: str = "median",
        backend: str | None = None, tolerance: float = 0.1, max_pieces: int = 3) -> FitResult:
    """Fit every (op, group size, intra_node) of ``points``; ConfigError if any has fewer than 2 sizes."""
    if not 0 < tolerance:
        raise ConfigError("tolerance", tolerance, "must be > 0")
    if max_pieces < 1:
        raise ConfigError("max_pieces", max_pieces, "must be >= 1")
    groups: dict[tuple[str, int, bool | None], dict[int, list[float]]] = {}
    noisy: dict[tuple[str, int, bool | None], list[bool]] = {}
    for p in points:
        groups.setdefault((p.op, p.group_size, p.intra_node), {}).setdefault(p.size_bytes, []).append(p.time_s)
        noisy.setdefault((p.op, p.group_size, p.intra_node), []).append(p.noisy)
    if not groups:
        raise ConfigError("input", source, "has no rows to fit")
    curves, residuals = [], []
    unreliable: dict[tuple[str, int, bool | None], str] = {}
    noisy_rows: dict[tuple[str, int, bool | None], str] = {}
    merged: list[str] = []
    for (op, n, intra), by_size in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        if len(by_size) < 2:
            only = next(iter(by_size))
            raise ConfigError(f"{op} over {n} ranks", f"{len(by_size)} size ({only} B)",
                              "need at least 2 message sizes to fit latency and bandwidth", source=source)
        sizes = sorted(by_size)
        times = [_median(by_size[s]) for s in sizes]  # repeated sizes: their median
        f = _factor(op, n)
        pieces = _physical(sizes, times, f, f"{op} over {n} ranks", merged, tolerance=tolerance,
                           max_pieces=max_pieces)
        segs = tuple(Segment(size_min_bytes=int(sizes[s]), size_max_bytes=int(sizes[e]), alpha_s=a,
                             busbw_bytes_per_s=f / b if b > 0 else math.inf) for s, e, a, b in pieces)
        curve = Curve(op=op, group_size=n, segments=segs, intra_node=intra)
        curves.append(curve)
        why = _unreliable(segs[-1])
        if why is not None:
            unreliable[(op, n, intra)] = why
        flags = noisy[(op, n, intra)]
        if sum(flags) * 2 > len(flags):
            noisy_rows[(op, n, intra)] = f"{sum(flags)} of {len(flags)}"
        # Curve.time_s's segment for each size, found walking the sizes up (they are sorted) instead of searching
        bounds = [math.sqrt(a.size_max_bytes * b.size_min_bytes) for a, b in itertools.pairwise(segs)]
        j = 0
        for s, t in zip(sizes, times):
            while j < len(bounds) and s > bounds[j]:
                j += 1
            residuals.append(Residual(op=op, group_size=n, size_bytes=int(s), measured_time_s=t,
                                      fitted_time_s=segs[j].time_s(s, f)))
    return FitResult(curves=tuple(curves), residuals=tuple(residuals), source=source, time_kind=time_kind,
                     backend=backend, tolerance=tolerance, max_pieces=max_pieces, unreliable=unreliable, noisy=noisy_rows,
                     merged=tuple(merged))


def _physical(sizes: Sequence[int], times: Sequence[float], factor: float, curve: str, said: list[str], *,
              tolerance: float, max_pieces: int) -> list[tuple[int, int, float, float]]:
    """:func:`fit_curve`'s pieces, none with a bus bandwidth no link has: where the best split holds such a piece
    (a line through a few noisy small-message times can rise by microseconds over tens of bytes, a bus bandwidth
    of kB/s that would time a real message of that size wrongly), the curve is split again among plausible pieces
    only, and ``said`` names the rows. A flat piece (infinite bus bandwidth: latency-bound messages) is plausible;
    one piece over every size is always kept (then the curve itself may be unreliable, see :func:`_unreliable`)."""

    def why(beta: float) -> str | None:
        return None if beta <= 0 else implausible_link(factor / beta)

    pieces = fit_curve(sizes, times, tolerance=tolerance, max_pieces=max_pieces)
    bad = [p for p in pieces if why(p[3])]
    if not bad or len(pieces) == 1:
        return pieces
    kept = fit_curve(sizes, times, tolerance=tolerance, max_pieces=max_pieces, plausible=lambda b: why(b) is None)
    for s, e, _, beta in bad:
        into = next(p for p in kept if p[0] <= s <= p[1])
        rows = ", ".join(f"{int(sizes[i]):,}" for i in range(s, e + 1))
        said.append(f"{curve}: the rows of {rows} B alone give a line whose bus bandwidth {why(beta)}: fitted "
                    f"within {int(sizes[into[0]]):,}-{int(sizes[into[1]]):,} B instead")
    return kept


def _median(values: list[float]) -> float:
    """``float(np.median(values))``, without numpy's cost for the one or few times most sizes have."""
    if len(values) == 1:
        return float(values[0])
    return float(statistics.median(values)) if len(values) < 64 else float(np.median(values))


def _unreliable(largest: Segment) -> str | None:
    """Why a fitted curve means nothing physically, judged on the segment of its largest messages (where bus
    bandwidth, not latency, sets the time: a small-message segment may rightly be flat)."""
    if math.isinf(largest.busbw_bytes_per_s):
        return (f"infinite bus bandwidth: the time did not grow with size up to {largest.size_max_bytes:,} B "
                "(measure larger messages)")
    why = implausible_link(largest.busbw_bytes_per_s)
    return None if why is None else f"bus bandwidth {why}"


# --- output -----------------------------------------------------------------------------------------------

def _toml_float(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return repr(float(f"{value:.6g}"))


def _toml_str(text: str) -> str:
    return json.dumps(str(text))  # a JSON string is a valid TOML basic string


def to_toml(result: FitResult, *, command: str | None = None, table_prefix: str = "") -> str:
    """The fitted model as TOML for ``commscope estimate --bandwidth``, with each row's error in ``[fit]``.

    ``table_prefix`` (``"collectives."``) nests the tables in another file (``commscope calibrate``'s cluster file).
    """
    out = [
        f"# commscope bandwidth model, fitted by `commscope fit` from {result.source}",
        "# Per op and group size n: time_s = alpha_us x 1e-6 + size_bytes x f(op, n) / (busbw_GBps x 1e9),",
        "# piecewise in size (segments); f is nccl-tests' bus-bandwidth factor (all_reduce 2(n-1)/n;",
        "# all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, sendrecv 1).",
        (f"# Fitted on {result.time_kind} times, least squares on relative error, "
        f"tolerance {result.tolerance:g}, at most {result.max_pieces} segments."),
        "# Use: commscope estimate ... --bandwidth THIS_FILE",
        "",
        f"[{table_prefix}model]",
        f"kind = {_toml_str(FITTED_KIND)}",
        "version = 1",
        f"source = {_toml_str(result.source)}",
        f"time = {_toml_str(result.time_kind)}",
    ]
    if result.backend:
        out.append(f"backend = {_toml_str(result.backend)}")
    out.append(f"created = {_toml_str(datetime.now(UTC).isoformat(timespec='seconds'))}")
    if command:
        out.append(f"command = {_toml_str(command)}")
    out.append(f"tolerance = {_toml_float(result.tolerance)}")
    for c in result.curves:
        out += ["", f"[[{table_prefix}curves]]", f"op = {_toml_str(c.op)}", f"group_size = {c.group_size}"]
        if c.intra_node is not None:
            out.append(f"intra_node = {'true' if c.intra_node else 'false'}")
        out.append(f"max_rel_error = {_toml_float(result.max_rel_error(c.op, c.group_size))}")
        why = result.why_unreliable(c)
        if why is not None:  # read back, the curve is left out of the model (and the estimate says so)
            out.append(f"unreliable = {_toml_str(why)}")
        noisy = result.noisy_rows(c)
        if noisy is not None:  # read back, a note in the estimate
            out.append(f"noisy_rows = {_toml_str(noisy)}")
        # an unreliable curve's lines are no link's: kept as a comment, never as a model a reader could use
        lead = "# " if why is not None else ""
        if why is not None:
            out += ["segments = []", "# what the rows fitted, not a link's bandwidth:"]
        out.append(f"{lead}segments = [")
        for s in c.segments:
            out.append(f"{lead}  {{ size_min_bytes = {s.size_min_bytes}, size_max_bytes = {s.size_max_bytes}, "
                       f"alpha_us = {_toml_float(s.alpha_s / US)}, busbw_GBps = {_toml_float(s.busbw_bytes_per_s / GB)} }},")
        out.append(f"{lead}]")
    out += ["", "# Each measured row against the fit: rel_error = (fitted - measured) / measured.", f"[{table_prefix}fit]",
            'columns = ["op", "group_size", "size_bytes", "measured_us", "fitted_us", "rel_error"]', "rows = ["]
    for r in result.residuals:
        out.append(f"  [{_toml_str(r.op)}, {r.group_size}, {r.size_bytes}, {_toml_float(r.measured_time_s / US)}, "
                   f"{_toml_float(r.fitted_time_s / US)}, {_toml_float(r.rel_error)}],")
    out += ["]", ""]
    return "\n".join(out)
