"""Reading a measured bandwidth table for ``estimate --bandwidth``.

Accepted: nccl-tests / rccl-tests stdout (parsed by :mod:`commscope.io.nccl_tests`), or a table as JSON
(a list of rows, or ``{"rows": [...]}``), TOML (``[[rows]]``) or CSV with the columns
``op, group_size, size_bytes`` and ``busbw_GBps`` (or ``busbw_bytes_per_s``), optionally ``intra_node``.
``commscope bench --out`` JSON is such a table (its rows must have passed their data check: ``wrong`` 0).
A TOML file written by ``commscope fit`` (``[model] kind = "commscope-fitted-bandwidth"``) gives the fitted
alpha-beta model (:class:`commscope.bench.fitted.FittedModel`) instead of an interpolated table, and so does a
cluster file written by ``commscope calibrate`` (its ``[collectives]`` table holds such a model).
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from pathlib import Path

from commscope.bandwidth import AlphaBeta, BandwidthModel, MeasuredTable, TableRow, table_from_bench_rows
from commscope.errors import ConfigError
from commscope.spec.cluster import LINK_BANDWIDTH_RANGE_BYTES_PER_S, implausible_link
from commscope.units import GB

_REQUIRED = ("op", "group_size", "size_bytes")


def _rows_from_mappings(items, source: str) -> list[TableRow]:
    rows = []
    for i, item in enumerate(items, start=1):
        missing = [k for k in _REQUIRED if k not in item]
        if "busbw_GBps" not in item and "busbw_bytes_per_s" not in item:
            missing.append("busbw_GBps")
        if missing:
            raise ConfigError(f"row {i}", dict(item), f"lacks {', '.join(missing)}", source=source)
        try:
            busbw = float(item["busbw_bytes_per_s"]) if "busbw_bytes_per_s" in item else float(item["busbw_GBps"]) * GB
            intra = item.get("intra_node")
            if isinstance(intra, str):
                intra = {"true": True, "false": False, "": None}.get(intra.strip().lower())
            rows.append(TableRow(op=str(item["op"]), group_size=int(item["group_size"]),
                                 size_bytes=int(float(item["size_bytes"])), busbw_bytes_per_s=busbw, intra_node=intra))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"row {i}", dict(item), f"has a non-numeric value ({exc})", source=source) from None
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


def read_bandwidth(path: Path, *, fallback: AlphaBeta | None = None) -> BandwidthModel:
    """A MeasuredTable (or a FittedModel, for ``commscope fit`` output) from ``path``; ConfigError for anything
    malformed or physically impossible."""
    model = _read_bandwidth(Path(path), fallback)
    return _plausible(model) if isinstance(model, MeasuredTable) else model


def _read_bandwidth(path: Path, fallback: AlphaBeta | None) -> BandwidthModel:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("bandwidth", str(path), "is a directory; give a file" if path.is_dir() else "no such file")
    source = path.name
    suffix = path.suffix.lower()
    text = path.read_text(errors="replace")
    try:
        if suffix == ".json":
            data = json.loads(text)
            items = data.get("rows", data) if isinstance(data, dict) else data
            _refuse_wrong(items, source)
            return MeasuredTable(rows=_rows_from_mappings(items, source), source=source, fallback=fallback)
        if suffix == ".toml":
            data = tomllib.loads(text)
            if isinstance(data.get("collectives"), dict):  # a cluster file from `commscope calibrate`
                data = data["collectives"]
            model = data.get("model")
            if isinstance(model, dict) and model.get("kind") is not None:
                from commscope.bench.fitted import read_fitted

                return read_fitted(path, fallback=fallback)
            return MeasuredTable(rows=_rows_from_mappings(data.get("rows", []), source), source=source, fallback=fallback)
        if suffix == ".csv":
            return MeasuredTable(rows=_rows_from_mappings(list(csv.DictReader(text.splitlines())), source), source=source,
                                 fallback=fallback)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("bandwidth", source, f"is not valid {suffix[1:].upper()}: {exc}") from None
    from commscope.io.nccl_tests import parse_nccl_tests

    try:
        result = parse_nccl_tests(path)
    except ValueError as exc:
        raise ConfigError("bandwidth", source, str(exc)) from None
    # out-of-place rows that passed nccl-tests' own check and moved data
    rows = [r for r in result.rows if not r.in_place and r.size_bytes > 0 and not r.failed_check]
    return table_from_bench_rows(rows, source=source, fallback=fallback)
