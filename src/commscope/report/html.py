"""One self-contained HTML report: the data builder and the renderer.

:func:`build_report_data` turns library results (a :class:`~commscope.api.Prediction`, its
:class:`~commscope.estimate.Estimate`, a :class:`~commscope.estimate.plan.Plan`, measured op logs, a bandwidth
benchmark, MoE routing) into one JSON-ready dict; every number the page shows is in it, already computed
here (pooled heatmap cells, shares, histograms, timed schedules, measured-vs-predicted bytes).
:func:`render_html` embeds that dict in a single HTML file whose own small script only draws it: inline
SVG and canvas, no library, no font, no image and no request of any kind leaves the page.

Section builders, each usable alone:

====================  =======================================================================
heatmap_section       per-axis sparse cells, GPU level up to 1,024 GPUs, node level above;
                      each cell the largest entry of the block it covers when pooled
bytes_section         bytes by axis and by link class (intra-node / inter-node), shares
message_size_section  histogram of op sizes in powers of two, per axis (ops and bytes)
breakdown_section     the iteration-time terms of an estimate, and of a plan's top entries
schedule_section      the timed pipeline schedule (1F1B / interleaved / GPipe) with bubbles
compare_measured      measured vs predicted bytes per axis (the arithmetic, for the page and tests)
bench_section         bus-bandwidth curves of a benchmark, with the cluster model's curve
moe_section           routing heatmaps over iterations and their imbalance metrics
====================  =======================================================================

Input files of the optional sections (loaders below): measured runs are per-rank JSON Lines op logs
(:func:`commscope.io.oplog.read_ops_jsonl`); a benchmark is ``{"meta": {...}, "rows": [{"op",
"group_size", "size_bytes", "busbw_bytes_per_s", "time_s", ...}]}``; MoE routing is an ``.npz`` with a
``routing`` array (iterations, ep, ep) of token counts sent from EP rank i to EP rank j.
"""

from __future__ import annotations

import functools
import html as _html
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.commop import AXES, REPORT_AXES, CommOp

#: Format of the embedded data (bumped on incompatible changes).
FORMAT_NAME = "commscope.report"
FORMAT_VERSION = 1
#: Worlds up to this many GPUs are drawn GPU by GPU, larger ones node by node (as the PNG heatmaps).
AUTO_GPU_LEVEL_MAX = 1024
#: Most cells per side of the page's heatmap; above it each cell is the largest entry of a block.
HTML_MAX_CELLS = 512
#: Most slots of a pipeline timeline kept in the page (2 m v p slots per schedule).
MAX_SCHEDULE_SLOTS = 60_000
#: Most MoE iterations whose routing matrix is embedded per file (evenly sampled; metrics cover all).
MAX_MOE_FRAMES = 64

#: Display name and colour of each axis; the PNG figures use the same.
AXIS_STYLE: dict[str, tuple[str, str]] = {
    "tp": ("TP", "#4e79a7"),
    "pp": ("PP", "#f28e2b"),
    "dp": ("DP", "#59a14f"),
    "emb": ("EMB", "#b07aa1"),
    "cp": ("CP", "#d4a017"),
    "ep": ("EP", "#e15759"),
    "other": ("other", "#9c755f"),
}
#: Iteration-time terms of an Estimate in drawing order: (key, label, field, colour).
TERMS: tuple[tuple[str, str, str, str], ...] = (
    ("compute", "compute", "compute_s", "#8e9aaf"),
    ("tp", "TP", "tp_s", AXIS_STYLE["tp"][1]),
    ("pp", "PP", "pp_s", AXIS_STYLE["pp"][1]),
    ("cp", "CP (exposed)", "cp_s", AXIS_STYLE["cp"][1]),
    ("ep", "EP", "ep_s", AXIS_STYLE["ep"][1]),
    ("dp", "DP", "dp_s", AXIS_STYLE["dp"][1]),
    ("emb", "embedding sync", "emb_s", AXIS_STYLE["emb"][1]),
    ("optimizer", "optimizer step", "optimizer_s", "#b4a7d6"),
    ("bubble", "bubble", "bubble_s", "#c8c8c8"),
)


# ----------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLogs:
    """The op records of a measured run: every rank's log, merged."""

    ops: tuple[CommOp, ...]
    """Every record of every file; when the records carry step tags, untagged ones have phase ``setup``."""
    files: tuple[str, ...]
    num_iterations: int = 1
    """Iterations the logs cover; measured sums are divided by it to compare with one predicted iteration."""
    steps: tuple[int, ...] = ()
    """The distinct ``step`` tags of the records (``extra``), as `commscope record` writes them."""
    problems: tuple[str, ...] = ()
    header: dict[str, Any] = field(default_factory=dict)
    """The first file's header line (``commscope_header``), if any."""
    num_attributed: int = 0
    """Records that had no axis and took one from a prediction's layout (:func:`with_axes`)."""
    formats: tuple[str, ...] = ()
    """The formats read (``jsonl``, ``kineto``, ``deepspeed``, ...)."""
    missing_fields: tuple[str, ...] = ()
    """CommOp fields the records could not give."""
    notes: tuple[str, ...] = ()
    """What the reader assumed (a group taken from the world size, ...)."""
    partial_steps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Steps some ranks did not log completely (left out): step -> those ranks."""
    matrix_omitted: str | None = None
    """Why no measured traffic matrix can be drawn (None: it can)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    """A collective micro-benchmark: ``meta`` as written and one dict per measured point."""

    rows: tuple[dict[str, Any], ...]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    problems: tuple[str, ...] = ()
    """Damaged rows skipped (``b.json rows[3].time_s=-1e-05: not a measured time (must be > 0): row skipped``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeRouting:
    """Token counts of one MoE routing record: ``routing[it, i, j]`` tokens EP rank i sends to EP rank j."""

    name: str
    routing: np.ndarray
    """(iterations, ep, ep) non-negative counts."""
    source: str = ""
    trace: Any = None
    """The :class:`~commscope.moe.trace.RoutingTrace` behind ``routing`` when it came from one (expert counts):
    the section then also shows the talk's dynamics (:func:`commscope.moe.metrics.routing_metrics`)."""


_HEADER_ITERATION_KEYS = ("num_iterations", "iterations", "num_steps", "steps")


def _step_of(op: CommOp) -> Any:
    for key, value in op.extra:
        if key == "step":
            return value
    return None


def load_measured(path: str | Path, *, num_iterations: int | None = None, layout=None) -> MeasuredLogs:
    """Read a measured run: a directory of per-rank files or one file, of any format
    :func:`commscope.io.runs.read_run` reads (commscope's op logs, Kineto traces, DeepSpeed logs, ...).

    Records tagged with a training step (``extra["step"]``) count as iterations and untagged ones as setup; steps
    some ranks did not log completely are left out (and said); ``num_iterations`` defaults to the number of
    complete steps, else the header's ``num_iterations`` (or ``iterations``, ``steps``), else 1. ``layout`` is the
    job's, when known (see :func:`~commscope.io.runs.read_run`).
    """
    from commscope.io.runs import read_run

    path = Path(path)
    if not path.exists():
        raise ConfigError("measured", str(path), "no such file or directory (expected per-rank op logs or another "
                                                 "tool's records)")
    try:
        run = read_run(path, layout=layout)
    except ValueError as exc:
        raise ConfigError("measured", str(path), str(exc).removeprefix(f"{path}: ")) from None
    if layout is not None and run.world_size and (run.world_size > layout.world_size or (
            run.world_size != layout.world_size and "jsonl" in run.formats)):
        raise ConfigError("measured", str(path), f"holds the logs of {run.world_size} ranks, but the job to compare them "
                                                 f"with has {layout.world_size} (tp x pp x dp x cp): describe the "
                                                 "recorded job (its flags, or model.toml and parallel.toml beside the "
                                                 "logs), or give --no-predicted")
    ops = [op for op in run.all_ops if _step_of(op) not in run.partial_steps]
    problems = list(run.problems)
    if run.partial_steps:
        problems.append("partial steps left out: " + "; ".join(
            f"step {k} (rank(s) {', '.join(map(str, v))})" for k, v in sorted(run.partial_steps.items())))
    header = next((dict(h) for _, h in sorted(run.headers.items()) if h), {})
    steps = sorted({s for s in (_step_of(op) for op in ops) if isinstance(s, int)})
    if steps:
        ops = [op if isinstance(_step_of(op), int) or op.phase == "setup" else op.with_(phase="setup") for op in ops]
    if num_iterations is None:
        found = [header[k] for k in _HEADER_ITERATION_KEYS if isinstance(header.get(k), int) and header[k] >= 1]
        num_iterations = len(steps) if steps else (found[0] if found else 1)
    elif steps and num_iterations != len(steps):  # the logs say how many: a different count would rescale them all
        raise ConfigError("measured_iterations", num_iterations, f"the logs mark {len(steps)} complete training "
                                                                 f"step(s); leave it out (or give {len(steps)})")
    if num_iterations < 1:
        raise ConfigError("measured_iterations", num_iterations, "must be a positive integer")
    if num_iterations > max(len(ops), 1):  # an iteration without a single op on any rank: a typo, not a job
        raise ConfigError("measured_iterations", num_iterations, f"is more than the {len(ops)} op records the logs "
                                                                 "hold; give the number of training iterations logged")
    return MeasuredLogs(ops=tuple(ops), files=run.files, num_iterations=num_iterations, steps=tuple(steps),
                        problems=tuple(problems), header=header, formats=run.formats,
                        missing_fields=run.missing_fields, notes=run.notes, partial_steps=dict(run.partial_steps),
                        matrix_omitted=run.matrix_omitted)


_BENCH_REQUIRED = ("op", "group_size", "size_bytes", "busbw_bytes_per_s")


def load_bench(path: str | Path) -> BenchResult:
    """Read a benchmark JSON ``{"meta": {...}, "rows": [...]}`` (a bare list of rows is accepted too). A row whose
    numbers no measurement has (:func:`commscope.io.checks.bench_row_problem`: the rules ``fit`` and ``--bandwidth``
    apply) is skipped and named in ``problems``; a file of no usable row is refused."""
    from commscope.io.checks import bench_row_problem, read_json_document

    path = Path(path)
    if not path.is_file():
        raise ConfigError("bench", str(path), "no such file (expected a benchmark JSON with meta and rows)")
    doc = read_json_document(path, "bench", what="a benchmark JSON with meta and rows (commscope bench --out)")
    rows = doc.get("rows") if isinstance(doc, dict) else doc
    meta = doc.get("meta", {}) if isinstance(doc, dict) else {}
    if not isinstance(rows, list) or not rows:
        raise ConfigError("bench", str(path), 'needs a non-empty "rows" list of {op, group_size, size_bytes, busbw_bytes_per_s}')
    out, problems = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"rows[{i}]", row, "must be an object", source=str(path))
        missing = [k for k in _BENCH_REQUIRED if k not in row]
        if missing:
            raise ConfigError(f"rows[{i}]", {k: row[k] for k in list(row)[:4]}, f"lacks {', '.join(missing)}", source=str(path))
        why = bench_row_problem(row)
        if why is not None:
            problems.append(f"{path.name} rows[{i + 1}].{why}: row skipped")
            continue
        try:
            clean = dict(row, op=str(row["op"]), group_size=int(row["group_size"]), size_bytes=int(row["size_bytes"]),
                         busbw_bytes_per_s=float(row["busbw_bytes_per_s"]))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"rows[{i}]", row, f"has a non-numeric value ({exc})", source=str(path)) from None
        out.append(clean)
    if not out:
        raise ConfigError("bench", str(path), f"has no usable row: {'; '.join(problems[:3])}")
    return BenchResult(rows=tuple(out), meta=dict(meta) if isinstance(meta, dict) else {"meta": meta}, source=str(path),
                       problems=tuple(problems))


def load_moe(path: str | Path) -> list[MoeRouting]:
    """Read an ``.npz`` with a ``routing`` array (iterations, ep, ep), or every ``*.npz`` of a directory; a
    routing trace (:mod:`commscope.moe.trace`: a ``counts`` array, or a directory of ``routing-rank*.npz``)
    becomes its rank-to-rank tokens summed over micro-batches and layers."""
    from commscope.moe.routing import rank_tokens
    from commscope.moe.trace import RANK_FILE_GLOB, load_trace

    def from_trace(source: Path) -> MoeRouting:
        trace = load_trace(source)
        assert trace.placement is not None  # __post_init__ fills in the default
        routing = rank_tokens(trace.counts.sum(axis=(1, 2)), trace.placement, trace.ep)
        return MoeRouting(name=source.stem if source.is_file() else source.name, routing=routing, source=str(source),
                          trace=trace)

    path = Path(path)
    if not path.exists():
        raise ConfigError("moe", str(path), "no such file or directory (expected .npz files with a routing array)")
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    out = []
    if path.is_dir() and any(path.glob(RANK_FILE_GLOB)):
        out.append(from_trace(path))
        files = [f for f in files if not f.match(RANK_FILE_GLOB)]
    if not files and not out:
        raise ConfigError("moe", str(path), "holds no *.npz files")
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as npz:
                if "counts" in npz.files:
                    routing = None
                elif "routing" not in npz.files:
                    raise ConfigError("moe", str(f), f"has no 'routing' array (it has: {', '.join(npz.files) or 'nothing'})")
                else:
                    routing = np.asarray(npz["routing"])
        except (OSError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError("moe", str(f), "is not a readable .npz archive of routing counts (truncated, corrupt, or "
                                             "not written by numpy: a routing trace from `commscope moe` or "
                                             "commscope.moe.RoutingTrace.save)") from None
        if routing is None:
            out.append(from_trace(f))
            continue
        if routing.ndim == 2:
            routing = routing[None]
        if routing.ndim != 3 or routing.shape[1] != routing.shape[2] or routing.shape[0] < 1:
            raise ConfigError("moe", str(f), f"routing has shape {routing.shape}; expected (iterations, ep, ep)")
        if not np.issubdtype(routing.dtype, np.number) or not np.all(np.isfinite(routing)) or np.any(routing < 0):
            raise ConfigError("moe", str(f), "routing must hold finite token counts >= 0")
        out.append(MoeRouting(name=f.stem, routing=routing, source=str(f)))
    return out


# ----------------------------------------------------------------------------------------------- sections


def _axis_list(keys: Iterable[str]) -> list[dict[str, str]]:
    return [{"key": a, "label": AXIS_STYLE[a][0], "color": AXIS_STYLE[a][1]} for a in keys]


def _pooled_cells(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, side: int, block: int,
                  *, sum_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse (row, col, bytes) of a side x side matrix pooled into blocks (largest entry of each block).

    ``sum_first``: entries may repeat a (src, dst) pair (node level) and are summed before pooling.
    """
    if src.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    src = src.astype(np.int64)
    dst = dst.astype(np.int64)
    nbytes = nbytes.astype(np.int64)
    if sum_first:
        key = src * side + dst
        uniq, inverse = np.unique(key, return_inverse=True)
        summed = np.zeros(uniq.size, dtype=np.int64)
        np.add.at(summed, inverse.reshape(-1), nbytes)
        src, dst, nbytes = uniq // side, uniq % side, summed
    cells = -(-side // block)
    key = (src // block) * cells + dst // block
    order = np.lexsort((nbytes, key))  # by cell, largest entry last
    key, nbytes = key[order], nbytes[order]
    last = np.flatnonzero(np.concatenate([key[1:] != key[:-1], [True]]))
    return key[last] // cells, key[last] % cells, nbytes[last]


def heatmap_section(tm, *, level: str = "auto", max_cells: int = HTML_MAX_CELLS) -> dict[str, Any]:
    """Per-axis sparse cells of the traffic matrix ``[src, dst]``, ready to draw.

    ``level`` is ``auto`` (GPUs up to 1,024, nodes above), ``gpu`` or ``node``. A side longer than
    ``max_cells`` is pooled into blocks, each drawn cell holding the largest entry of its block. ``all`` is
    the sum over axes of each pair (then pooled the same way), for the default view with every axis on.
    """
    if level not in ("auto", "gpu", "node"):
        raise ConfigError("level", level, "valid: auto, gpu, node")
    if level == "auto":
        level = "gpu" if tm.world_size <= AUTO_GPU_LEVEL_MAX else "node"
    g = tm.gpus_per_node
    side = tm.world_size if level == "gpu" else tm.num_nodes
    block = max(1, math.ceil(side / max_cells))
    cells = -(-side // block)
    by_axis = tm.bytes_by_axis()

    def layer(axis: str | None) -> dict[str, Any]:
        s, d, b = tm.pairs(axis)
        if level == "node":
            s, d = s // g, d // g
        r, c, v = _pooled_cells(s, d, b, side, block, sum_first=level == "node")
        out: dict[str, Any] = {"r": r.tolist(), "c": c.tolist(), "b": v.tolist(), "num_cells": int(r.size)}
        if axis is not None:
            out.update(axis=axis, label=AXIS_STYLE[axis][0], color=AXIS_STYLE[axis][1], total_bytes=by_axis[axis])
        return out

    present = [a for a in (*REPORT_AXES, "other") if by_axis.get(a)]
    layers = [layer(a) for a in present]
    everything = layer(None)
    values = [v for lay in layers for v in lay["b"]] + everything["b"]
    unit = "GPU" if level == "gpu" else "node"
    notes = [f"{tm.world_size:,} GPUs on {tm.num_nodes:,} node{'s' if tm.num_nodes != 1 else ''} of {g} GPUs"]
    if level == "node":
        notes.append("node level: bytes node src sends to node dst; the diagonal is intra-node traffic")
    if block > 1:
        notes.append(f"each cell is the largest entry of a {block}\u00d7{block} block of {unit}s")
    return {
        "level": level, "unit": unit, "side": side, "block": block, "cells": cells, "gpus_per_node": g,
        "num_nodes": tm.num_nodes, "world_size": tm.world_size, "algorithm": tm.algorithm, "view": tm.view,
        "total_bytes": tm.total_bytes, "min_bytes": min(values) if values else 0, "max_bytes": max(values) if values else 0,
        "layers": layers, "all": everything, "notes": notes,
    }


def bytes_section(tm, logical_bytes_by_axis: dict[str, int] | None = None) -> dict[str, Any]:
    """Bytes each axis puts on links per iteration, split by link class, with its share of all traffic."""
    total = tm.total_bytes
    by_axis = tm.bytes_by_axis()
    links = tm.bytes_by_axis_and_link()
    rows = []
    for axis in (*REPORT_AXES, "other"):
        b = by_axis.get(axis, 0)
        if not b and axis == "other":
            continue
        lk = links.get(axis, {"intra_node": 0, "inter_node": 0})
        rows.append({"axis": axis, "label": AXIS_STYLE[axis][0], "color": AXIS_STYLE[axis][1], "bytes": b,
                     "intra_node_bytes": lk["intra_node"], "inter_node_bytes": lk["inter_node"],
                     "share": b / total if total else 0.0, "inter_node_share": lk["inter_node"] / b if b else 0.0,
                     "logical_bytes": (logical_bytes_by_axis or {}).get(axis)})
    link = tm.bytes_by_link()
    return {"rows": rows, "total_bytes": total, "intra_node_bytes": link["intra_node"], "inter_node_bytes": link["inter_node"],
            "inter_node_share": link["inter_node"] / total if total else 0.0}


def per_iteration(total: int, num_iterations: int) -> int | float:
    """A count summed over iterations, per iteration: an exact integer when it divides, else the mean."""
    return total // num_iterations if total % num_iterations == 0 else total / num_iterations


def size_histogram(size_bytes: np.ndarray, counts: np.ndarray, axes: Sequence[str], *,
                   num_iterations: int = 1) -> dict[str, Any]:
    """Histogram of message sizes in power-of-two bins [2^k, 2^(k+1)), per axis: ops and bytes per iteration.

    ``size_bytes``, ``counts`` (ops of that size) and ``axes`` are parallel; sums are divided by
    ``num_iterations`` (exact integers when they divide); ops of 0 bytes are counted apart.
    """
    size_bytes = np.asarray(size_bytes, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    axes_arr = np.asarray(list(axes), dtype=object)

    def per_it(total: int) -> int | float:
        return per_iteration(total, num_iterations)

    zero = per_it(int(counts[size_bytes <= 0].sum()))
    keep = size_bytes > 0
    size_bytes, counts, axes_arr = size_bytes[keep], counts[keep], axes_arr[keep]
    if size_bytes.size == 0:
        return {"edges_bytes": [], "series": [], "total_ops": 0, "zero_size_ops": zero, "num_iterations": num_iterations}
    exp = np.floor(np.log2(size_bytes)).astype(np.int64)
    # exact integer bin for sizes near a power of two (floating log2 may round across the edge)
    exp = np.where((np.int64(1) << exp) > size_bytes, exp - 1, exp)
    exp = np.where((np.int64(1) << (exp + 1)) <= size_bytes, exp + 1, exp)
    lo, hi = int(exp.min()), int(exp.max())
    edges = [1 << k for k in range(lo, hi + 2)]
    series = []
    for axis in (*REPORT_AXES, "other"):
        sel = axes_arr == axis
        if not sel.any():
            continue
        c = np.zeros(hi - lo + 1, dtype=np.int64)
        b = np.zeros(hi - lo + 1, dtype=np.int64)
        np.add.at(c, exp[sel] - lo, counts[sel])
        np.add.at(b, exp[sel] - lo, counts[sel] * size_bytes[sel])
        series.append({"axis": axis, "label": AXIS_STYLE[axis][0], "color": AXIS_STYLE[axis][1],
                       "counts": [per_it(int(x)) for x in c], "bytes": [per_it(int(x)) for x in b]})
    return {"edges_bytes": edges, "series": series, "total_ops": per_it(int(counts.sum())), "zero_size_ops": zero,
            "num_iterations": num_iterations}


def message_size_section(workload=None, measured: MeasuredLogs | None = None) -> dict[str, Any]:
    """Message-size distributions of the predicted ops (a collective once per group, p2p on the send side)
    and, when given, of the measured ones counted alike (:func:`logical_measured_ops`)."""
    out: dict[str, Any] = {}
    if workload is not None:
        sets = [s for s in workload.opsets if s.op != "recv"]
        out["predicted"] = size_histogram(np.array([s.size_bytes for s in sets], dtype=np.int64),
                                          np.array([s.num_ops for s in sets], dtype=np.int64), [s.axis for s in sets])
    if measured is not None:
        ops = logical_measured_ops(measured.ops)
        out["measured"] = size_histogram(np.array([op.size_bytes for op in ops], dtype=np.int64),
                                         np.array([op.count for op in ops], dtype=np.int64), [op.axis for op in ops],
                                         num_iterations=measured.num_iterations)
    return out


def _terms(estimate) -> list[dict[str, Any]]:
    total = estimate.iteration_time_s
    hidden = getattr(estimate, "hidden_s", None) or {}
    return [{"key": key, "label": label, "color": color, "seconds": getattr(estimate, attr),
             "share": getattr(estimate, attr) / total if total else 0.0,
             "hidden_seconds": float(hidden.get(key, 0.0))} for key, label, attr, color in TERMS]


def _config_label(p) -> str:
    parts = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"] + [f"{k}{getattr(p, k)}" for k in ("cp", "ep") if getattr(p, k) > 1]
    extra = [f"mb{p.micro_batch_size}"]
    if p.virtual_pipeline_size > 1:
        extra.append(f"v{p.virtual_pipeline_size}")
    if p.sequence_parallel:
        extra.append("sp")
    if p.recompute != "none":
        extra.append(f"rc:{p.recompute}")
    if p.distributed_optimizer:
        extra.append("distopt")
    elif p.zero_stage:
        extra.append(f"zero{p.zero_stage}")
    return " ".join(parts) + " \u00b7 " + " ".join(extra)


def breakdown_section(estimate, *, parallel=None, plan=None) -> dict[str, Any]:
    """The iteration-time terms of ``estimate`` (seconds and shares), and of ``plan``'s entries if given."""
    out: dict[str, Any] = {
        "method": estimate.method, "iteration_time_s": estimate.iteration_time_s, "terms": _terms(estimate),
        "comm_ratio": estimate.comm_ratio, "bubble_ratio": estimate.bubble_ratio, "tokens_per_s": estimate.tokens_per_s,
        "tflops_per_gpu": estimate.tflops_per_gpu, "mfu": estimate.mfu, "gpu_util": estimate.gpu_util,
        "critical_stage": estimate.critical_stage,
        "label": _config_label(parallel) if parallel is not None else "this job",
    }
    if plan is not None:
        out["plan"] = {
            "num_gpus": plan.num_gpus, "global_batch_size": plan.global_batch_size,
            "num_candidates": plan.num_candidates, "num_valid": plan.num_valid, "num_fit": plan.num_fit,
            "notes": list(plan.notes),
            "entries": [{"rank": i + 1, "label": _config_label(e.parallel), "iteration_time_s": e.estimate.iteration_time_s,
                         "terms": _terms(e.estimate), "reason": e.reason, "memory_GiB": e.memory_bytes / 2**30,
                         "mfu": e.estimate.mfu, "tflops_per_gpu": e.estimate.tflops_per_gpu}
                        for i, e in enumerate(plan.entries)],
        }
    return out


def schedule_section(parallel, estimate, *, names: Sequence[str] | None = None) -> dict[str, Any]:
    """Timed pipeline schedules of one iteration (stage times from ``estimate``, see
    :func:`commscope.estimate.schedule.schedule_for`), followed by the estimate's DP and embedding reduction.

    ``names`` defaults to the configured schedule, plus plain 1F1B beside an interleaved one and an
    interleaved v=2 what-if beside 1F1B when the micro-batches allow it.
    """
    from commscope.estimate.schedule import (
        FORWARD_SHARE,
        micro_batch_time_s,
        pipeline_schedule,
        schedule_for,
        stage_micro_batch_times_s,
    )

    p, m, v = parallel.pp, parallel.num_micro_batches, parallel.virtual_pipeline_size
    configured = "interleaved" if v > 1 else parallel.schedule
    if names is None:
        names = [configured]
        if configured == "interleaved":
            names.append("1f1b")
        elif p > 1 and m % p == 0:
            names.append("interleaved-what-if")
    schedules, notes = [], []
    for name in names:
        if name == "interleaved-what-if":
            share = FORWARD_SHARE[parallel.recompute]
            t_chunk = stage_micro_batch_times_s(estimate, parallel) / 2
            sched = pipeline_schedule("interleaved", pp=p, num_micro_batches=m, virtual_pipeline_size=2,
                                      fwd_s=share * t_chunk, bwd_s=(1 - share) * t_chunk)
            label = "interleaved v=2 (what-if, same micro-batch times)"
        else:
            sched = schedule_for(parallel, estimate, name)
            label = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": f"interleaved 1F1B (v={v})"}[name]
            if name != configured:
                label += " (for comparison)"
        if len(sched.slots) > MAX_SCHEDULE_SLOTS:
            notes.append(f"{label}: {len(sched.slots):,} slots, more than the page keeps ({MAX_SCHEDULE_SLOTS:,}); not drawn")
            continue
        d = sched.to_dict()
        d.update(label=label, configured=name == configured)
        schedules.append(d)
    end = getattr(estimate, "tail_s", estimate.dp_s + estimate.emb_s)
    optimizer = getattr(estimate, "optimizer_s", 0.0)
    tail = [{"key": "dp", "label": "DP gradient reduction and parameter all-gather (exposed)",
             "seconds": max(0.0, end - estimate.emb_s - optimizer), "color": AXIS_STYLE["dp"][1]},
            {"key": "emb", "label": "embedding sync", "seconds": estimate.emb_s, "color": AXIS_STYLE["emb"][1]},
            {"key": "optimizer", "label": "optimizer step", "seconds": optimizer, "color": "#b4a7d6"}]
    notes.append("every stage takes its own time per micro-batch from the estimate (the slowest is stage "
                 f"{estimate.critical_stage}); forward : backward = 1 : {'3' if parallel.recompute == 'full' else '2'}")
    if estimate.method == "seed" and v > 1:
        notes.append("the seed method ignores interleaving in its bubble term; the timeline does not")
    return {"pp": p, "num_micro_batches": m, "virtual_pipeline_size": v, "micro_batch_time_s": micro_batch_time_s(estimate, parallel),
            "schedules": schedules, "tail": [t for t in tail if t["seconds"] > 0],
            "iteration_time_s": estimate.iteration_time_s, "notes": notes}


def predicted_bytes_by_axis(workload) -> dict[str, dict[str, int]]:
    """Bytes (sum of message sizes) and ops per axis of one predicted iteration, counted as measured logs
    record them (:func:`commscope.measure.capture.analysis.predicted_ops_by_kind`). Worked example: a TP all_reduce of
    13,107,200 bytes over 2 ranks is one op of 13,107,200 bytes; a balanced all_to_all of 4 x 1 MB over 4
    ranks is 4 ops of 4 MB.
    """
    from commscope.measure.capture.analysis import predicted_ops_by_kind

    out = {a: {"bytes": 0, "ops": 0} for a in AXES}
    for (axis, _op), (count, nbytes) in predicted_ops_by_kind(workload).items():
        out[axis]["bytes"] += nbytes
        out[axis]["ops"] += count
    return out


def logical_measured_ops(ops: Iterable[CommOp]) -> list[CommOp]:
    """Measured records counted the way :func:`predicted_bytes_by_axis` counts, setup records left out
    (:func:`commscope.measure.capture.analysis.is_logical`)."""
    from commscope.measure.capture.analysis import is_logical

    return [op for op in ops if op.phase != "setup" and is_logical(op)]


def with_axes(measured: MeasuredLogs, prediction) -> MeasuredLogs:
    """The logs with every record whose axis is ``other`` given the axis of the prediction's process group
    it ran on (the capture module's attribution: recorders do not know the parallelism)."""
    ops = list(measured.ops)
    unknown = [i for i, op in enumerate(ops) if op.axis == "other"]
    if not unknown or prediction is None:
        return measured
    try:
        from commscope.measure.capture.analysis import attribute_axes
    except ImportError:  # pragma: no cover - the capture module is part of the package
        return measured
    fixed = attribute_axes([ops[i] for i in unknown], prediction.workload.layout)
    for i, op in zip(unknown, fixed):
        ops[i] = op
    return replace(measured, ops=tuple(ops),
                   num_attributed=measured.num_attributed + sum(op.axis != "other" for op in fixed))


def measured_bytes_by_axis(ops: Iterable[CommOp]) -> dict[str, dict[str, int]]:
    """Bytes (``size_bytes x count``) and ops per axis of measured records, counted by :func:`logical_measured_ops`
    and, as ``summarize`` counts them, an all_to_all row of a whole group (nccl-tests) once per sending rank
    (:func:`commscope.io.runs.senders`)."""
    from commscope.io.runs import senders

    out = {a: {"bytes": 0, "ops": 0} for a in AXES}
    for op in logical_measured_ops(ops):
        n = op.count * senders(op, op.rank)
        out[op.axis]["bytes"] += op.size_bytes * n
        out[op.axis]["ops"] += n
    return out


def compare_measured(measured: MeasuredLogs, prediction=None) -> dict[str, Any]:
    """Measured vs predicted bytes and ops per axis for one iteration: the measured sums divided by the
    iterations the logs cover, beside :func:`predicted_bytes_by_axis` of the prediction, and their ratio.
    Records without an axis (``other``) take the axis of the prediction's group they ran on."""
    measured = with_axes(measured, prediction)
    meas = measured_bytes_by_axis(measured.ops)
    pred = predicted_bytes_by_axis(prediction.workload) if prediction is not None else None
    n = measured.num_iterations
    rows: list[dict[str, Any]] = []
    for axis in (*REPORT_AXES, "other"):
        mb, mo = per_iteration(meas[axis]["bytes"], n), per_iteration(meas[axis]["ops"], n)
        pb = pred[axis]["bytes"] if pred else None
        po = pred[axis]["ops"] if pred else None
        if not mb and not pb:
            continue
        rows.append({"axis": axis, "label": AXIS_STYLE[axis][0], "color": AXIS_STYLE[axis][1],
                     "measured_bytes": mb, "predicted_bytes": pb, "measured_ops": mo, "predicted_ops": po,
                     "ratio": (mb / pb) if pb else None})
    ranks = sorted({op.rank for op in measured.ops if op.rank is not None})
    setup = sum(1 for op in measured.ops if op.phase == "setup")
    notes = [f"{len(measured.files)} log file(s), {len(measured.ops):,} records"
             + (f" from {len(ranks)} rank(s)" if ranks else "")
             + f"; {n} iteration(s)" + (f" (steps {measured.steps[0]}–{measured.steps[-1]})" if measured.steps else "")
             + f": measured sums are divided by {n}",
             ("counted once per collective (its group's lowest rank), per issuing rank for all_to_all, at the send "
             "for point-to-point; recv and setup records left out")]
    if setup:
        notes.append(f"{setup:,} setup records (before the first step) left out")
    if measured.num_attributed:
        notes.append(f"{measured.num_attributed:,} records without an axis took the axis of the prediction's group they ran on")
    if prediction is not None and ranks and len(ranks) != prediction.traffic.world_size:
        notes.append(f"the logs cover {len(ranks)} ranks, the prediction {prediction.traffic.world_size}")
    if measured.formats and measured.formats != ("jsonl",):
        notes.append(f"read from {', '.join(measured.formats)} records; not in them: "
                     f"{', '.join(measured.missing_fields) or 'nothing'}")
    notes += list(measured.notes)
    if measured.matrix_omitted:
        notes.append(f"measured traffic matrix omitted: {measured.matrix_omitted}")
    notes += list(measured.problems[:10])
    if len(measured.problems) > 10:
        notes.append(f"... and {len(measured.problems) - 10} more problems")
    total_m = sum(r["measured_bytes"] for r in rows)
    total_p = sum(r["predicted_bytes"] or 0 for r in rows) if pred else None
    return {"rows": rows, "num_iterations": n, "num_ranks": len(ranks), "files": list(measured.files),
            "measured_total_bytes": total_m, "predicted_total_bytes": total_p,
            "ratio": (total_m / total_p) if total_p else None, "notes": notes}


def measured_heatmap_section(measured: MeasuredLogs, prediction=None, *, level: str = "auto") -> dict[str, Any] | None:
    """The measured traffic matrix (logical view, ring algorithm), drawn like the predicted one; None when
    the capture module that decomposes measured ops is unavailable or the logs hold no flows."""
    try:
        from commscope.measure.capture.analysis import measured_traffic
    except ImportError:  # pragma: no cover
        return None
    if measured.matrix_omitted:
        return None
    ops = [op for op in logical_measured_ops(with_axes(measured, prediction).ops) if op.group]
    if not ops:
        return None
    world = prediction.traffic.world_size if prediction is not None else \
        max(max(op.group) for op in ops) + 1
    gpn = prediction.cluster.gpus_per_node if prediction is not None else 8
    tm = measured_traffic(ops, world, gpn, view="logical",
                          algorithm=prediction.traffic.algorithm if prediction is not None else "ring")
    if tm.total_bytes == 0:
        return None
    section = heatmap_section(tm, level=level)
    n = measured.num_iterations
    if n > 1:  # per iteration, as the predicted heatmap
        for layer in (*section["layers"], section["all"]):
            layer["b"] = [b / n for b in layer["b"]]
            if "total_bytes" in layer:
                layer["total_bytes"] /= n
        for key in ("total_bytes", "min_bytes", "max_bytes"):
            section[key] /= n
    section["notes"].append(f"bytes per iteration: the {n} measured iteration(s) summed and divided by {n}")
    return section


def _short(value: Any, limit: int = 12) -> Any:
    """A meta value for display: long lists cut to their first items and a count."""
    if isinstance(value, list) and len(value) > limit:
        return [*value[:limit], f"… {len(value):,} items in all"]
    if isinstance(value, dict):
        return {k: _short(v, limit) for k, v in value.items()}
    return value


def bench_section(bench: BenchResult, cluster=None) -> dict[str, Any]:
    """Bus bandwidth against message size per (op, group size, intra/inter-node), with the cluster's
    alpha-beta model at the same points (a group inside one node when ``intra_node`` is true or unknown and
    it fits, else spread over as few nodes as hold it, at least two)."""
    from commscope.estimate.bandwidth import AlphaBeta, GroupSpan, busbw_factor

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in bench.rows:
        groups.setdefault((row["op"], row["group_size"], row.get("intra_node")), []).append(row)
    model = AlphaBeta(cluster) if cluster is not None else None
    series = []
    order = {True: 0, None: 1, False: 2}
    for (op, n, intra), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 1))):
        rows = sorted(rows, key=lambda r: r["size_bytes"])
        where = {True: " intra-node", False: " inter-node"}.get(intra, "")
        s: dict[str, Any] = {"op": op, "group_size": n, "intra_node": intra, "label": f"{op} \u00d7{n}{where}",
                             "size_bytes": [r["size_bytes"] for r in rows],
                             "busbw_bytes_per_s": [r["busbw_bytes_per_s"] for r in rows],
                             "time_s": [r.get("time_s") for r in rows],
                             "noisy": [bool(r.get("noisy", False)) for r in rows]}
        if model is not None and n >= 2:
            g = cluster.gpus_per_node
            nodes = max(2, -(-n // g)) if intra is False else -(-n // g)
            span = GroupSpan(n=n, num_nodes=min(nodes, n), per_node=max(1, n // min(nodes, n)))
            try:
                f = busbw_factor(op, n)
            except ValueError:  # an op the model does not know: no model curve
                f = None
            if f is not None:
                times = [model.op_time_s(op, float(sz), span) for sz in s["size_bytes"]]
                s["model_busbw_bytes_per_s"] = [sz * f / t if t > 0 else None for sz, t in zip(s["size_bytes"], times)]
        series.append(s)
    notes = []
    if model is not None:
        notes.append(f"dashed: the {cluster.name} preset's alpha-beta model for the same op, ranks and sizes")
    ran_as = sorted({f"{r['op']} ran as {r['backend_op']}" for r in bench.rows
                     if r.get("backend_op") and r["backend_op"] != r["op"]})
    if ran_as:
        notes.append("the backend executed " + "; ".join(ran_as) + " (busbw still uses the logical op's factor)")
    if any(any(x["noisy"]) for x in series):
        notes.append("hollow points: noisy rows (their times vary a lot between iterations)")
    return {"source": bench.source, "meta": _short(bench.meta), "series": series, "notes": notes}


def time_section(time_result: dict[str, Any]) -> dict[str, Any]:
    """Measured against predicted in time, from :func:`commscope.cli.compare_cmd.time_comparison` (a
    :func:`commscope.measure.capture.timing.compare_time` result): durations against message size per (axis, op, group
    size) with the model's curve, effective-bandwidth factors per op kind, exposed communication per step and
    axis, and the predicted step against the measured one, term by term."""
    series: dict[tuple, dict[str, Any]] = {}
    for r in time_result["durations"]["by_bin"]:
        key = (r["axis"], r["op"], r["group_size"])
        se = series.setdefault(key, {"label": f"{r['axis']}/{r['op']} n={r['group_size']}", "axis": r["axis"],
                                     "size_bytes": [], "measured_median_s": [], "measured_p95_s": [],
                                     "predicted_median_s": [], "count": [], "factor": []})
        for k, v in (("size_bytes", r["median_size_bytes"]), ("measured_median_s", r["measured_median_s"]),
                     ("measured_p95_s", r["measured_p95_s"]), ("predicted_median_s", r["predicted_median_s"]),
                     ("count", r["count"]), ("factor", r["factor"])):
            se[k].append(v)
    for curve in time_result.get("model_curves", []):  # the model over the sizes around the bins, dashed
        key = (curve["axis"], curve["op"], curve["group_size"])
        if key in series:
            series[key]["model_size_bytes"], series[key]["model_s"] = curve["size_bytes"], curve["predicted_s"]
    return {"series": list(series.values()), "factors": time_result["durations"]["by_op"],
            "steps": time_result["steps"], "step": time_result["step"], "terms": time_result["terms"],
            "bandwidth": time_result.get("bandwidth"),
            "notes": list(time_result["notes"]) + list(time_result.get("bandwidth_notes", []))}


def moe_metrics(routing: np.ndarray) -> dict[str, list[float]]:
    """Per-iteration metrics of (iterations, ep, ep) token counts:

    - ``load_imbalance``: max over EP ranks of tokens received / mean (1 = balanced);
    - ``cross_rank_fraction``: tokens sent to another EP rank / all tokens;
    - ``entropy``: entropy of the (src, dst) distribution over log(ep^2) (1 = uniform, 0 = one pair).
    """
    r = np.asarray(routing, dtype=np.float64)
    ep = r.shape[1]
    total = r.sum(axis=(1, 2))
    received = r.sum(axis=1)  # (it, ep)
    mean = received.mean(axis=1)
    imbalance = np.divide(received.max(axis=1), mean, out=np.ones_like(mean), where=mean > 0)
    diag = np.trace(r, axis1=1, axis2=2)
    cross = np.divide(total - diag, total, out=np.zeros_like(total), where=total > 0)
    prob = np.divide(r, total[:, None, None], out=np.zeros_like(r), where=total[:, None, None] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(prob > 0, prob * np.log(prob), 0.0).sum(axis=(1, 2))
    norm = math.log(ep * ep) if ep > 1 else 1.0
    return {"load_imbalance": imbalance.tolist(), "cross_rank_fraction": cross.tolist(), "entropy": (ent / norm).tolist()}


def moe_section(routings: Sequence[MoeRouting], *, max_frames: int = MAX_MOE_FRAMES) -> dict[str, Any]:
    """MoE routing over iterations: up to ``max_frames`` evenly sampled (ep, ep) matrices per file and the
    metrics of :func:`moe_metrics` for every iteration."""
    items = []
    for item in routings:
        r = item.routing
        its = r.shape[0]
        frames = np.unique(np.linspace(0, its - 1, min(its, max_frames)).round().astype(np.int64))
        sampled = r[frames]
        items.append({"name": item.name, "source": item.source, "num_iterations": its, "ep": int(r.shape[1]),
                      "frames": frames.tolist(),
                      "matrices": [[[float(x) if not float(x).is_integer() else int(x) for x in row] for row in mat]
                                   for mat in sampled],
                      "max_tokens": float(sampled.max()) if sampled.size else 0.0,
                      **_moe_dynamics(item.trace, moe_metrics(r))})
    notes = ["routing[i, j]: tokens EP rank i (row) sends to EP rank j (column)"]
    for it in items:
        if "phases" in it:
            notes.append(_phases_note(it["name"], it["summary"], it["phases"]))
    if any(item.trace is not None for item in routings):
        notes += list(MOE_DYNAMICS_NOTES)
    return {"items": items, "notes": notes}


#: The seed talk's MoE quantities drawn over iterations for a trace with expert counts: (metric, label, colour).
MOE_DYNAMICS_SERIES = (("expert_entropy", "expert entropy (1 = uniform)", "#59a14f"),
                       ("expert_imbalance", "expert max / mean", "#e15759"),
                       ("balance_error", "slowest rank vs balanced", "#76b7b2"),
                       ("prediction_error_last", "error predicting k from k-1", "#4e79a7"),
                       ("pairs_switching", "pairs switching on/off", "#edc948"))
MOE_DYNAMICS_NOTES = (
    ("expert entropy: of the load over experts per layer / log E, 1 = uniform (the talk: low entropy); its "
     "least-squares slope is the trend towards uniformity"),
    ("pairs switching on/off: share of rank pairs above or below their own mean that flip from one iteration to "
     "the next (~0.5 independent noise, ~0 steady: the talk's on-off regularity)"),
    ("error predicting k from k-1: relative L1 error of each layer's rank-to-rank matrix predicted by the previous "
     "iteration's (0 = perfectly predictable)"),
    ("slowest rank vs balanced: the busiest rank's all-to-all bytes over what balanced routing (every peer tool's "
     "assumption) gives it"),
)


def _moe_dynamics(trace, metrics: dict[str, list[float]]) -> dict[str, Any]:
    """``metrics``, and for a routing trace the talk's quantities per iteration (added to ``metrics`` and drawn as
    ``series``), their means per window of training (``phases``) and the run's ``summary``."""
    if trace is None:
        return {"metrics": metrics}
    from commscope.moe.metrics import routing_metrics

    dyn = routing_metrics(trace)
    summary = dyn.summary()
    return {"metrics": {**metrics, **{key: getattr(dyn, key) for key, _, _ in MOE_DYNAMICS_SERIES}},
            "series": [{"key": key, "label": label, "color": color} for key, label, color in MOE_DYNAMICS_SERIES],
            "phases": summary.pop("phases"),
            "summary": {k: summary[k] for k in ("expert_entropy_first", "expert_entropy_last",
                                                "uniformity_trend_per_iteration", "on_off_switch_rate",
                                                "pair_autocorrelation", "prediction_error_last_mean",
                                                "balance_error_mean", "balance_error_max")}}


def _phases_note(name: str, summary: dict[str, Any], phases: list[dict[str, Any]]) -> str:
    """One line: the run's dynamics per window of training, as `commscope moe analyze` prints them."""
    def num(v: Any, fmt: str = ".2f") -> str:
        return "\u2013" if v is None else format(v, fmt)

    windows = "; ".join(f"it {p['first_iteration']}-{p['last_iteration']}: entropy {num(p['expert_entropy'])}, "
                        f"switching {num(p['pairs_switching'])}, error from k-1 {num(p['prediction_error_last'])}, "
                        f"slowest rank {num(p['balance_error'])}x balanced" for p in phases)
    trend = (summary["uniformity_trend_per_iteration"] or 0.0) * 100
    return (f"{name} over training \u2014 {windows}. Expert entropy {num(summary['expert_entropy_first'], '.3f')} "
            f"\u2192 {num(summary['expert_entropy_last'], '.3f')}, trend {trend:+.3f} per 100 iterations; on-off "
            f"switching {num(summary['on_off_switch_rate'])}, lag-1 autocorrelation "
            f"{num(summary['pair_autocorrelation'])}")


def _summary(prediction, estimate) -> list[dict[str, Any]]:
    out = []
    if prediction is not None:
        tm = prediction.traffic
        link = tm.bytes_by_link()
        out += [
            {"label": "GPUs", "value": tm.world_size, "kind": "count",
             "detail": f"{tm.num_nodes:,} node{'s' if tm.num_nodes != 1 else ''} \u00d7 {tm.gpus_per_node}"},
            {"label": "bytes sent per iteration", "value": tm.total_bytes, "kind": "bytes",
             "detail": f"{link['inter_node'] / tm.total_bytes:.1%} inter-node" if tm.total_bytes else ""},
            # counted as the message-size chart counts them (a transfer once, at its send), so that the page has one
            # number of ops; the op list's records count each receive too
            {"label": "ops per iteration", "value": sum(s.num_ops for s in prediction.workload.opsets if s.op != "recv"),
             "kind": "count", "detail": f"{prediction.num_ops:,} records with the receives; {tm.num_pairs:,} GPU pairs talk"},
        ]
    if estimate is not None:
        out += [
            {"label": "iteration time", "value": estimate.iteration_time_s, "kind": "seconds", "detail": f"{estimate.method} estimate"},
            {"label": "communication", "value": estimate.comm_ratio, "kind": "ratio", "detail": "of the iteration"},
            {"label": "pipeline bubble", "value": estimate.bubble_ratio, "kind": "ratio", "detail": "of the iteration"},
            {"label": "MFU", "value": estimate.mfu, "kind": "ratio", "detail": f"{estimate.tflops_per_gpu:.0f} TFLOP/s per GPU"},
        ]
    return out


def _inputs(prediction, estimate, *, command_line: str | None, files: dict[str, Any] | None) -> dict[str, Any]:
    from commscope import __version__

    out: dict[str, Any] = {"commscope_version": __version__, "command_line": command_line, "files": files or {}}
    if prediction is not None:
        from commscope.spec.files import cluster_to_mapping, model_to_mapping, parallel_to_mapping

        out.update(model=model_to_mapping(prediction.model), parallel=parallel_to_mapping(prediction.parallel),
                   cluster=cluster_to_mapping(prediction.cluster), algorithm=prediction.traffic.algorithm)
    if estimate is not None:
        if estimate.compute_model == "gpu":  # a result, not an input: said as one (the cluster's gpu_util is the input)
            out["estimate_method"] = (f"{estimate.method}: the GPU's compute model, {estimate.gpu_util:.1%} of "
                                      f"{estimate.peak_flops / 1e12:.0f} TFLOP/s peak while computing")
        else:
            out.update(estimate_method=estimate.method, gpu_util=estimate.gpu_util)
    if prediction is not None:
        timed = _timed_attention(prediction)
        if timed is not None:
            out["attention_timed"] = timed
    return out


def _timed_attention(prediction) -> str | None:
    """How the estimate times attention where it is not as the job asked (flash on a GPU without fused kernels)."""
    from commscope.estimate.compute.model import timed_attention
    from commscope.estimate.gpus import gpu_for_cluster

    try:
        gpu = gpu_for_cluster(prediction.cluster)
    except ConfigError:  # no GPU preset: the estimate says how it copes
        return None
    asked = prediction.parallel.attention
    timed, notes = timed_attention(prediction.model, prediction.parallel, gpu)
    return None if timed.attention == asked else f"{timed.attention}: {notes[0].split(':')[0]}"


def build_report_data(*, prediction=None, estimate=None, plan=None, measured: MeasuredLogs | None = None,
                      bench: BenchResult | None = None, moe: Sequence[MoeRouting] | None = None,
                      command_line: str | None = None, files: dict[str, Any] | None = None,
                      title: str | None = None, heatmap_level: str = "auto",
                      time_comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the report shows, as one JSON-ready dict (sections absent when their input is).

    ``estimate`` without ``prediction`` is allowed only for the breakdown; the schedule needs both.
    ``command_line`` and ``files`` are recorded so that the report can be reproduced. ``time_comparison`` (measured
    logs against the bandwidth model and estimate, :func:`commscope.cli.compare_cmd.time_comparison`) adds the
    time section.
    """
    t0 = time.perf_counter()
    if prediction is None and estimate is None and measured is None and bench is None and not moe:
        raise ConfigError("report", "nothing", "needs a prediction, an estimate, measured logs, a benchmark or MoE routing")
    sections: dict[str, Any] = {}
    notes: list[str] = []
    if prediction is not None:
        tm = prediction.traffic
        sections["heatmap"] = heatmap_section(tm, level=heatmap_level)
        sections["bytes"] = bytes_section(tm, prediction.workload.logical_bytes_by_axis())
        notes += list(prediction.workload.notes)
    if measured is not None:
        measured = with_axes(measured, prediction)
    if prediction is not None or measured is not None:
        sections["message_sizes"] = message_size_section(prediction.workload if prediction is not None else None, measured)
    if estimate is not None:
        par = prediction.parallel if prediction is not None else None
        sections["breakdown"] = breakdown_section(estimate, parallel=par, plan=plan)
        if par is not None:
            sections["schedule"] = schedule_section(par, estimate)
        notes += list(estimate.notes)
    elif plan is not None:
        raise ConfigError("plan", "given", "needs the estimate of the job it is compared with")
    if measured is not None:
        sections["measured"] = compare_measured(measured, prediction)
        measured_map = measured_heatmap_section(measured, prediction, level=heatmap_level)
        if measured_map is not None:
            sections["measured_heatmap"] = measured_map
    if time_comparison is not None:
        sections["time"] = time_section(time_comparison)
    if bench is not None:
        sections["bench"] = bench_section(bench, prediction.cluster if prediction is not None else None)
    if moe:
        sections["moe"] = moe_section(moe)
    if title is None:
        if prediction is not None:
            p = prediction.parallel
            title = f"{prediction.model.name} on {prediction.cluster.name}: {_config_label(p)}, {p.world_size:,} GPUs"
        else:
            title = "commscope report"
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "title": title,
        "axes": _axis_list((*REPORT_AXES, "other")),
        "summary": _summary(prediction, estimate),
        "inputs": _inputs(prediction, estimate, command_line=command_line, files=files),
        "notes": list(dict.fromkeys(notes)),
        "build_s": time.perf_counter() - t0,
        **sections,
    }


# ----------------------------------------------------------------------------------------------- rendering


def _jsonable(value: Any) -> Any:
    """Python/numpy values -> JSON values; floats to 7 significant digits, non-finite to null."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        x = float(value)
        if not math.isfinite(x):
            return None
        return x if x == 0 or x.is_integer() and abs(x) < 2**53 else float(f"{x:.7g}")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"report data: {type(value).__name__} is not JSON-serialisable")


def data_to_json(data: dict[str, Any]) -> str:
    """The embedded JSON: compact, and safe inside a ``<script>`` element (``<``, ``>``, ``&`` escaped)."""
    text = json.dumps(_jsonable(data), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


# The page only draws: every number it shows is in the embedded data. Its skeleton, style and script are files
# of their own, shipped as package data (commscope/report/assets/: page.html, report.css, report.js) and inlined
# here, so that the report stays one self-contained file that makes no request. Errors (window.onerror,
# console.error, a section that fails to draw) are listed in #errors and counted in <body data-errors>, which
# the browser test reads.
ASSETS = ("page.html", "report.css", "report.js")


@functools.cache
def page_asset(name: str) -> str:
    """The text of one of the page's files (:data:`ASSETS`)."""
    if name not in ASSETS:
        raise ValueError(f"no report asset {name!r}; the assets are {', '.join(ASSETS)}")
    return resources.files("commscope.report").joinpath("assets", name).read_text(encoding="utf-8")


def render_html(data: dict[str, Any]) -> str:
    """The report as one self-contained HTML document (inline style and script, data embedded as JSON)."""
    parts = {"TITLE": _html.escape(str(data.get("title", "commscope report"))), "CSS": page_asset("report.css"),
             "DATA": data_to_json(data), "JS": page_asset("report.js")}
    return re.sub(r"%(TITLE|CSS|DATA|JS)%", lambda mo: parts[mo.group(1)], page_asset("page.html"))


def write_html(data: dict[str, Any], path: str | Path) -> Path:
    """Render ``data`` and write it to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from commscope.io.atomic import write_text

    write_text(path, render_html(data))
    return path


__all__ = [
    "AXIS_STYLE",
    "TERMS",
    "BenchResult",
    "MeasuredLogs",
    "MoeRouting",
    "bench_section",
    "breakdown_section",
    "build_report_data",
    "bytes_section",
    "compare_measured",
    "data_to_json",
    "heatmap_section",
    "load_bench",
    "load_measured",
    "load_moe",
    "logical_measured_ops",
    "measured_bytes_by_axis",
    "measured_heatmap_section",
    "message_size_section",
    "moe_metrics",
    "moe_section",
    "predicted_bytes_by_axis",
    "render_html",
    "schedule_section",
    "size_histogram",
    "time_section",
    "with_axes",
    "write_html",
]
