"""A measured run from whatever records a user has: one file or a directory of per-rank files, any format.

:func:`read_run` is what ``summarize``, ``compare`` and ``report --measured`` read with. It accepts

- commscope's own ``rank*.jsonl`` logs (``commscope record``), with their headers and ``.done`` markers;
- any file :func:`commscope.io.importers.import_records` reads (Kineto traces, DeepSpeed comms logs, nccl-tests /
  rccl-tests output, PyTorch Flight Recorder dumps, ``NCCL_DEBUG=INFO`` logs), the format told from the content;
- a directory of such files, one per rank, merged.

Recorded logs are data to defend: a bad record (an unknown dtype, a null group, a size of ``1e400``, a step that
is no integer) is reported with its file and line and skipped by the reader; here the run as a whole is checked
too: duplicate and missing ranks, a header whose rank disagrees with the file name, files of other formats or
of other runs in the same directory, steps some ranks did not finish. Everything found is in
:attr:`RunLog.problems` (what was wrong or skipped) and :attr:`RunLog.notes` (what was assumed); nothing of it
stops the reading, only an input with nothing importable does (a ``ValueError`` that says why).

Records without process-group ranks (DeepSpeed's) take the whole world as their group when the world size is
known and no layout says the job has groups of another size; otherwise :attr:`RunLog.matrix_omitted` says why no
traffic matrix can be built from them.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commscope.io.import_base import ImportResult, missing_fields
from commscope.io.oplog import FAILURE_FILE, read_failure
from commscope.record import COLLECTIVES, CommOp

__all__ = ["RunLog", "op_step", "read_run"]

#: Headers whose ``started_ns`` differ by more than this are from different runs (a job's ranks start within
#: seconds of each other; one hour leaves room for a slow rendezvous).
MIXED_RUN_START_SPREAD_NS = 3600 * 10**9
_RANK_IN_NAME = re.compile(r"(\d+)(?:\D*)$")
#: Formats whose records without a group are the world's: DeepSpeed computes its bandwidths with the world size.
_WORLD_GROUP_FORMATS = frozenset({"deepspeed"})
_IGNORED_SUFFIXES = (".done", ".md", ".png", ".html", ".npz", ".csv", ".toml")  # .toml: the job saved beside the logs
_IGNORED_NAMES = (FAILURE_FILE,)  # the launcher's marker of a failed run: read into RunLog.failure


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLog:
    """All ranks' records of one measured run."""

    ops_by_rank: dict[int, list[CommOp]]
    """Records of each global rank, in file order."""
    world_size: int
    """Ranks of the job (0 when nothing says it)."""
    problems: tuple[str, ...] = ()
    """What was wrong in the input or skipped: ``<file> line <n>: ...`` for records, run-level findings too."""
    unfinished_ranks: tuple[int, ...] = ()
    """Ranks whose commscope log has no completion marker (the job crashed or is still running)."""
    headers: dict[int, dict] = field(default_factory=dict)
    unranked: tuple[CommOp, ...] = ()
    """Records that name no rank (a DeepSpeed summary row, an nccl-tests row): each counts once."""
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

    @property
    def all_ops(self) -> list[CommOp]:
        """Every record, ranked ones by rank, then the unranked ones."""
        return [op for _, ops in sorted(self.ops_by_rank.items()) for op in ops] + list(self.unranked)


def op_step(op: CommOp) -> int | None:
    """The training step a measured op was tagged with (None: setup)."""
    for key, value in op.extra:
        if key == "step":
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def read_run(path: str | Path, *, layout: Any = None) -> RunLog:
    """Read a measured run from ``path``: a directory of per-rank files, or one file, of any importable format.

    ``layout`` (a :class:`commscope.layout.Layout`) is the job's, when known: it decides whether records without
    a group may take the whole world as their group. Raises ValueError (naming the path and why) when nothing
    importable is found; every lesser problem is reported in the result.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                       and not p.name.endswith(_IGNORED_SUFFIXES) and p.name not in _IGNORED_NAMES)
        if not files:
            raise ValueError(f"{path}: an empty directory: no rank*.jsonl logs (commscope record) and no file another "
                             f"tool wrote (Kineto traces, DeepSpeed logs, Flight Recorder dumps, NCCL_DEBUG logs)")
    else:
        files = [path]
    reader = _Reader(path)
    for f in files:
        reader.read(f, alone=not path.is_dir())
    return reader.finish(layout)


class _Reader:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.results: list[tuple[Path, ImportResult, int | None]] = []
        self.headers: dict[int, dict] = {}
        self.unfinished: list[int] = []
        self.steps_by_rank: dict[int, list[dict[str, int]]] = {}

    def read(self, f: Path, *, alone: bool) -> None:
        from commscope.io.importers import detect_format, import_records

        try:
            fmt = detect_format(f)
        except ValueError as exc:
            if alone:
                raise
            self.problems.append(f"{f.name}: not read: {str(exc).split(': ', 1)[-1]}")
            return
        try:
            if fmt == "jsonl":
                result = _read_jsonl(f)
            else:
                result = import_records(f, format=fmt)
        except ValueError as exc:
            if alone:
                raise
            self.problems.append(f"{f.name}: not read: {str(exc).split(': ', 1)[-1]}")
            return
        self.problems += result.problems
        self.results.append((f, result, _file_rank(f, result, self.problems)))

    def finish(self, layout: Any) -> RunLog:
        if not self.results:
            found = "; ".join(self.problems[:3])
            raise ValueError(f"{self.root}: nothing importable" + (f" ({found})" if found else ""))
        results = self._one_format()
        ops_by_rank: dict[int, list[CommOp]] = {}
        unranked: list[CommOp] = []
        owner: dict[int, str] = {}
        world = 0
        for f, result, rank in results:
            if result.format == "jsonl" and rank is not None:
                if rank in owner:
                    self.problems.append(f"{f.name}: rank {rank} again (also in {owner[rank]}): two runs in one "
                                         f"directory, or a copied file? this file is skipped")
                    continue
                owner[rank] = f.name
                self.headers[rank] = dict(result.meta.get("header") or {})
                if result.meta.get("steps"):
                    self.steps_by_rank[rank] = sorted(result.meta["steps"], key=lambda m: m["step"])
                if not f.with_suffix(".done").exists():
                    self.unfinished.append(rank)
            for op in result.ops:
                r = op.rank if op.rank is not None else rank
                if r is None:
                    unranked.append(op)
                else:
                    ops_by_rank.setdefault(r, []).append(op if op.rank == r else op.with_(rank=r))
            meta_world = result.meta.get("world_size") or (result.meta.get("header") or {}).get("world_size")
            if isinstance(meta_world, int) and not isinstance(meta_world, bool) and meta_world > 0:
                world = max(world, meta_world)
        world = max([world, *(r + 1 for r in ops_by_rank),
                     *(max(op.group) + 1 for ops in ops_by_rank.values() for op in ops if op.group),
                     *(max(op.group) + 1 for op in unranked if op.group)])
        if layout is not None and world <= layout.world_size and {r.format for _, r, _ in results} - {"jsonl",
                                                                                                "nccl_tests"}:
            world = layout.world_size  # the records of one rank, or a log without ranks, see part of the world
        self._check_headers(results, world)
        ops_by_rank, unranked, omitted = self._groups(ops_by_rank, unranked, world, results, layout)
        all_ops = [op for ops in ops_by_rank.values() for op in ops] + unranked
        always = tuple(sorted({name for _, r, _ in results for name in r.missing_fields}))
        return RunLog(ops_by_rank=ops_by_rank, world_size=world, problems=tuple(self.problems),
                      unfinished_ranks=tuple(sorted(self.unfinished)), headers=self.headers,
                      unranked=tuple(unranked), files=tuple(str(f) for f, _, _ in results),
                      formats=tuple(sorted({r.format for _, r, _ in results})),
                      missing_fields=missing_fields(all_ops, always) if all_ops else always,
                      notes=tuple(self.notes), matrix_omitted=omitted,
                      partial_steps=_partial_steps(ops_by_rank), steps_by_rank=self.steps_by_rank,
                      failure=read_failure(self.root) if self.root.is_dir() else None)

    def _one_format(self) -> list[tuple[Path, ImportResult, int | None]]:
        """The results of the directory's main format; files of other formats are reported and left out."""
        kinds = Counter(r.format for _, r, _ in self.results)
        if len(kinds) == 1:
            return self.results
        main = max(kinds, key=lambda k: (kinds[k], k == "jsonl"))
        others = [f"{f.name} ({r.format})" for f, r, _ in self.results if r.format != main]
        self.problems.append(f"{self.root}: files of several formats ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))}); "
                             f"read the {kinds[main]} {main} file(s), left out: {', '.join(others[:8])}"
                             + (" ..." if len(others) > 8 else ""))
        return [t for t in self.results if t[1].format == main]

    def _check_headers(self, results: list[tuple[Path, ImportResult, int | None]], world: int) -> None:
        worlds: dict[int, list[str]] = defaultdict(list)
        starts: list[tuple[int, str]] = []
        for f, result, _ in results:
            header = result.meta.get("header") or {}
            w = header.get("world_size")
            if isinstance(w, int) and not isinstance(w, bool):
                worlds[w].append(f.name)
            s = header.get("started_ns")
            if isinstance(s, int) and not isinstance(s, bool):
                starts.append((s, f.name))
        if len(worlds) > 1:
            self.problems.append("headers disagree on the world size (" + "; ".join(
                f"{w}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for w, names in sorted(worlds.items()))
                + "): files of different runs in one directory?")
        if starts:
            lo, hi = min(starts), max(starts)
            if hi[0] - lo[0] > MIXED_RUN_START_SPREAD_NS:
                self.problems.append(f"{lo[1]} and {hi[1]} started {(hi[0] - lo[0]) / 3.6e12:.1f} hours apart: files "
                                     f"of different runs in one directory?")
        if any(r.format == "jsonl" for _, r, _ in results) and world:
            logged = {rank for _, r, rank in results if r.format == "jsonl" and rank is not None}
            missing = sorted(set(range(world)) - logged)
            if missing and logged:
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
        if not num:
            return ops_by_rank, unranked, (f"{num_p2p} send/recv/all_to_all records name no peer or group "
                                           f"({formats}): the traffic matrix is omitted" if num_p2p else None)
        if formats not in _WORLD_GROUP_FORMATS:
            return ops_by_rank, unranked, (
                f"{num} collective records name no process group ({formats} does not say it), so their traffic "
                f"cannot be placed; the traffic matrix is omitted")
        if layout is not None:
            p = layout.parallel
            if max(p.tp, p.pp, p.cp) > 1:
                return ops_by_rank, unranked, (
                    f"{num} collective records name no process group ({formats} logs none), and with tp={p.tp}, "
                    f"pp={p.pp}, cp={p.cp} their group could be any of several; the traffic matrix is omitted")
        if world < 2:
            return ops_by_rank, unranked, (f"{num} collective records name no process group ({formats} logs none) "
                                           f"and the world size is unknown; the traffic matrix is omitted")
        everyone = tuple(range(world))

        def fix(op: CommOp) -> CommOp:
            return op.with_(group=everyone) if groupless(op) else op

        how = "the job's parallelism (dp only)" if layout is not None else "the records (give --tp/--pp/--dp to check)"
        self.notes.append(f"{num} collective records without a process group ({formats} logs none) took the whole "
                          f"world of {world} ranks as their group, from {how}")
        return ({r: [fix(op) for op in ops] for r, ops in ops_by_rank.items()}, [fix(op) for op in unranked],
                None)


def _read_jsonl(f: Path) -> ImportResult:
    """A commscope op log as an ImportResult; a log with a header and no op is a rank that issued none."""
    from commscope.io.oplog import read_ops_jsonl

    log = read_ops_jsonl(f)
    return ImportResult(ops=log.ops, source=str(f), format="jsonl", missing_fields=missing_fields(log.ops),
                        problems=list(log.problems), meta={"header": dict(log.header), "steps": list(log.steps)})


def _file_rank(f: Path, result: ImportResult, problems: list[str]) -> int | None:
    """The rank a whole file belongs to: a commscope header's, a trace's or dump's own, else its name's digits."""
    header = result.meta.get("header") or {}
    stated = header.get("rank", result.meta.get("rank"))
    m = _RANK_IN_NAME.search(f.name.split(".", 1)[0])
    named = int(m.group(1)) if m and f.name.startswith(("rank", "rank-", "rank_")) else None
    if stated is not None and (isinstance(stated, bool) or not isinstance(stated, int) or stated < 0):
        problems.append(f"{f.name} line 1: header rank={stated!r} is no rank (an integer >= 0); "
                        + (f"using {named} from the file name" if named is not None else "its records keep theirs"))
        stated = None
    if stated is not None and named is not None and stated != named:
        problems.append(f"{f.name}: the header says rank {stated}, the file name rank {named}; using the header's")
    if result.format in ("jsonl", "kineto", "flight_recorder"):
        return stated if stated is not None else named
    return None


def _partial_steps(ops_by_rank: dict[int, list[CommOp]]) -> dict[int, tuple[int, ...]]:
    """Steps that some rank with step tags lacks, and a rank's last step when it holds fewer records than the
    median of that rank's other steps (a rank killed in the middle of it)."""
    counts = {r: Counter(s for s in map(op_step, ops) if s is not None) for r, ops in ops_by_rank.items()}
    tagged = {r: c for r, c in counts.items() if c}
    every = set().union(*(set(c) for c in tagged.values())) if tagged else set()
    out: dict[int, set[int]] = defaultdict(set)
    for r, c in tagged.items():
        for s in every - set(c):
            out[s].add(r)
        last = max(c)
        others = sorted(n for s, n in c.items() if s != last)
        if others and c[last] < others[len(others) // 2]:
            out[last].add(r)
    return {s: tuple(sorted(rs)) for s, rs in sorted(out.items())}
