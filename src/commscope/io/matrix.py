"""Traffic matrices on disk: a triplet CSV for people and other tools, an NPZ for exact reloads.

Orientation everywhere: a row ``src,dst,axis,bytes`` says GPU ``src`` sends ``bytes`` to GPU ``dst`` per
iteration for parallelism axis ``axis`` (``traffic_bytes[src, dst]``, as in :mod:`commscope.pattern.traffic`).

Triplet CSV::

    src,dst,axis,bytes
    0,1,tp,473532727
    0,8,pp,3623878656

one row per (src, dst, axis), sorted by src, dst, axis (in the order of :data:`commscope.commop.AXES`).
The CSV does not hold ``world_size``, ``gpus_per_node``, ``algorithm`` or ``view``: pass them to
:func:`read_triplets_csv`. The NPZ holds everything, and :func:`read_npz` gives back an equal matrix.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import IO

import numpy as np

from commscope.io.atomic import atomic_path, write_bytes
from commscope.commop import AXES
from commscope.pattern.traffic import TrafficMatrix

TRIPLET_COLUMNS: tuple[str, ...] = ("src", "dst", "axis", "bytes")
#: Bumped when the NPZ layout changes incompatibly.
NPZ_FORMAT_VERSION = 1
_AXIS_CODE = {a: i for i, a in enumerate(AXES)}
_NPZ_KEYS = ("src", "dst", "axis", "axes", "bytes", "world_size", "gpus_per_node", "algorithm", "view")
_VIEWS = ("logical", "wire")


def _check_path_readable(path: Path) -> None:
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, expected a file")


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "wt" if mode == "w" else "rt", encoding="utf-8", newline="\n" if mode == "w" else None)
    return open(path, mode, encoding="utf-8", newline="\n" if mode == "w" else None)


def _sorted_order(tm: TrafficMatrix) -> np.ndarray:
    return np.lexsort((tm.axis, tm.dst, tm.src))


# ----------------------------------------------------------------------------------------------- CSV


def write_triplets_csv(path: str | Path, tm: TrafficMatrix) -> int:
    """Write ``tm`` as ``src,dst,axis,bytes`` rows, sorted; returns the number of rows. ``.gz`` compresses."""
    path = Path(path)
    order = _sorted_order(tm)
    src = tm.src[order].tolist()
    dst = tm.dst[order].tolist()
    axis = [AXES[c] for c in tm.axis[order].tolist()]
    nbytes = tm.bytes[order].tolist()
    with atomic_path(path) as tmp, _open_text(tmp, "w") as fh:
        fh.write(",".join(TRIPLET_COLUMNS) + "\n")
        step = 65536
        for k in range(0, len(src), step):
            rows = zip(src[k:k + step], dst[k:k + step], axis[k:k + step], nbytes[k:k + step])
            fh.write("".join(f"{s},{d},{a},{b}\n" for s, d, a, b in rows))
    return len(src)


def _int_cell(text: str, column: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{where}: {column}={text.strip()!r} is not an integer") from None


def read_triplets_csv(path: str | Path, world_size: int | None = None, gpus_per_node: int = 8, *,
                      algorithm: str = "ring", view: str = "logical") -> TrafficMatrix:
    """Read a ``src,dst,axis,bytes`` CSV into a :class:`TrafficMatrix`.

    ``world_size`` defaults to the largest rank seen + 1 (pass it when the last ranks send and receive
    nothing). Columns may come in any order; rows in any order; rows repeating a (src, dst, axis) are summed;
    rows of zero bytes are dropped. A bad row raises ``ValueError`` naming the file and the line:
    ``traffic.csv line 7: axis='xp' is not one of tp, pp, dp, ep, cp, emb, other``.
    """
    path = Path(path)
    _check_path_readable(path)
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node={gpus_per_node}: must be >= 1")
    if world_size is not None and world_size < 1:
        raise ValueError(f"world_size={world_size}: must be >= 1")
    if view not in _VIEWS:
        raise ValueError(f"view={view!r}: valid views are {', '.join(_VIEWS)}")
    name = path.name
    src: list[int] = []
    dst: list[int] = []
    axis: list[int] = []
    nbytes: list[int] = []
    with _open_text(path, "r") as fh:
        header = fh.readline()
        columns = [c.strip() for c in header.strip().split(",")]
        if sorted(columns) != sorted(TRIPLET_COLUMNS):
            raise ValueError(f"{name} line 1: expected the header {','.join(TRIPLET_COLUMNS)}, got {header.strip()!r}")
        k_src, k_dst, k_axis, k_bytes = (columns.index(c) for c in TRIPLET_COLUMNS)
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            cells = line.split(",")
            where = f"{name} line {lineno}"
            if len(cells) != 4:
                raise ValueError(f"{where}: expected 4 fields {','.join(columns)}, got {len(cells)}: {line.strip()!r}")
            s = _int_cell(cells[k_src], "src", where)
            d = _int_cell(cells[k_dst], "dst", where)
            a = cells[k_axis].strip()
            b = _int_cell(cells[k_bytes], "bytes", where)
            code = _AXIS_CODE.get(a)
            if code is None:
                raise ValueError(f"{where}: axis={a!r} is not one of {', '.join(AXES)}")
            if s < 0 or d < 0 or (world_size is not None and max(s, d) >= world_size):
                bound = f"0..{world_size - 1}" if world_size is not None else ">= 0"
                raise ValueError(f"{where}: rank out of range (src={s}, dst={d}), expected {bound}")
            if s == d:
                raise ValueError(f"{where}: src = dst = {s}; a GPU sends nothing to itself in a traffic matrix")
            if b < 0:
                raise ValueError(f"{where}: bytes={b} is negative")
            src.append(s)
            dst.append(d)
            axis.append(code)
            nbytes.append(b)
    return _matrix(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(axis, dtype=np.int64),
                   np.array(nbytes, dtype=np.int64), world_size, gpus_per_node, algorithm, view)


def _matrix(src: np.ndarray, dst: np.ndarray, axis: np.ndarray, nbytes: np.ndarray, world_size: int | None,
            gpus_per_node: int, algorithm: str, view: str) -> TrafficMatrix:
    """A coalesced TrafficMatrix: sorted by (src, dst, axis), repeated keys summed, zero entries dropped."""
    if world_size is None:
        world_size = int(max(src.max(), dst.max())) + 1 if src.size else 1
    key = (src * world_size + dst) * len(AXES) + axis
    order = np.argsort(key, kind="stable")
    key = key[order]
    nbytes = nbytes[order]
    if key.size:
        starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        nbytes = np.add.reduceat(nbytes, starts)
        key = key[starts]
    keep = nbytes > 0
    key, nbytes = key[keep], nbytes[keep]
    pair, axis = np.divmod(key, len(AXES))
    src, dst = np.divmod(pair, world_size)
    return TrafficMatrix(world_size=world_size, gpus_per_node=gpus_per_node, src=src, dst=dst, axis=axis,
                         bytes=nbytes.astype(np.int64), algorithm=algorithm, view=view)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- NPZ


def write_npz(path: str | Path, tm: TrafficMatrix) -> None:
    """Write ``tm`` to a compressed ``.npz``: arrays ``src``, ``dst``, ``axis`` (codes into ``axes``),
    ``axes`` (axis names), ``bytes``, and scalars ``world_size``, ``gpus_per_node``, ``algorithm``, ``view``.

    Loads without pickle (``np.load(path)``); :func:`read_npz` gives back an equal matrix.
    """
    path = Path(path)
    order = _sorted_order(tm)
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        src=tm.src[order].astype(np.int64),
        dst=tm.dst[order].astype(np.int64),
        axis=tm.axis[order].astype(np.int64),
        axes=np.array(AXES),
        bytes=tm.bytes[order].astype(np.int64),
        world_size=np.int64(tm.world_size),
        gpus_per_node=np.int64(tm.gpus_per_node),
        algorithm=np.array(tm.algorithm),
        view=np.array(tm.view),
        format_version=np.int64(NPZ_FORMAT_VERSION),
    )
    write_bytes(path, buffer.getvalue())  # np.savez would append ".npz" to a path without that suffix


def read_npz(path: str | Path) -> TrafficMatrix:
    """Read a matrix written by :func:`write_npz`. Raises ``ValueError`` naming the file when it is not one."""
    path = Path(path)
    _check_path_readable(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:  # noqa: BLE001 - zipfile.BadZipFile, OSError, EOFError, ValueError: whatever a broken file raises
        raise ValueError(f"{path}: cannot read as .npz ({type(exc).__name__}: {exc})") from None
    missing = [k for k in _NPZ_KEYS if k not in arrays]
    if missing:
        raise ValueError(f"{path}: not a commscope traffic matrix, missing array(s) {', '.join(missing)}")
    version = int(arrays.get("format_version", NPZ_FORMAT_VERSION))
    if version > NPZ_FORMAT_VERSION:
        raise ValueError(f"{path}: format_version={version} is newer than this commscope reads "
                         f"({NPZ_FORMAT_VERSION}); upgrade commscope")
    names = [str(a) for a in arrays["axes"].tolist()]
    unknown = [a for a in names if a not in _AXIS_CODE]
    if unknown:
        raise ValueError(f"{path}: unknown axis name(s) {', '.join(unknown)}; valid: {', '.join(AXES)}")
    src, dst, codes, nbytes = (np.asarray(arrays[k]).astype(np.int64) for k in ("src", "dst", "axis", "bytes"))
    if not (src.shape == dst.shape == codes.shape == nbytes.shape and src.ndim == 1):
        raise ValueError(f"{path}: arrays src, dst, axis, bytes must be 1-D of one length, got shapes "
                         f"{src.shape}, {dst.shape}, {codes.shape}, {nbytes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= len(names)):
        raise ValueError(f"{path}: axis codes must lie in 0..{len(names) - 1}")
    world_size = int(arrays["world_size"])
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= world_size):
        raise ValueError(f"{path}: ranks must lie in 0..{world_size - 1}")
    remap = np.array([_AXIS_CODE[a] for a in names], dtype=np.int64)
    return _matrix(src, dst, remap[codes], nbytes, world_size, int(arrays["gpus_per_node"]),
                   str(arrays["algorithm"]), str(arrays["view"]))


__all__ = ["TRIPLET_COLUMNS", "read_npz", "read_triplets_csv", "write_npz", "write_triplets_csv"]
