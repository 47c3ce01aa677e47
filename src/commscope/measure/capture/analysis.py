"""What a recorded run did: ops by kind and axis, message sizes, and its traffic matrix.

Measured logs hold one record per rank per op. A collective therefore appears once on every member;
:func:`logical_ops` keeps it once (from the group's lowest rank) and keeps point-to-point ops on the
sending side, so that measured ops can be decomposed into flows by exactly the code that decomposes
predictions (:func:`commscope.pattern.traffic.build_traffic`).

Two views of a measured matrix: ``logical`` decomposes the ops as called; ``wire`` decomposes what the
backend ran instead (gloo executes reduce_scatter as an all_reduce of the whole input).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from commscope.io.runs import AxisAttribution, RunLog, RunTotals, is_logical, op_step, read_run, run_totals
from commscope.commop import CommOp
from commscope.units import DTYPE_BYTES

__all__ = ["RunLog", "RunTotals", "attribute_axes", "compare", "is_logical", "logical_ops", "measured_traffic",
           "op_step", "predicted_ops_by_kind", "read_run", "size_histogram", "summary"]


def _totals(run: RunLog | RunTotals, layout=None) -> RunTotals:
    """The totals of ``run``, their axes per step attributed from ``layout``."""
    if not isinstance(run, RunTotals):
        return run_totals(run, layout=layout)
    if layout is not None and run.axes_layout is not layout:
        raise ValueError("these totals were read without the prediction's layout: read them with "
                         "read_run_totals(path, layout=prediction.workload.layout)")
    return run

def logical_ops(run: RunLog) -> list[CommOp]:
    """Each collective once (from its group's lowest rank), each p2p once (its send), all-to-alls per rank;
    records that name no rank (a DeepSpeed summary row) once each."""
    return [op for op in run.all_ops if is_logical(op)]


def predicted_ops_by_kind(workload) -> dict[tuple[str, str], list[int]]:
    """[count, bytes] per (axis, op) of one predicted iteration, counted as :func:`is_logical` counts records:
    a collective once per group, a p2p once (its send), an all_to_all once per issuing rank with its own
    send bytes."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for s in workload.opsets:
        if s.op == "recv":
            continue
        row = out[(s.axis, s.op)]
        if s.op == "all_to_all":
            if s.splits is None:
                sent = s.size_bytes * s.group_size * s.num_groups
            else:  # (n, n) shared by every group, or (groups, n, n)
                sent = int(s.splits.sum()) * (s.num_groups if s.splits.ndim == 2 else 1)
            row[0] += s.num_ops * s.group_size
            row[1] += sent * s.count
        else:
            row[0] += s.num_ops
            row[1] += s.logical_bytes
    return out


def attribute_axes(ops: list[CommOp], layout) -> list[CommOp]:
    """Set each op's axis from the group it ran on, using a :class:`~commscope.pattern.layout.Layout`."""
    axis_of = AxisAttribution(layout)
    return [op.with_(axis=axis_of(op)) for op in ops]


def measured_traffic(ops: list[CommOp], world_size: int, gpus_per_node: int, *, view: str = "logical",
                     algorithm: str = "ring"):
    """Decompose logical measured ops into a TrafficMatrix (``view='wire'``: as the backend executed them). A rooted
    collective's flows start (or end) at the root its record names (:func:`commscope.pattern.traffic.root_first`)."""
    from commscope.commop import op_root
    from commscope.pattern.traffic import TrafficMatrix, build_traffic, root_first
    from commscope.pattern.workload.base import OpSet

    def executed(op: CommOp) -> str:
        return op.backend_op if (view == "wire" and op.backend_op) else op.op

    # the decomposition splits buffers at element boundaries: a dtype the model does not know (unknown in a
    # DeepSpeed log, bool, int16) is split by bytes
    ops = [op if op.dtype in DTYPE_BYTES else op.with_(dtype="uint8") for op in ops]

    # identical ops collapse into one op set with a repeat count; all_to_alls stay one per issuing rank,
    # each with its own send splits
    grouped: dict[tuple, int] = defaultdict(int)
    opsets = []
    for op in ops:
        name = executed(op)
        if name == "all_to_all":
            n = len(op.group)
            mat = np.zeros((n, n), dtype=np.int64)
            mat[op.group.index(op.rank)] = op.splits if op.splits is not None else [op.size_bytes // n] * n
            opsets.append(OpSet(op="all_to_all", axis=op.axis, name="measured", size_bytes=op.size_bytes, dtype=op.dtype,
                                phase="fwd", groups=np.array([op.group], dtype=np.int64), repeat=op.count, splits=mat))
            continue
        group = (op.rank, op.peer) if op.op == "send" else root_first(name, op.group, op_root(op))
        grouped[(name, op.axis, op.dtype, op.size_bytes, group)] += op.count
    for (name, axis, dtype, size, group), count in grouped.items():
        opsets.append(OpSet(op=name, axis=axis, name="measured", size_bytes=size, dtype=dtype, phase="fwd",
                            groups=np.array([group], dtype=np.int64), repeat=count))
    tm = build_traffic(opsets, world_size, gpus_per_node, algorithm=algorithm)
    return TrafficMatrix(world_size=tm.world_size, gpus_per_node=tm.gpus_per_node, src=tm.src, dst=tm.dst, axis=tm.axis,
                         bytes=tm.bytes, algorithm=algorithm, view="wire" if view == "wire" else "logical")


def size_histogram(ops: list[CommOp]) -> list[tuple[int, int, int]]:
    """(upper bound bytes, ops, bytes) per power-of-two bin of message size."""
    bins: Counter = Counter()
    totals: Counter = Counter()
    for op in ops:
        top = 1 << max(0, int(op.size_bytes - 1).bit_length()) if op.size_bytes > 0 else 0
        bins[top] += op.count
        totals[top] += op.size_bytes * op.count
    return [(k, bins[k], totals[k]) for k in sorted(bins)]


def _rootless(ops: list[CommOp]) -> str | None:
    """A note for rooted collectives whose records name no root (Kineto traces, Flight Recorder and DeepSpeed logs
    do not record one): the traffic matrix draws them from (or into) the first rank of their group, which may not be
    the root the job used. None when every such op names its root."""
    from commscope.commop import ROOTED_OPS, op_root

    counts: dict[str, int] = {}
    for op in ops:
        if op.op in ROOTED_OPS and len(op.group) > 1 and op_root(op) is None:
            counts[op.op] = counts.get(op.op, 0) + op.count
    if not counts:
        return None
    what = ", ".join(f"{n:,} {name}" for name, n in sorted(counts.items()))
    return (f"{what} op(s) name no root (these records do not say which rank it was): the traffic matrix draws each "
            "from (or into) the first rank of its group")


def summary(run: RunLog | RunTotals, *, layout=None, gpus_per_node: int = 8) -> dict:
    """JSON-ready summary of a recorded run (read into memory, or its totals read rank by rank)."""
    run = _totals(run)
    ops = list(run.logical)
    if layout is not None:
        ops = attribute_axes(ops, layout)
    by_kind: dict[str, dict] = {}
    for op in ops:
        key = f"{op.axis}/{op.op}"
        row = by_kind.setdefault(key, {"axis": op.axis, "op": op.op, "count": 0, "bytes": 0, "group_sizes": set()})
        row["count"] += op.count
        row["bytes"] += op.size_bytes * op.count
        row["group_sizes"].add(len(op.group))
    for row in by_kind.values():
        row["group_sizes"] = sorted(row["group_sizes"])
    traffic: dict = {"omitted": run.matrix_omitted}
    notes = list(run.notes)
    if run.matrix_omitted is None:
        rootless = _rootless(ops)
        if rootless:
            notes.append(rootless)
        for view in ("logical", "wire"):
            tm = measured_traffic(ops, run.world_size, gpus_per_node, view=view)
            traffic[view] = {"total_bytes": tm.total_bytes, "bytes_by_axis": tm.bytes_by_axis(),
                             "num_pairs": tm.num_pairs}
    return {
        "world_size": run.world_size,
        "formats": list(run.formats),
        "files": len(run.files),
        "ranks_logged": list(run.ranks_logged),
        "unfinished_ranks": list(run.unfinished_ranks),
        **({"failure": run.failure} if run.failure is not None else {}),
        "partial_steps": {str(k): list(v) for k, v in run.partial_steps.items()},
        "missing_fields": list(run.missing_fields),
        "notes": notes,
        "problems": list(run.problems),
        "records": run.num_records,
        "unranked_records": run.num_unranked,
        "logical_ops": sum(op.count for op in ops),
        "ops": sorted(by_kind.values(), key=lambda r: (r["axis"], r["op"])),
        "size_histogram": [{"le_bytes": k, "ops": n, "bytes": b} for k, n, b in size_histogram(ops)],
        "traffic": traffic,
    }


def per_step(total: int, num_steps: int) -> int | float:
    """``total / num_steps``, an integer when it divides (counts stay counts in JSON: 4, not 4.0)."""
    return total // num_steps if total % num_steps == 0 else total / num_steps


def compare(prediction, run: RunLog | RunTotals) -> dict:
    """Predicted vs measured communication per axis and op kind, per iteration.

    Measured: logical ops (each collective once, p2p on the send side) attributed to axes by the predicted
    layout, ops tagged with a step averaged over the steps, untagged ones reported apart as setup.
    Predicted: the workload's ops (send side for p2p). ``max_rel_error`` is the largest relative byte
    difference over axes that either side uses.
    """
    layout = prediction.workload.layout
    if run.world_size and layout.world_size != run.world_size:
        raise ValueError(f"the prediction has {layout.world_size} ranks, the logs {run.world_size}")
    run = _totals(run, layout)
    all_steps = sorted({step for _, _, step, _, _ in run.by_step if step is not None})
    problems = list(run.problems)
    partial = dict(run.partial_steps)
    steps = [s for s in all_steps if s not in partial]
    if partial:
        shown = "; ".join(f"step {s}: rank(s) {', '.join(map(str, r))}" for s, r in sorted(partial.items())[:8])
        if steps:
            problems.append(f"partial steps left out of the comparison ({shown}): some ranks did not log them "
                            f"completely")
        else:
            steps = all_steps
            problems.append(f"every step is partial ({shown}); compared anyway: the measured side is short")
    num_steps = max(1, len(steps))
    measured: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    setup: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for axis, name, step, count, nbytes in run.by_step:
        if step is not None and step not in steps:
            continue  # a partial step
        target = setup if (steps and step is None) else measured
        row = target[(axis, name)]
        row[0] += count
        row[1] += nbytes
    predicted = predicted_ops_by_kind(prediction.workload)
    rows = []
    for key in sorted(set(measured) | set(predicted)):
        m_count, m_bytes = (per_step(x, num_steps) for x in measured.get(key, (0, 0)))
        p_count, p_bytes = predicted.get(key, (0, 0))
        rows.append({"axis": key[0], "op": key[1], "predicted_count": p_count, "measured_count": m_count,
                     "predicted_bytes": p_bytes, "measured_bytes": m_bytes, "diff_bytes": m_bytes - p_bytes})
    by_axis: dict[str, dict] = {}
    for r in rows:
        a = by_axis.setdefault(str(r["axis"]), {"predicted_bytes": 0, "measured_bytes": 0, "predicted_count": 0,
                                           "measured_count": 0})
        for k in a:
            a[k] += r[k]
    rel = [abs(a["measured_bytes"] - a["predicted_bytes"]) / max(a["predicted_bytes"], a["measured_bytes"], 1)
           for a in by_axis.values()]
    return {"steps": steps, "num_steps": num_steps, "by_axis": by_axis, "by_op": rows,
            "setup": [{"axis": k[0], "op": k[1], "count": v[0], "bytes": v[1]} for k, v in sorted(setup.items())],
            "max_rel_error": max(rel) if rel else 0.0, "unfinished_ranks": list(run.unfinished_ranks),
            "silent_ranks": list(run.silent_ranks),
            **({"failure": run.failure} if run.failure is not None else {}),
            "partial_steps": {str(k): list(v) for k, v in partial.items()}, "problems": problems,
            "notes": list(run.notes), "formats": list(run.formats), "missing_fields": list(run.missing_fields)}
