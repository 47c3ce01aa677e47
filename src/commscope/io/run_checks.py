"""The checks of a measured run as a whole, apart from its records: which rank a file is (its header's, its name's),
a rank's completion marker, a second log of one rank, the steps some ranks did not finish, why records without a
group or sending rank leave the run without a traffic matrix; and file names as problem lines list them.

:mod:`commscope.io.runs` reports what these find in :attr:`~commscope.io.run_log.RunFindings.problems` and
:attr:`~commscope.io.run_log.RunFindings.notes`.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from commscope.commop import CommOp
from commscope.io.import_base import ImportResult
from commscope.io.oplog_checks import is_int
from commscope.io.run_log import op_step

_RANK_IN_NAME = re.compile(r"(\d+)(?:\D*)$")
#: The name the recorder gives a rank's log (gzipped afterwards, or by the synthetic writer, too).
_RECORDER_NAME = re.compile(r"rank(\d{5})(\.jsonl(?:\.gz)?)")
#: Formats whose records without a group are the world's: DeepSpeed computes its bandwidths with the world size.
_WORLD_GROUP_FORMATS = frozenset({"deepspeed"})


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
