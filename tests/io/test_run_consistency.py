"""Recorded logs that read without an error but disagree with themselves: a size or group no job can have, a log cut
at a line boundary, a copied file, runs mixed in one directory. Each is one problem line naming the file (and line),
and the reader in memory (read_run) and the one folding rank files into totals (read_run_totals) find the same.

The logs are the synthetic job's (:func:`commscope.measure.capture.synthetic.write_synthetic_rank`, written line by line by
the recorder's own writer): 4 ranks, tp 1, pp 2, dp 2, one step; every test breaks a copy in one way.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from commscope.measure.capture.synthetic import write_synthetic_rank
from commscope.io.runs import read_run, read_run_totals, run_totals

RANKS = 4


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    out = tmp_path / "logs"
    out.mkdir()
    for r in range(RANKS):
        write_synthetic_rank(out, r, RANKS, 0, gz=False, layers=1, steps=1)
    return out


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


def _edit_record(path: Path, lineno: int, **fields: object) -> str:
    """Set ``fields`` in the record on 1-based line ``lineno`` of ``path``; returns ``'<file> line <n>: '``."""
    lines = _lines(path)
    obj = json.loads(lines[lineno - 1])
    assert "op" in obj, lines[lineno - 1]
    obj.update(fields)
    lines[lineno - 1] = json.dumps(obj, separators=(",", ":"))
    _write(path, lines)
    return f"{path.name} line {lineno}: "


def _read_both(logs: Path):
    """The run read in memory and folded into totals: their findings must agree."""
    in_memory, streamed = read_run(logs), read_run_totals(logs)
    assert streamed == run_totals(in_memory)
    return in_memory, streamed


def _problems(logs: Path) -> tuple[str, ...]:
    return _read_both(logs)[1].problems


@pytest.mark.parametrize(("value", "message"), [
    (2**41, "size_bytes=2199023255552 is larger than any real message (> 1 TiB"),
    ("4000", "size_bytes='4000': expected a whole number of bytes >= 0"),
    (-4, "size_bytes=-4: expected a whole number of bytes >= 0"),
])
def test_a_size_no_message_can_have_is_reported_and_skipped(logs: Path, value: object, message: str) -> None:
    where = _edit_record(logs / "rank00001.jsonl", 2, size_bytes=value)
    run, totals = _read_both(logs)
    found = [p for p in totals.problems if p.startswith(where)]
    assert len(found) == 1 and message in found[0] and found[0].endswith(", skipped"), totals.problems
    assert "not supported between" not in found[0]
    assert len(run.ops_by_rank[1]) == len(_lines(logs / "rank00001.jsonl")) - 3  # header, step line, the bad one


@pytest.mark.parametrize(("field", "value", "message"), [
    ("group", ["0", "1"], "group=['0', '1']: expected a list of ranks (integers >= 0)"),  # int() made them ranks
    ("group", [0.5], "group=[0.5]: expected a list of ranks (integers >= 0)"),
    ("count", "2", "count='2': expected an integer >= 1"),
])
def test_a_field_int_would_convert_is_reported_not_converted(logs: Path, field: str, value: object,
                                                             message: str) -> None:
    where = _edit_record(logs / "rank00000.jsonl", 2, **{field: value})
    assert [p for p in _problems(logs) if p.startswith(where)] == [f"{where}{message}, skipped"]


@pytest.mark.parametrize(("fields", "message"), [
    ({"group": [0, 1, 2, 99]}, "group=[0, 1, 2, 99]: rank 99 is not below the header's world_size=4"),
    ({"group": [1, 2, 3]}, "group=[1, 2, 3] does not hold the record's rank 0"),
    ({"group": [0, 0, 1, 2]}, "group=[0, 0, 1, 2]: rank 0 more than once"),
])
def test_a_group_the_record_cannot_have_is_reported_and_skipped(logs: Path, fields: dict, message: str) -> None:
    where = _edit_record(logs / "rank00000.jsonl", 2, **fields)
    run, totals = _read_both(logs)
    found = [p for p in totals.problems if p.startswith(where)]
    assert len(found) == 1 and message in found[0] and found[0].endswith(", skipped"), totals.problems
    # the skipped record neither makes the run bigger nor leaves a rank "without a log"
    assert run.world_size == totals.world_size == RANKS and not any("no log for" in p for p in totals.problems)


def test_a_send_whose_peer_is_not_in_its_group_is_reported(logs: Path) -> None:
    path = logs / "rank00000.jsonl"  # the first stage: it sends its activations to rank 2
    k = next(i for i, line in enumerate(_lines(path), 1) if line.startswith('{"op":"send"'))
    assert json.loads(_lines(path)[k - 1])["group"] == [0, 2]
    where = _edit_record(path, k, peer=1)
    assert [p for p in _problems(logs) if p.startswith(where)] == [
        f"{where}peer=1 is not in group=[0, 2]: expected a member of the group it sent or received on, skipped"]


def test_a_broadcast_whose_root_is_not_in_its_group_is_reported(logs: Path) -> None:
    """A broadcast's root is where its traffic starts; one outside its group could be drawn from nowhere (the matrix
    would start it at the group's first rank, silently)."""
    path = logs / "rank00000.jsonl"
    extra = json.loads(_lines(path)[1])["extra"]
    where = _edit_record(path, 2, op="broadcast", group=[0, 1], extra={**extra, "root": 3})
    assert [p for p in _problems(logs) if p.startswith(where)] == [
        (f"{where}root=3 is not in group=[0, 1]: expected the member of the group the broadcast starts at (a global rank), "
        "skipped")]


def test_a_record_of_another_rank_in_a_ranks_log_is_reported(logs: Path) -> None:
    where = _edit_record(logs / "rank00000.jsonl", 2, rank=1, group=[0, 1])
    run, totals = _read_both(logs)
    assert [p for p in totals.problems if p.startswith(where)] == [
        f"{where}rank=1 in the log of rank 0 (its header's): expected 0, skipped"]
    assert len(run.ops_by_rank[1]) == len(_lines(logs / "rank00001.jsonl")) - 2


def test_a_log_cut_at_a_line_boundary_is_found_by_its_done_marker(logs: Path) -> None:
    path = logs / "rank00000.jsonl"
    written = int((logs / "rank00000.done").read_text())
    _write(path, _lines(path)[:3])  # head -n 3: the header and two records, every line whole
    assert f"rank00000.jsonl: 2 op records, its .done marker says {written} were written: the file was cut or " \
           f"edited" in _problems(logs)


def test_a_log_with_more_records_than_its_marker_is_reported(logs: Path) -> None:
    path = logs / "rank00003.jsonl"
    lines = _lines(path)
    _write(path, [*lines, lines[1]])
    written = int((logs / "rank00003.done").read_text())
    assert any(p.startswith(f"rank00003.jsonl: {written + 1} op records, its .done marker says {written} were written")
               for p in _problems(logs))


def test_a_damaged_record_is_reported_once_not_also_as_a_cut_file(logs: Path) -> None:
    path = logs / "rank00001.jsonl"
    lines = _lines(path)
    lines[3] = lines[3][:40]  # a record broken in the middle of the file: still a record the recorder wrote
    _write(path, lines)
    problems = _problems(logs)
    assert len(problems) == 1 and problems[0].startswith("rank00001.jsonl line 4: invalid JSON"), problems


def test_the_marker_of_a_log_gzipped_after_the_run_is_found(logs: Path) -> None:
    for r in range(RANKS):
        path = logs / f"rank{r:05d}.jsonl"
        (logs / f"rank{r:05d}.jsonl.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    streamed = _read_both(logs)[1]
    assert streamed.unfinished_ranks == () and streamed.problems == ()
    (logs / "rank00002.done").write_text("7\n")
    assert any(p.startswith("rank00002.jsonl.gz: ") and "marker says 7" in p for p in _problems(logs))


def test_the_recorders_file_of_a_rank_wins_over_a_copy_beside_it(logs: Path) -> None:
    (logs / "rank00001 (copy).jsonl").write_bytes((logs / "rank00001.jsonl").read_bytes())
    run, totals = _read_both(logs)
    assert totals.problems == (("rank00001 (copy).jsonl: rank 1 again (also in rank00001.jsonl): two runs in one "
                                "directory, or a copied file? this file is skipped"),)
    assert totals.unfinished_ranks == () and len(run.ops_by_rank[1]) == len(_lines(logs / "rank00001.jsonl")) - 2


def test_a_header_only_log_is_said_plainly_and_its_rank_counted(logs: Path) -> None:
    path = logs / "rank00003.jsonl"
    _write(path, _lines(path)[:1])
    (logs / "rank00003.done").write_text("0\n")  # the rank issued no op and finished
    run, totals = _read_both(logs)
    assert totals.problems == (("rank00003.jsonl: the log holds no op record, only its header: rank 3 is counted as "
                               "logged, with no ops"),)
    assert run.ops_by_rank[3] == [] and totals.ranks_logged == (0, 1, 2, 3) and totals.unfinished_ranks == ()


def test_a_lone_header_only_log_is_one_rank_with_no_records(tmp_path: Path) -> None:
    write_synthetic_rank(tmp_path, 0, 1, 0, gz=False, steps=1)
    path = tmp_path / "rank00000.jsonl"
    _write(path, _lines(path)[:1])
    (tmp_path / "rank00000.done").unlink()
    for totals in (run_totals(read_run(path)), run_totals(read_run(tmp_path)), read_run_totals(tmp_path)):
        assert totals.ranks_logged == (0,) and totals.world_size == 1 and totals.unfinished_ranks == (0,)
        assert totals.problems == (("rank00000.jsonl: the log holds no op record, only its header: rank 0 is counted "
                                   "as logged, with no ops"),)


def _set_header(path: Path, **fields: object) -> None:
    lines = _lines(path)
    header = json.loads(lines[0])
    header["commscope_header"].update(fields)
    _write(path, [json.dumps(header), *lines[1:]])


def test_logs_of_different_runs_are_told_apart_by_their_run_id(logs: Path) -> None:
    # the script destroyed its process group before the first flush: no header says the world size
    for r in range(RANKS):
        _set_header(logs / f"rank{r:05d}.jsonl", world_size=None, run_id="job-7" if r == 0 else "job-9")
    run, totals = _read_both(logs)
    assert totals.problems == (("rank00000.jsonl is of run job-7, rank00001.jsonl to rank00003.jsonl of run job-9: "
                               "logs of different runs mixed in one directory"),)
    assert sorted(run.ops_by_rank) == [0, 1, 2, 3]  # and read on


def test_one_run_id_and_logs_without_one_are_no_problem(logs: Path) -> None:
    for r in range(2):
        _set_header(logs / f"rank{r:05d}.jsonl", run_id="job-7")
    assert _problems(logs) == ()
    _set_header(logs / "rank00003.jsonl", run_id=7)
    assert _problems(logs) == (("rank00003.jsonl line 1: header run_id=7: expected the run's id (a non-empty string); "
                               "not compared"),)


def test_a_header_with_another_world_size_is_reported(logs: Path) -> None:
    _set_header(logs / "rank00002.jsonl", world_size=8)
    assert _problems(logs)[0] == ("headers disagree on the world size (4: rank00000.jsonl, rank00001.jsonl, "
                                  "rank00003.jsonl; 8: rank00002.jsonl): files of different runs in one directory?")
    _set_header(logs / "rank00002.jsonl", world_size="4")
    assert _problems(logs) == (("rank00002.jsonl line 1: header world_size='4': expected the number of ranks (an "
                               "integer >= 1) or null; not used"),)


def test_a_header_rank_beyond_its_world_size_is_reported(logs: Path) -> None:
    _set_header(logs / "rank00003.jsonl", world_size=3)
    assert ("rank00003.jsonl line 1: header rank=3 is not below its world_size=3: a rank of another run, or a "
            "damaged header?") in _problems(logs)


def test_a_bad_line_in_a_copied_log_is_reported_once_with_the_file_kept(logs: Path) -> None:
    where = _edit_record(logs / "rank00001.jsonl", 2, op="allreduce")
    (logs / "rank00001.jsonl.gz").write_bytes(gzip.compress((logs / "rank00001.jsonl").read_bytes()))
    assert _problems(logs) == (
        (f"{where}not a valid CommOp (CommOp.op='allreduce': valid ops are all_reduce, all_gather, reduce_scatter, "
        f"all_to_all, broadcast, reduce, send, recv, barrier, gather, scatter), skipped"),
        ("rank00001.jsonl.gz: rank 1 again (also in rank00001.jsonl): two runs in one directory, or a copied file? "
        "this file is skipped"))


@pytest.mark.parametrize(("fields", "message"), [
    ({"op": "send", "group": [0, 1]},  # once a traceback in summarize's traffic matrix
     "op='send' names no peer: expected the rank it sent to (peer, a member of group=[0, 1]), skipped"),
    ({"op": "send", "group": [0, 1], "peer": 1}, "peer=1 is the record's own rank: a send goes to another rank"),
    ({"op": "all_to_all", "group": [0, 1, 2, 3], "splits": [1, 2]},  # once a traceback: cannot broadcast (2,) to (4,)
     "splits=[1, 2] has 2 entries for group=[0, 1, 2, 3]: expected the bytes sent to each of its 4 members"),
    ({"op": "all_to_all", "group": [0, 1], "splits": [1, 2]}, "splits=[1, 2] sum to 3 B, size_bytes=8388608"),
])
def test_a_p2p_or_all_to_all_record_that_places_bytes_nowhere_is_reported(logs: Path, fields: dict,
                                                                          message: str) -> None:
    where = _edit_record(logs / "rank00001.jsonl", 2, **fields)  # an all-reduce of rank 1, made another op
    found = [p for p in _problems(logs) if p.startswith(where)]
    assert len(found) == 1 and message in found[0], found
