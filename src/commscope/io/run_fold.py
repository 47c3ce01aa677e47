"""A measured run's records folded into totals, one record (or many equal ones) at a time: the logical ops merged
(records that differ only in times, sequence numbers, names, phases or layers are one op with their counts summed)
and, per step, counts and bytes per axis and op. Memory grows with the run's distinct ops, not with its records.

:func:`run_totals` folds a :class:`~commscope.io.run_log.RunLog` already in memory; :mod:`commscope.io.runs` folds
commscope's own logs file by file as it reads them (``read_run_totals``), into the same totals.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from commscope.commop import COLLECTIVES, CommOp, op_root
from commscope.io.import_base import missing_of, note_fields
from commscope.io.run_log import AxisAttribution, RunLog, RunTotals, _is_logical, op_step, senders


class _Fold:
    """Totals of records, added one record (or ``n`` equal ones) at a time."""

    def __init__(self) -> None:
        self.records: Counter[int | None] = Counter()
        self.steps: dict[int, Counter[int]] = {}
        self.logical: dict[tuple, int] = {}
        self.world = 0
        self.groupless = 0
        self.p2p_groupless = 0
        self.a2a_unranked = 0  # all_to_all records without the rank that sent them (no row of the matrix)
        self.relevant: set[str] = set()
        self.known: set[str] = set()
        self.own_rank_known = False  # whether some record names its rank itself (the file's missing fields)

    def add(self, op: CommOp, by_step: dict[int | None, int], rank: int | None) -> None:
        """Records equal to ``op`` but for their step, ``by_step[s]`` of step ``s``, of the file of ``rank`` (the
        rank of records that name none)."""
        r = op.rank if op.rank is not None else rank
        n = sum(by_step.values())
        self.records[r] += n
        if r is not None:
            counts = self.steps.get(r)
            if counts is None:
                counts = self.steps[r] = Counter()
            for step, k in by_step.items():
                if step is not None:
                    counts[step] += k
            self.world = max(self.world, r + 1)
        if op.group:
            self.world = max(self.world, max(op.group) + 1)
        else:
            if op.op in COLLECTIVES and op.op != "barrier":
                self.groupless += n
            if op.op in ("send", "recv", "all_to_all"):
                self.p2p_groupless += n
        if op.op == "all_to_all" and r is None:
            self.a2a_unranked += n
        self.own_rank_known = self.own_rank_known or op.rank is not None
        note_fields(op, self.relevant, self.known, rank=r)
        self.add_logical(op, by_step, r)

    def add_logical(self, op: CommOp, by_step: dict[int | None, int], r: int | None) -> None:
        if _is_logical(op.op, r, op.group):
            each = op.count * senders(op, r)
            root = op_root(op)
            for step, k in by_step.items():
                key = (op.op, op.axis, op.group, op.size_bytes, op.dtype, r, op.peer, op.splits, op.backend_op, root,
                       step)
                self.logical[key] = self.logical.get(key, 0) + each * k

    def file_missing(self) -> tuple[str, ...]:
        """The missing fields of the file's own records (before records without a rank took the file's)."""
        known = self.known if self.own_rank_known else self.known - {"rank"}
        return missing_of(self.relevant, known)


class _RunFold(_Fold):
    """The run's totals: files' folds merged, logical ops kept without their step, and per step only counts and
    bytes per (axis, op), the axis attributed from a layout (memory: the run's distinct ops, not x its steps)."""

    def __init__(self, layout: Any = None) -> None:
        super().__init__()
        self.layout = layout
        self.axis_of = AxisAttribution(layout) if layout is not None else None
        self.axes: dict[tuple, str] = {}
        self.by_step: dict[tuple[str, str, int | None], list[int]] = {}
        self.rank_steps: dict[int, tuple[tuple[int, int], ...]] = {}  # rank -> (step, records), ...
        self.interned: dict[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] = {}  # ranks alike share one

    def merge(self, other: _Fold) -> None:
        self.records.update(other.records)
        for r, counts in other.steps.items():
            if r in self.rank_steps:  # records of one rank in two files
                counts = Counter(dict(self.rank_steps[r])) + counts
            frozen = tuple(sorted(counts.items()))
            self.rank_steps[r] = self.interned.setdefault(frozen, frozen)
        for (name, axis, group, size, dtype, rank, peer, splits, backend_op, root, step), count in other.logical.items():
            key = (name, axis, group, size, dtype, rank, peer, splits, backend_op, root, None)
            self.logical[key] = self.logical.get(key, 0) + count
            where = (name, axis, group, dtype, rank, peer)
            attributed = self.axes.get(where)
            if attributed is None:
                attributed = self.axes[where] = axis if self.axis_of is None else self.axis_of(
                    CommOp(op=name, axis=axis, group=group, size_bytes=size, dtype=dtype, rank=rank, peer=peer))
            row = self.by_step.setdefault((attributed, name, step), [0, 0])
            row[0] += count
            row[1] += count * size
        self.world = max(self.world, other.world)
        self.groupless += other.groupless
        self.p2p_groupless += other.p2p_groupless
        self.a2a_unranked += other.a2a_unranked
        self.relevant |= other.relevant
        self.known |= other.known

    def logical_ops(self) -> tuple[CommOp, ...]:
        out = [CommOp(op=name, axis=axis, group=group, size_bytes=size, dtype=dtype, rank=rank, peer=peer,
                      splits=splits, backend_op=backend_op, count=count,
                      extra=(("root", root),) if root is not None else ())
               for (name, axis, group, size, dtype, rank, peer, splits, backend_op, root, _), count
               in self.logical.items()]
        return tuple(sorted(out, key=_op_order))

    def step_rows(self) -> tuple[tuple[str, str, int | None, int, int], ...]:
        return tuple(sorted(((a, o, s, c, b) for (a, o, s), (c, b) in self.by_step.items()),
                            key=lambda row: (row[0], row[1], -1 if row[2] is None else row[2])))


def _op_order(op: CommOp) -> tuple:
    return (op.op, op.axis, op.group, op.size_bytes, op.dtype, -1 if op.rank is None else op.rank,
            -1 if op.peer is None else op.peer, op.splits or (), op.backend_op or "",
            -1 if (root := op_root(op)) is None else root)


def run_totals(run: RunLog, *, layout: Any = None) -> RunTotals:
    """The totals of a run read into memory (see :class:`RunTotals`); ``layout`` attributes the axes per step."""
    each = _Fold()
    for rank, ops in sorted(run.ops_by_rank.items()):
        for op in ops:
            each.add_logical(op, {op_step(op): 1}, rank if op.rank is None else op.rank)
    for op in run.unranked:
        each.add_logical(op, {op_step(op): 1}, op.rank)
    fold = _RunFold(layout)
    fold.merge(each)
    return RunTotals(**run.findings(), ranks_logged=tuple(sorted(run.ops_by_rank)),
                     num_records=sum(len(v) for v in run.ops_by_rank.values()) + len(run.unranked),
                     num_unranked=len(run.unranked), logical=fold.logical_ops(), by_step=fold.step_rows(),
                     axes_layout=layout)

