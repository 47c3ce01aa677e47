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

This module reads the files (:func:`read_run`, :func:`read_run_totals`, :func:`write_run_parquet`) and is where
callers import from; what a run is once read lives in :mod:`commscope.io.run_log`, the folding of records into
totals in :mod:`commscope.io.run_fold`, and the checks of the run as a whole in :mod:`commscope.io.run_checks`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from commscope.commop import COLLECTIVES, CommOp
from commscope.io.import_base import ImportResult, missing_fields, missing_of
from commscope.io.oplog import FAILURE_FILE, read_failure
from commscope.io.oplog_checks import is_int
from commscope.io.run_checks import (
    _RECORDER_NAME,
    _duplicate,
    _file_names,
    _file_rank,
    _finished_ranks,
    _marker,
    _partial_steps,
    _partial_steps_of,
    _rank_of,
    _why_no_matrix,
)
from commscope.io.run_fold import _Fold, _RunFold, run_totals
from commscope.io.run_log import AxisAttribution, RunFindings, RunLog, RunTotals, is_logical, op_step, senders

__all__ = ["AxisAttribution", "RunFindings", "RunLog", "RunTotals", "is_logical", "op_step", "read_run", "read_run_totals", "run_totals",
           "write_run_parquet"]

#: Headers whose ``started_ns`` differ by more than this are from different runs (a job's ranks start within
#: seconds of each other; one hour leaves room for a slow rendezvous).
MIXED_RUN_START_SPREAD_NS = 3600 * 10**9
#: Formats whose records name the rank that logged them, not the ranks of the job: DeepSpeed's verbose lines come
#: from rank 0 alone (``log_dist(..., ranks=[0])``), so rank 0 says nothing of a world of 32. The world size is the
#: log's own (from its bandwidths, or given), else unknown, never the ranks seen.
_LOGGING_RANK_FORMATS = frozenset({"deepspeed"})
_IGNORED_SUFFIXES = (".done", ".md", ".png", ".html", ".npz", ".csv", ".toml")  # .toml: the job saved beside the logs
_IGNORED_NAMES = (FAILURE_FILE,)  # the launcher's marker of a failed run: read into RunLog.failure


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
    directory as one table. The files are renamed into place together once every one is written
    (:class:`~commscope.io.atomic.OutputSet`): a full disk half-way leaves no table of some ranks only, which a query
    would read as the whole run. Returns (files written, rows, problems of the files read). Raises ValueError naming
    the path when nothing could be read."""
    from commscope.io.atomic import OutputSet

    path, out_dir = Path(path), Path(out_dir)
    files = _run_files(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    with OutputSet(out_dir) as staged:
        written, rows, problems = _write_parquet_tables(path, files, staged, layout)
    return written, rows, problems


def _write_parquet_tables(path: Path, files: list[Path], staged: Any, layout: Any) -> tuple[list[Path], int, list[str]]:
    from dataclasses import replace

    from commscope.io.tables import write_ops_parquet

    out_dir = staged.folder
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
        rows += write_ops_parquet(staged.path(target.name), ops)
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
        odd = sorted(p.name for p in path.iterdir() if not p.name.startswith(".") and not p.is_file()
                     and not p.is_dir())  # a pipe, a device, a dangling link: never read (a read could block)
        what = (f"holds no regular file ({', '.join(odd[:4])}{' ...' if len(odd) > 4 else ''}: not a regular file, a "
                "pipe, a device or a dangling link)" if odd else "an empty directory")
        raise ValueError(f"{path}: {what}: no rank*.jsonl logs (commscope record) and no file another "
                         f"tool wrote (Kineto traces, DeepSpeed logs, Flight Recorder dumps, NCCL_DEBUG logs)")
    return files


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



def _read_jsonl(f: Path) -> ImportResult:
    """A commscope op log as an ImportResult; a log with a header and no op is a rank that issued none."""
    from commscope.io.oplog import read_ops_jsonl

    log = read_ops_jsonl(f)
    return ImportResult(ops=log.ops, source=str(f), format="jsonl", missing_fields=missing_fields(log.ops),
                        problems=list(log.problems), meta={"header": dict(log.header), "steps": list(log.steps),
                                                           "num_records": log.num_records, "num_ops": len(log.ops)})

