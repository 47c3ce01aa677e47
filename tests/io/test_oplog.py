"""Op logs on disk: JSONL and CSV round trips, and reading what a crashed writer left behind."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import jobs

import commscope.io
from commscope.io.oplog import CSV_COLUMNS, MAX_PROBLEMS, OpLog, read_ops_csv, read_ops_jsonl, write_ops_csv, write_ops_jsonl
from commscope.commop import CommOp
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.workload.dense import build_workload


def _workload():
    model = ModelSpec(name="gpt-1.5b", num_layers=24, hidden_size=2304, num_heads=24, seq_len=1024)
    return build_workload(model, ParallelSpec(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4))


MEASURED = [
    CommOp(op="all_to_all", axis="ep", group=(4, 5, 6, 7), size_bytes=4096, dtype="fp32", rank=5,
           splits=(1024, 0, 2048, 1024), phase="fwd", micro_batch=3, layer=11, name="moe_dispatch, \"quoted\"",
           t_start_ns=1_700_000_000_123_456_789, t_end_ns=1_700_000_000_123_999_999),
    CommOp(op="reduce_scatter", axis="dp", group=(0, 2), size_bytes=10, rank=0, backend_op="all_reduce",
           phase="bwd", name="grad_bucket0\tünïcode"),
    CommOp(op="send", axis="pp", group=(0, 8), size_bytes=0, rank=0, peer=8, count=3),
    CommOp(op="barrier", axis="other", group=(0,), size_bytes=0, phase="setup"),
]
EXTRA = CommOp(op="broadcast", axis="other", group=(0, 1, 2), size_bytes=8, extra=(("a", 1), ("b", "x")))


def test_public_api():
    assert set(commscope.io.__all__) == {
        "OpLog", "read_npz", "read_ops_csv", "read_ops_jsonl", "read_triplets_csv", "write_npz", "write_ops_csv",
        "write_ops_jsonl", "write_triplets_csv",
    }
    for name in commscope.io.__all__:
        assert getattr(commscope.io, name) is not None


# ----------------------------------------------------------------------------------------------- JSONL


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_jsonl_round_trip_of_a_workload(tmp_path, suffix):
    w = _workload()
    ops = list(w.ops())
    path = tmp_path / f"ops{suffix}"
    header = {"world_size": w.world_size, "model": {"name": "gpt-1.5b"}, "parallel": {"tp": 2, "pp": 4, "dp": 4}}
    assert write_ops_jsonl(path, iter(ops), header=header) == len(ops) == w.num_ops()
    log = read_ops_jsonl(path)
    assert isinstance(log, OpLog)
    assert log.ops == ops
    assert log.problems == []
    assert log.header["world_size"] == 32
    assert log.header["parallel"] == {"tp": 2, "pp": 4, "dp": 4}
    assert log.header["format"] == "commscope.ops"
    assert log.header["format_version"] == 1
    if suffix.endswith(".gz"):
        with gzip.open(path, "rt") as fh:
            assert json.loads(fh.readline()) == {"commscope_header": log.header}


def test_jsonl_round_trip_of_every_field(tmp_path):
    path = tmp_path / "measured.jsonl"
    ops = [*MEASURED, EXTRA]
    assert write_ops_jsonl(path, ops) == len(ops)
    log = read_ops_jsonl(path)
    assert log.ops == ops
    assert log.header == {}
    assert log.problems == []


def test_jsonl_lines_are_exactly_to_dict(tmp_path):
    """The hand-built fast path writes the same text as json.dumps(op.to_dict())."""
    ops = [*MEASURED, EXTRA, *list(_workload().ops("group"))]
    path = tmp_path / "ops.jsonl"
    write_ops_jsonl(path, ops)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines == [json.dumps(op.to_dict(), separators=(",", ":")) for op in ops]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=jobs(max_world=16, moe=None))
def test_jsonl_and_csv_round_trip_random_workloads(tmp_path, job):
    model, parallel = job
    ops = list(build_workload(model, parallel).ops())
    write_ops_jsonl(tmp_path / "r.jsonl", ops, header={"seed": 1})
    assert read_ops_jsonl(tmp_path / "r.jsonl").ops == ops
    write_ops_csv(tmp_path / "r.csv", ops)
    assert read_ops_csv(tmp_path / "r.csv").ops == ops


def test_truncated_last_line_keeps_every_previous_record(tmp_path):
    ops = list(_workload().ops())[:500]
    path = tmp_path / "ops.jsonl"
    write_ops_jsonl(path, ops, header={"world_size": 32})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 25])  # a rank killed while writing its last record
    log = read_ops_jsonl(path)
    assert log.ops == ops[:-1]
    assert log.problems == ["ops.jsonl line 501: truncated JSON, skipped"]  # line 1 is the header
    assert log.header["world_size"] == 32


def test_corrupt_lines_in_the_middle_are_skipped_with_line_numbers(tmp_path):
    ops = list(_workload().ops())[:10]
    lines = [json.dumps(op.to_dict()) for op in ops]
    lines[2] = lines[2][:30] + "#garbage"
    lines[5] = "[1, 2, 3]"
    lines[7] = json.dumps({**ops[7].to_dict(), "axis": "zz"})
    lines.insert(8, "")  # blank lines are fine
    lines.insert(9, json.dumps({**ops[8].to_dict(), "colour": "red"}))
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log = read_ops_jsonl(path)
    assert log.ops == [ops[k] for k in (0, 1, 3, 4, 6, 8, 9)]
    assert len(log.problems) == 4
    assert log.problems[0].startswith("bad.jsonl line 3: invalid JSON (")
    assert log.problems[1] == "bad.jsonl line 6: expected a JSON object, got list, skipped"
    assert log.problems[2].startswith("bad.jsonl line 8: not a valid CommOp (CommOp.axis='zz'")
    assert log.problems[3].startswith("bad.jsonl line 10: not a valid CommOp (unknown CommOp field(s) ['colour']")


def test_concatenated_logs_keep_both_and_report_the_second_header(tmp_path):
    ops = list(_workload().ops())[:6]
    a, b = tmp_path / "rank0.jsonl", tmp_path / "rank1.jsonl"
    write_ops_jsonl(a, ops[:3], header={"rank": 0})
    write_ops_jsonl(b, ops[3:], header={"rank": 1})
    both = tmp_path / "all.jsonl"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    log = read_ops_jsonl(both)
    assert log.ops == ops
    assert log.header["rank"] == 0
    assert log.problems == ["all.jsonl line 5: another commscope_header (files concatenated?), ignored"]


def test_truncated_gzip_keeps_what_was_decompressed(tmp_path):
    ops = list(_workload().ops())
    path = tmp_path / "ops.jsonl.gz"
    write_ops_jsonl(path, ops)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 3 // 4])
    log = read_ops_jsonl(path)
    assert 0 < len(log.ops) < len(ops)
    assert log.ops == ops[: len(log.ops)]
    assert any("compressed stream ends early" in p for p in log.problems)


def test_header_only_file_is_an_empty_log(tmp_path):
    path = tmp_path / "idle_rank.jsonl"
    assert write_ops_jsonl(path, [], header={"rank": 3}) == 0
    log = read_ops_jsonl(path)
    assert log.ops == [] and log.header["rank"] == 3 and log.problems == []


def test_missing_empty_or_garbage_files_raise_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match="nope.jsonl: no such file"):
        read_ops_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: empty file"):
        read_ops_jsonl(tmp_path / "empty.jsonl")
    (tmp_path / "junk.jsonl").write_text("hello\nworld\n")
    with pytest.raises(ValueError, match=r"junk.jsonl: no valid line in 2 lines \(junk.jsonl line 1: invalid JSON"):
        read_ops_jsonl(tmp_path / "junk.jsonl")


def test_problems_are_capped(tmp_path):
    path = tmp_path / "noisy.jsonl"
    good = json.dumps(MEASURED[0].to_dict())
    path.write_text("\n".join([good] + ["{oops"] * (MAX_PROBLEMS + 7)) + "\n")
    log = read_ops_jsonl(path)
    assert len(log.ops) == 1
    assert len(log.problems) == MAX_PROBLEMS + 1
    assert log.problems[-1] == "... and 7 more problems not listed"


def test_unserialisable_header_or_extra_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="header for .* cannot be written as JSON"):
        write_ops_jsonl(tmp_path / "h.jsonl", [], header={"f": object()})
    bad = CommOp(op="broadcast", axis="other", group=(0, 1), size_bytes=8, extra=(("f", object()),))
    with pytest.raises(ValueError, match="CommOp.extra=.* cannot be written as JSON"):
        write_ops_jsonl(tmp_path / "e.jsonl", [bad])


# ----------------------------------------------------------------------------------------------- CSV


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_csv_round_trip(tmp_path, suffix):
    ops = [*list(_workload().ops()), *MEASURED]
    path = tmp_path / f"ops{suffix}"
    assert write_ops_csv(path, ops) == len(ops)
    log = read_ops_csv(path)
    assert log.ops == ops
    assert log.problems == []


def test_csv_columns_and_cells(tmp_path):
    path = tmp_path / "ops.csv"
    write_ops_csv(path, MEASURED[:1])
    header, row = path.read_text(encoding="utf-8").splitlines()
    assert header == ",".join(CSV_COLUMNS)
    assert header == ("op,axis,name,group,rank,peer,size_bytes,dtype,phase,micro_batch,layer,count,splits,"
                      "t_start_ns,t_end_ns,backend_op")
    assert row.startswith('all_to_all,ep,"moe_dispatch, ""quoted""",4 5 6 7,5,,4096,fp32,fwd,3,11,1,1024 0 2048 1024,')


def test_csv_drops_extra(tmp_path):
    write_ops_csv(tmp_path / "x.csv", [EXTRA])
    assert read_ops_csv(tmp_path / "x.csv").ops == [EXTRA.with_(extra=())]


def test_csv_bad_rows_are_reported_and_skipped(tmp_path):
    ops = list(_workload().ops())[:5]
    path = tmp_path / "ops.csv"
    write_ops_csv(path, ops)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2].replace("all_reduce", "all_reduse", 1)
    lines[3] = lines[3].replace(",18874368,", ",lots,", 1)
    path.write_text("\n".join(lines) + "\n" + "all_reduce,tp,x,0 1,,,12", encoding="utf-8")  # truncated last row
    log = read_ops_csv(path)
    assert log.ops == [ops[0], ops[3], ops[4]]
    assert log.problems[0].startswith("ops.csv line 3: CommOp.op='all_reduse'")
    assert log.problems[1] == "ops.csv line 4: size_bytes='lots': expected an integer, skipped"
    assert log.problems[2] == "ops.csv line 7: truncated row (7 fields, expected 16), skipped"


def test_csv_with_columns_reordered_and_a_minimum_of_them(tmp_path):
    path = tmp_path / "mini.csv"
    path.write_text("size_bytes,group,axis,op,colour\n1024,0 1 2 3,dp,all_reduce,red\n", encoding="utf-8")
    log = read_ops_csv(path)
    assert log.ops == [CommOp(op="all_reduce", axis="dp", group=(0, 1, 2, 3), size_bytes=1024)]
    assert log.problems == ["mini.csv line 1: unknown column(s) colour, ignored"]


def test_csv_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="gone.csv: no such file"):
        read_ops_csv(tmp_path / "gone.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="empty.csv: empty file"):
        read_ops_csv(tmp_path / "empty.csv")
    (tmp_path / "cols.csv").write_text("op,axis\nall_reduce,tp\n")
    with pytest.raises(ValueError, match="cols.csv line 1: missing column\\(s\\) group, size_bytes"):
        read_ops_csv(tmp_path / "cols.csv")
    (tmp_path / "bad.csv").write_text("op,axis,group,size_bytes\nfoo,tp,0 1,5\n")
    with pytest.raises(ValueError, match="bad.csv: no valid row in 1 rows"):
        read_ops_csv(tmp_path / "bad.csv")
    write_ops_csv(tmp_path / "none.csv", [])
    assert read_ops_csv(tmp_path / "none.csv").ops == []


def test_csv_rows_get_the_checks_of_jsonl_records(tmp_path):
    path = tmp_path / "ops.csv"
    write_ops_csv(path, [CommOp(op="all_reduce", axis="dp", group=(0, 1), size_bytes=2**41),
                         CommOp(op="all_reduce", axis="dp", group=(0, 1), size_bytes=8, dtype="float33"),
                         CommOp(op="all_reduce", axis="dp", group=(0, 1), size_bytes=8)])
    log = read_ops_csv(path)
    assert len(log.ops) == 1 and log.problems[0].startswith("ops.csv line 2: size_bytes=2199023255552 is larger than")
    assert log.problems[1].startswith("ops.csv line 3: dtype='float33': unknown")


def test_a_binary_line_is_said_to_be_binary_not_a_utf16_error(tmp_path):
    """json.loads guesses UTF-16 from bytes such as 0xff 0xfe and reported that codec's failure ('utf-16-le' codec
    can't decode ...) for a line of binary junk in a rank log: the problem now says the line is not UTF-8 text."""
    ops = list(_workload().ops())[:3]
    path = tmp_path / "junk.jsonl"
    path.write_bytes(b"\n".join([json.dumps(ops[0].to_dict()).encode(), bytes([0xFF, 0xFE, 0x00, 0x41, 0x9C, 0x00]),
                                 json.dumps(ops[1].to_dict()).encode()]) + b"\n")
    log = read_ops_jsonl(path)
    assert log.ops == ops[:2]
    assert log.problems == [("junk.jsonl line 2: invalid JSON (not UTF-8 text: byte 0xff at column 1; binary data?), "
                             "skipped")]
