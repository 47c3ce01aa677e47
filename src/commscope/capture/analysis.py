"""What a recorded run did: ops by kind and axis, message sizes, and its traffic matrix.

Measured logs hold one record per rank per op. A collective therefore appears once on every member;
:func:`logical_ops` keeps it once (from the group's lowest rank) and keeps point-to-point ops on the
sending side, so that measured ops can be decomposed into flows by exactly the code that decomposes
predictions (:func:`commscope.traffic.build_traffic`).

Two views of a measured matrix: ``logical`` decomposes the ops as called; ``wire`` decomposes what the
backend ran instead (gloo executes reduce_scatter as an all_reduce of the whole input).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from commscope.io.oplog import read_ops_jsonl
from commscope.record import CommOp


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLog:
    """All ranks' logs of one recorded run."""

    ops_by_rank: dict[int, list[CommOp]]
    world_size: int
    problems: tuple[str, ...] = ()
    unfinished_ranks: tuple[int, ...] = ()
    """Ranks whose log has no completion marker (the job crashed or is still running)."""
    headers: dict[int, dict] = field(default_factory=dict)


def read_run(logdir: str | Path) -> RunLog:
    """Read every ``rank*.jsonl`` of ``logdir``; truncated lines and unfinished ranks are reported, not fatal."""
    logdir = Path(logdir)
    files = sorted(logdir.glob("rank*.jsonl"))
    if not files:
        raise ValueError(f"{logdir}: no rank*.jsonl logs (record a run with commscope.capture.record or `commscope record`)")
    ops_by_rank: dict[int, list[CommOp]] = {}
    problems: list[str] = []
    headers: dict[int, dict] = {}
    unfinished = []
    world = 0
    for path in files:
        log = read_ops_jsonl(path)
        problems += log.problems
        rank = int(log.header.get("rank", path.stem.removeprefix("rank")))
        headers[rank] = log.header
        ops_by_rank[rank] = list(log.ops)
        world = max(world, int(log.header.get("world_size") or 0), rank + 1,
                    *(max(op.group) + 1 for op in log.ops if op.group))
        if not path.with_suffix(".done").exists():
            unfinished.append(rank)
    return RunLog(ops_by_rank=ops_by_rank, world_size=world, problems=tuple(problems),
                  unfinished_ranks=tuple(unfinished), headers=headers)


def is_logical(op: CommOp) -> bool:
    """Whether a measured record counts as one logical op: a collective once (the record of its group's lowest
    rank, or a record without a rank), an all_to_all and a send on every issuing rank, never a recv."""
    if op.op == "recv":
        return False
    return op.op in ("send", "all_to_all") or op.rank is None or not op.group or op.rank == min(op.group)


def logical_ops(run: RunLog) -> list[CommOp]:
    """Each collective once (from its group's lowest rank), each p2p once (its send), all-to-alls per rank."""
    return [op for _, ops in sorted(run.ops_by_rank.items()) for op in ops if is_logical(op)]


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
    """Set each op's axis from the group it ran on, using a :class:`~commscope.layout.Layout`."""
    by_group: dict[frozenset, str] = {}
    for kind, axis in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("dp-cp", "dp"), ("expert-dp", "dp"), ("emb", "emb")):
        for g in layout.groups(kind):
            by_group.setdefault(frozenset(int(x) for x in g), axis)
    # an EP group can hold the same ranks as a DP group (dp = ep): all-to-alls (and int64 all-gathers) on it are
    # EP, the rest DP
    ep_groups = {frozenset(int(x) for x in g) for g in layout.groups("ep")} if layout.parallel.ep > 1 else set()
    pp_groups = layout.groups("pp")
    pp_pairs = {frozenset((int(g[i]), int(g[j]))) for g in pp_groups for i in range(len(g)) for j in range(len(g)) if i != j}
    world = frozenset(range(layout.world_size))
    out = []
    for op in ops:
        members = frozenset(op.group)
        if op.op in ("send", "recv") and op.peer is not None:
            pair = frozenset((op.rank, op.peer))
            axis = "pp" if pair in pp_pairs else by_group.get(members, "other")
            if axis == "other":
                for g in layout.groups("cp"):
                    if pair <= frozenset(int(x) for x in g):
                        axis = "cp"
        elif members in ep_groups and (op.op == "all_to_all" or (op.op == "all_gather" and op.dtype == "int64")):
            # integer all-gathers on an EP group are the MoE dispatcher's token counts, not DP parameter gathers
            axis = "ep"
        else:
            axis = by_group.get(members, "dp" if members == world and layout.parallel.dp == layout.world_size else "other")
            if axis == "other" and members in ep_groups:
                axis = "ep"
        out.append(op.with_(axis=axis))
    return out


def measured_traffic(ops: list[CommOp], world_size: int, gpus_per_node: int, *, view: str = "logical",
                     algorithm: str = "ring"):
    """Decompose logical measured ops into a TrafficMatrix (``view='wire'``: as the backend executed them)."""
    from commscope.traffic import TrafficMatrix, build_traffic
    from commscope.workload.base import OpSet

    def executed(op: CommOp) -> str:
        return op.backend_op if (view == "wire" and op.backend_op) else op.op

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
        group = (op.rank, op.peer) if op.op == "send" else op.group
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


def summary(run: RunLog, *, layout=None, gpus_per_node: int = 8) -> dict:
    """JSON-ready summary of a recorded run."""
    ops = logical_ops(run)
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
    logical = measured_traffic(ops, run.world_size, gpus_per_node, view="logical")
    wire = measured_traffic(ops, run.world_size, gpus_per_node, view="wire")
    return {
        "world_size": run.world_size,
        "ranks_logged": sorted(run.ops_by_rank),
        "unfinished_ranks": list(run.unfinished_ranks),
        "problems": list(run.problems),
        "records": sum(len(v) for v in run.ops_by_rank.values()),
        "logical_ops": sum(op.count for op in ops),
        "ops": sorted(by_kind.values(), key=lambda r: (r["axis"], r["op"])),
        "size_histogram": [{"le_bytes": k, "ops": n, "bytes": b} for k, n, b in size_histogram(ops)],
        "traffic": {"logical": {"total_bytes": logical.total_bytes, "bytes_by_axis": logical.bytes_by_axis(),
                                "num_pairs": logical.num_pairs},
                    "wire": {"total_bytes": wire.total_bytes, "bytes_by_axis": wire.bytes_by_axis(),
                             "num_pairs": wire.num_pairs}},
    }


def op_step(op: CommOp) -> int | None:
    """The training step a measured op was tagged with (None: setup)."""
    return dict(op.extra).get("step")


def compare(prediction, run: RunLog) -> dict:
    """Predicted vs measured communication per axis and op kind, per iteration.

    Measured: logical ops (each collective once, p2p on the send side) attributed to axes by the predicted
    layout, ops tagged with a step averaged over the steps, untagged ones reported apart as setup.
    Predicted: the workload's ops (send side for p2p). ``max_rel_error`` is the largest relative byte
    difference over axes that either side uses.
    """
    layout = prediction.workload.layout
    if layout.world_size != run.world_size:
        raise ValueError(f"the prediction has {layout.world_size} ranks, the logs {run.world_size}")
    ops = attribute_axes(logical_ops(run), layout)
    steps = sorted({s for s in (op_step(o) for o in ops) if s is not None})
    num_steps = max(1, len(steps))
    measured: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    setup: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for op in ops:
        target = setup if (steps and op_step(op) is None) else measured
        row = target[(op.axis, op.op)]
        row[0] += op.count
        row[1] += op.size_bytes * op.count
    predicted = predicted_ops_by_kind(prediction.workload)
    rows = []
    for key in sorted(set(measured) | set(predicted)):
        m_count, m_bytes = (x / num_steps for x in measured.get(key, (0, 0)))
        p_count, p_bytes = predicted.get(key, (0, 0))
        rows.append({"axis": key[0], "op": key[1], "predicted_count": p_count, "measured_count": m_count,
                     "predicted_bytes": p_bytes, "measured_bytes": m_bytes, "diff_bytes": m_bytes - p_bytes})
    by_axis: dict[str, dict] = {}
    for r in rows:
        a = by_axis.setdefault(str(r["axis"]), {"predicted_bytes": 0, "measured_bytes": 0.0, "predicted_count": 0,
                                           "measured_count": 0.0})
        for k in a:
            a[k] += r[k]
    rel = [abs(a["measured_bytes"] - a["predicted_bytes"]) / max(a["predicted_bytes"], a["measured_bytes"], 1)
           for a in by_axis.values()]
    return {"steps": steps, "num_steps": num_steps, "by_axis": by_axis, "by_op": rows,
            "setup": [{"axis": k[0], "op": k[1], "count": v[0], "bytes": v[1]} for k, v in sorted(setup.items())],
            "max_rel_error": max(rel) if rel else 0.0, "unfinished_ranks": list(run.unfinished_ranks),
            "problems": list(run.problems)}
