"""Reading a measured bandwidth table for ``estimate --bandwidth``.

Accepted: nccl-tests / rccl-tests stdout (parsed by :mod:`commscope.io.nccl_tests`), or a table as JSON
(a list of rows, or ``{"rows": [...]}``), TOML (``[[rows]]``) or CSV with the columns
``op, group_size, size_bytes`` and ``busbw_GBps`` (or ``busbw_bytes_per_s``), optionally ``intra_node``.
``commscope bench --out`` JSON is such a table (its rows must have passed their data check: ``wrong`` 0).
A TOML file written by ``commscope fit`` (``[model] kind = "commscope-fitted-bandwidth"``) gives the fitted
alpha-beta model (:class:`commscope.estimate.fitted.FittedModel`) instead of an interpolated table, and so does a
cluster file written by ``commscope calibrate`` (its ``[collectives]`` table holds such a model).
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from collections.abc import Callable
from pathlib import Path

from commscope.estimate.fitted import BUSBW_OPS, mixed_variants, row_variants
from commscope.estimate.bandwidth import AlphaBeta, BandwidthModel, MeasuredTable, TableRow, table_from_bench_rows
from commscope.errors import ConfigError
from commscope.spec.cluster import LINK_BANDWIDTH_RANGE_BYTES_PER_S, implausible_link
from commscope.units import GB

_REQUIRED = ("op", "group_size", "size_bytes")
#: Ops a table row may measure (after canonical_op: nccl-tests' ``allreduce`` and ``all_reduce_perf`` are
#: ``all_reduce``, send/recv ``sendrecv``).
TABLE_OPS = BUSBW_OPS
_INTRA_NODE = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False, "": None}


def _rows_from_mappings(items, source: str, skipped: list[str], *, line_of=None) -> list[TableRow]:
    """Rows of a measured table, each field checked. A row whose numbers no measurement has (an op it does not
    know, a size, group size, time or bandwidth out of :mod:`commscope.io.checks`' rules) is skipped, named in
    ``skipped`` (``b.json rows[3].time_s=-1e-05: not a measured time (must be > 0): row skipped``), as ``fit`` skips
    it; a table of no usable row is refused. A table that is no table (not a list of rows, a row lacking a column, an
    unreadable intra_node) is refused. ``line_of(i)``: how row ``i`` (from 1) is named (``rows[i]``)."""
    from commscope.estimate.fitted import canonical_op
    from commscope.io.checks import bench_row_problem

    if not isinstance(items, list):
        raise ConfigError("bandwidth", source, "expected a list of rows (op, group_size, size_bytes, busbw_GBps)")
    rows = []
    variants: list[tuple[str, int, bool | None, str | None, str | None, str | None]] = []
    for i, item in enumerate(items, start=1):
        where = f"row {i}"
        if not isinstance(item, dict):
            raise ConfigError(where, item, "expected a table of op, group_size, size_bytes, busbw_GBps", source=source)
        if None in item:  # csv.DictReader: cells beyond the header
            raise ConfigError(where, item[None], "has more cells than the header has columns", source=source)
        missing = [k for k in _REQUIRED if item.get(k) in (None, "")]
        if item.get("busbw_GBps") in (None, "") and item.get("busbw_bytes_per_s") in (None, ""):
            missing.append("busbw_GBps")
        if missing:
            raise ConfigError(where, dict(item), f"lacks {', '.join(missing)}", source=source)
        op = canonical_op(item["op"])
        named = line_of(i) if line_of is not None else f"rows[{i}]"
        why = (f"op={item['op']!r}: not a collective a bandwidth table holds ({', '.join(TABLE_OPS)})"
               if op not in TABLE_OPS else bench_row_problem(item))
        if why is not None:
            skipped.append(f"{source} {named}.{why}: row skipped")
            continue
        n, size = int(float(item["group_size"])), int(float(item["size_bytes"]))
        key = "busbw_bytes_per_s" if item.get("busbw_bytes_per_s") not in (None, "") else "busbw_GBps"
        busbw = float(item[key]) * (1.0 if key == "busbw_bytes_per_s" else GB)
        intra = item.get("intra_node")
        if isinstance(intra, str):
            intra = _INTRA_NODE.get(intra.strip().lower(), intra)
        if intra is not None and not isinstance(intra, bool):
            raise ConfigError(f"{where}.intra_node", intra, "valid: true or false (or empty: not known)", source=source)
        rows.append(TableRow(op=op, group_size=n, size_bytes=size, busbw_bytes_per_s=busbw, intra_node=intra))
        variants.append((op, n, intra, *row_variants(item)))
    if not rows and skipped:
        raise ConfigError("bandwidth", source, f"has no usable row: {'; '.join(skipped[:3])}"
                                               + (f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""))
    mixed = mixed_variants(variants)
    if mixed is not None:  # `commscope bench` rows of several types or roots, or a table written so: kept apart
        op, n, what, pick, _ = mixed
        fit = f" (commscope fit {source} {pick} --out model.toml fits one)" if source.lower().endswith(".json") else ""
        raise ConfigError("bandwidth", source, f"times {op} over {n} ranks {what}, which one table cannot hold apart: "
                                               f"keep one of each per op and group size{fit}")
    return rows


def _refuse_wrong(items, source: str) -> None:
    """Rows of ``commscope bench`` whose data check failed must not become a bandwidth model."""
    if not isinstance(items, list):
        return
    for i, item in enumerate(items, start=1):
        if isinstance(item, dict) and item.get("wrong"):
            raise ConfigError(f"row {i}.wrong", item["wrong"],
                              f"{item.get('op')} at {item.get('size_bytes')} B had wrong results; measure again",
                              source=source)


def _plausible(table: MeasuredTable) -> MeasuredTable:
    """Refuse a table with a bus bandwidth no real link has (NaN, infinite, above any interconnect): a damaged
    or mistyped row, which interpolation would spread over every size near it."""
    hi = LINK_BANDWIDTH_RANGE_BYTES_PER_S[1]
    for r in table.rows:
        if not (math.isfinite(r.busbw_bytes_per_s) and r.busbw_bytes_per_s <= hi):
            why = implausible_link(r.busbw_bytes_per_s) if math.isfinite(r.busbw_bytes_per_s) else None
            raise ConfigError(f"{r.op} over {r.group_size} ranks at {r.size_bytes} B: busbw",
                              f"{r.busbw_bytes_per_s / GB:g} GB/s", why or "must be a finite number",
                              source=table.source)
    return table


def _one_type_and_redop(rows, source: str) -> None:
    """Refuse nccl-tests rows that time one op and group size in several types, reduction ops or roots (``-d all``,
    ``-o all``, ``-r -1``: every size again per type / op / root): interpolated together they would be mixed, one
    taken the others lost; ``commscope fit --dtype --redop --root`` picks one."""
    mixed = mixed_variants((r.op, r.group_size, r.intra_node, r.dtype, r.redop,
                            None if r.root is None else str(r.root)) for r in rows)
    if mixed is not None:
        op, n, what, pick, opts = mixed
        raise ConfigError("bandwidth", source, f"times {op} over {n} ranks {what} (nccl-tests {opts}), which one table "
                                               f"cannot hold apart; fit one: commscope fit {source} {pick} --out "
                                               "model.toml, and give --bandwidth model.toml")


def _one_machine(rows, runs: list[dict], source: str) -> None:
    """Refuse nccl-tests rows of one curve from tables of other hardware (two machines' outputs pasted into one
    file): interpolated together they would be one machine's curve, which none measured. Tables of one machine (a
    run repeated) are pooled, each size's median busbw, as ``commscope fit`` pools them."""
    from commscope.io.nccl_tests import describe_tables, mixed_hardware, pick_tables

    mixed = mixed_hardware(rows, runs)
    if mixed is not None:
        op, n, where = mixed
        first = pick_tables(where).split(" or ")[0]
        raise ConfigError("bandwidth", source, f"times {op} over {n or '?'} ranks on other hardware, outputs pasted "
                                               f"together: {describe_tables(where)}, which one table must not pool; "
                                               f"fit one machine's tables ({pick_tables(where)}): commscope fit "
                                               f"{source} {first} --out model.toml, and give --bandwidth model.toml")


def read_bandwidth(path: Path, *, fallback: AlphaBeta | None = None,
                   warn: Callable[[str], None] | None = None) -> BandwidthModel:
    """A MeasuredTable (or a FittedModel, for ``commscope fit`` output) from ``path``; ConfigError for anything
    malformed or physically impossible. A damaged row (:mod:`commscope.io.checks`' rules, as ``fit`` applies them)
    is skipped and said, one line each: to ``warn`` when given, else in the table's notes."""
    skipped: list[str] = []
    model = _read_bandwidth(Path(path), fallback, skipped)
    for line in skipped:
        if warn is not None:
            warn(line)
        elif isinstance(model, MeasuredTable):
            model.notes.append(line)
    return _plausible(model) if isinstance(model, MeasuredTable) else model


def _read_bandwidth(path: Path, fallback: AlphaBeta | None, skipped: list[str]) -> BandwidthModel:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("bandwidth", str(path), "is a directory; give a file" if path.is_dir() else
                          "is not a regular file (a pipe or a device?); give a file" if path.exists() else "no such file")
    source = path.name
    suffix = path.suffix.lower()
    from commscope.io.import_base import read_input

    try:  # (read once: nccl-tests output below is parsed from this text; .gz too)
        text = read_input(path)[1].decode("utf-8", errors="replace")
    except ValueError as exc:
        raise ConfigError("bandwidth", str(path), str(exc).removeprefix(f"{path}: ")) from None
    try:
        if suffix == ".json":
            data = json.loads(text)
            items = data.get("rows", data) if isinstance(data, dict) else data
            _refuse_wrong(items, source)
            return MeasuredTable(rows=_rows_from_mappings(items, source, skipped), source=source, fallback=fallback)
        if suffix == ".toml":
            data = tomllib.loads(text)
            if isinstance(data.get("collectives"), dict):  # a cluster file from `commscope calibrate`
                data = data["collectives"]
            model = data.get("model")
            if isinstance(model, dict) and model.get("kind") is not None:
                from commscope.estimate.fitted import read_fitted

                return read_fitted(path, fallback=fallback)
            return MeasuredTable(rows=_rows_from_mappings(data.get("rows", []), source, skipped), source=source,
                                 fallback=fallback)
        if suffix == ".csv":  # rows named by their line (the header is line 1)
            return MeasuredTable(rows=_rows_from_mappings(list(csv.DictReader(text.splitlines())), source, skipped,
                                                          line_of=lambda i: f"line {i + 1}"),
                                 source=source, fallback=fallback)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("bandwidth", source, f"is not valid {suffix[1:].upper()}: {exc}") from None
    from commscope.io.nccl_tests import parse_nccl_tests_text

    try:
        result = parse_nccl_tests_text(text, name=source)
    except ValueError as exc:
        raise ConfigError("bandwidth", source, str(exc)) from None
    # a failed data check refuses the file, as `commscope fit` and bench JSON rows with ``wrong`` do
    failed = next((r for r in result.rows if r.failed_check), None)
    if failed is not None:
        raise ConfigError("data check", failed.wrong if failed.wrong else failed.max_error,
                          f"{failed.op} at {failed.size_bytes} B failed nccl-tests' data check ({failed.source}); "
                          "measure again", source=source)
    # out-of-place rows that moved data; the smallest sizes print a busbw that rounds to 0.00 GB/s, which says
    # nothing to interpolate (sizes under the table take its smallest busbw). A time that is no measurement (0.00 us:
    # damaged) makes its busbw none either: the row is skipped and said, as `commscope fit` skips it.
    from commscope.io.checks import row_time_problem

    rows = []
    for r in result.rows:
        if r.in_place or r.size_bytes <= 0:
            continue
        why = row_time_problem(r.op, r.size_bytes, r.time_s)
        if why is not None:
            skipped.append(f"{r.source}: {why}: row skipped")
        elif r.busbw_bytes_per_s > 0:
            rows.append(r)
    if not rows:
        ranks = sorted({r.group_size for r in result.rows if r.group_size})
        raise ConfigError("bandwidth", source, "no row measured a link: " + (
            f"the rows ran on {ranks[0]} rank (busbw 0 by definition); measure over 2 ranks or more"
            if ranks and max(ranks) < 2 else "every row has size 0 or a bus bandwidth of 0.00 GB/s"))
    _one_machine(rows, result.meta.get("runs", []), source)  # first, as `commscope fit` refuses them: each
    _one_type_and_redop(rows, source)  # suggestion then runs as it says
    table = table_from_bench_rows(rows, source=source, fallback=fallback)
    table.notes.extend(result.problems)  # what the reader found wrong (runs pooled, times no link has, ...)
    return table
