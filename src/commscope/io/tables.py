"""Op lists and traffic matrices as tables: Parquet files and pandas / polars DataFrames.

Everything here needs optional packages: ``pyarrow`` for Parquet and for polars (``pip install
"commscope[parquet]"``), ``pandas`` or ``polars`` for the DataFrames. Without them the functions raise an
ImportError that names the package to install; nothing else in commscope imports this module.

Op lists (``ops.parquet``): one row per CommOp with the columns of :data:`OP_COLUMNS`, in CommOp's field order.
``group`` and ``splits`` are lists of int64, unknown values are nulls, ``extra`` is its JSON text (so any
value a producer kept survives). :func:`read_ops_parquet` gives back CommOps equal to those written.

Traffic matrices (``traffic.parquet``): ``traffic_bytes[src, dst]`` as rows ``src, dst, axis, bytes`` (int64,
int64, string, int64), sorted like the triplet CSV; ``world_size``, ``gpus_per_node``, ``algorithm`` and
``view`` are in the file's metadata (keys ``commscope.*``), so :func:`read_matrix_parquet` gives back an equal
matrix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from commscope.commop import AXES, CommOp
from commscope.pattern.traffic import TrafficMatrix

__all__ = [
    "OP_COLUMNS",
    "matrix_to_pandas",
    "matrix_to_polars",
    "ops_to_pandas",
    "ops_to_polars",
    "read_matrix_parquet",
    "read_ops_parquet",
    "write_matrix_parquet",
    "write_ops_parquet",
]

#: Columns of an op table, in CommOp's field order.
OP_COLUMNS: tuple[str, ...] = (
    "op", "axis", "group", "size_bytes", "dtype", "rank", "peer", "splits", "phase", "micro_batch", "layer",
    "count", "name", "t_start_ns", "t_end_ns", "backend_op", "extra",
)
_INT_COLUMNS = ("size_bytes", "rank", "peer", "micro_batch", "layer", "count", "t_start_ns", "t_end_ns")
_MATRIX_META = ("world_size", "gpus_per_node", "algorithm", "view")
_META_PREFIX = "commscope."


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module} is not installed: pip install {module} (or commscope[{extra}])") from None


def _pyarrow() -> Any:
    _require("pyarrow.parquet", "parquet")
    import pyarrow

    return pyarrow


def _read_table(path: Path) -> Any:
    _pyarrow()
    import pyarrow.parquet as pq

    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        return pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...: all mean "not Parquet"
        raise ValueError(f"{path}: not a Parquet file ({type(exc).__name__}: {exc})") from None


# ----------------------------------------------------------------------------------------------- op lists


def _op_columns(ops: Iterable[CommOp]) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {c: [] for c in OP_COLUMNS}
    for op in ops:
        for c in OP_COLUMNS:
            value = getattr(op, c)
            if c in ("group", "splits") and value is not None:
                value = list(value)
            elif c == "extra":
                value = json.dumps(dict(value), separators=(",", ":"), sort_keys=True) if value else None
            cols[c].append(value)
    return cols


def _ops_table(ops: Iterable[CommOp]) -> Any:
    pa = _pyarrow()
    cols = _op_columns(ops)
    types = {c: pa.int64() for c in _INT_COLUMNS} | {"group": pa.list_(pa.int64()), "splits": pa.list_(pa.int64())}
    schema = pa.schema([(c, types.get(c, pa.string())) for c in OP_COLUMNS])
    return pa.table(cols, schema=schema)


def write_ops_parquet(path: str | Path, ops: Iterable[CommOp]) -> int:
    """Write ``ops`` to a Parquet file (columns :data:`OP_COLUMNS`); returns the number of rows."""
    import pyarrow.parquet as pq

    from commscope.io.atomic import atomic_path

    table = _ops_table(ops)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return int(table.num_rows)


def read_ops_parquet(path: str | Path) -> list[CommOp]:
    """Read an op table written by :func:`write_ops_parquet`. Raises ValueError naming the file and the row of a
    record that is no valid CommOp, or the columns that are missing."""
    path = Path(path)
    table = _read_table(path)
    missing = [c for c in ("op", "axis", "group", "size_bytes") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: not a commscope op table, missing column(s) {', '.join(missing)}")
    rows = table.to_pylist()
    ops = []
    for i, row in enumerate(rows):
        kwargs = {k: v for k, v in row.items() if k in OP_COLUMNS and v is not None}
        for key in ("group", "splits"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        if "extra" in kwargs:
            kwargs["extra"] = tuple(sorted(json.loads(kwargs["extra"]).items()))
        try:
            ops.append(CommOp(**kwargs))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path} row {i}: not a valid CommOp ({exc})") from None
    return ops


def ops_to_pandas(ops: Iterable[CommOp]) -> Any:
    """A pandas DataFrame with one row per op (columns :data:`OP_COLUMNS`; ``group``/``splits`` as lists,
    nullable integers as pandas' Int64, ``extra`` as JSON text)."""
    pd = _require("pandas", "pandas")
    frame = pd.DataFrame(_op_columns(ops), columns=list(OP_COLUMNS))
    for c in _INT_COLUMNS:
        frame[c] = frame[c].astype("Int64")
    return frame


def ops_to_polars(ops: Iterable[CommOp]) -> Any:
    """A polars DataFrame with one row per op (the Parquet schema)."""
    pl = _require("polars", "polars")
    return pl.from_arrow(_ops_table(ops))


# ----------------------------------------------------------------------------------------------- matrices


def write_matrix_parquet(path: str | Path, tm: TrafficMatrix) -> int:
    """Write ``tm`` as Parquet rows ``src, dst, axis, bytes`` with its scalars in the metadata; returns rows."""
    pa = _pyarrow()
    import pyarrow.parquet as pq

    cols = tm.columns()
    table = pa.table({"src": pa.array(cols["src"], pa.int64()), "dst": pa.array(cols["dst"], pa.int64()),
                      "axis": pa.array(list(cols["axis"]), pa.string()), "bytes": pa.array(cols["bytes"], pa.int64())})
    meta = {f"{_META_PREFIX}{k}": str(getattr(tm, k)) for k in _MATRIX_META}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta,
                                           f"{_META_PREFIX}orientation": "traffic_bytes[src, dst] per iteration"})
    from commscope.io.atomic import atomic_path

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return int(table.num_rows)


def read_matrix_parquet(path: str | Path) -> TrafficMatrix:
    """Read a matrix written by :func:`write_matrix_parquet`; raises ValueError naming the file otherwise."""
    path = Path(path)
    table = _read_table(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    missing = [k for k in _MATRIX_META if f"{_META_PREFIX}{k}" not in meta]
    missing += [c for c in ("src", "dst", "axis", "bytes") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: not a commscope traffic matrix, missing {', '.join(missing)}")
    axes = table.column("axis").to_pylist()
    unknown = sorted(set(axes) - set(AXES))
    if unknown:
        raise ValueError(f"{path}: axis={unknown[0]!r} unknown; valid: {', '.join(AXES)}")
    code = {a: i for i, a in enumerate(AXES)}
    return TrafficMatrix(world_size=int(meta[f"{_META_PREFIX}world_size"]),
                         gpus_per_node=int(meta[f"{_META_PREFIX}gpus_per_node"]),
                         src=table.column("src").to_numpy().astype(np.int64),
                         dst=table.column("dst").to_numpy().astype(np.int64),
                         axis=np.array([code[a] for a in axes], dtype=np.int64),
                         bytes=table.column("bytes").to_numpy().astype(np.int64),
                         algorithm=meta[f"{_META_PREFIX}algorithm"],
                         view=meta[f"{_META_PREFIX}view"])


def matrix_to_pandas(tm: TrafficMatrix) -> Any:
    """A pandas DataFrame ``src, dst, axis, bytes`` (``traffic_bytes[src, dst]``), with ``intra_node``."""
    return tm.to_pandas()


def matrix_to_polars(tm: TrafficMatrix) -> Any:
    """A polars DataFrame ``src, dst, axis, bytes, intra_node``."""
    return tm.to_polars()
