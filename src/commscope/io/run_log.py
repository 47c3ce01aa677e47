"""What a measured run is once read, and how its records count: :class:`RunLog` (every rank's records) and
:class:`RunTotals` (the records folded into totals), the :class:`RunFindings` about the run as a whole they share;
which records count as one logical op (:func:`is_logical`, :func:`senders`), a record's step (:func:`op_step`) and
its axis told from its group (:class:`AxisAttribution`).

:mod:`commscope.io.runs` reads runs into these and re-exports them, where callers import them;
:mod:`commscope.io.run_fold` folds records into totals by the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from commscope.commop import CommOp
from commscope.io.oplog_checks import is_int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFindings:
    """What a measured run's files say about the run as a whole, apart from its records: shared by
    :class:`RunLog` (records in memory) and :class:`RunTotals` (records folded into totals)."""

    world_size: int
    """Ranks of the job (0 when nothing says it)."""
    problems: tuple[str, ...] = ()
    """What was wrong in the input or skipped: ``<file> line <n>: ...`` for records, run-level findings too."""
    unfinished_ranks: tuple[int, ...] = ()
    """Ranks whose commscope log has no completion marker (the job crashed or is still running)."""
    headers: dict[int, dict] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    """The formats read (``jsonl``, ``kineto``, ...)."""
    missing_fields: tuple[str, ...] = ()
    """CommOp fields the input could not give (see :class:`commscope.io.importers.ImportResult`)."""
    notes: tuple[str, ...] = ()
    """What was assumed or recovered (a group taken from the world size, ...): facts a user must know."""
    matrix_omitted: str | None = None
    """Why no traffic matrix can be built from these records (None: it can)."""
    partial_steps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Steps some ranks did not log completely: step -> the ranks that miss it or were cut short in it."""
    steps_by_rank: dict[int, list[dict[str, int]]] = field(default_factory=dict)
    """Each rank's step lines (``step``, ``t_start_ns``, ``t_end_ns``), when the job marked its steps."""
    failure: dict[str, Any] | None = None
    """The launcher's marker of a failed run (:data:`commscope.io.oplog.FAILURE_FILE`): the rank that failed
    first and how; None when the run did not fail under a commscope launcher."""
    silent_ranks: tuple[int, ...] = ()
    """Ranks of a recording that logged no op: a log of their own holding none (only its header, or only damaged
    records), or no log where the other ranks have theirs. What they sent is missing from every total."""

    def findings(self) -> dict[str, Any]:
        """These fields by name, to hand on to another kind of run."""
        return {f.name: getattr(self, f.name) for f in fields(RunFindings)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLog(RunFindings):
    """All ranks' records of one measured run."""

    ops_by_rank: dict[int, list[CommOp]]
    """Records of each global rank, in file order (an empty list for a rank whose commscope log holds none)."""
    unranked: tuple[CommOp, ...] = ()
    """Records that name no rank (a DeepSpeed summary row, an nccl-tests row): each counts once."""

    @property
    def all_ops(self) -> list[CommOp]:
        """Every record, ranked ones by rank, then the unranked ones."""
        return [op for _, ops in sorted(self.ops_by_rank.items()) for op in ops] + list(self.unranked)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTotals(RunFindings):
    """What ``summarize`` and ``compare`` need of a measured run, without its records: the run-level findings of
    :class:`RunLog` and its logical ops (:func:`is_logical`) merged, records that differ only in what these
    commands do not read (times, sequence numbers, names, phases, layers) one op with their counts summed.

    :func:`read_run_totals` builds it reading one rank's file at a time (memory: the distinct ops of the run,
    not its records); :func:`run_totals` from a RunLog in memory. Both give equal totals for the same files."""

    ranks_logged: tuple[int, ...] = ()
    """Ranks with at least one record, or a commscope log of their own (one without records included: a rank that
    logged no op, reported in :attr:`problems`)."""
    num_records: int = 0
    """Records read, ranked and unranked (each line once, whatever its ``count``)."""
    num_unranked: int = 0
    logical: tuple[CommOp, ...] = ()
    """The logical ops, merged: op, axis, group, size, dtype, rank, peer, splits, backend_op and a rooted
    collective's root (``extra["root"]``, where recorded) kept, ``count`` the sum over the records merged (of every
    step and setup); in a fixed order."""
    by_step: tuple[tuple[str, str, int | None, int, int], ...] = ()
    """Logical ops per step: (axis, op, step or None for setup, count, bytes), the axis attributed from
    :attr:`axes_layout` (the recorded axis without one)."""
    axes_layout: Any = field(default=None, compare=False)
    """The layout :attr:`by_step`'s axes come from (None: as recorded)."""


class AxisAttribution:
    """The axis of a measured op from the group it ran on, using a :class:`~commscope.pattern.layout.Layout`: called
    with an op, gives its axis (``tp``, ``pp``, ``dp``, ``ep``, ``cp``, ``emb`` or ``other``)."""

    def __init__(self, layout: Any) -> None:
        self.by_group: dict[frozenset, str] = {}
        for kind, axis in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("dp-cp", "dp"), ("expert-dp", "dp"), ("emb", "emb")):
            for g in layout.groups(kind):
                self.by_group.setdefault(frozenset(int(x) for x in g), axis)
        # an EP group can hold the same ranks as a DP group (dp = ep): all-to-alls (and int64 all-gathers) on it
        # are EP, the rest DP
        self.ep_groups = ({frozenset(int(x) for x in g) for g in layout.groups("ep")} if layout.parallel.ep > 1
                          else set())
        self.pp_pairs = {frozenset((int(g[i]), int(g[j]))) for g in layout.groups("pp") for i in range(len(g))
                         for j in range(len(g)) if i != j}
        self.cp_groups = [frozenset(int(x) for x in g) for g in layout.groups("cp")]
        self.world = frozenset(range(layout.world_size))
        self.dp_only = layout.parallel.dp == layout.world_size

    def __call__(self, op: CommOp) -> str:
        members = frozenset(op.group)
        if op.op in ("send", "recv") and op.peer is not None:
            pair = frozenset((op.rank, op.peer))
            axis = "pp" if pair in self.pp_pairs else self.by_group.get(members, "other")
            if axis == "other":
                for g in self.cp_groups:
                    if pair <= g:
                        axis = "cp"
            return axis
        if members in self.ep_groups and (op.op == "all_to_all" or (op.op == "all_gather" and op.dtype == "int64")):
            # integer all-gathers on an EP group are the MoE dispatcher's token counts, not DP parameter gathers
            return "ep"
        axis = self.by_group.get(members, "dp" if members == self.world and self.dp_only else "other")
        if axis == "other" and members in self.ep_groups:
            axis = "ep"
        return axis


def is_logical(op: CommOp) -> bool:
    """Whether a measured record counts as one logical op: a collective once (the record of its group's lowest
    rank, or a record without a rank), an all_to_all and a send on every issuing rank, never a recv. (An all_to_all
    record without a rank but with a group, an nccl-tests row, stands for every member's send: the totals count it
    :func:`senders` times.)"""
    return _is_logical(op.op, op.rank, op.group)


def senders(op: CommOp, rank: int | None) -> int:
    """How many per-rank all_to_all calls record ``op`` (of ``rank``, None: no rank known) stands for: all_to_all
    is counted once per sending rank, as commscope's own logs and its predictions count it; a record with a group
    but no rank (nccl-tests prints one row per collective, each of its n ranks sending ``size_bytes``) stands for
    n of them. 1 for everything else, and for an all_to_all without a group (DeepSpeed's summary table: one rank's
    own calls)."""
    return len(op.group) if op.op == "all_to_all" and rank is None and op.group else 1


def _is_logical(name: str, rank: int | None, group: tuple[int, ...]) -> bool:
    if name == "recv":
        return False
    return name in ("send", "all_to_all") or rank is None or not group or rank == min(group)


def op_step(op: CommOp) -> int | None:
    """The training step a measured op was tagged with (None: setup)."""
    for key, value in op.extra:
        if key == "step":
            return value if is_int(value) else None
    return None
