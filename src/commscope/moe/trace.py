"""The routing trace: how many tokens each EP rank sent to each expert, per iteration, micro-batch and MoE layer.

The contract (written by :mod:`commscope.moe.generators` and by a real training run, read by :func:`load_trace`):

=====================================  ===========================================================================
``counts[it, mb, layer, rank, x]``     int64 in 0..2**40, shape (iterations, micro_batches, layers, ep, experts): the
                                       token-to-expert assignments EP source rank ``rank`` made to expert ``x``
                                       (after top-k, before capacity dropping). Summed over experts, a rank's row
                                       is its tokens x top_k; no entry exceeds its tokens (a token picks an
                                       expert at most once).
``placement[x]``                       the EP rank hosting expert x; default contiguous blocks,
                                       ``x * ep // experts`` = ``x // (experts / ep)`` when ep divides experts
``layer_ids``                          the model layer index of each entry of the ``layer`` axis
``top_k``, ``tokens_per_rank``         experts per token; tokens per rank per micro-batch (``None``: unknown)
``source``                             where the trace came from (a file, a directory, a generator)
=====================================  ===========================================================================

Files:

- one trace: an ``.npz`` with arrays ``counts``, ``placement``, ``layer_ids`` and ``meta`` (a JSON string:
  ``format``, ``version``, ``top_k``, ``num_experts``, ``tokens_per_rank``, ``source``) -- :func:`save_trace`;
- a real run: a directory of ``routing-rank{rank:05d}.npz``, one per EP source rank (a rank knows only its
  own row), ``counts`` of shape (iterations, micro_batches, layers, experts), the same metadata plus ``rank``
  (and ``ep`` when the writer knows it) -- :func:`write_rank_trace`; :func:`load_trace` stacks them along
  the rank axis;
- the report's older format: ``routing`` of shape (iterations, ep, ep), tokens EP rank i sent to EP rank j,
  read as one expert per rank (experts = ep, identity placement, top_k 1, one micro-batch, one layer).

Every problem with a trace is a :class:`~commscope.errors.ConfigError` that names the file, the iteration
(and micro-batch, layer, rank, expert where one is at fault) and the field:
``routing/routing-rank00003.npz, iteration 12, micro-batch 0, layer 5, expert 7: counts=-2: must be >= 0``.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from commscope.errors import ConfigError

FORMAT = "commscope-routing"
RANK_FORMAT = "commscope-routing-rank"
VERSION = 1
RANK_FILE_GLOB = "routing-rank*.npz"
_RANK_FILE = re.compile(r"routing-rank(\d+)\.npz$")
TRACE_DIMS = ("iteration", "micro-batch", "layer", "rank", "expert")
RANK_DIMS = ("iteration", "micro-batch", "layer", "expert")
_OLD_DIMS = ("iteration", "rank", "to rank")
#: The largest token-to-expert count a trace may hold: 2**40 (1.1e12). One entry is the assignments of one EP rank to
#: one expert in one micro-batch and layer, at most the rank's tokens (~1e7 in the largest micro-batches); the bound
#: keeps every sum over a trace exact in int64 and float64, and refuses a value the int64 cast would wrap (1e30).
MAX_TOKEN_COUNT = 1 << 40
_PLURAL = {"iteration": "iterations", "micro-batch": "micro_batches", "layer": "layers", "rank": "ep", "to rank": "ep",
           "expert": "experts"}


def contiguous_placement(num_experts: int, ep: int) -> np.ndarray:
    """(experts,) EP rank of each expert in contiguous blocks: expert x on rank ``x * ep // num_experts``.

    Megatron-core's default: with 64 experts over ep=8, experts 0-7 live on rank 0, 8-15 on rank 1, ...
    """
    return np.arange(num_experts, dtype=np.int64) * ep // num_experts


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingTrace:
    """Token-to-expert counts of a run (see the module docstring for the contract). Validated on creation."""

    counts: np.ndarray
    """(iterations, micro_batches, layers, ep, experts) int64 assignments from EP rank to expert."""
    top_k: int
    """Experts each token is routed to."""
    num_experts: int | None = None
    """Routed experts per MoE layer; ``None``: ``counts.shape[-1]`` (given: must equal it)."""
    placement: np.ndarray | None = None
    """(experts,) int64 EP rank hosting each expert; ``None``: :func:`contiguous_placement`."""
    layer_ids: tuple[int, ...] | None = None
    """Model layer index of each MoE layer of the ``layer`` axis; ``None``: 0, 1, ..."""
    tokens_per_rank: int | None = None
    """Tokens each EP rank routes per micro-batch and layer; ``None`` when unknown (not checked then)."""
    source: str = "routing trace"
    """Where the trace comes from; error messages start with it."""
    first_iteration: int = 0
    """The training iteration of ``counts[0]`` (non-zero for a cut of a longer run)."""

    def __post_init__(self) -> None:
        src = self.source
        if self.layer_ids is not None:
            layer_ids = _checked_layer_ids(self.layer_ids, src)
        else:
            layer_ids = None
        counts = checked_counts(self.counts, TRACE_DIMS, src, layer_ids=layer_ids)
        _, _, num_layers, ep, experts = counts.shape
        if layer_ids is None:
            layer_ids = tuple(range(num_layers))
        elif len(layer_ids) != num_layers:
            raise ConfigError("layer_ids", layer_ids, f"must name one model layer per MoE layer of counts ({num_layers})",
                              source=src)
        if self.num_experts is not None and self.num_experts != experts:
            raise ConfigError("num_experts", self.num_experts, f"counts has {experts} experts (its last dimension)",
                              source=src)
        if not _is_int(self.top_k) or not 1 <= self.top_k <= experts:
            raise ConfigError("top_k", self.top_k, f"must be an integer in 1..num_experts={experts}", source=src)
        placement = _checked_placement(self.placement, experts, ep, src)
        if not _is_int(self.first_iteration) or self.first_iteration < 0:
            raise ConfigError("first_iteration", self.first_iteration, "must be an integer >= 0", source=src)
        tokens = self.tokens_per_rank
        if tokens is not None:
            if not _is_int(tokens) or tokens < 1:
                raise ConfigError("tokens_per_rank", tokens, "must be a positive integer or unset", source=src)
            _check_rows(counts, int(tokens), int(self.top_k), src, layer_ids)
        for name, value in (("counts", counts), ("num_experts", experts), ("top_k", int(self.top_k)),
                            ("placement", placement), ("layer_ids", layer_ids),
                            ("tokens_per_rank", None if tokens is None else int(tokens)), ("source", str(src)),
                            ("first_iteration", int(self.first_iteration))):
            object.__setattr__(self, name, value)

    # ----- derived shapes -----
    @property
    def iterations(self) -> int:
        return int(self.counts.shape[0])

    @property
    def micro_batches(self) -> int:
        return int(self.counts.shape[1])

    @property
    def num_layers(self) -> int:
        return int(self.counts.shape[2])

    @property
    def ep(self) -> int:
        return int(self.counts.shape[3])

    def take_iterations(self, start: int, stop: int | None = None) -> RoutingTrace:
        """The trace of entries ``start .. stop - 1`` of the iteration axis (``stop=None``: only ``start``);
        its ``first_iteration`` keeps the training iteration numbers."""
        stop = start + 1 if stop is None else stop
        if not (_is_int(start) and _is_int(stop) and 0 <= start < stop <= self.iterations):
            raise ConfigError("routing_iteration", start if stop == start + 1 else (start, stop),
                              f"must be within the trace's iterations 0..{self.iterations - 1}", source=self.source)
        return RoutingTrace(counts=self.counts[start:stop], top_k=self.top_k, placement=self.placement,
                            layer_ids=self.layer_ids, tokens_per_rank=self.tokens_per_rank, source=self.source,
                            first_iteration=self.first_iteration + start)


# ----------------------------------------------------------------------------------------------- writing


def save_trace(trace: RoutingTrace, path: str | Path) -> Path:
    """Write ``trace`` as one ``.npz`` (``counts``, ``placement``, ``layer_ids``, ``meta``); returns the path."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    meta = {"format": FORMAT, "version": VERSION, "top_k": trace.top_k, "num_experts": trace.num_experts,
            "tokens_per_rank": trace.tokens_per_rank, "source": trace.source, "first_iteration": trace.first_iteration}
    assert trace.placement is not None  # __post_init__ fills in the default
    _write_npz(path, counts=_compact(trace.counts), placement=trace.placement,
               layer_ids=np.asarray(trace.layer_ids, dtype=np.int64), meta=np.array(json.dumps(meta)))
    return path


def write_rank_trace(directory: str | Path, rank: int, counts_rank: np.ndarray, *, top_k: int, num_experts: int,
                     placement: np.ndarray | None = None, layer_ids: tuple[int, ...] | None = None,
                     ep: int | None = None, tokens_per_rank: int | None = None) -> Path:
    """Write one EP source rank's routing, ``counts_rank`` of shape (iterations, micro_batches, layers,
    experts), as ``directory/routing-rank{rank:05d}.npz``; returns the path.

    ``ep`` (the EP group size) lets :func:`load_trace` notice a missing last rank; ``placement`` and
    ``layer_ids`` default as in :class:`RoutingTrace`. The file is written under a temporary name and renamed,
    so a reader never sees half of it.
    """
    src = f"rank {rank}"
    if not _is_int(rank) or rank < 0 or (ep is not None and rank >= ep):
        raise ConfigError("rank", rank, "must be an EP rank >= 0" + (f" and < ep={ep}" if ep is not None else ""))
    counts = checked_counts(counts_rank, RANK_DIMS, src)
    if counts.shape[-1] != num_experts:
        raise ConfigError("num_experts", num_experts, f"counts has {counts.shape[-1]} experts (its last dimension)",
                          source=src)
    if not _is_int(top_k) or not 1 <= top_k <= num_experts:
        raise ConfigError("top_k", top_k, f"must be an integer in 1..num_experts={num_experts}", source=src)
    meta: dict[str, Any] = {"format": RANK_FORMAT, "version": VERSION, "rank": int(rank), "top_k": int(top_k),
                            "num_experts": int(num_experts), "tokens_per_rank": tokens_per_rank,
                            "source": f"rank {rank}"}
    if ep is not None:
        meta["ep"] = int(ep)
    arrays: dict[str, np.ndarray] = {"counts": _compact(counts), "meta": np.array(json.dumps(meta))}
    if placement is not None:
        arrays["placement"] = np.asarray(placement)
    if layer_ids is not None:
        arrays["layer_ids"] = np.asarray(layer_ids, dtype=np.int64)
    path = Path(directory) / f"routing-rank{rank:05d}.npz"
    _write_npz(path, **arrays)
    return path


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    from commscope.io.atomic import atomic_open

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy's stub: a key of **kwds could be allow_pickle


def _compact(counts: np.ndarray) -> np.ndarray:
    """The counts in the smallest unsigned dtype that holds them (files 4-8x smaller; read back as int64)."""
    top = int(counts.max()) if counts.size else 0
    return counts.astype(np.min_scalar_type(top))


# ----------------------------------------------------------------------------------------------- reading


def load_trace(path: str | Path) -> RoutingTrace:
    """Read a routing trace: one ``.npz`` (this format or the report's ``routing`` array), or a directory of
    ``routing-rank*.npz`` files (or holding exactly one trace ``.npz``). Raises ConfigError on bad input."""
    path = Path(path)
    if path.is_dir():
        return _load_directory(path)
    if not path.exists():
        raise ConfigError("routing trace", str(path),
                          "no such file or directory (expected an .npz trace or a directory of routing-rank*.npz files)")
    arrays = _read_npz(path)
    src = str(path)
    if "counts" in arrays:
        meta = _meta(arrays, src)
        if meta.get("format") == RANK_FORMAT:
            raise ConfigError("file", path.name, "holds one EP rank's routing: give the directory of all "
                              "routing-rank*.npz files", source=src)
        return RoutingTrace(counts=arrays["counts"], top_k=_meta_int(meta, "top_k", src),
                            num_experts=_meta_int(meta, "num_experts", src, required=False),
                            placement=arrays.get("placement"), layer_ids=_layer_ids_of(arrays, src),
                            tokens_per_rank=_meta_int(meta, "tokens_per_rank", src, required=False), source=src,
                            first_iteration=_meta_int(meta, "first_iteration", src, required=False) or 0)
    if "routing" in arrays:
        routing = arrays["routing"]
        if routing.ndim == 2:
            routing = routing[None]
        routing = checked_counts(routing, _OLD_DIMS, src, field="routing")
        if routing.shape[1] != routing.shape[2]:
            raise ConfigError("routing", routing.shape, "must have shape (iterations, ep, ep)", source=src)
        ep = routing.shape[1]
        return RoutingTrace(counts=routing[:, None, None], top_k=1, placement=np.arange(ep, dtype=np.int64),
                            layer_ids=(0,), source=src)
    raise ConfigError("counts", None, f"missing: the file holds {', '.join(sorted(arrays)) or 'no arrays'}; expected "
                      "'counts' (a commscope routing trace) or 'routing' (iterations, ep, ep)", source=src)


def _load_directory(directory: Path) -> RoutingTrace:
    files = sorted(directory.glob(RANK_FILE_GLOB))
    src = str(directory)
    if not files:
        others = sorted(directory.glob("*.npz"))
        if len(others) == 1:
            return load_trace(others[0])
        found = f"it holds {', '.join(f.name for f in others)}: give one of them" if others else "it holds no .npz files"
        raise ConfigError("routing trace", src, f"has no {RANK_FILE_GLOB} files; {found}")
    first: dict[str, Any] | None = None
    by_rank: dict[int, np.ndarray] = {}
    for f in files:
        part = _read_rank_file(f)
        rank = part["rank"]
        if rank in by_rank:
            raise ConfigError("rank", rank, f"appears twice in {src} (two files claim it)", source=str(f))
        if first is None:
            first = part
        else:
            _check_same(first, part)
        by_rank[rank] = part["counts"]
    assert first is not None
    ep = first["ep"] if first["ep"] is not None else max(by_rank) + 1
    beyond = sorted(r for r in by_rank if r >= ep)
    if beyond:
        raise ConfigError("rank", beyond[0], f"is not in the EP group of ep={ep} ranks the files declare", source=src)
    missing = [r for r in range(ep) if r not in by_rank]
    if missing:
        names = ", ".join(f"routing-rank{r:05d}.npz" for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ConfigError("ranks", missing, f"missing: an EP group of {ep} ranks needs one file per rank; "
                          f"{src} lacks {names}", source=src)
    counts = np.stack([by_rank[r] for r in range(ep)], axis=3)  # (it, mb, layer, ep, experts)
    return RoutingTrace(counts=counts, top_k=first["top_k"], placement=first["placement"],
                        layer_ids=first["layer_ids"], tokens_per_rank=first["tokens_per_rank"], source=src)


def _read_rank_file(path: Path) -> dict[str, Any]:
    src = str(path)
    arrays = _read_npz(path)
    if "counts" not in arrays:
        raise ConfigError("counts", None, f"missing: the file holds {', '.join(sorted(arrays)) or 'no arrays'}",
                          source=src)
    meta = _meta(arrays, src)
    rank = _meta_int(meta, "rank", src)
    match = _RANK_FILE.search(path.name)
    if match and int(match.group(1)) != rank:
        raise ConfigError("rank", rank, f"disagrees with the file name {path.name}", source=src)
    layer_ids = _layer_ids_of(arrays, src)
    counts = checked_counts(arrays["counts"], RANK_DIMS, src, layer_ids=layer_ids)
    num_experts = _meta_int(meta, "num_experts", src, required=False)
    if num_experts is not None and num_experts != counts.shape[-1]:
        raise ConfigError("num_experts", num_experts, f"counts has {counts.shape[-1]} experts (its last dimension)",
                          source=src)
    placement = arrays.get("placement")
    return {"path": path, "rank": rank, "counts": counts, "top_k": _meta_int(meta, "top_k", src),
            "ep": _meta_int(meta, "ep", src, required=False), "layer_ids": layer_ids,
            "placement": None if placement is None else np.asarray(placement),
            "tokens_per_rank": _meta_int(meta, "tokens_per_rank", src, required=False)}


def _check_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Every rank's file must describe the same run: shapes, experts, top_k, layers, placement, ep."""
    src, other = str(b["path"]), a["path"].name
    sa, sb = a["counts"].shape, b["counts"].shape
    if sa[-1] != sb[-1]:
        raise ConfigError("num_experts", sb[-1], f"differs from {other}, which has {sa[-1]} experts", source=src)
    if sa[:3] != sb[:3]:
        raise ConfigError("counts", sb, f"has (iterations, micro_batches, layers) = {sb[:3]}, {other} has {sa[:3]}: "
                          "every rank must record the same iterations, micro-batches and layers", source=src)
    for key in ("top_k", "ep", "layer_ids", "tokens_per_rank"):
        if a[key] != b[key]:
            raise ConfigError(key, b[key], f"differs from {other}, which has {a[key]!r}", source=src)
    pa, pb = a["placement"], b["placement"]
    if (pa is None) != (pb is None) or (pa is not None and not np.array_equal(pa, pb)):
        raise ConfigError("placement", None if pb is None else pb.tolist(), f"differs from {other}", source=src)


#: The first bytes of a zip (every .npz) and of a single .npy array.
_ZIP_MAGIC = b"PK"
_NPY_MAGIC = b"\x93NUMPY"


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz``; a file that is no zip (text, a single .npy array, nothing), or a truncated or
    corrupt one, is a ConfigError, never a traceback (numpy reads any non-zip as a pickle: 'contains pickled data')."""
    try:
        with open(path, "rb") as fh:  # our handle: numpy leaks its own when a zip is truncated
            head = fh.read(len(_NPY_MAGIC))
            if head.startswith(_ZIP_MAGIC):
                fh.seek(0)
                with np.load(fh, allow_pickle=False) as npz:
                    return {name: np.asarray(npz[name]) for name in npz.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, RuntimeError) as exc:
        raise ConfigError("file", path.name, f"is not a readable .npz archive ({exc}): truncated, corrupt, or not "
                          "written by numpy", source=str(path)) from None
    what = ("is empty" if not head else "is a single .npy array" if head == _NPY_MAGIC
            else f"starts with {head!r}, not a zip's {_ZIP_MAGIC!r}")
    raise ConfigError("file", path.name, f"is not an .npz archive: it {what}; give a routing trace as numpy.savez "
                      "writes it (a zip of arrays: 'counts' and 'meta', or 'routing')", source=str(path))


def _meta(arrays: dict[str, np.ndarray], src: str) -> dict[str, Any]:
    if "meta" not in arrays:
        return {}
    try:
        meta = json.loads(str(arrays["meta"]))
    except ValueError as exc:
        raise ConfigError("meta", str(arrays["meta"])[:80], f"must be a JSON object ({exc})", source=src) from None
    if not isinstance(meta, dict):
        raise ConfigError("meta", meta, "must be a JSON object", source=src)
    return meta


def _meta_int(meta: dict[str, Any], key: str, src: str, *, required: bool = True) -> Any:
    value = meta.get(key)
    if value is None:
        if required:
            raise ConfigError(key, None, "missing from the file's meta (a JSON object with top_k, num_experts, ...)",
                              source=src)
        return None
    if not _is_int(value):
        raise ConfigError(key, value, "must be an integer", source=src)
    return int(value)


def _layer_ids_of(arrays: dict[str, np.ndarray], src: str) -> tuple[int, ...] | None:
    if "layer_ids" not in arrays:
        return None
    return _checked_layer_ids(arrays["layer_ids"], src)


# ----------------------------------------------------------------------------------------------- validation


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _where(mask: np.ndarray, dims: tuple[str, ...], layer_ids: tuple[int, ...] | None) -> str:
    """'iteration 12, micro-batch 0, layer 5, rank 3' for the first True entry of ``mask``."""
    index = np.unravel_index(int(np.argmax(mask)), mask.shape)
    parts = []
    for name, i in zip(dims, map(int, index)):
        parts.append(f"layer {layer_ids[i]}" if name == "layer" and layer_ids is not None else f"{name} {i}")
    return ", ".join(parts)


def checked_counts(values: Any, dims: tuple[str, ...], source: str, *, field: str = "counts",
                   layer_ids: tuple[int, ...] | None = None) -> np.ndarray:
    """``values`` as a C-ordered int64 array of ``len(dims)`` dimensions, or a ConfigError that names the
    source, the first offending position (iteration first) and the field."""
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(field, type(values).__name__, f"must be an array of shape ({', '.join(dims)}) ({exc})",
                          source=source) from None
    shape_text = "(" + ", ".join(_PLURAL[d] for d in dims) + ")"
    if arr.ndim != len(dims):
        raise ConfigError(field, arr.shape, f"must have {len(dims)} dimensions {shape_text}", source=source)
    if 0 in arr.shape:
        raise ConfigError(field, arr.shape, f"must not be empty {shape_text}", source=source)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ConfigError(field, str(arr.dtype), "must hold integer token counts", source=source)

    def fail(mask: np.ndarray, expected: str) -> None:
        raise ConfigError(field, arr[np.unravel_index(int(np.argmax(mask)), arr.shape)].item(), expected,
                          source=f"{source}, {_where(mask, dims, layer_ids)}")

    if not np.issubdtype(arr.dtype, np.integer):
        finite = np.isfinite(arr)
        if not finite.all():
            fail(~finite, "must be a finite token count")
        whole = arr == np.rint(arr)
        if not whole.all():
            fail(~whole, "must be a whole number of tokens")
    negative = arr < 0
    if negative.any():
        fail(negative, "must be >= 0 (token-to-expert assignments)")
    huge = arr > MAX_TOKEN_COUNT  # before the cast, which would wrap it (1e30 -> -9223372036854775808)
    if huge.any():
        fail(huge, f"not a token count: must be <= 2**40 = {MAX_TOKEN_COUNT:,} (tokens one EP rank routes to one "
                   "expert or rank are at most its tokens, ~1e7 in the largest micro-batches)")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_rows(counts: np.ndarray, tokens: int, top_k: int, src: str, layer_ids: tuple[int, ...]) -> None:
    """With known tokens per rank: no expert gets a token twice, and every rank routes tokens x top_k."""
    over = counts > tokens
    if over.any():
        raise ConfigError("counts", int(counts[np.unravel_index(int(np.argmax(over)), counts.shape)]),
                          f"must be <= tokens_per_rank={tokens} (a token picks an expert at most once)",
                          source=f"{src}, {_where(over, TRACE_DIMS, layer_ids)}")
    rows = counts.sum(axis=-1)
    wrong = rows != tokens * top_k
    if wrong.any():
        index = np.unravel_index(int(np.argmax(wrong)), rows.shape)
        raise ConfigError("counts", int(rows[index]), f"summed over experts must be tokens_per_rank x top_k = "
                          f"{tokens} x {top_k} = {tokens * top_k}", source=f"{src}, {_where(wrong, TRACE_DIMS[:-1], layer_ids)}")


def _checked_placement(placement: Any, experts: int, ep: int, src: str) -> np.ndarray:
    if placement is None:
        return contiguous_placement(experts, ep)
    arr = np.asarray(placement)
    if arr.shape != (experts,):
        raise ConfigError("placement", arr.shape, f"must have one EP rank per expert: shape ({experts},)", source=src)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError("placement", str(arr.dtype), "must hold integer EP ranks", source=src)
    bad = (arr < 0) | (arr >= ep)
    if bad.any():
        x = int(np.argmax(bad))
        raise ConfigError(f"placement[{x}]", int(arr[x]), f"expert {x} must live on an EP rank in 0..{ep - 1} "
                          f"(counts has ep={ep} source ranks)", source=src)
    return np.ascontiguousarray(arr, dtype=np.int64)


def _checked_layer_ids(layer_ids: Any, src: str) -> tuple[int, ...]:
    arr = np.asarray(layer_ids)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError("layer_ids", arr.tolist(), "must be a list of model layer indices", source=src)
    ids = tuple(int(x) for x in arr)
    if any(x < 0 for x in ids) or len(set(ids)) != len(ids):
        raise ConfigError("layer_ids", ids, "must be distinct model layer indices >= 0", source=src)
    return ids


__all__ = [
    "FORMAT",
    "MAX_TOKEN_COUNT",
    "RANK_FORMAT",
    "RoutingTrace",
    "checked_counts",
    "contiguous_placement",
    "load_trace",
    "save_trace",
    "write_rank_trace",
]
