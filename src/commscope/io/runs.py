"""A measured run from whatever records a user has: one file or a directory of per-rank files, any format.

:func:`read_run` is what ``summarize``, ``compare`` and ``report --measured`` read with. It accepts

- commscope's own ``rank*.jsonl`` logs (``commscope record``), with their headers and ``.done`` markers;
- any file :func:`commscope.io.importers.import_records` reads (Kineto traces, DeepSpeed comms logs, nccl-tests /
  rccl-tests output, PyTorch Flight Recorder dumps, ``NCCL_DEBUG=INFO`` logs), the format told from the content;
- a directory of such files, one per rank, merged.

Recorded logs are data to defend: a bad record (an unknown dtype, a null group, a size of ``1e400`` or over 1 TiB,
a group without the record's rank or beyond the header's world size, a step that is no integer) is reported with
its file and line and skipped by the reader; here the run as a whole is checked too: duplicate and missing ranks
(the recorder's ``rank#####.jsonl`` kept over a copy of it), a header whose rank disagrees with the file name, a
log with fewer or more records than its ``.done`` marker says were written, a log with no record, files of other
formats or of other runs in the same directory (headers with different ``run_id``, world sizes or start times),
steps some ranks did not finish. Everything found is in
:attr:`RunLog.problems` (what was wrong or skipped) and :attr:`RunLog.notes` (what was assumed); nothing of it
stops the reading, only an input with nothing importable does (a ``ValueError`` that says why).

Records without process-group ranks (DeepSpeed's) take the whole world as their group when the world size is
known and no layout says the job has groups of another size; otherwise :attr:`RunLog.matrix_omitted` says why no
traffic matrix can be built from them.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from commscope.io.import_base import ImportResult, missing_fields, missing_of, note_fields
from commscope.io.oplog import FAILURE_FILE, is_int, read_failure
from commscope.commop import COLLECTIVES, CommOp, op_root

__all__ = ["AxisAttribution", "RunFindings", "RunLog", "RunTotals", "is_logical", "op_step", "read_run", "read_run_totals", "run_totals",
           "write_run_parquet"]

#: Headers whose ``started_ns`` differ by more than this are from different runs (a job's ranks start within
#: seconds of each other; one hour leaves room for a slow rendezvous).
MIXED_RUN_START_SPREAD_NS = 3600 * 10**9
_RANK_IN_NAME = re.compile(r"(\d+)(?:\D*)$")
#: The name the recorder gives a rank's log (gzipped afterwards, or by the synthetic writer, too).
_RECORDER_NAME = re.compile(r"rank(\d{5})(\.jsonl(?:\.gz)?)")
#: Formats whose records without a group are the world's: DeepSpeed computes its bandwidths with the world size.
_WORLD_GROUP_FORMATS = frozenset({"deepspeed"})
#: Formats whose records name the rank that logged them, not the ranks of the job: DeepSpeed's verbose lines come
#: from rank 0 alone (``log_dist(..., ranks=[0])``), so rank 0 says nothing of a world of 32. The world size is the
#: log's own (from its bandwidths, or given), else unknown, never the ranks seen.
_LOGGING_RANK_FORMATS = frozenset({"deepspeed"})
_IGNORED_SUFFIXES = (".done", ".md", ".png", ".html", ".npz", ".csv", ".toml")  # .toml: the job saved beside the logs
_IGNORED_NAMES = (FAILURE_FILE,)  # the launcher's marker of a failed run: read into RunLog.failure


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


def read_run(path: str | Path, *, layout: Any = None) -> RunLog:
    """Read a measured run from ``path``: a directory of per-rank files, or one file, of any importable format.

    ``layout`` (a :class:`commscope.pattern.layout.Layout`) is the job's, when known: it decides whether records without
    a group may take the whole world as their group. Raises ValueError (naming the path and why) when nothing
    importable is found; every lesser problem is reported in the result.
    """
    path = Path(path)
    files = _run_files(path)
    reader = _Reader(path)
    for f in files:
        reader.read(f, alone=not path.is_dir())
    return reader.finish(layout)


def read_run_totals(path: str | Path, *, layout: Any = None, jobs: int = 1) -> RunTotals:
    """:func:`run_totals` of :func:`read_run`, reading commscope's own logs one rank file at a time: each file's
    records are folded into the run's totals and dropped, so memory grows with the distinct ops of the run, not
    with its records. ``jobs`` > 1 reads that many files at once in worker processes. Other formats are read
    as :func:`read_run` reads them. Raises ValueError as :func:`read_run` does."""
    path = Path(path)
    files = _run_files(path)
    reader = _Reader(path)
    reader.fold = _RunFold(layout)
    if jobs > 1 and len(files) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for f, got in zip(files, pool.map(_read_file, files, [True] * len(files),
                                              chunksize=max(1, min(16, len(files) // (4 * jobs))))):
                reader.take(f, *got)
    else:
        for f in files:
            reader.take(f, *_read_file(f, True, alone=not path.is_dir()))
    return reader.finish_totals(layout)


def write_run_parquet(path: str | Path, out_dir: str | Path, *, layout: Any = None) -> tuple[list[Path], int, list[str]]:
    """Every rank file of the recorded run at ``path`` (any importable format) as one Parquet op table in
    ``out_dir`` (``rank00003.jsonl.gz`` -> ``rank00003.parquet``; columns of :data:`commscope.io.tables.OP_COLUMNS`,
    the file's rank filled in where its records name none, the axis attributed from ``layout`` when it is
    given, as ``summarize`` attributes it), one file at a time, so that memory holds one rank's records at most. For queries over logs too large for one machine's memory: DuckDB, Dask or Spark read the
    directory as one table. Returns (files written, rows, problems of the files read). Raises ValueError naming
    the path when nothing could be read."""
    from dataclasses import replace

    from commscope.io.tables import write_ops_parquet

    path, out_dir = Path(path), Path(out_dir)
    files = _run_files(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    rows = 0
    problems: list[str] = []
    axis_of = AxisAttribution(layout) if layout is not None else None
    for f in files:
        got, _ = _read_file(f, False, alone=not path.is_dir())
        if isinstance(got, str):
            problems.append(got)
            continue
        problems += got.problems
        rank = _file_rank(f, got, problems)
        ops = [op if op.rank is not None or rank is None else replace(op, rank=rank) for op in got.ops]
        if axis_of is not None:
            ops = [op.with_(axis=axis_of(op)) for op in ops]
        if not ops:
            continue
        target = out_dir / (f.name.split(".", 1)[0] + ".parquet")
        if target in written:  # two files of one stem (rank0.jsonl and rank0.csv): keep both
            target = out_dir / f"{f.name.replace('.', '_')}.parquet"
        rows += write_ops_parquet(target, ops)
        written.append(target)
    if not written:
        raise ValueError(f"{path}: no records to export" + (f" ({problems[0]})" if problems else ""))
    return written, rows, problems


def _run_files(path: Path) -> list[Path]:
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if not path.is_dir():
        return [path]
    # the recorder's own names first: where a copy (``rank00001 (copy).jsonl``) holds the same rank, the
    # recorder's file is the rank's and the copy the one reported and skipped
    files = sorted((p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                    and not p.name.endswith(_IGNORED_SUFFIXES) and p.name not in _IGNORED_NAMES),
                   key=lambda p: (_RECORDER_NAME.fullmatch(p.name) is None, p.name))
    if not files:
        raise ValueError(f"{path}: an empty directory: no rank*.jsonl logs (commscope record) and no file another "
                         f"tool wrote (Kineto traces, DeepSpeed logs, Flight Recorder dumps, NCCL_DEBUG logs)")
    return files


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


def _read_file(f: Path, fold: bool, alone: bool = False) -> tuple[ImportResult | str, _Fold | None]:
    """One file of a run: its ImportResult (for commscope's logs with ``fold``: without records, which are in
    the returned _Fold), or why it was not read (a ValueError when it is the run's only file)."""
    from commscope.io.importers import detect_format, import_records

    try:
        fmt = "jsonl" if fold and _is_oplog(f) else detect_format(f)
        if fmt != "jsonl":
            return import_records(f, format=fmt), None
        if not fold:
            return _read_jsonl(f), None
        return _fold_jsonl(f)
    except ValueError as exc:
        if alone:
            raise
        return f"{f.name}: not read: {str(exc).split(': ', 1)[-1]}", None


def _is_oplog(f: Path) -> bool:
    """Whether ``f`` begins as commscope's own logs do (a header line or an op line), from its first line only:
    :func:`commscope.io.importers.detect_format` reads the whole file."""
    import gzip

    if not f.is_file():  # a pipe would block here, or lose its first line to this look (detect_format says why)
        return False
    try:
        with (gzip.open(f, "rb") if f.suffix == ".gz" else f.open("rb")) as fh:
            first = fh.readline(1 << 16)
    except (OSError, EOFError):
        return False
    return first.startswith((b'{"commscope_header"', b'{"op":')) and first.endswith(b"}\n")


def _fold_jsonl(f: Path) -> tuple[ImportResult, _Fold]:
    from commscope.io.oplog import scan_ops_jsonl

    fold = _Fold()
    rank: list[int | None] = []  # the file's rank, from its header (known before its first record)

    def add(op: CommOp, by_step: dict[int | None, int], header: dict[str, Any]) -> None:
        if not rank:
            rank.append(_rank_of(f, header, {}, "jsonl")[0])
        fold.add(op, by_step, rank[0])

    log = scan_ops_jsonl(f, add)
    result = ImportResult(ops=[], source=str(f), format="jsonl",
                          missing_fields=fold.file_missing() if fold.records else (),
                          problems=list(log.problems), meta={"header": dict(log.header), "steps": list(log.steps),
                                                             "num_records": log.num_records,
                                                             "num_ops": sum(fold.records.values())})
    return result, fold


class _Reader:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.fold: _RunFold | None = None  # in fold mode, the jsonl files' records, folded as they are read
        self.owner: dict[int, str] = {}  # rank -> the name of its commscope log (the first one read)
        self.duplicates: dict[str, str] = {}  # the name of a second log of a rank -> the problem that says so
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.results: list[tuple[Path, ImportResult, int | None]] = []
        self.headers: dict[int, dict] = {}
        self.unfinished: list[int] = []
        self.silent: set[int] = set()  # ranks that logged no op
        self.steps_by_rank: dict[int, list[dict[str, int]]] = {}

    def read(self, f: Path, *, alone: bool) -> None:
        self.take(f, *_read_file(f, False, alone=alone))

    def take(self, f: Path, got: ImportResult | str, fold: _Fold | None) -> None:
        """A file's result (or why it was not read), and in fold mode its records' totals."""
        if isinstance(got, str):
            self.problems.append(got)
            return
        found: list[str] = []
        rank = _file_rank(f, got, found)
        self.results.append((f, got, rank))
        if got.format == "jsonl" and rank is not None:
            if rank in self.owner:  # a second log of one rank is skipped whole: its records and their problems
                self.duplicates[f.name] = _duplicate(f, rank, self.owner[rank])
                self.problems += found
                return
            self.owner[rank] = f.name
        self.problems += got.problems + found
        if fold is not None and self.fold is not None:
            self.fold.merge(fold)

    def finish(self, layout: Any) -> RunLog:
        if not self.results:
            found = "; ".join(self.problems[:3])
            raise ValueError(f"{self.root}: nothing importable" + (f" ({found})" if found else ""))
        results = self._one_format()
        ops_by_rank: dict[int, list[CommOp]] = {}
        unranked: list[CommOp] = []
        world = 0
        only_logging = set()  # ranks seen only in logs written by one rank for all (DeepSpeed's: not the world)
        for f, result, rank in results:
            if f.name in self.duplicates:
                self.problems.append(self.duplicates[f.name])
                continue
            if result.format == "jsonl" and rank is not None:
                self._rank_file(f, result, rank)
                ops_by_rank.setdefault(rank, [])  # a log without records is a rank that logged none, not no rank
            for op in result.ops:
                r = op.rank if op.rank is not None else rank
                if r is None:
                    unranked.append(op)
                else:
                    ops_by_rank.setdefault(r, []).append(op if op.rank == r else op.with_(rank=r))
                    if result.format in _LOGGING_RANK_FORMATS:
                        only_logging.add(r)
            meta_world = result.meta.get("world_size") or (result.meta.get("header") or {}).get("world_size")
            if is_int(meta_world) and meta_world > 0:
                world = max(world, meta_world)
        world = max([world, *(r + 1 for r in ops_by_rank if r not in only_logging),
                     *(max(op.group) + 1 for ops in ops_by_rank.values() for op in ops if op.group),
                     *(max(op.group) + 1 for op in unranked if op.group)])
        if layout is not None and world <= layout.world_size and {r.format for _, r, _ in results} - {"jsonl",
                                                                                                "nccl_tests"}:
            world = layout.world_size  # the records of one rank, or a log without ranks, see part of the world
        self._check_headers(results, world)
        self._note_whole_group_a2a(unranked, results)
        ops_by_rank, unranked, omitted = self._groups(ops_by_rank, unranked, world, results, layout)
        all_ops = [op for ops in ops_by_rank.values() for op in ops] + unranked
        always = tuple(sorted({name for _, r, _ in results for name in r.missing_fields}))
        failure = read_failure(self.root) if self.root.is_dir() else None
        finished = _finished_ranks(self.headers, self.unfinished, failure)
        return RunLog(ops_by_rank=ops_by_rank, world_size=world, problems=tuple(self.problems),
                      unfinished_ranks=tuple(sorted(self.unfinished)), headers=self.headers,
                      unranked=tuple(unranked), files=tuple(str(f) for f, _, _ in results),
                      formats=tuple(sorted({r.format for _, r, _ in results})),
                      missing_fields=missing_fields(all_ops, always) if all_ops else always,
                      notes=tuple(self.notes), matrix_omitted=omitted,
                      partial_steps=_partial_steps(ops_by_rank, finished), steps_by_rank=self.steps_by_rank,
                      failure=failure, silent_ranks=tuple(sorted(self.silent)))

    def _note_whole_group_a2a(self, unranked: list[CommOp], results: list[tuple[Path, ImportResult, int | None]]) -> None:
        """Say that all_to_all rows for a whole group (nccl-tests') are counted per sending rank, and what that is."""
        rows = [op for op in unranked if senders(op, None) > 1]
        if not rows:
            return
        calls = sum(op.count for op in rows)
        sends = sum(op.count * senders(op, None) for op in rows)
        formats = ", ".join(sorted({r.format for _, r, _ in results}))
        self.notes.append(f"{len(rows)} all_to_all records ({formats}) each time one collective of its whole group: "
                          f"counted once per sending rank, as commscope's own logs count all_to_all, so their "
                          f"{calls:,} collectives are {sends:,} ops, and their bytes each rank's send buffer x the "
                          f"group size")

    def _rank_file(self, f: Path, result: ImportResult, rank: int) -> None:
        self.headers[rank] = dict(result.meta.get("header") or {})
        if result.meta.get("steps"):
            self.steps_by_rank[rank] = sorted(result.meta["steps"], key=lambda m: m["step"])
        marker = _marker(f)
        if result.meta.get("num_ops") == 0 and self.headers[rank].get("world_size") == 1 \
                and not result.meta.get("num_records") and marker is not None:  # finished, as one rank finishes
            self.notes.append(f"{f.name}: a world of one rank talks to no one: the log holds its header and step "
                              "lines, no op")
        elif result.meta.get("num_ops") == 0:
            self.silent.add(rank)
            written = result.meta.get("num_records") or 0
            self.problems.append(f"{f.name}: " + (f"none of its {written} op records is valid" if written else
                                                  "the log holds no op record, only its header")
                                 + f": rank {rank} is counted as logged, with no ops")
        if marker is None:
            self.unfinished.append(rank)
        else:
            self._check_marker(f, marker, result.meta.get("num_records"))

    def _check_marker(self, f: Path, marker: Path, num_records: int | None) -> None:
        """A finished log holds as many op records as its completion marker says the recorder wrote."""
        try:
            text = marker.read_text(encoding="utf-8", errors="replace").strip()
        except OSError as exc:
            self.problems.append(f"{marker.name}: unreadable ({exc.strerror or exc}); {f.name} taken as finished")
            return
        if not text:  # a marker without a count (touched by hand, or by an older recorder): nothing to compare
            return
        if not text.isdigit():
            self.problems.append(f"{marker.name}: holds {text[:40]!r}, expected the number of op records the "
                                 f"recorder wrote to {f.name}; not compared")
            return
        if num_records is not None and int(text) != num_records:
            how = ("the file was cut or edited" if num_records < int(text) else
                   "records were added after the recorder finished it, or the file was edited")
            self.problems.append(f"{f.name}: {num_records} op records, its .done marker says {int(text)} were "
                                 f"written: {how}")

    def finish_totals(self, layout: Any) -> RunTotals:
        """finish() for a reader in fold mode: the same findings, from the folded records of commscope's logs."""
        fold = self.fold
        if fold is None or not self.results or self._main_format() != "jsonl":
            return run_totals(self.finish(layout), layout=layout)
        results = self._one_format()
        world = 0
        for f, result, rank in results:  # in finish()'s order, so that both list their findings alike
            if rank is not None and self.owner.get(rank) == f.name:
                self._rank_file(f, result, rank)
            elif f.name in self.duplicates:
                self.problems.append(self.duplicates[f.name])
            meta_world = (result.meta.get("header") or {}).get("world_size")
            if is_int(meta_world) and meta_world > 0:
                world = max(world, meta_world)
        world = max(world, fold.world, *(r + 1 for r in self.owner))
        self._check_headers(results, world)
        omitted = _why_no_matrix(fold.groupless, fold.p2p_groupless, "jsonl", layout, world,
                                 a2a_unranked=fold.a2a_unranked)
        always = tuple(sorted({name for _, r, _ in results for name in r.missing_fields}))
        failure = read_failure(self.root) if self.root.is_dir() else None
        finished = _finished_ranks(self.headers, self.unfinished, failure)
        return RunTotals(world_size=world, problems=tuple(self.problems), unfinished_ranks=tuple(sorted(self.unfinished)),
                         headers=self.headers, files=tuple(str(f) for f, _, _ in results), formats=("jsonl",),
                         missing_fields=missing_of(fold.relevant, fold.known, always) if fold.records else always,
                         notes=tuple(self.notes), matrix_omitted=omitted,
                         partial_steps=_partial_steps_of(fold.rank_steps, finished), steps_by_rank=self.steps_by_rank,
                         failure=failure, silent_ranks=tuple(sorted(self.silent)),
                         ranks_logged=tuple(sorted({r for r in fold.records if r is not None} | set(self.owner))),
                         num_records=sum(fold.records.values()), num_unranked=fold.records.get(None, 0),
                         logical=fold.logical_ops(), by_step=fold.step_rows(), axes_layout=layout)

    def _main_format(self) -> str:
        kinds = Counter(r.format for _, r, _ in self.results)
        return max(kinds, key=lambda k: (kinds[k], k == "jsonl"))

    def _one_format(self) -> list[tuple[Path, ImportResult, int | None]]:
        """The results of the directory's main format; files of other formats are reported and left out."""
        kinds: Counter[str] = Counter(r.format for _, r, _ in self.results)
        if len(kinds) == 1:
            return self.results
        main = self._main_format()
        others = [f"{f.name} ({r.format})" for f, r, _ in self.results if r.format != main]
        self.problems.append(f"{self.root}: files of several formats ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))}); "
                             f"read the {kinds[main]} {main} file(s), left out: {', '.join(others[:8])}"
                             + (" ..." if len(others) > 8 else ""))
        return [t for t in self.results if t[1].format == main]

    def _check_headers(self, results: list[tuple[Path, ImportResult, int | None]], world: int) -> None:
        worlds: dict[int, list[str]] = defaultdict(list)
        runs: dict[str, list[str]] = defaultdict(list)
        starts: list[tuple[int, str]] = []
        for f, result, _ in results:
            header = result.meta.get("header") or {}
            w = header.get("world_size")
            if is_int(w) and w > 0:
                worlds[w].append(f.name)
            elif w is not None:  # null: the job had no process group when the log began
                self.problems.append(f"{f.name} line 1: header world_size={w!r}: expected the number of ranks (an "
                                     f"integer >= 1) or null; not used")
            run_id = header.get("run_id")
            if isinstance(run_id, str) and run_id:
                runs[run_id].append(f.name)
            elif run_id is not None:  # absent in logs of recorders before run ids
                self.problems.append(f"{f.name} line 1: header run_id={run_id!r}: expected the run's id (a "
                                     f"non-empty string); not compared")
            s = header.get("started_ns")
            if is_int(s):
                starts.append((s, f.name))
        if len(worlds) > 1:
            self.problems.append("headers disagree on the world size (" + "; ".join(
                f"{w}: {_file_names(names)}" for w, names in sorted(worlds.items()))
                + "): files of different runs in one directory?")
        if len(runs) > 1:  # every rank of one run writes the same run_id, whatever its world size says
            by_first = sorted(runs.items(), key=lambda item: min(item[1]))
            self.problems.append(", ".join(
                f"{_file_names(names)}{(' is' if len(names) == 1 else ' are') if k == 0 else ''} of run {run_id}"
                for k, (run_id, names) in enumerate(by_first)) + ": logs of different runs mixed in one directory")
        if starts:
            lo, hi = min(starts), max(starts)
            if hi[0] - lo[0] > MIXED_RUN_START_SPREAD_NS:
                self.problems.append(f"{lo[1]} and {hi[1]} started {(hi[0] - lo[0]) / 3.6e12:.1f} hours apart: files "
                                     f"of different runs in one directory?")
        if any(r.format == "jsonl" for _, r, _ in results) and world:
            logged = {rank for _, r, rank in results if r.format == "jsonl" and rank is not None}
            missing = sorted(set(range(world)) - logged)
            if missing and logged:
                self.silent.update(missing)
                shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
                self.problems.append(f"no log for rank(s) {shown} of the {world} ranks: their ops are not counted")

    def _groups(self, ops_by_rank: dict[int, list[CommOp]], unranked: list[CommOp], world: int,
                results: list[tuple[Path, ImportResult, int | None]],
                layout: Any) -> tuple[dict[int, list[CommOp]], list[CommOp], str | None]:
        """Records without a group take the world as their group where that is unambiguous; else the reason."""
        def groupless(op: CommOp) -> bool:
            return not op.group and op.op in COLLECTIVES and op.op != "barrier"

        num = sum(groupless(op) for ops in ops_by_rank.values() for op in ops) + sum(map(groupless, unranked))
        num_p2p = sum(1 for op in [*unranked, *(o for ops in ops_by_rank.values() for o in ops)]
                      if op.op in ("send", "recv", "all_to_all") and not op.group)
        formats = ", ".join(sorted({r.format for _, r, _ in results}))
        a2a_unranked = sum(1 for op in unranked if op.op == "all_to_all")
        why = _why_no_matrix(num, num_p2p, formats, layout, world, a2a_unranked=a2a_unranked)
        if why is not None or not num:
            return ops_by_rank, unranked, why
        everyone = tuple(range(world))

        def fix(op: CommOp) -> CommOp:
            return op.with_(group=everyone) if groupless(op) else op

        how = "the job's parallelism (dp only)" if layout is not None else "the records (give --tp/--pp/--dp to check)"
        self.notes.append(f"{num} collective records without a process group ({formats} logs none) took the whole "
                          f"world of {world} ranks as their group, from {how}")
        return ({r: [fix(op) for op in ops] for r, ops in ops_by_rank.items()}, [fix(op) for op in unranked],
                None)


def _why_no_matrix(num: int, num_p2p: int, formats: str, layout: Any, world: int, *,
                   a2a_unranked: int = 0) -> str | None:
    """Why records without a group (``num`` collectives, ``num_p2p`` send/recv/all_to_all) or all_to_alls without
    the rank that sent them (``a2a_unranked``: a matrix row is one rank's sends) leave the run without a traffic
    matrix; None when there are none, or when they can take the whole world as their group."""
    if not num:
        if num_p2p:
            return (f"{num_p2p} send/recv/all_to_all records name no peer or group ({formats}): the traffic matrix "
                    f"is omitted")
        return _why_no_a2a_rows(a2a_unranked, formats)
    if formats not in _WORLD_GROUP_FORMATS:
        return (f"{num} collective records name no process group ({formats} does not say it), so their traffic "
                f"cannot be placed; the traffic matrix is omitted")
    if layout is not None:
        p = layout.parallel
        if max(p.tp, p.pp, p.cp) > 1:
            return (f"{num} collective records name no process group ({formats} logs none), and with tp={p.tp}, "
                    f"pp={p.pp}, cp={p.cp} their group could be any of several; the traffic matrix is omitted")
    if world < 2:
        return (f"{num} collective records name no process group ({formats} logs none) and the world size is "
                f"unknown; the traffic matrix is omitted")
    return _why_no_a2a_rows(a2a_unranked, formats)


def _why_no_a2a_rows(a2a_unranked: int, formats: str) -> str | None:
    """Why all_to_all records that name no sending rank (a row for the whole group, as nccl-tests and DeepSpeed's
    summary table give) leave the run without a traffic matrix, whose rows are each rank's sends."""
    if not a2a_unranked:
        return None
    return (f"{a2a_unranked} all_to_all records ({formats}) name no sending rank (one row for the whole group), so "
            f"their sends cannot be placed rank by rank; the traffic matrix is omitted")


def _file_names(names: list[str], limit: int = 6) -> str:
    """File names for a problem line, the recorder's names of consecutive ranks as one range
    (``rank00001.jsonl to rank00003.jsonl``): at most ``limit`` items, then how many files more."""
    ranges: list[list[str]] = []
    last: tuple[int, str] | None = None  # the rank and suffix of the name before, when it is the recorder's
    for name in sorted(names):
        m = _RECORDER_NAME.fullmatch(name)
        this = (int(m.group(1)), m.group(2)) if m else None
        if this is not None and last is not None and this == (last[0] + 1, last[1]):
            ranges[-1].append(name)
        else:
            ranges.append([name])
        last = this
    shown = [", ".join(r) if len(r) < 3 else f"{r[0]} to {r[-1]}" for r in ranges[:limit]]
    more = sum(len(r) for r in ranges[limit:])
    return ", ".join(shown + ([f"and {more} files more"] if more else []))


def _duplicate(f: Path, rank: int, first: str) -> str:
    return (f"{f.name}: rank {rank} again (also in {first}): two runs in one directory, or a copied file? this "
            f"file is skipped")


def _marker(f: Path) -> Path | None:
    """The completion marker of a rank log, or None when it has none: the recorder's ``rank00003.done`` beside
    ``rank00003.jsonl`` (and beside the same log gzipped afterwards, ``rank00003.jsonl.gz``), or the log's name
    with its last suffix replaced (``rank00003.jsonl.done`` beside ``rank00003.jsonl.gz``)."""
    for marker in (f.with_name(f.name.split(".", 1)[0] + ".done"), f.with_suffix(".done")):
        if marker.is_file():
            return marker
    return None


def _read_jsonl(f: Path) -> ImportResult:
    """A commscope op log as an ImportResult; a log with a header and no op is a rank that issued none."""
    from commscope.io.oplog import read_ops_jsonl

    log = read_ops_jsonl(f)
    return ImportResult(ops=log.ops, source=str(f), format="jsonl", missing_fields=missing_fields(log.ops),
                        problems=list(log.problems), meta={"header": dict(log.header), "steps": list(log.steps),
                                                           "num_records": log.num_records, "num_ops": len(log.ops)})


def _file_rank(f: Path, result: ImportResult, problems: list[str]) -> int | None:
    """The rank a whole file belongs to: a commscope header's, a trace's or dump's own, else its name's digits."""
    rank, found = _rank_of(f, result.meta.get("header") or {}, result.meta, result.format)
    problems += found
    return rank


def _rank_of(f: Path, header: dict[str, Any], meta: dict[str, Any], fmt: str) -> tuple[int | None, list[str]]:
    """:func:`_file_rank` from a file's header, meta and format: the rank and what was wrong on the way."""
    problems = []
    stated = header.get("rank", meta.get("rank"))
    m = _RANK_IN_NAME.search(f.name.split(".", 1)[0])
    named = int(m.group(1)) if m and f.name.startswith(("rank", "rank-", "rank_")) else None
    if stated is not None and (isinstance(stated, bool) or not isinstance(stated, int) or stated < 0):
        problems.append(f"{f.name} line 1: header rank={stated!r} is no rank (an integer >= 0); "
                        + (f"using {named} from the file name" if named is not None else "its records keep theirs"))
        stated = None
    if stated is not None and named is not None and stated != named:
        problems.append(f"{f.name}: the header says rank {stated}, the file name rank {named}; using the header's")
    world = header.get("world_size")
    if stated is not None and is_int(world) and 0 < world <= stated:
        problems.append(f"{f.name} line 1: header rank={stated} is not below its world_size={world}: a rank of "
                        f"another run, or a damaged header?")
    if fmt in ("jsonl", "kineto", "flight_recorder"):
        return (stated if stated is not None else named), problems
    return None, problems


def _partial_steps(ops_by_rank: dict[int, list[CommOp]], finished: Collection[int] = ()) -> dict[int, tuple[int, ...]]:
    """Steps that some rank with step tags lacks, and a rank's last step when the rank may have been stopped in
    it (it is not among ``finished``, the ranks whose log ended normally) and it holds fewer records than every
    other step of that rank. Steps differ in their ops: DDP rebuilds its buckets in its second step, which then
    holds more ops than the rest (a median of the others took the last of 3 steps as short)."""
    return _partial_steps_of({r: Counter(s for s in map(op_step, ops) if s is not None)
                              for r, ops in ops_by_rank.items()}, finished)


def _partial_steps_of(counts: Mapping[int, Mapping[int, int] | tuple[tuple[int, int], ...]],
                      finished: Collection[int] = ()) -> dict[int, tuple[int, ...]]:
    """:func:`_partial_steps` from each rank's records per step (a mapping or (step, records) pairs; ranks whose
    counts are one object are looked at once)."""
    seen: dict[int, tuple[frozenset[int], int | None]] = {}  # id of counts -> (steps, the last step when short)
    tagged: dict[int, tuple[frozenset[int], int | None]] = {}
    for r, c in counts.items():
        if not c:
            continue
        view = seen.get(id(c))
        if view is None:
            d = dict(c)
            last = max(d)
            others = [n for s, n in d.items() if s != last]
            view = seen[id(c)] = (frozenset(d), last if others and d[last] < min(others) else None)
        tagged[r] = view if r not in finished else (view[0], None)
    every = frozenset().union(*(v[0] for v in tagged.values())) if tagged else frozenset()
    out: dict[int, set[int]] = defaultdict(set)
    for r, (steps, short) in tagged.items():
        for s in every - steps:
            out[s].add(r)
        if short is not None:
            out[short].add(r)
    return {s: tuple(sorted(rs)) for s, rs in sorted(out.items())}


def _finished_ranks(headers: Mapping[int, Any], unfinished: Collection[int], failure: dict[str, Any] | None) -> set[int]:
    """Ranks whose commscope log ended normally (its completion marker written) in a run that did not fail: their
    last step is whole, however few ops it holds."""
    return set() if failure is not None else set(headers) - set(unfinished)
