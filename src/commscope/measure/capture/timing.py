"""Measured against predicted in time: op durations, effective bandwidth, exposed communication, step time.

A recorded op carries the time it was issued (``t_start_ns``) and the time the job first saw it complete
(``t_end_ns``: when ``wait()`` returned, or else at the next op, step mark or the end of the recording, an
upper bound). Its measured duration is the difference, on the rank that recorded it. For each record this
module also asks the bandwidth model (the cluster's alpha-beta tiers, or a measured/fitted model:
``--bandwidth``) how long the same op, size and group should take, and compares:

- per axis, op kind and message-size bin (powers of two): the measured duration's median and p95, the
  model's, the achieved bus bandwidth ``size x f(op, n) / t`` (nccl-tests' busbw [nccl-tests-perf]) beside the
  model's, and the **effective-bandwidth factor** = model time / measured time (the median over records of
  the bin): 1 means the op ran in training as fast as the micro-benchmark says; 0.25 means it took 4x as long.
  The seed talk's overhead analysis, measured on the user's own job [seed-talk].
- **exposed communication**, per rank and step: the length of the union of the rank's op intervals inside
  its step (the interval the job marked, ``commscope.measure.capture.step``), per axis and over all axes, against the
  step time. What the union covers is time in which the rank had communication outstanding; without compute
  records it cannot tell an op that waited from one that ran under compute, so it is an upper bound on the
  exposed time (exact for ops the rank waited on at once, as gloo's synchronous collectives).
- the **predicted step** (:func:`commscope.estimate.estimate`, refined, on the given cluster and bandwidth
  model) against the measured step times (per step the slowest rank), term by term: communication per axis
  (predicted exposed + hidden, measured union), and the rest (predicted compute, optimizer and bubble;
  measured step minus the union of all communication).

Every record of a measured step gets a predicted duration; setup records (before the first step) are
counted apart. Pure functions of a :class:`~commscope.measure.capture.analysis.RunLog`: numpy and the standard library.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from commscope.estimate.bandwidth import BandwidthModel, GroupSpan, busbw_factor
from commscope.measure.capture.analysis import RunLog, attribute_axes, op_step
from commscope.commop import CommOp

__all__ = ["TIME_AXES", "compare_time", "duration_table", "exposed_communication", "op_timings", "step_times"]

#: Axes a time comparison reports, in order.
TIME_AXES = ("tp", "pp", "dp", "ep", "cp", "emb", "other")
_NS = 1e-9


def _size_bin(size_bytes: int) -> int:
    """Upper bound of the power-of-two bin of ``size_bytes`` (as the size histogram bins)."""
    return 1 << max(0, int(size_bytes - 1).bit_length()) if size_bytes > 0 else 0


def _factor(op: str, n: int) -> float | None:
    try:
        return busbw_factor(op, n if op not in ("send", "recv") else 2)
    except ValueError:
        return None


def _members(op: CommOp) -> tuple[int, ...]:
    if op.op in ("send", "recv") and op.peer is not None and op.rank is not None:
        return (op.rank, op.peer)
    return op.group


def op_timings(run: RunLog, layout, bandwidth: BandwidthModel, gpus_per_node: int) -> list[dict[str, Any]]:
    """One row per timed record (both timestamps): rank, step (None: setup), axis, op, size, group size,
    measured and predicted seconds, achieved and model busbw (None where the op has no bus factor)."""
    rows = []
    spans: dict[tuple[int, ...], GroupSpan] = {}
    for rank, ops in sorted(run.ops_by_rank.items()):
        for op in attribute_axes(ops, layout):
            if op.t_start_ns is None or op.t_end_ns is None:
                continue
            members = _members(op)
            span = spans.get(members)
            if span is None:
                span = spans[members] = GroupSpan.of(members, gpus_per_node)
            measured = max(0.0, (op.t_end_ns - op.t_start_ns) * _NS)
            predicted = bandwidth.op_time_s(op.op, op.size_bytes, span) if op.size_bytes > 0 and span.n > 1 else 0.0
            f = _factor(op.op, span.n)
            rows.append({"rank": rank, "step": op_step(op), "axis": op.axis, "op": op.op, "size_bytes": op.size_bytes,
                         "group_size": span.n, "span": span, "t_start_ns": op.t_start_ns, "t_end_ns": op.t_end_ns,
                         "measured_s": measured, "predicted_s": predicted,
                         "achieved_busbw_bytes_per_s": op.size_bytes * f / measured if f and measured > 0 else None,
                         "model_busbw_bytes_per_s": op.size_bytes * f / predicted if f and predicted > 0 else None})
    return rows


def model_curves(timings: list[dict[str, Any]], bandwidth: BandwidthModel) -> list[dict[str, Any]]:
    """The bandwidth model's time of each (axis, op, group size) of ``timings`` at every power of two from half
    the smallest size of any of them to twice the largest (the span of its groups as the first record's): the
    curves the measured durations are compared with, over the whole range they are drawn on."""
    first: dict[tuple, dict[str, Any]] = {}
    for t in timings:
        if t["size_bytes"] > 0 and t["group_size"] > 1:
            first.setdefault((t["axis"], t["op"], t["group_size"]), t)
    if not first:
        return []
    sizes = [t["size_bytes"] for t in timings if t["size_bytes"] > 0]
    lo, hi = max(1, min(sizes) // 2), 2 * max(sizes)
    points = [1 << e for e in range(lo.bit_length() - 1, hi.bit_length())]
    out = []
    for key in sorted(first, key=lambda k: (_axis_order(k[0]), *k[1:])):
        row = first[key]
        out.append({"axis": key[0], "op": key[1], "group_size": key[2], "size_bytes": points,
                    "predicted_s": [bandwidth.op_time_s(row["op"], float(s), row["span"]) for s in points]})
    return out


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def duration_table(timings: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``by_bin``: per (axis, op, size bin, group size) the measured median/p95, the model's median, busbw and
    the effective-bandwidth factor; ``by_op``: per (axis, op) the same over all sizes, the factor as
    total model time over total measured time (weighted by time) beside the median of the per-record factors."""
    bins: dict[tuple, list[dict]] = defaultdict(list)
    kinds: dict[tuple, list[dict]] = defaultdict(list)
    for t in timings:
        bins[(t["axis"], t["op"], _size_bin(t["size_bytes"]), t["group_size"])].append(t)
        kinds[(t["axis"], t["op"])].append(t)

    def stats(rows: list[dict]) -> dict[str, Any]:
        meas = [r["measured_s"] for r in rows]
        ratios = [r["predicted_s"] / r["measured_s"] for r in rows if r["measured_s"] > 0 and r["predicted_s"] > 0]
        ach = [r["achieved_busbw_bytes_per_s"] for r in rows if r["achieved_busbw_bytes_per_s"] is not None]
        mod = [r["model_busbw_bytes_per_s"] for r in rows if r["model_busbw_bytes_per_s"] is not None]
        return {"count": len(rows), "median_size_bytes": int(np.median([r["size_bytes"] for r in rows])),
                "measured_median_s": _median(meas),
                "measured_p95_s": float(np.percentile(meas, 95)) if meas else None,
                "predicted_median_s": _median([r["predicted_s"] for r in rows]),
                "measured_total_s": float(sum(meas)), "predicted_total_s": float(sum(r["predicted_s"] for r in rows)),
                "achieved_busbw_bytes_per_s": _median(ach), "model_busbw_bytes_per_s": _median(mod),
                "factor": _median(ratios)}

    by_bin = [{"axis": a, "op": o, "le_bytes": b, "group_size": n, **stats(rows)}
              for (a, o, b, n), rows in sorted(bins.items(), key=lambda kv: (_axis_order(kv[0][0]), *kv[0][1:]))]
    by_op = []
    for (a, o), rows in sorted(kinds.items(), key=lambda kv: (_axis_order(kv[0][0]), kv[0][1])):
        s = stats(rows)
        s["time_weighted_factor"] = s["predicted_total_s"] / s["measured_total_s"] if s["measured_total_s"] > 0 else None
        by_op.append({"axis": a, "op": o, **s})
    return {"by_bin": by_bin, "by_op": by_op}


def _axis_order(axis: str) -> int:
    return TIME_AXES.index(axis) if axis in TIME_AXES else len(TIME_AXES)


def _union_s(intervals: list[tuple[int, int]]) -> float:
    """Total length of the union of [start, end) intervals (ns in, s out)."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total * _NS


def exposed_communication(run: RunLog, timings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank and marked step: step time, the union of the rank's op intervals inside the step (all axes and per
    axis; ops clipped to the step) and its share of the step. Empty when the job marked no step times."""
    by_rank_step: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for t in timings:
        if t["step"] is not None:
            by_rank_step[(t["rank"], t["step"])].append(t)
    out = []
    for rank, marks in sorted(run.steps_by_rank.items()):
        for m in marks:
            s0, s1 = m["t_start_ns"], m["t_end_ns"]
            step_s = max(0.0, (s1 - s0) * _NS)
            per_axis: dict[str, list[tuple[int, int]]] = defaultdict(list)
            for t in by_rank_step.get((rank, m["step"]), []):
                a, b = max(t["t_start_ns"], s0), min(t["t_end_ns"], s1)
                if b > a:
                    per_axis[t["axis"]].append((a, b))
            comm = _union_s([iv for ivs in per_axis.values() for iv in ivs])
            out.append({"rank": rank, "step": m["step"], "step_s": step_s, "comm_s": comm,
                        "comm_share": comm / step_s if step_s > 0 else None,
                        "by_axis_s": {a: _union_s(ivs) for a, ivs in sorted(per_axis.items(), key=lambda kv: _axis_order(kv[0]))}})
    return out


def step_times(exposed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per marked step: the slowest rank's step time, and the mean over ranks of exposed communication (total
    and per axis)."""
    steps: dict[int, list[dict]] = defaultdict(list)
    for row in exposed:
        steps[row["step"]].append(row)
    out = []
    for step, rows in sorted(steps.items()):
        axes = sorted({a for r in rows for a in r["by_axis_s"]}, key=_axis_order)
        out.append({"step": step, "step_s": max(r["step_s"] for r in rows), "num_ranks": len(rows),
                    "comm_s": float(np.mean([r["comm_s"] for r in rows])),
                    "by_axis_s": {a: float(np.mean([r["by_axis_s"].get(a, 0.0) for r in rows])) for a in axes}})
    return out


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values))}


def compare_time(prediction, run: RunLog, bandwidth: BandwidthModel, estimate) -> dict[str, Any]:
    """Everything this module measures for ``run`` against ``prediction`` timed by ``bandwidth`` and ``estimate``
    (see the module docstring), JSON-ready."""
    layout = prediction.workload.layout
    if layout.world_size != run.world_size:
        raise ValueError(f"the prediction has {layout.world_size} ranks, the logs {run.world_size}")
    gpn = prediction.cluster.gpus_per_node
    timings = op_timings(run, layout, bandwidth, gpn)
    has_steps = any(t["step"] is not None for t in timings)
    measured = [t for t in timings if t["step"] is not None] if has_steps else timings
    exposed = exposed_communication(run, timings)
    steps = step_times(exposed)
    step_s = [s["step_s"] for s in steps]
    terms = []
    if steps:
        est = estimate
        axes = sorted({a for s in steps for a in s["by_axis_s"]} | {a for a in TIME_AXES[:-1]
                                                                     if getattr(est, f"{a}_s", 0) > 0
                                                                     or est.hidden_s.get(a, 0) > 0}, key=_axis_order)
        for a in axes:
            pred = getattr(est, f"{a}_s", 0.0) + est.hidden_s.get(a, 0.0)
            meas = _spread([s["by_axis_s"].get(a, 0.0) for s in steps])
            terms.append({"term": f"{a} communication", "axis": a, "predicted_s": pred,
                          "predicted_exposed_s": getattr(est, f"{a}_s", 0.0), "measured_s": meas["median"],
                          "measured_min_s": meas["min"], "measured_max_s": meas["max"]})
        rest = _spread([s["step_s"] - s["comm_s"] for s in steps])
        terms.append({"term": "compute and the rest", "axis": None,
                      "predicted_s": est.iteration_time_s - est.comm_s, "predicted_exposed_s": None,
                      "measured_s": rest["median"], "measured_min_s": rest["min"], "measured_max_s": rest["max"]})
        for t in terms:
            t["ratio"] = t["measured_s"] / t["predicted_s"] if t["predicted_s"] and t["measured_s"] is not None else None
    spread = _spread(step_s)
    missing = sum(1 for t in measured if t["predicted_s"] <= 0 and t["size_bytes"] > 0 and t["group_size"] > 1)
    notes = [(f"durations: {len(measured):,} timed records of {'the measured steps' if has_steps else 'the run'} "
              f"({len(timings) - len(measured):,} setup records apart); each rank's record of a collective counts"
              " (ranks that arrive early wait for the last)"),
             ("exposed communication: the union of a rank's op intervals inside its step, an upper bound (an async "
              "op's interval runs until the job first looks at it)")]
    if not steps:
        notes.append("the logs have no step times (mark steps with commscope.measure.capture.step and RankLog.end_step): "
                     "no exposed communication or step comparison")
    return {
        "num_timed_records": len(measured), "num_setup_records": len(timings) - len(measured),
        "records_without_prediction": missing,
        "durations": duration_table(measured),
        "model_curves": model_curves(measured, bandwidth),
        "exposed": exposed, "steps": steps,
        "step": {"predicted_s": estimate.iteration_time_s, "measured_median_s": spread["median"],
                 "measured_min_s": spread["min"], "measured_max_s": spread["max"], "num_steps": len(steps),
                 "ratio": spread["median"] / estimate.iteration_time_s
                 if spread["median"] is not None and estimate.iteration_time_s > 0 else None,
                 "compute_model": estimate.compute_model, "gpu_util": estimate.gpu_util},
        "terms": terms,
        "bandwidth_notes": list(getattr(bandwidth, "notes", [])),
        "notes": notes,
    }

