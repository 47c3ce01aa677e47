"""One self-contained HTML report: the data builder and the renderer.

:func:`build_report_data` turns library results (a :class:`~commscope.api.Prediction`, its
:class:`~commscope.estimate.Estimate`, a :class:`~commscope.plan.Plan`, measured op logs, a bandwidth
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

import html as _html
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.record import AXES, REPORT_AXES, CommOp

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


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    """A collective micro-benchmark: ``meta`` as written and one dict per measured point."""

    rows: tuple[dict[str, Any], ...]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = ""


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


def load_measured(path: str | Path, *, num_iterations: int | None = None) -> MeasuredLogs:
    """Read one op-log file or every ``*.jsonl`` / ``*.jsonl.gz`` of a directory (one per rank).

    Records tagged with a training step (``extra["step"]``) count as iterations and untagged ones as setup;
    ``num_iterations`` defaults to the number of distinct steps, else the header's ``num_iterations``
    (or ``iterations``, ``steps``), else 1.
    """
    from commscope.io.oplog import read_ops_jsonl

    path = Path(path)
    if not path.exists():
        raise ConfigError("measured", str(path), "no such file or directory (expected per-rank *.jsonl op logs)")
    files = sorted(p for pattern in ("*.jsonl", "*.jsonl.gz") for p in path.glob(pattern)) if path.is_dir() else [path]
    if not files:
        raise ConfigError("measured", str(path), "holds no *.jsonl or *.jsonl.gz op logs")
    ops: list[CommOp] = []
    problems: list[str] = []
    header: dict[str, Any] = {}
    for f in files:
        try:
            log = read_ops_jsonl(f)
        except ValueError as exc:
            raise ConfigError("measured", str(f), str(exc)) from None
        ops += log.ops
        problems += log.problems
        if not header and log.header:
            header = dict(log.header)
    steps = sorted({s for s in (_step_of(op) for op in ops) if isinstance(s, int)})
    if steps:
        ops = [op if isinstance(_step_of(op), int) or op.phase == "setup" else op.with_(phase="setup") for op in ops]
    if num_iterations is None:
        found = [header[k] for k in _HEADER_ITERATION_KEYS if isinstance(header.get(k), int) and header[k] >= 1]
        num_iterations = len(steps) if steps else (found[0] if found else 1)
    if num_iterations < 1:
        raise ConfigError("measured_iterations", num_iterations, "must be a positive integer")
    return MeasuredLogs(ops=tuple(ops), files=tuple(str(f) for f in files), num_iterations=num_iterations,
                        steps=tuple(steps), problems=tuple(problems), header=header)


_BENCH_REQUIRED = ("op", "group_size", "size_bytes", "busbw_bytes_per_s")


def load_bench(path: str | Path) -> BenchResult:
    """Read a benchmark JSON ``{"meta": {...}, "rows": [...]}`` (a bare list of rows is accepted too)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("bench", str(path), "no such file (expected a benchmark JSON with meta and rows)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("bench", str(path), f"is not JSON ({exc})") from None
    rows = doc.get("rows") if isinstance(doc, dict) else doc
    meta = doc.get("meta", {}) if isinstance(doc, dict) else {}
    if not isinstance(rows, list) or not rows:
        raise ConfigError("bench", str(path), 'needs a non-empty "rows" list of {op, group_size, size_bytes, busbw_bytes_per_s}')
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"rows[{i}]", row, "must be an object", source=str(path))
        missing = [k for k in _BENCH_REQUIRED if k not in row]
        if missing:
            raise ConfigError(f"rows[{i}]", {k: row[k] for k in list(row)[:4]}, f"lacks {', '.join(missing)}", source=str(path))
        try:
            clean = dict(row, op=str(row["op"]), group_size=int(row["group_size"]), size_bytes=int(row["size_bytes"]),
                         busbw_bytes_per_s=float(row["busbw_bytes_per_s"]))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"rows[{i}]", row, f"has a non-numeric value ({exc})", source=str(path)) from None
        out.append(clean)
    return BenchResult(rows=tuple(out), meta=dict(meta) if isinstance(meta, dict) else {"meta": meta}, source=str(path))


def load_moe(path: str | Path) -> list[MoeRouting]:
    """Read an ``.npz`` with a ``routing`` array (iterations, ep, ep), or every ``*.npz`` of a directory; a
    routing trace (:mod:`commscope.moe.trace`: a ``counts`` array, or a directory of ``routing-rank*.npz``)
    becomes its rank-to-rank tokens summed over micro-batches and layers."""
    from commscope.moe.routing import rank_tokens
    from commscope.moe.trace import RANK_FILE_GLOB, load_trace

    def from_trace(source: Path) -> MoeRouting:
        trace = load_trace(source)
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
            raise ConfigError("moe", str(f), f"is not a readable .npz ({exc})") from None
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
        return total // num_iterations if total % num_iterations == 0 else total / num_iterations

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
    return [{"key": key, "label": label, "color": color, "seconds": getattr(estimate, attr),
             "share": getattr(estimate, attr) / total if total else 0.0} for key, label, attr, color in TERMS]


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
    :func:`commscope.schedule.schedule_for`), followed by the estimate's DP and embedding reduction.

    ``names`` defaults to the configured schedule, plus plain 1F1B beside an interleaved one and an
    interleaved v=2 what-if beside 1F1B when the micro-batches allow it.
    """
    from commscope.schedule import FORWARD_SHARE, micro_batch_time_s, pipeline_schedule, schedule_for

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
            t_chunk = micro_batch_time_s(estimate, parallel) / 2
            sched = pipeline_schedule("interleaved", pp=p, num_micro_batches=m, virtual_pipeline_size=2,
                                      fwd_s=share * t_chunk, bwd_s=(1 - share) * t_chunk)
            label = "interleaved v=2 (what-if, same micro-batch time)"
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
    notes.append("every stage takes the estimate's critical-stage time per micro-batch "
                 f"(stage {estimate.critical_stage}); forward : backward = 1 : "
                 f"{'3' if parallel.recompute == 'full' else '2'}")
    if estimate.method == "seed" and v > 1:
        notes.append("the seed method ignores interleaving in its bubble term; the timeline does not")
    return {"pp": p, "num_micro_batches": m, "virtual_pipeline_size": v, "micro_batch_time_s": micro_batch_time_s(estimate, parallel),
            "schedules": schedules, "tail": [t for t in tail if t["seconds"] > 0],
            "iteration_time_s": estimate.iteration_time_s, "notes": notes}


def predicted_bytes_by_axis(workload) -> dict[str, dict[str, int]]:
    """Bytes (sum of message sizes) and ops per axis of one predicted iteration, counted as measured logs
    record them (:func:`commscope.capture.analysis.predicted_ops_by_kind`). Worked example: a TP all_reduce of
    13,107,200 bytes over 2 ranks is one op of 13,107,200 bytes; a balanced all_to_all of 4 x 1 MB over 4
    ranks is 4 ops of 4 MB.
    """
    from commscope.capture.analysis import predicted_ops_by_kind

    out = {a: {"bytes": 0, "ops": 0} for a in AXES}
    for (axis, _op), (count, nbytes) in predicted_ops_by_kind(workload).items():
        out[axis]["bytes"] += nbytes
        out[axis]["ops"] += count
    return out


def logical_measured_ops(ops: Iterable[CommOp]) -> list[CommOp]:
    """Measured records counted the way :func:`predicted_bytes_by_axis` counts, setup records left out
    (:func:`commscope.capture.analysis.is_logical`)."""
    from commscope.capture.analysis import is_logical

    return [op for op in ops if op.phase != "setup" and is_logical(op)]


def with_axes(measured: MeasuredLogs, prediction) -> MeasuredLogs:
    """The logs with every record whose axis is ``other`` given the axis of the prediction's process group
    it ran on (the capture module's attribution: recorders do not know the parallelism)."""
    ops = list(measured.ops)
    unknown = [i for i, op in enumerate(ops) if op.axis == "other"]
    if not unknown or prediction is None:
        return measured
    try:
        from commscope.capture.analysis import attribute_axes
    except ImportError:  # pragma: no cover - the capture module is part of the package
        return measured
    fixed = attribute_axes([ops[i] for i in unknown], prediction.workload.layout)
    for i, op in zip(unknown, fixed):
        ops[i] = op
    return replace(measured, ops=tuple(ops),
                   num_attributed=measured.num_attributed + sum(op.axis != "other" for op in fixed))


def measured_bytes_by_axis(ops: Iterable[CommOp]) -> dict[str, dict[str, int]]:
    """Bytes (``size_bytes x count``) and ops per axis of measured records, counted by :func:`logical_measured_ops`."""
    out = {a: {"bytes": 0, "ops": 0} for a in AXES}
    for op in logical_measured_ops(ops):
        out[op.axis]["bytes"] += op.size_bytes * op.count
        out[op.axis]["ops"] += op.count
    return out


def compare_measured(measured: MeasuredLogs, prediction=None) -> dict[str, Any]:
    """Measured vs predicted bytes and ops per axis for one iteration: the measured sums divided by the
    iterations the logs cover, beside :func:`predicted_bytes_by_axis` of the prediction, and their ratio.
    Records without an axis (``other``) take the axis of the prediction's group they ran on."""
    measured = with_axes(measured, prediction)
    meas = measured_bytes_by_axis(measured.ops)
    pred = predicted_bytes_by_axis(prediction.workload) if prediction is not None else None
    n = measured.num_iterations
    rows = []
    for axis in (*REPORT_AXES, "other"):
        mb, mo = meas[axis]["bytes"] / n, meas[axis]["ops"] / n
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
             "counted once per collective (its group's lowest rank), per issuing rank for all_to_all, at the send "
             "for point-to-point; recv and setup records left out"]
    if setup:
        notes.append(f"{setup:,} setup records (before the first step) left out")
    if measured.num_attributed:
        notes.append(f"{measured.num_attributed:,} records without an axis took the axis of the prediction's group they ran on")
    if prediction is not None and ranks and len(ranks) != prediction.traffic.world_size:
        notes.append(f"the logs cover {len(ranks)} ranks, the prediction {prediction.traffic.world_size}")
    notes += list(measured.problems[:10])
    total_m = sum(r["measured_bytes"] for r in rows)
    total_p = sum(r["predicted_bytes"] or 0 for r in rows) if pred else None
    return {"rows": rows, "num_iterations": n, "num_ranks": len(ranks), "files": list(measured.files),
            "measured_total_bytes": total_m, "predicted_total_bytes": total_p,
            "ratio": (total_m / total_p) if total_p else None, "notes": notes}


def measured_heatmap_section(measured: MeasuredLogs, prediction=None, *, level: str = "auto") -> dict[str, Any] | None:
    """The measured traffic matrix (logical view, ring algorithm), drawn like the predicted one; None when
    the capture module that decomposes measured ops is unavailable or the logs hold no flows."""
    try:
        from commscope.capture.analysis import measured_traffic
    except ImportError:  # pragma: no cover
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
    from commscope.bandwidth import AlphaBeta, GroupSpan, busbw_factor

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
             "detail": f"{tm.num_nodes:,} nodes \u00d7 {tm.gpus_per_node}"},
            {"label": "bytes sent per iteration", "value": tm.total_bytes, "kind": "bytes",
             "detail": f"{link['inter_node'] / tm.total_bytes:.1%} inter-node" if tm.total_bytes else ""},
            {"label": "ops per iteration", "value": prediction.num_ops, "kind": "count", "detail": f"{tm.num_pairs:,} GPU pairs talk"},
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
        out.update(estimate_method=estimate.method, gpu_util=estimate.gpu_util)
    return out


def build_report_data(*, prediction=None, estimate=None, plan=None, measured: MeasuredLogs | None = None,
                      bench: BenchResult | None = None, moe: Sequence[MoeRouting] | None = None,
                      command_line: str | None = None, files: dict[str, Any] | None = None,
                      title: str | None = None, heatmap_level: str = "auto") -> dict[str, Any]:
    """Everything the report shows, as one JSON-ready dict (sections absent when their input is).

    ``estimate`` without ``prediction`` is allowed only for the breakdown; the schedule needs both.
    ``command_line`` and ``files`` are recorded so that the report can be reproduced.
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


def render_html(data: dict[str, Any]) -> str:
    """The report as one self-contained HTML document (inline style and script, data embedded as JSON)."""
    parts = {"TITLE": _html.escape(str(data.get("title", "commscope report"))), "CSS": _CSS,
             "DATA": data_to_json(data), "JS": _JS}
    return re.sub(r"%(TITLE|CSS|DATA|JS)%", lambda mo: parts[mo.group(1)], _PAGE)


def write_html(data: dict[str, Any], path: str | Path) -> Path:
    """Render ``data`` and write it to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(data), encoding="utf-8")
    return path


__all__ = [
    "AXIS_STYLE",
    "BenchResult",
    "MeasuredLogs",
    "MoeRouting",
    "TERMS",
    "bench_section",
    "breakdown_section",
    "build_report_data",
    "bytes_section",
    "compare_measured",
    "data_to_json",
    "heatmap_section",
    "logical_measured_ops",
    "measured_heatmap_section",
    "with_axes",
    "predicted_bytes_by_axis",
    "load_bench",
    "load_measured",
    "load_moe",
    "measured_bytes_by_axis",
    "message_size_section",
    "moe_metrics",
    "moe_section",
    "render_html",
    "schedule_section",
    "size_histogram",
    "write_html",
]


# ----------------------------------------------------------------------------------------------- page assets
# The page only draws: every number it shows is in the embedded data. No external request of any kind:
# system fonts, inline SVG and canvas, no library. Errors (window.onerror, console.error, a section that
# fails to draw) are listed in #errors and counted in <body data-errors>, which the browser test reads.

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="commscope">
<title>%TITLE%</title>
<style>%CSS%</style>
</head>
<body data-ready="0" data-errors="0">
<script>
(function () {
  "use strict";
  var list = [];
  function note(text) {
    list.push(String(text));
    document.body.setAttribute("data-errors", String(list.length));
    var box = document.getElementById("errors");
    if (box) {
      box.hidden = false;
      var li = document.createElement("li");
      li.textContent = String(text);
      box.querySelector("ul").appendChild(li);
    }
  }
  window.commscopeErrors = list;
  window.commscopeReportError = note;
  window.addEventListener("error", function (e) {
    var t = e.target;
    if (t && t !== window && (t.src || t.href)) { note("request from the page: " + (t.src || t.href)); return; }
    note("error: " + (e.message || e) + (e.lineno ? " (line " + e.lineno + ")" : ""));
  }, true);  /* capture: resource errors (a request that failed) do not bubble */
  window.addEventListener("unhandledrejection", function (e) { note("unhandled rejection: " + e.reason); });
  var original = console.error;
  console.error = function () {
    note("console.error: " + Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();
</script>
<header>
  <h1 id="title">%TITLE%</h1>
  <div class="sub" id="subtitle"></div>
  <nav id="nav"></nav>
</header>
<div id="errors" hidden><strong>Errors while drawing this report</strong><ul></ul></div>
<main>
  <section id="summary" class="kpis"></section>
  <div id="sections"></div>
</main>
<footer id="footer"></footer>
<div id="tip" role="tooltip"></div>
<script id="report-data" type="application/json">%DATA%</script>
<script>%JS%</script>
</body>
</html>
"""

_CSS = r"""
:root { --fg: #1f2933; --muted: #616e7c; --line: #e4e7eb; --bg: #f4f6f8; --card: #fff; --accent: #3e6ea8; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: var(--bg); }
header { background: #1f2933; color: #fff; padding: 18px 28px 10px; }
header h1 { margin: 0; font-size: 20px; font-weight: 600; letter-spacing: .01em; }
header .sub { color: #cbd2d9; font-size: 13px; margin-top: 3px; }
nav { margin-top: 10px; display: flex; flex-wrap: wrap; gap: 4px 16px; }
nav a { color: #9fb3c8; text-decoration: none; font-size: 13px; }
nav a:hover { color: #fff; }
main { max-width: 1200px; margin: 0 auto; padding: 16px 20px 30px; }
footer { max-width: 1200px; margin: 0 auto 30px; padding: 0 20px; color: var(--muted); font-size: 12px; }
.kpis { display: grid; grid-template-columns: repeat(auto-fit, minmax(140px, 1fr)); gap: 10px; }
.kpi { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; }
.kpi .l { color: var(--muted); font-size: 11px; text-transform: uppercase; letter-spacing: .05em; }
.kpi .v { font-size: 22px; font-weight: 600; margin: 1px 0; }
.kpi .d { color: var(--muted); font-size: 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 16px 18px 14px;
        margin: 14px 0; box-shadow: 0 1px 2px rgba(15, 23, 42, .04); }
.card h2 { margin: 0; font-size: 16px; font-weight: 600; }
.card .what { color: var(--muted); margin: 2px 0 12px; font-size: 13px; }
.row { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.side { flex: 1 1 260px; min-width: 240px; font-size: 13px; }
.controls { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; margin: 0 0 10px; }
.controls .lab { color: var(--muted); font-size: 12px; margin-right: 2px; }
.chip, .btn { border: 1px solid #cbd2d9; background: #fff; border-radius: 14px; padding: 3px 10px; font: inherit;
              font-size: 12px; cursor: pointer; display: inline-flex; gap: 6px; align-items: center; color: var(--fg); }
.chip { padding-left: 6px; }
.chip[aria-pressed="false"] { opacity: .45; }
.chip[aria-pressed="false"] .sw { background: #fff !important; }
.chip .sw { width: 12px; height: 12px; border-radius: 3px; display: inline-block; border: 1px solid rgba(0,0,0,.15); }
.btn[aria-pressed="true"] { background: var(--accent); border-color: var(--accent); color: #fff; }
.sep { width: 1px; height: 18px; background: var(--line); margin: 0 6px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { color: var(--muted); font-weight: 500; font-size: 12px; }
th:first-child, td:first-child { text-align: left; }
td .sw { width: 10px; height: 10px; border-radius: 2px; display: inline-block; margin-right: 6px; }
.kv td { text-align: left; white-space: normal; overflow-wrap: anywhere; vertical-align: top; }
th .sw { width: 10px; height: 10px; border-radius: 2px; display: inline-block; margin-right: 5px; } .kv td:first-child { color: var(--muted); white-space: nowrap; }
ul.notes { color: var(--muted); font-size: 12px; margin: 10px 0 0; padding-left: 18px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; color: var(--muted); margin: 6px 0; }
.legend span.k { display: inline-flex; align-items: center; gap: 5px; }
.legend i { width: 12px; height: 12px; border-radius: 2px; display: inline-block; }
.stat { font-size: 13px; margin: 6px 0; }
.stat b { font-weight: 600; }
#tip { position: fixed; pointer-events: none; background: rgba(31, 41, 51, .95); color: #fff; font-size: 12px;
       padding: 6px 9px; border-radius: 6px; max-width: 380px; z-index: 10; display: none; line-height: 1.4; }
#tip .h { font-weight: 600; margin-bottom: 2px; }
#errors { background: #fde8e8; border: 1px solid #e12d39; color: #8a041a; padding: 10px 14px; border-radius: 8px;
          margin: 14px auto 0; max-width: 1160px; }
canvas { display: block; max-width: 100%; }
svg { display: block; max-width: 100%; height: auto; overflow: visible; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
pre { background: #f5f7fa; border: 1px solid var(--line); padding: 8px 10px; border-radius: 6px; overflow-x: auto;
      font-size: 12px; margin: 6px 0; white-space: pre-wrap; overflow-wrap: anywhere; }
details summary { cursor: pointer; color: var(--accent); font-size: 13px; margin-top: 8px; }
.frames { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 8px; }
.frames figure { margin: 0; cursor: pointer; text-align: center; font-size: 11px; color: var(--muted); }
.frames figure.on canvas { outline: 2px solid var(--accent); }
input[type=range] { width: 260px; vertical-align: middle; }
.muted { color: var(--muted); }
"""

_JS = r"""
(function () {
"use strict";
var D = JSON.parse(document.getElementById("report-data").textContent);
var NS = "http://www.w3.org/2000/svg";
var report = window.commscopeReportError || function (m) { throw new Error(m); };
var PARAMS = new URLSearchParams((location.search || "").slice(1) + "&" + (location.hash || "").slice(1));
var API = window.commscopeReport = {};

/* ---------------------------------------------------------------- helpers (presentation only) */
function el(tag, attrs, parent, text) {
  var e = document.createElement(tag);
  if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function sv(tag, attrs, parent, text) {
  var e = document.createElementNS(NS, tag);
  if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function svgRoot(parent, w, h) {
  return sv("svg", {viewBox: "0 0 " + w + " " + h, width: w, height: h, role: "img"}, parent);
}
function titled(node, text) { sv("title", null, node, text); return node; }
function sig(v) {
  if (Number.isInteger(v)) return String(v);
  var a = Math.abs(v);
  return String(parseFloat(a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2)));
}
function fmtBytes(b) {
  if (b === null || b === undefined) return "\u2013";
  var u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"], i = 0, v = Math.abs(b);
  while (Number(sig(v)) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (b < 0 ? "-" : "") + (i === 0 ? String(Math.round(v)) : sig(v)) + " " + u[i];
}
function fmtSec(s) {
  if (s === null || s === undefined) return "\u2013";
  var a = Math.abs(s);
  if (a === 0) return "0 s";
  if (a < 1e-3) return sig(s * 1e6) + " \u00b5s";
  if (a < 1) return sig(s * 1e3) + " ms";
  return sig(s) + " s";
}
function fmtPct(x) { return x === null || x === undefined ? "\u2013" : (100 * x).toFixed(1) + "%"; }
function fmtCount(n) {
  if (n === null || n === undefined) return "\u2013";
  return n.toLocaleString("en-US", {maximumFractionDigits: Math.abs(n) >= 100 ? 0 : 2});
}
function fmtGBps(b) { return b === null || b === undefined ? "\u2013" : sig(b / 1e9) + " GB/s"; }
function fmtRatio(x) { return x === null || x === undefined ? "\u2013" : "\u00d7" + x.toFixed(x >= 10 ? 1 : 3); }
function fmt(kind, v) {
  return kind === "bytes" ? fmtBytes(v) : kind === "seconds" ? fmtSec(v) : kind === "ratio" ? fmtPct(v) : fmtCount(v);
}
function niceTicks(max, n) {  /* about n round ticks from 0 to >= max */
  if (!(max > 0)) return [0, 1];
  var step = Math.pow(10, Math.floor(Math.log10(max / n))), err = max / n / step;
  step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
  var out = [];
  for (var t = 0; t <= max * 1.0001 + step * 0.999; t += step) { out.push(t); if (t >= max) break; }
  return out;
}
function hexRgb(hex) { var n = parseInt(hex.slice(1), 16); return [(n >> 16) & 255, (n >> 8) & 255, n & 255]; }
function mix(a, b, t) { return [0, 1, 2].map(function (i) { return Math.round(a[i] + (b[i] - a[i]) * t); }); }
function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
var VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"].map(hexRgb);
function viridis(t) {
  t = Math.max(0, Math.min(1, t));
  var x = t * (VIRIDIS.length - 1), i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  return mix(VIRIDIS[i], VIRIDIS[i + 1], x - i);
}
function axisShade(hex, t) {  /* light tint (few bytes) -> the axis colour -> a dark shade (many bytes) */
  var c = hexRgb(hex), white = [255, 255, 255], black = [20, 20, 30];
  t = Math.max(0, Math.min(1, t));
  return t < 0.6 ? mix(mix(c, white, 0.72), c, t / 0.6) : mix(c, black, (t - 0.6) / 0.4 * 0.4);
}
var tip = document.getElementById("tip");
function showTip(evt, head, lines) {
  tip.textContent = "";
  el("div", {class: "h"}, tip, head);
  (lines || []).forEach(function (l) { el("div", null, tip, l); });
  tip.style.display = "block";
  var x = evt.clientX + 14, y = evt.clientY + 14, w = tip.offsetWidth, h = tip.offsetHeight;
  if (x + w > window.innerWidth - 8) x = evt.clientX - w - 14;
  if (y + h > window.innerHeight - 8) y = evt.clientY - h - 14;
  tip.style.left = x + "px"; tip.style.top = y + "px";
}
function hideTip() { tip.style.display = "none"; }
function sizeCanvas(cv, w, h) {  /* w x h CSS pixels, sharp on high-density screens; returns the context */
  var dpr = Math.max(1, Math.min(3, window.devicePixelRatio || 1));
  cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
  cv.style.width = w + "px";
  cv.cssWidth = w; cv.cssHeight = h;
  var ctx = cv.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}
function canvasPoint(canvas, evt) {  /* mouse position in the canvas's CSS pixels */
  var r = canvas.getBoundingClientRect();
  return [(evt.clientX - r.left) * canvas.cssWidth / r.width, (evt.clientY - r.top) * canvas.cssHeight / r.height];
}
function stripes(defs, id, color) {
  var p = sv("pattern", {id: id, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"}, defs);
  sv("rect", {width: 6, height: 6, fill: rgb(mix(hexRgb(color), [255, 255, 255], 0.72))}, p);
  sv("rect", {width: 3, height: 6, fill: color}, p);
  return "url(#" + id + ")";
}
function notesList(parent, notes) {
  if (!notes || !notes.length) return;
  var ul = el("ul", {class: "notes"}, parent);
  notes.forEach(function (n) { el("li", null, ul, n); });
}
function legend(parent, items) {
  var box = el("div", {class: "legend"}, parent);
  items.forEach(function (it) {
    var k = el("span", {class: "k"}, box);
    var i = el("i", null, k);
    i.style.background = it.color;
    if (it.border) i.style.border = it.border;
    el("span", null, k, it.label);
  });
  return box;
}
function buttons(parent, label, options, current, onpick) {
  var box = el("div", {class: "controls"}, parent);
  if (label) el("span", {class: "lab"}, box, label);
  var made = options.map(function (o) {
    var b = el("button", {class: "btn", type: "button", "aria-pressed": String(o.key === current), "data-key": o.key}, box, o.label);
    b.addEventListener("click", function () {
      made.forEach(function (m) { m.setAttribute("aria-pressed", String(m === b)); });
      onpick(o.key);
    });
    return b;
  });
  return box;
}
var NAV = document.getElementById("nav"), SECTIONS = document.getElementById("sections");
function card(id, title, what) {
  var c = el("section", {class: "card", id: id}, SECTIONS);
  el("h2", null, c, title);
  if (what) el("p", {class: "what"}, c, what);
  el("a", {href: "#" + id}, NAV, title);
  return c;
}
function section(name, fn) {
  try { fn(); } catch (err) { report("section " + name + ": " + (err && err.stack ? err.stack.split("\n")[0] : err)); }
}
var AXES = {};
D.axes.forEach(function (a) { AXES[a.key] = a; });

/* ---------------------------------------------------------------- header and summary */
section("summary", function () {
  var inp = D.inputs || {}, parts = [];
  if (inp.model) parts.push("model " + inp.model.name);
  if (inp.cluster) parts.push("cluster " + inp.cluster.name + " (" + inp.cluster.gpu + ")");
  if (inp.parallel) parts.push("global batch " + inp.parallel.global_batch_size + ", micro-batch " + inp.parallel.micro_batch_size);
  if (inp.algorithm) parts.push(inp.algorithm + " collectives");
  document.getElementById("subtitle").textContent = parts.filter(Boolean).join(" \u00b7 ");
  var box = document.getElementById("summary");
  (D.summary || []).forEach(function (k) {
    var d = el("div", {class: "kpi"}, box);
    el("div", {class: "l"}, d, k.label);
    el("div", {class: "v"}, d, fmt(k.kind, k.value));
    if (k.detail) el("div", {class: "d"}, d, k.detail);
  });
});

/* ---------------------------------------------------------------- traffic heatmap */
function drawHeatmap(H, id, title, intro) {
  var c = card(id, title, intro || ("Bytes each " + H.unit + " (row, sender) sends to each " + H.unit + " (column, receiver) in one iteration. " +
    "Colour: the parallelism axis that sends the most between the pair; darker = more bytes (log scale). " +
    "Toggle axes to see each pattern alone."));
  var primary = id === "heatmap";
  var controls = el("div", {class: "controls"}, c);
  el("span", {class: "lab"}, controls, "axes");
  var enabled = {}, chips = {};
  H.layers.forEach(function (l) { enabled[l.axis] = true; });
  var requested = PARAMS.get("axes");
  if (requested !== null) {
    var want = requested.split(",").filter(Boolean);
    H.layers.forEach(function (l) { enabled[l.axis] = want.indexOf(l.axis) >= 0; });
  }
  var mode = PARAMS.get("colour") === "bytes" ? "bytes" : "axis";
  H.layers.forEach(function (l) {
    var b = el("button", {class: "chip", type: "button", "data-axis": l.axis, "aria-pressed": String(!!enabled[l.axis])}, controls);
    el("span", {class: "sw"}, b).style.background = l.color;
    el("span", null, b, l.label + " \u00b7 " + fmtBytes(l.total_bytes));
    b.addEventListener("click", function () { enabled[l.axis] = !enabled[l.axis]; sync(); });
    chips[l.axis] = b;
  });
  var all = el("button", {class: "btn", type: "button"}, controls, "all");
  all.addEventListener("click", function () { H.layers.forEach(function (l) { enabled[l.axis] = true; }); sync(); });
  var none = el("button", {class: "btn", type: "button"}, controls, "none");
  none.addEventListener("click", function () { H.layers.forEach(function (l) { enabled[l.axis] = false; }); sync(); });
  el("span", {class: "sep"}, controls);
  el("span", {class: "lab"}, controls, "colour");
  var modeButtons = [["axis", "by axis"], ["bytes", "by bytes"]].map(function (m) {
    var b = el("button", {class: "btn", type: "button", "aria-pressed": String(mode === m[0])}, controls, m[1]);
    b.addEventListener("click", function () {
      mode = m[0];
      modeButtons.forEach(function (x) { x.setAttribute("aria-pressed", String(x === b)); });
      draw();
    });
    return b;
  });

  var row = el("div", {class: "row"}, c);
  /* whole pixels per cell up to 310 cells a side; above, fractional, and every busy cell drawn at least
     2 px wide so that sparse patterns (a DP diagonal among 2,048 nodes) stay visible */
  var N = H.cells, scale = N <= 310 ? Math.max(1, Math.floor(620 / N)) : 620 / N, dot = Math.max(scale, 2);
  var M = {l: 66, t: 12, r: 12, b: 50}, P = Math.round(N * scale);
  var canvas = el("canvas", {id: id + "-canvas", "aria-label": title}, row);
  var ctx = sizeCanvas(canvas, M.l + P + M.r, M.t + P + M.b);
  var side = el("div", {class: "side"}, row);
  var legendCanvas = el("canvas", {id: id + "-legend"}, side);
  var status = el("p", {class: "stat"}, side);
  var explain = el("ul", {class: "notes"}, side);
  ["TP groups: blocks on the diagonal (neighbouring GPUs, inside a node).",
   "DP groups: diagonals at a stride of tp \u00d7 cp; PP: lines to the next stage (and back).",
   "EMB: first and last pipeline stage; EP: all-to-all blocks; CP: ring to the neighbour."].forEach(function (t) {
    el("li", null, explain, t);
  });
  notesList(side, H.notes.concat([H.algorithm + " algorithm, " + H.view + " view; total " + fmtBytes(H.total_bytes)]));

  var maps = H.layers.map(function (l) {
    var m = new Map();
    for (var i = 0; i < l.r.length; i++) m.set(l.r[i] * N + l.c[i], l.b[i]);
    return m;
  });
  var allMap = new Map();
  for (var i = 0; i < H.all.r.length; i++) allMap.set(H.all.r[i] * N + H.all.c[i], H.all.b[i]);
  var lo = Math.log(Math.max(1, H.min_bytes)), hi = Math.log(Math.max(1, H.max_bytes));
  if (hi - lo < Math.log(10)) lo = hi - Math.log(10);
  function level(v) { return (Math.log(v) - lo) / (hi - lo); }
  var lastBest = new Map();

  function sync() {
    H.layers.forEach(function (l) { chips[l.axis].setAttribute("aria-pressed", String(!!enabled[l.axis])); });
    draw();
  }
  function draw() {
    var best = new Map(), on = 0;
    H.layers.forEach(function (l, li) {
      if (!enabled[l.axis]) return;
      on++;
      for (var i = 0; i < l.r.length; i++) {
        var k = l.r[i] * N + l.c[i], cur = best.get(k);
        if (!cur || l.b[i] > cur[1]) best.set(k, [li, l.b[i]]);
      }
    });
    var allOn = on === H.layers.length;
    lastBest = best;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.cssWidth, canvas.cssHeight);
    ctx.fillStyle = "#fcfcfd"; ctx.fillRect(M.l, M.t, P, P);
    if (scale >= 6) {
      ctx.strokeStyle = "#eef0f3"; ctx.lineWidth = 1; ctx.beginPath();
      for (var g = 1; g < N; g++) {
        ctx.moveTo(M.l + g * scale + 0.5, M.t); ctx.lineTo(M.l + g * scale + 0.5, M.t + P);
        ctx.moveTo(M.l, M.t + g * scale + 0.5); ctx.lineTo(M.l + P, M.t + g * scale + 0.5);
      }
      ctx.stroke();
    }
    var gap = scale >= 6 ? 1 : 0, cells = [];
    best.forEach(function (cur, k) { cells.push([k, cur[0], allOn ? (allMap.get(k) || cur[1]) : cur[1]]); });
    cells.sort(function (a, b) { return a[2] - b[2]; });  /* busiest on top where widened cells overlap */
    cells.forEach(function (cell) {
      var k = cell[0], r = Math.floor(k / N), col = k - r * N, cur = [cell[1]];
      var t = level(cell[2]);
      ctx.fillStyle = rgb(mode === "axis" ? axisShade(H.layers[cur[0]].color, t) : viridis(t));
      ctx.fillRect(M.l + col * scale + gap, M.t + r * scale + gap, dot - gap, dot - gap);
    });
    if (H.level === "gpu" && H.block === 1 && H.num_nodes > 1 && H.num_nodes <= 64) {
      ctx.strokeStyle = "rgba(60,70,80,.55)"; ctx.lineWidth = 1; ctx.beginPath();
      for (var n = 1; n < H.num_nodes; n++) {
        var p = Math.round(n * H.gpus_per_node * scale) + 0.5;
        ctx.moveTo(M.l + p, M.t); ctx.lineTo(M.l + p, M.t + P);
        ctx.moveTo(M.l, M.t + p); ctx.lineTo(M.l + P, M.t + p);
      }
      ctx.stroke();
    }
    ctx.strokeStyle = "#9aa5b1"; ctx.lineWidth = 1; ctx.strokeRect(M.l - 0.5, M.t - 0.5, P + 1, P + 1);
    /* ticks: powers of two giving about 8 labels, or node starts at GPU level */
    var step = Math.pow(2, Math.max(0, Math.ceil(Math.log2(Math.max(H.side, 1) / 8))));
    if (H.level === "gpu" && H.gpus_per_node > step && H.side / H.gpus_per_node >= 4) step = H.gpus_per_node;
    ctx.fillStyle = "#52606d"; ctx.font = "11px system-ui, sans-serif";
    for (var idx = 0; idx < H.side; idx += step) {
      var pos = (Math.floor(idx / H.block) + 0.5) * scale;
      ctx.textAlign = "center"; ctx.textBaseline = "top"; ctx.fillText(String(idx), M.l + pos, M.t + P + 5);
      ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.fillText(String(idx), M.l - 6, M.t + pos);
    }
    ctx.font = "12px system-ui, sans-serif"; ctx.fillStyle = "#323f4b";
    ctx.textAlign = "center"; ctx.textBaseline = "alphabetic";
    ctx.fillText("destination " + H.unit + " (dst, receives) \u2192", M.l + P / 2, M.t + P + 38);
    ctx.save(); ctx.translate(16, M.t + P / 2); ctx.rotate(-Math.PI / 2);
    ctx.fillText("\u2190 source " + H.unit + " (src, sends)", 0, 0); ctx.restore();
    canvas.setAttribute("data-cells", String(best.size));
    canvas.setAttribute("data-axes", H.layers.filter(function (l) { return enabled[l.axis]; }).map(function (l) { return l.axis; }).join(","));
    if (primary) document.body.setAttribute("data-heatmap-cells", String(best.size));
    if (!H.layers.length) {
      ctx.fillStyle = "#9aa5b1"; ctx.font = "14px system-ui, sans-serif"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
      ctx.fillText("no communication", M.l + P / 2, M.t + P / 2);
    }
    status.textContent = best.size.toLocaleString("en-US") + " cells drawn" +
      (allOn ? " \u00b7 shade: all axes together" : on ? " \u00b7 shade: the largest selected axis" : " \u00b7 no axis selected");
    drawLegend(allOn);
  }
  function drawLegend() {
    var rows = mode === "axis" ? H.layers.filter(function (l) { return enabled[l.axis]; }) : [{label: "bytes", color: null}];
    var lc = legendCanvas, h = 16, top = 4;
    var lctx = sizeCanvas(lc, 300, top + Math.max(rows.length, 1) * (h + 3) + 22), x0 = 44, w = 240;
    lctx.font = "11px system-ui, sans-serif"; lctx.textBaseline = "middle";
    rows.forEach(function (l, i) {
      var y = top + i * (h + 3);
      for (var px = 0; px < w; px++) {
        lctx.fillStyle = rgb(l.color ? axisShade(l.color, px / (w - 1)) : viridis(px / (w - 1)));
        lctx.fillRect(x0 + px, y, 1, h);
      }
      lctx.fillStyle = "#52606d"; lctx.textAlign = "right"; lctx.fillText(l.label, x0 - 6, y + h / 2);
    });
    var yb = top + Math.max(rows.length, 1) * (h + 3) + 8;
    lctx.fillStyle = "#52606d";
    lctx.textAlign = "left"; lctx.fillText(fmtBytes(Math.exp(lo)), x0, yb);
    lctx.textAlign = "center"; lctx.fillText(fmtBytes(Math.exp((lo + hi) / 2)), x0 + w / 2, yb);
    lctx.textAlign = "right"; lctx.fillText(fmtBytes(Math.exp(hi)), x0 + w, yb);
  }
  canvas.addEventListener("mousemove", function (evt) {
    var p = canvasPoint(canvas, evt), col = Math.floor((p[0] - M.l) / scale), r = Math.floor((p[1] - M.t) / scale);
    if (col < 0 || r < 0 || col >= N || r >= N) { hideTip(); return; }
    var k = r * N + col, span = function (i) {
      var a = i * H.block, b = Math.min(H.side, a + H.block) - 1;
      return a === b ? H.unit + " " + a : H.unit + "s " + a + "\u2013" + b;
    };
    var lines = [];
    H.layers.forEach(function (l, li) {
      var v = maps[li].get(k);
      if (v) lines.push(l.label + ": " + fmtBytes(v) + (enabled[l.axis] ? "" : " (hidden)"));
    });
    if (allMap.get(k)) lines.push("all axes: " + fmtBytes(allMap.get(k)));
    if (!lines.length) lines.push("no traffic");
    if (H.block > 1) lines.push("largest pair of the block");
    showTip(evt, span(r) + " \u2192 " + span(col), lines);
  });
  canvas.addEventListener("mouseleave", hideTip);
  if (primary) {
    API.setAxes = function (list) { H.layers.forEach(function (l) { enabled[l.axis] = list.indexOf(l.axis) >= 0; }); sync(); return lastBest.size; };
    API.heatmapCells = function () { return lastBest.size; };
  }
  sync();
}

/* ---------------------------------------------------------------- bytes by axis and link */
function drawBytes(B) {
  var c = card("bytes", "Bytes by axis and link",
    "What each kind of parallelism puts on the links per iteration: solid inside a node (NVLink, PCIe), striped between nodes (the network).");
  var rows = B.rows, W = 1120, lh = 30, L = 70, R = 300, H = rows.length * lh + 30;
  var s = svgRoot(c, W, H), defs = sv("defs", null, s);
  var max = Math.max.apply(null, rows.map(function (r) { return r.bytes; }).concat([1]));
  var bw = W - L - R;
  rows.forEach(function (r, i) {
    var y = 8 + i * lh, g = sv("g", null, s);
    sv("text", {x: L - 10, y: y + 15, "text-anchor": "end", "font-size": 13, fill: "#323f4b"}, g, r.label);
    sv("rect", {x: L, y: y + 3, width: bw, height: 18, fill: "#f5f7fa"}, g);
    var wi = bw * r.intra_node_bytes / max, we = bw * r.inter_node_bytes / max;
    titled(sv("rect", {x: L, y: y + 3, width: wi, height: 18, fill: r.color}, g), r.label + " intra-node: " + fmtBytes(r.intra_node_bytes));
    titled(sv("rect", {x: L + wi, y: y + 3, width: we, height: 18, fill: stripes(defs, "st-" + r.axis, r.color)}, g),
           r.label + " inter-node: " + fmtBytes(r.inter_node_bytes));
    var text = r.bytes ? fmtBytes(r.bytes) + "  \u00b7  " + fmtPct(r.share) + " of all  \u00b7  " + fmtPct(r.inter_node_share) + " inter-node" : "none";
    sv("text", {x: L + bw + 12, y: y + 16, "font-size": 12, fill: r.bytes ? "#323f4b" : "#9aa5b1"}, g, text);
  });
  var y = 8 + rows.length * lh + 14;
  sv("text", {x: L, y: y, "font-size": 12, fill: "#616e7c"}, s,
     "all axes: " + fmtBytes(B.total_bytes) + "  \u00b7  intra-node " + fmtBytes(B.intra_node_bytes) +
     "  \u00b7  inter-node " + fmtBytes(B.inter_node_bytes) + " (" + fmtPct(B.inter_node_share) + ")");
  var t = el("table", null, c), hr = el("tr", null, el("thead", null, t));
  ["axis", "bytes sent", "share", "intra-node", "inter-node", "op bytes (sum of message sizes)"].forEach(function (h) { el("th", null, hr, h); });
  var tb = el("tbody", null, t);
  rows.forEach(function (r) {
    var tr = el("tr", null, tb), td = el("td", null, tr);
    el("span", {class: "sw"}, td).style.background = r.color;
    td.appendChild(document.createTextNode(r.label));
    [fmtBytes(r.bytes), fmtPct(r.share), fmtBytes(r.intra_node_bytes), fmtBytes(r.inter_node_bytes),
     r.logical_bytes === null || r.logical_bytes === undefined ? "\u2013" : fmtBytes(r.logical_bytes)].forEach(function (v) { el("td", null, tr, v); });
  });
}

/* ---------------------------------------------------------------- message sizes */
function histogram(parent, Hh, what) {
  var box = el("div", null, parent);
  var W = 1120, Hgt = 300, M = {l: 70, r: 16, t: 14, b: 58};
  var n = Hh.edges_bytes.length - 1;
  function draw() {
    box.textContent = "";
    if (n <= 0) { el("p", {class: "muted"}, box, "no ops with a size"); return; }
    var s = svgRoot(box, W, Hgt), pw = W - M.l - M.r, ph = Hgt - M.t - M.b, bw = pw / n;
    var key = what.mode === "bytes" ? "bytes" : "counts", totals = [];
    for (var i = 0; i < n; i++) totals.push(Hh.series.reduce(function (a, se) { return a + se[key][i]; }, 0));
    var ticks = niceTicks(Math.max.apply(null, totals.concat([1])), 5), top = ticks[ticks.length - 1];
    ticks.forEach(function (t) {
      var y = M.t + ph - ph * t / top;
      sv("line", {x1: M.l, x2: M.l + pw, y1: y, y2: y, stroke: "#eef0f3"}, s);
      sv("text", {x: M.l - 8, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#616e7c"}, s, key === "bytes" ? fmtBytes(t) : fmtCount(t));
    });
    for (var b = 0; b < n; b++) {
      var y0 = M.t + ph;
      Hh.series.forEach(function (se) {
        var v = se[key][b];
        if (!v) return;
        var h = ph * v / top;
        titled(sv("rect", {x: M.l + b * bw + 1, y: y0 - h, width: Math.max(bw - 2, 1), height: h, fill: se.color}, s),
               se.label + ", " + fmtBytes(Hh.edges_bytes[b]) + " \u2264 size < " + fmtBytes(Hh.edges_bytes[b + 1]) + ": " +
               fmtCount(se.counts[b]) + " ops, " + fmtBytes(se.bytes[b]));
        y0 -= h;
      });
      if (totals[b] > 0) sv("text", {x: M.l + (b + 0.5) * bw, y: y0 - 4, "text-anchor": "middle", "font-size": 10, fill: "#52606d"}, s,
                            key === "bytes" ? fmtBytes(totals[b]) : fmtCount(totals[b]));
    }
    var every = Math.max(1, Math.ceil(n / 14));
    for (var e = 0; e <= n; e += every) {
      var x = M.l + e * bw;
      sv("line", {x1: x, x2: x, y1: M.t + ph, y2: M.t + ph + 4, stroke: "#9aa5b1"}, s);
      sv("text", {x: x, y: M.t + ph + 17, "text-anchor": "middle", "font-size": 11, fill: "#616e7c"}, s, fmtBytes(Hh.edges_bytes[e]));
    }
    sv("line", {x1: M.l, x2: M.l + pw, y1: M.t + ph + 0.5, y2: M.t + ph + 0.5, stroke: "#9aa5b1"}, s);
    sv("text", {x: M.l + pw / 2, y: Hgt - 12, "text-anchor": "middle", "font-size": 12, fill: "#323f4b"}, s,
       "message size (power-of-two bins, nccl-tests' size convention)");
    sv("text", {x: 14, y: M.t + ph / 2, "text-anchor": "middle", "font-size": 12, fill: "#323f4b",
                transform: "rotate(-90 14 " + (M.t + ph / 2) + ")"}, s, key === "bytes" ? "bytes" : "ops per iteration");
    legend(box, Hh.series.map(function (se) { return {label: se.label, color: se.color}; }));
  }
  what.redraw = draw;
  draw();
}
function drawSizes(S) {
  var c = card("sizes", "Message sizes",
    "How many ops of each size one iteration issues, by axis: small messages pay latency, large ones bandwidth.");
  var what = {mode: "counts"}, views = [];
  if (S.predicted) views.push({key: "predicted", label: "predicted (" + fmtCount(S.predicted.total_ops) + " ops)", h: S.predicted});
  if (S.measured) views.push({key: "measured", label: "measured (" + fmtCount(S.measured.total_ops) + " ops, mean of " +
                                S.measured.num_iterations + " iteration" + (S.measured.num_iterations === 1 ? "" : "s") + ")", h: S.measured});
  var current = views[0], holder;
  var bar = el("div", {class: "controls"}, c);
  buttons(bar, "count", [{key: "counts", label: "ops"}, {key: "bytes", label: "bytes"}], "counts",
          function (k) { what.mode = k; what.redraw(); });
  if (views.length > 1) buttons(bar, "source", views, current.key, function (k) {
    current = views.filter(function (v) { return v.key === k; })[0]; holder.textContent = ""; histogram(holder, current.h, what);
  });
  holder = el("div", null, c);
  histogram(holder, current.h, what);
  notesList(c, ["a collective counts once per group, a point-to-point transfer once (its send), an all_to_all once per issuing rank" +
                (S.measured ? "; measured: recv and setup records left out, per iteration" : "")]);
}

/* ---------------------------------------------------------------- iteration time */
function drawBreakdown(B) {
  var c = card("breakdown", "Where the iteration time goes",
    "The " + B.method + " estimate of one iteration, term by term (critical pipeline stage " + B.critical_stage + ").");
  var W = 1120, s = svgRoot(c, W, 92), L = 10, bw = W - 20, x = L;
  B.terms.forEach(function (t) {
    if (!(t.seconds > 0)) return;
    var w = bw * t.share, g = sv("g", null, s);
    titled(sv("rect", {x: x, y: 26, width: Math.max(w, 0.5), height: 40, fill: t.color, stroke: "#fff", "stroke-width": 1}, g),
           t.label + ": " + fmtSec(t.seconds) + " (" + fmtPct(t.share) + ")");
    if (w > 70) {
      sv("text", {x: x + w / 2, y: 44, "text-anchor": "middle", "font-size": 12, fill: t.key === "bubble" ? "#323f4b" : "#fff",
                  "font-weight": 600}, g, t.label);
      sv("text", {x: x + w / 2, y: 59, "text-anchor": "middle", "font-size": 11, fill: t.key === "bubble" ? "#323f4b" : "#fff"}, g,
         fmtPct(t.share));
    }
    x += w;
  });
  sv("text", {x: L, y: 16, "font-size": 12, fill: "#323f4b"}, s, B.label + " \u2014 " + fmtSec(B.iteration_time_s) + " per iteration");
  sv("text", {x: L + bw, y: 16, "font-size": 12, fill: "#616e7c", "text-anchor": "end"}, s,
     "communication " + fmtPct(B.comm_ratio) + " \u00b7 bubble " + fmtPct(B.bubble_ratio) + " \u00b7 " +
     fmtCount(B.tokens_per_s) + " tokens/s");
  var t = el("table", {style: "margin-top:8px"}, c), hr = el("tr", null, el("thead", null, t));
  el("th", null, hr, "");
  B.terms.forEach(function (term) {
    var th = el("th", null, hr);
    el("span", {class: "sw"}, th).style.background = term.color;
    th.appendChild(document.createTextNode(term.label));
  });
  el("th", null, hr, "iteration");
  var tb = el("tbody", null, t), r1 = el("tr", null, tb), r2 = el("tr", null, tb);
  el("td", null, r1, "seconds"); el("td", null, r2, "share");
  B.terms.forEach(function (term) { el("td", null, r1, fmtSec(term.seconds)); el("td", null, r2, fmtPct(term.share)); });
  el("td", null, r1, fmtSec(B.iteration_time_s)); el("td", null, r2, "100%");
  if (B.plan) drawPlan(c, B);
}
function drawPlan(c, B) {
  var P = B.plan;
  el("h2", {style: "margin-top:18px"}, c, "Top configurations of the plan");
  el("p", {class: "what"}, c, P.num_gpus.toLocaleString("en-US") + " GPUs, global batch " + P.global_batch_size + ": " +
     fmtCount(P.num_candidates) + " candidates, " + fmtCount(P.num_valid) + " valid, " + fmtCount(P.num_fit) +
     " fit in memory; the fastest, estimated op by op, beside this job.");
  var cols = [{label: "this job", sub: B.label, terms: B.terms, iteration_time_s: B.iteration_time_s, reason: ""}].concat(
    P.entries.map(function (e) { return {label: "#" + e.rank, sub: e.label, terms: e.terms, iteration_time_s: e.iteration_time_s,
                                         reason: e.reason + " \u00b7 " + sig(e.memory_GiB) + " GiB \u00b7 MFU " + fmtPct(e.mfu)}; }));
  var W = 1120, H = 360, M = {l: 70, r: 10, t: 14, b: 100}, pw = W - M.l - M.r, ph = H - M.t - M.b;
  var s = svgRoot(c, W, H);
  var ticks = niceTicks(Math.max.apply(null, cols.map(function (k) { return k.iteration_time_s; })), 5), top = ticks[ticks.length - 1];
  ticks.forEach(function (t) {
    var y = M.t + ph - ph * t / top;
    sv("line", {x1: M.l, x2: M.l + pw, y1: y, y2: y, stroke: "#eef0f3"}, s);
    sv("text", {x: M.l - 8, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#616e7c"}, s, fmtSec(t));
  });
  var slot = pw / cols.length, bw = Math.min(64, slot * 0.6);
  cols.forEach(function (k, i) {
    var x = M.l + i * slot + (slot - bw) / 2, y = M.t + ph;
    var g = titled(sv("g", null, s), k.label + ": " + k.sub + " \u2014 " + fmtSec(k.iteration_time_s) + (k.reason ? "\n" + k.reason : ""));
    k.terms.forEach(function (t) {
      if (!(t.seconds > 0)) return;
      var h = ph * t.seconds / top;
      titled(sv("rect", {x: x, y: y - h, width: bw, height: h, fill: t.color}, g), t.label + ": " + fmtSec(t.seconds));
      y -= h;
    });
    sv("text", {x: x + bw / 2, y: y - 5, "text-anchor": "middle", "font-size": 11, fill: "#323f4b"}, g, fmtSec(k.iteration_time_s));
    sv("text", {x: x + bw / 2, y: M.t + ph + 16, "text-anchor": "middle", "font-size": 12, "font-weight": 600,
                fill: i === 0 ? "#3e6ea8" : "#323f4b"}, g, k.label);
    var parts = [];
    k.sub.split(" \u00b7 ").forEach(function (p) {  /* one line per word where the column is narrow */
      if (p.length * 5.6 > slot - 6) parts = parts.concat(p.split(" ")); else parts.push(p);
    });
    parts.forEach(function (p, j) {
      sv("text", {x: x + bw / 2, y: M.t + ph + 31 + 13 * j, "text-anchor": "middle", "font-size": 10, fill: "#616e7c"}, g, p);
    });
  });
  legend(c, B.terms.map(function (t) { return {label: t.label, color: t.color}; }));
  notesList(c, P.notes);
}

/* ---------------------------------------------------------------- pipeline schedule */
function drawSchedule(S) {
  var c = card("schedule", "Pipeline schedule of one iteration",
    "Each row is a pipeline stage; boxes are forward (light) and backward (dark) passes of a micro-batch, numbered; " +
    "hatched gaps are the bubble, where a stage waits.");
  if (!S.schedules.length) { notesList(c, S.notes); return; }
  var current = S.schedules.filter(function (x) { return x.configured; })[0] || S.schedules[0];
  var requested = PARAMS.get("schedule");
  S.schedules.forEach(function (x) { if (requested && x.name === requested) current = x; });
  if (S.schedules.length > 1) buttons(c, "schedule", S.schedules.map(function (x) { return {key: x.label, label: x.label}; }), current.label,
    function (k) { current = S.schedules.filter(function (x) { return x.label === k; })[0]; draw(); });
  var stat = el("p", {class: "stat"}, c);
  var canvas = el("canvas", {id: "schedule-canvas", "aria-label": "pipeline timeline"}, c);
  legend(c, [{label: "forward", color: "#9ec5e8"}, {label: "backward", color: "#3a78b5"},
             {label: "bubble (idle)", color: "#f6d7d3", border: "1px solid #e0a39a"}].concat(
             S.tail.map(function (t) { return {label: t.label, color: t.color}; })));
  notesList(c, S.notes);
  var ctx, M = {l: 74, r: 14, t: 8, b: 34}, W = 1120, rowH, total, pw, byStage;
  var hatch = document.createElement("canvas"); hatch.width = 8; hatch.height = 8;
  var hc = hatch.getContext("2d");
  hc.fillStyle = "#fbe9e6"; hc.fillRect(0, 0, 8, 8);
  hc.strokeStyle = "#e9b3aa"; hc.lineWidth = 1.5; hc.beginPath(); hc.moveTo(0, 8); hc.lineTo(8, 0); hc.moveTo(-2, 2); hc.lineTo(2, -2);
  hc.moveTo(6, 10); hc.lineTo(10, 6); hc.stroke();
  function chunkColor(kind, chunk, v) {
    var base = kind === "fwd" ? [158, 197, 232] : [58, 120, 181];
    return rgb(v > 1 ? mix(base, kind === "fwd" ? [120, 170, 220] : [24, 72, 130], chunk / Math.max(1, v - 1)) : base);
  }
  function draw() {
    var X = current, p = X.pp, sl = X.slots;
    rowH = Math.max(9, Math.min(28, Math.floor(440 / p)));
    ctx = sizeCanvas(canvas, W, M.t + p * rowH + M.b);
    total = X.makespan_s + S.tail.reduce(function (a, t) { return a + t.seconds; }, 0);
    pw = W - M.l - M.r;
    var xs = function (t) { return M.l + pw * t / total; };
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, canvas.cssHeight);
    var pattern = ctx.createPattern(hatch, "repeat");
    ctx.font = "11px system-ui, sans-serif";
    for (var st = 0; st < p; st++) {
      var y = M.t + st * rowH;
      ctx.fillStyle = pattern; ctx.fillRect(xs(0), y + 1, xs(X.makespan_s) - xs(0), rowH - 2);
      ctx.fillStyle = "#52606d"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
      if (rowH >= 11 || st % Math.ceil(11 / rowH) === 0) ctx.fillText("stage " + st, M.l - 8, y + rowH / 2);
    }
    byStage = [];
    for (var s2 = 0; s2 < p; s2++) byStage.push([]);
    for (var i = 0; i < sl.stage.length; i++) {
      var s = sl.stage[i], x0 = xs(sl.t_start_s[i]), x1 = xs(sl.t_end_s[i]), yy = M.t + s * rowH;
      byStage[s].push(i);
      ctx.fillStyle = chunkColor(sl.kind[i], sl.chunk[i], X.virtual_pipeline_size);
      ctx.fillRect(x0, yy + 1, Math.max(x1 - x0 - (x1 - x0 > 3 ? 1 : 0), 0.6), rowH - 2);
      if (x1 - x0 >= 15 && rowH >= 12) {
        ctx.fillStyle = sl.kind[i] === "fwd" ? "#1f3b57" : "#fff"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
        ctx.fillText(String(sl.micro_batch[i]), (x0 + x1) / 2, yy + rowH / 2 + 0.5);
      }
    }
    var t0 = X.makespan_s;
    S.tail.forEach(function (t) {
      ctx.fillStyle = t.color; ctx.fillRect(xs(t0), M.t + 1, Math.max(xs(t0 + t.seconds) - xs(t0), 1), p * rowH - 2);
      if (xs(t0 + t.seconds) - xs(t0) > 30) {
        ctx.save(); ctx.fillStyle = "#fff"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
        ctx.fillText(t.key.toUpperCase(), (xs(t0) + xs(t0 + t.seconds)) / 2, M.t + p * rowH / 2); ctx.restore();
      }
      t0 += t.seconds;
    });
    var ticks = niceTicks(total, 8), base = M.t + p * rowH;
    ctx.strokeStyle = "#9aa5b1"; ctx.beginPath(); ctx.moveTo(M.l, base + 0.5); ctx.lineTo(M.l + pw, base + 0.5); ctx.stroke();
    ctx.fillStyle = "#616e7c"; ctx.textAlign = "center"; ctx.textBaseline = "top";
    ticks.forEach(function (t) {
      if (t > total * 1.0001) return;
      ctx.beginPath(); ctx.moveTo(xs(t) + 0.5, base); ctx.lineTo(xs(t) + 0.5, base + 4); ctx.stroke();
      ctx.fillText(fmtSec(t), xs(t), base + 7);
    });
    canvas.setAttribute("data-slots", String(sl.stage.length));
    stat.textContent = "";
    var add = function (label, value) { el("b", null, stat, label + " "); stat.appendChild(document.createTextNode(value + "    ")); };
    add(X.label + ":", "p = " + X.pp + ", m = " + X.num_micro_batches + (X.virtual_pipeline_size > 1 ? ", v = " + X.virtual_pipeline_size : ""));
    add("pipeline", fmtSec(X.makespan_s));
    add("idle", fmtPct(X.idle_fraction) + " of stage time (" + fmtSec(X.idle_s[0]) + " per stage on stage 0)");
    add("iteration", fmtSec(X.makespan_s + S.tail.reduce(function (a, t) { return a + t.seconds; }, 0)) +
        " (estimate " + fmtSec(S.iteration_time_s) + ")");
  }
  canvas.addEventListener("mousemove", function (evt) {
    var pt = canvasPoint(canvas, evt), st = Math.floor((pt[1] - M.t) / rowH), X = current, sl = X.slots;
    if (st < 0 || st >= X.pp || pt[0] < M.l) { hideTip(); return; }
    var t = (pt[0] - M.l) / pw * total;
    if (t > X.makespan_s) {
      var t0 = X.makespan_s;
      for (var j = 0; j < S.tail.length; j++) {
        if (t <= t0 + S.tail[j].seconds) { showTip(evt, S.tail[j].label, [fmtSec(S.tail[j].seconds) + ", after the pipeline flush"]); return; }
        t0 += S.tail[j].seconds;
      }
      hideTip(); return;
    }
    var ids = byStage[st];
    for (var k = 0; k < ids.length; k++) {
      var i = ids[k];
      if (t >= sl.t_start_s[i] && t <= sl.t_end_s[i]) {
        showTip(evt, "stage " + st + " \u00b7 micro-batch " + sl.micro_batch[i] + (X.virtual_pipeline_size > 1 ? " \u00b7 chunk " + sl.chunk[i] : ""),
                [(sl.kind[i] === "fwd" ? "forward" : "backward") + ", " + fmtSec(sl.t_start_s[i]) + " \u2192 " + fmtSec(sl.t_end_s[i])]);
        return;
      }
    }
    showTip(evt, "stage " + st + ": bubble", ["idle at " + fmtSec(t)]);
  });
  canvas.addEventListener("mouseleave", hideTip);
  draw();
}

/* ---------------------------------------------------------------- measured vs predicted */
function drawMeasured(Mm) {
  var c = card("measured", "Measured vs predicted",
    "Bytes per iteration of each axis's ops (sum of message sizes), from the measured ranks' op logs and from the prediction.");
  var rows = Mm.rows, hasPred = rows.some(function (r) { return r.predicted_bytes !== null; });
  var W = 1120, lh = hasPred ? 44 : 28, L = 70, R = 380, H = rows.length * lh + 16;
  var s = svgRoot(c, W, H), defs = sv("defs", null, s), bw = W - L - R;
  var max = Math.max.apply(null, rows.map(function (r) { return Math.max(r.measured_bytes || 0, r.predicted_bytes || 0); }).concat([1]));
  rows.forEach(function (r, i) {
    var y = 6 + i * lh, g = sv("g", null, s);
    sv("text", {x: L - 10, y: y + (hasPred ? 21 : 14), "text-anchor": "end", "font-size": 13, fill: "#323f4b"}, g, r.label);
    var yy = y + 2;
    if (hasPred) {
      titled(sv("rect", {x: L, y: yy, width: bw * (r.predicted_bytes || 0) / max, height: 15, fill: r.color}, g),
             "predicted " + fmtBytes(r.predicted_bytes));
      sv("text", {x: L + bw * (r.predicted_bytes || 0) / max + 6, y: yy + 12, "font-size": 11, fill: "#616e7c"}, g,
         "predicted " + fmtBytes(r.predicted_bytes));
      yy += 18;
    }
    titled(sv("rect", {x: L, y: yy, width: bw * r.measured_bytes / max, height: 15, fill: stripes(defs, "ms-" + r.axis, r.color)}, g),
           "measured " + fmtBytes(r.measured_bytes));
    sv("text", {x: L + bw * r.measured_bytes / max + 6, y: yy + 12, "font-size": 11, fill: "#616e7c"}, g, "measured " + fmtBytes(r.measured_bytes));
    if (hasPred) sv("text", {x: W - 10, y: y + 21, "text-anchor": "end", "font-size": 13, "font-weight": 600,
                             fill: r.ratio !== null && Math.abs(r.ratio - 1) <= 0.05 ? "#2f855a" : "#b7791f"}, g,
                    r.ratio === null ? "not predicted" : "measured/predicted " + fmtRatio(r.ratio));
  });
  legend(c, (hasPred ? [{label: "predicted", color: "#7b8794"}] : []).concat([{label: "measured (striped)", color: "repeating-linear-gradient(45deg,#7b8794 0 3px,#d9dde2 3px 6px)"}]));
  var t = el("table", null, c), hr = el("tr", null, el("thead", null, t));
  ["axis", "measured bytes", "predicted bytes", "ratio", "measured ops", "predicted ops"].forEach(function (h) { el("th", null, hr, h); });
  var tb = el("tbody", null, t);
  rows.forEach(function (r) {
    var tr = el("tr", null, tb), td = el("td", null, tr);
    el("span", {class: "sw"}, td).style.background = r.color;
    td.appendChild(document.createTextNode(r.label));
    [fmtBytes(r.measured_bytes), fmtBytes(r.predicted_bytes), fmtRatio(r.ratio), fmtCount(r.measured_ops),
     fmtCount(r.predicted_ops)].forEach(function (v) { el("td", null, tr, v); });
  });
  var tr = el("tr", null, tb);
  ["all", fmtBytes(Mm.measured_total_bytes), fmtBytes(Mm.predicted_total_bytes), fmtRatio(Mm.ratio), "", ""].forEach(function (v) { el("td", null, tr, v); });
  notesList(c, Mm.notes);
}

/* ---------------------------------------------------------------- bandwidth curves */
var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"];
function drawBench(Bn) {
  var c = card("bench", "Bus bandwidth against message size",
    "Measured busbw of each collective and group size (nccl-tests' definition); dashed: what the cluster model assumes.");
  var W = 1120, H = 380, M = {l: 70, r: 210, t: 14, b: 46}, pw = W - M.l - M.r, ph = H - M.t - M.b;
  var s = svgRoot(c, W, H), series = Bn.series, hidden = {};
  var sizes = [], ymax = 1;
  series.forEach(function (se) {
    sizes = sizes.concat(se.size_bytes);
    se.busbw_bytes_per_s.concat(se.model_busbw_bytes_per_s || []).forEach(function (v) { if (v > ymax) ymax = v; });
  });
  var lx0 = Math.log2(Math.max(1, Math.min.apply(null, sizes))), lx1 = Math.log2(Math.max.apply(null, sizes));
  if (lx1 - lx0 < 1) { lx0 -= 1; lx1 += 1; }
  var ticks = niceTicks(ymax / 1e9, 6), top = ticks[ticks.length - 1] * 1e9;
  var X = function (b) { return M.l + pw * (Math.log2(b) - lx0) / (lx1 - lx0); }, Y = function (v) { return M.t + ph - ph * v / top; };
  var plot = sv("g", null, s);
  function draw() {
    plot.textContent = "";
    ticks.forEach(function (t) {
      sv("line", {x1: M.l, x2: M.l + pw, y1: Y(t * 1e9), y2: Y(t * 1e9), stroke: "#eef0f3"}, plot);
      sv("text", {x: M.l - 8, y: Y(t * 1e9) + 4, "text-anchor": "end", "font-size": 11, fill: "#616e7c"}, plot, sig(t) + "");
    });
    var stepE = Math.max(1, Math.ceil((lx1 - lx0) / 10));
    for (var e = Math.ceil(lx0); e <= lx1; e += stepE) {
      sv("line", {x1: X(Math.pow(2, e)), x2: X(Math.pow(2, e)), y1: M.t, y2: M.t + ph, stroke: "#f3f4f6"}, plot);
      sv("text", {x: X(Math.pow(2, e)), y: M.t + ph + 16, "text-anchor": "middle", "font-size": 11, fill: "#616e7c"}, plot, fmtBytes(Math.pow(2, e)));
    }
    sv("line", {x1: M.l, x2: M.l + pw, y1: M.t + ph + 0.5, y2: M.t + ph + 0.5, stroke: "#9aa5b1"}, plot);
    sv("text", {x: M.l + pw / 2, y: H - 6, "text-anchor": "middle", "font-size": 12, fill: "#323f4b"}, plot, "message size (log scale)");
    sv("text", {x: 16, y: M.t + ph / 2, "text-anchor": "middle", "font-size": 12, fill: "#323f4b",
                transform: "rotate(-90 16 " + (M.t + ph / 2) + ")"}, plot, "bus bandwidth (GB/s)");
    series.forEach(function (se, i) {
      if (hidden[i]) return;
      var col = PALETTE[i % PALETTE.length];
      if (se.model_busbw_bytes_per_s) {
        var pts = [];
        se.size_bytes.forEach(function (b, j) { var v = se.model_busbw_bytes_per_s[j]; if (v !== null) pts.push(X(b) + "," + Y(v)); });
        sv("polyline", {points: pts.join(" "), fill: "none", stroke: col, "stroke-width": 1.5, "stroke-dasharray": "5 4", opacity: 0.75}, plot);
      }
      sv("polyline", {points: se.size_bytes.map(function (b, j) { return X(b) + "," + Y(se.busbw_bytes_per_s[j]); }).join(" "),
                      fill: "none", stroke: col, "stroke-width": 2.2}, plot);
      se.size_bytes.forEach(function (b, j) {
        var noisy = se.noisy && se.noisy[j];
        titled(sv("circle", {cx: X(b), cy: Y(se.busbw_bytes_per_s[j]), r: noisy ? 3.5 : 3, fill: noisy ? "#fff" : col, stroke: col,
                             "stroke-width": noisy ? 1.5 : 0}, plot),
               se.label + ": " + fmtBytes(b) + " \u2192 " + fmtGBps(se.busbw_bytes_per_s[j]) +
               (se.time_s[j] !== null && se.time_s[j] !== undefined ? ", " + fmtSec(se.time_s[j]) : "") + (noisy ? " (noisy)" : "") +
               (se.model_busbw_bytes_per_s && se.model_busbw_bytes_per_s[j] !== null ? " (model " + fmtGBps(se.model_busbw_bytes_per_s[j]) + ")" : ""));
      });
    });
  }
  var lg = sv("g", null, s);
  series.forEach(function (se, i) {
    var y = M.t + 6 + i * 18, g = sv("g", {style: "cursor:pointer"}, lg);
    var swatch = sv("rect", {x: M.l + pw + 16, y: y - 6, width: 14, height: 4, fill: PALETTE[i % PALETTE.length]}, g);
    var label = sv("text", {x: M.l + pw + 36, y: y, "font-size": 12, fill: "#323f4b"}, g, se.label);
    g.addEventListener("click", function () {
      hidden[i] = !hidden[i]; label.setAttribute("opacity", hidden[i] ? 0.35 : 1); swatch.setAttribute("opacity", hidden[i] ? 0.35 : 1); draw();
    });
  });
  draw();
  var meta = Bn.meta || {}, keys = Object.keys(meta);
  if (keys.length) {
    var t = el("table", {class: "kv"}, c), tb = el("tbody", null, t);
    keys.forEach(function (k) {
      var tr = el("tr", null, tb);
      el("td", null, tr, k);
      el("td", null, tr, plain(meta[k]));
    });
  }
  notesList(c, ["source: " + Bn.source].concat(Bn.notes));
}

/* ---------------------------------------------------------------- MoE routing */
function matrixCanvas(parent, mat, vmax, px, id) {
  var n = mat.length, sc = Math.max(1, Math.floor(px / n)), cv = el("canvas", {id: id}, parent);
  var ctx = sizeCanvas(cv, n * sc, n * sc);
  for (var i = 0; i < n; i++) for (var j = 0; j < n; j++) {
    ctx.fillStyle = rgb(viridis(vmax > 0 ? mat[i][j] / vmax : 0));
    ctx.fillRect(j * sc, i * sc, sc, sc);
  }
  return cv;
}
function drawMoe(Mo) {
  var c = card("moe", "MoE routing over iterations",
    "Tokens each expert-parallel rank (row) sends to each (column) per iteration: how the all-to-all pattern moves as training goes on.");
  Mo.items.forEach(function (it, idx) {
    var box = el("div", {style: idx ? "margin-top:18px;border-top:1px solid #e4e7eb;padding-top:12px" : ""}, c);
    el("div", {class: "stat"}, box).textContent = it.name + " \u2014 ep = " + it.ep + ", " + fmtCount(it.num_iterations) +
      " iterations (" + it.frames.length + " shown)";
    var row = el("div", {class: "row"}, box), left = el("div", null, row), right = el("div", {class: "side"}, row);
    var big = el("div", null, left), ctl = el("div", {class: "controls"}, left);
    el("span", {class: "lab"}, ctl, "iteration");
    var slider = el("input", {type: "range", min: 0, max: it.frames.length - 1, value: 0, step: 1}, ctl);
    var lab = el("span", {class: "lab"}, ctl);
    var chart = el("div", null, right);
    var strip = el("div", {class: "frames"}, box), figs = [];
    var pick = [];
    var k = Math.min(10, it.frames.length);
    for (var q = 0; q < k; q++) pick.push(Math.round(q * (it.frames.length - 1) / Math.max(1, k - 1)));
    pick = pick.filter(function (v, i, a) { return a.indexOf(v) === i; });
    pick.forEach(function (f) {
      var fig = el("figure", null, strip);
      matrixCanvas(fig, it.matrices[f], it.max_tokens, 84);
      el("figcaption", null, fig, "it " + it.frames[f]);
      fig.addEventListener("click", function () { slider.value = f; show(f); });
      figs.push([f, fig]);
    });
    var marker;
    function show(f) {
      big.textContent = "";
      var cv = matrixCanvas(big, it.matrices[f], it.max_tokens, 300, "moe-" + idx);
      el("div", {class: "muted", style: "font-size:11px"}, big, "row: sending EP rank (0 at the top) \u00b7 column: receiving EP rank");
      cv.addEventListener("mousemove", function (evt) {
        var p = canvasPoint(cv, evt), n = it.ep, i = Math.floor(p[1] / (cv.cssHeight / n)), j = Math.floor(p[0] / (cv.cssWidth / n));
        if (i < 0 || j < 0 || i >= n || j >= n) { hideTip(); return; }
        showTip(evt, "EP rank " + i + " \u2192 " + j, [fmtCount(it.matrices[f][i][j]) + " tokens, iteration " + it.frames[f]]);
      });
      cv.addEventListener("mouseleave", hideTip);
      var m = it.metrics, fi = it.frames[f];
      lab.textContent = it.frames[f] + "  \u00b7  load imbalance " + m.load_imbalance[fi].toFixed(2) + "  \u00b7  cross-rank " +
        fmtPct(m.cross_rank_fraction[fi]) + "  \u00b7  entropy " + m.entropy[fi].toFixed(2);
      figs.forEach(function (x) { x[1].className = x[0] === f ? "on" : ""; });
      if (marker) { var xx = marker.x(fi); marker.line.setAttribute("x1", xx); marker.line.setAttribute("x2", xx); }
    }
    slider.addEventListener("input", function () { show(+slider.value); });
    marker = metricChart(chart, it);
    show(0);
  });
  legend(c, [{label: "0 tokens", color: rgb(viridis(0))}, {label: "half", color: rgb(viridis(0.5))},
             {label: "the most tokens of any pair in the file (" + Mo.items.map(function (it) { return it.name + ": " + fmtCount(it.max_tokens); }).join(", ") + ")",
              color: rgb(viridis(1))}]);
  notesList(c, Mo.notes.concat(["load imbalance: the busiest rank's received tokens over the mean (1 = balanced); " +
    "cross-rank: share of tokens leaving their rank; entropy: of the (src, dst) distribution, 1 = uniform"]));
}
function metricChart(parent, it) {
  var W = 520, H = 220, M = {l: 46, r: 12, t: 10, b: 30}, pw = W - M.l - M.r, ph = H - M.t - M.b, n = it.num_iterations;
  var s = svgRoot(parent, W, H), m = it.metrics;
  var series = it.series || [{key: "load_imbalance", label: "load imbalance (max / mean)", color: "#e15759"},
    {key: "cross_rank_fraction", label: "cross-rank fraction", color: "#4e79a7"},
    {key: "entropy", label: "normalised entropy", color: "#59a14f"}];
  var ymax = 2;
  series.forEach(function (q) { m[q.key].forEach(function (v) { if (v !== null && v > ymax) ymax = v; }); });
  var ticks = niceTicks(ymax, 4), top = ticks[ticks.length - 1];
  var X = function (i) { return M.l + pw * (n > 1 ? i / (n - 1) : 0.5); }, Y = function (v) { return M.t + ph - ph * v / top; };
  ticks.forEach(function (t) {
    sv("line", {x1: M.l, x2: M.l + pw, y1: Y(t), y2: Y(t), stroke: "#eef0f3"}, s);
    sv("text", {x: M.l - 6, y: Y(t) + 4, "text-anchor": "end", "font-size": 10, fill: "#616e7c"}, s, sig(t));
  });
  var step = Math.max(1, Math.ceil(n / 2000));
  function line(vals, col, label) {
    var pts = [];
    for (var i = 0; i < n; i += step) if (vals[i] !== null) pts.push(X(i).toFixed(1) + "," + Y(vals[i]).toFixed(1));
    titled(sv("polyline", {points: pts.join(" "), fill: "none", stroke: col, "stroke-width": 1.8}, s), label);
  }
  series.forEach(function (q) { line(m[q.key], q.color, q.label); });
  sv("text", {x: M.l + pw / 2, y: H - 6, "text-anchor": "middle", "font-size": 11, fill: "#323f4b"}, s, "iteration");
  sv("text", {x: M.l, y: H - 6, "font-size": 10, fill: "#616e7c"}, s, "0");
  sv("text", {x: M.l + pw, y: H - 6, "text-anchor": "end", "font-size": 10, fill: "#616e7c"}, s, String(n - 1));
  var lineEl = sv("line", {x1: X(0), x2: X(0), y1: M.t, y2: M.t + ph, stroke: "#323f4b", "stroke-dasharray": "3 3"}, s);
  legend(parent, series.map(function (q) { return {label: q.label, color: q.color}; }));
  return {line: lineEl, x: X};
}

/* ---------------------------------------------------------------- inputs */
function plain(v) {
  if (Array.isArray(v)) return v.map(plain).join(", ");
  if (v !== null && typeof v === "object") return Object.keys(v).filter(function (k) { return k !== "source"; }).map(function (k) {
    return k + ": " + plain(v[k]); }).join(" \u00b7 ");
  return String(v);
}
function drawInputs(I) {
  var c = card("inputs", "Inputs", "What produced this report, so that it can be reproduced.");
  if (I.command_line) {
    el("div", {class: "stat"}, c, "command line");
    var pre = el("pre", {id: "command-line"}, c, I.command_line);
    var b = el("button", {class: "btn", type: "button"}, c, "copy command");
    b.addEventListener("click", function () {
      if (navigator.clipboard) navigator.clipboard.writeText(I.command_line).then(function () { b.textContent = "copied"; }, function () {
        b.textContent = "select the text above to copy"; });
      var range = document.createRange(); range.selectNodeContents(pre);
      var sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range);
    });
  }
  var row = el("div", {class: "row", style: "margin-top:10px"}, c);
  [["model", I.model], ["parallelism", I.parallel], ["cluster", I.cluster]].forEach(function (pair) {
    if (!pair[1]) return;
    var box = el("div", {class: "side"}, row);
    el("div", {class: "stat"}, box).textContent = pair[0];
    var t = el("table", {class: "kv"}, box), tb = el("tbody", null, t);
    Object.keys(pair[1]).forEach(function (k) {
      if (k === "source") return;  /* long citations: in the JSON below */
      var v = pair[1][k], tr = el("tr", null, tb);
      el("td", null, tr, k);
      el("td", null, tr, plain(v));
    });
  });
  var extra = {commscope_version: I.commscope_version, algorithm: I.algorithm, estimate_method: I.estimate_method, gpu_util: I.gpu_util};
  var files = I.files || {};
  Object.keys(files).forEach(function (k) { extra[k] = Array.isArray(files[k]) ? files[k].join(", ") : files[k]; });
  var t2 = el("table", {class: "kv", style: "margin-top:10px"}, c), tb2 = el("tbody", null, t2);
  Object.keys(extra).forEach(function (k) {
    if (extra[k] === undefined || extra[k] === null) return;
    var tr = el("tr", null, tb2); el("td", null, tr, k); el("td", null, tr, String(extra[k]));
  });
  var det = el("details", null, c);
  el("summary", null, det, "all inputs as JSON (with the presets' sources)");
  el("pre", null, det, JSON.stringify(I, null, 2));
}

/* ---------------------------------------------------------------- assemble */
if (D.heatmap) section("heatmap", function () { drawHeatmap(D.heatmap, "heatmap", "Who sends to whom"); });
if (D.bytes) section("bytes", function () { drawBytes(D.bytes); });
if (D.breakdown) section("breakdown", function () { drawBreakdown(D.breakdown); });
if (D.schedule) section("schedule", function () { drawSchedule(D.schedule); });
if (D.message_sizes && (D.message_sizes.predicted || D.message_sizes.measured)) section("sizes", function () { drawSizes(D.message_sizes); });
if (D.measured) section("measured", function () { drawMeasured(D.measured); });
if (D.measured_heatmap) section("measured heatmap", function () {
  drawHeatmap(D.measured_heatmap, "measured-heatmap", "Who sent to whom (measured)",
              "The measured ops decomposed into flows by the same code as the prediction (logical view), per iteration.");
});
if (D.bench) section("bench", function () { drawBench(D.bench); });
if (D.moe) section("moe", function () { drawMoe(D.moe); });
section("inputs", function () { drawInputs(D.inputs || {}); });
section("notes", function () {
  if (!D.notes || !D.notes.length) return;
  var c = card("notes", "Notes", "What the prediction and the estimate assumed.");
  notesList(c, D.notes);
});
section("footer", function () {
  document.getElementById("footer").textContent = "commscope " + (D.inputs && D.inputs.commscope_version || "") +
    " \u00b7 data format " + D.format + " v" + D.format_version + " \u00b7 built in " + fmtSec(D.build_s) +
    " \u00b7 self-contained: no request leaves this page";
});
document.body.setAttribute("data-ready", "1");
})();
"""
