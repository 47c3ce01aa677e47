"""The section builders of the HTML report: each turns one library result into the JSON-ready numbers the page draws.

====================  =======================================================================
heatmap_section       per-axis sparse cells, GPU level up to 1,024 GPUs, node level above;
                      each cell the largest entry of the block it covers when pooled
bytes_section         bytes by axis and by link class (intra-node / inter-node), shares
message_size_section  histogram of op sizes in powers of two, per axis (ops and bytes)
breakdown_section     the iteration-time terms of an estimate, and of a plan's top entries
schedule_section      the timed pipeline schedule (1F1B / interleaved / GPipe) with bubbles
compare_measured      measured vs predicted bytes per axis (the arithmetic, for the page and tests)
bench_section         bus-bandwidth curves of a benchmark, with the cluster model's curve
time_section          measured against predicted in time, per op and per step
====================  =======================================================================

Each is usable alone; :func:`commscope.report.html.build_report_data` calls those whose input it has. The MoE
section is :mod:`commscope.report.moe_section`; the counting that compares measured with predicted ops,
:mod:`commscope.report.counts`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.commop import REPORT_AXES
from commscope.report.counts import logical_measured_ops, measured_bytes_by_axis, predicted_bytes_by_axis, with_axes
from commscope.report.loaders import BenchResult, MeasuredLogs

__all__ = ["AUTO_GPU_LEVEL_MAX", "AXIS_STYLE", "HTML_MAX_CELLS", "MAX_SCHEDULE_SLOTS", "TERMS", "bench_section",
           "breakdown_section", "bytes_section", "compare_measured", "heatmap_section", "measured_heatmap_section",
           "message_size_section", "per_iteration", "schedule_section", "size_histogram", "time_section"]

#: Worlds up to this many GPUs are drawn GPU by GPU, larger ones node by node (as the PNG heatmaps).
AUTO_GPU_LEVEL_MAX = 1024
#: Most cells per side of the page's heatmap; above it each cell is the largest entry of a block.
HTML_MAX_CELLS = 512
#: Most slots of a pipeline timeline kept in the page (2 m v p slots per schedule).
MAX_SCHEDULE_SLOTS = 60_000

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
