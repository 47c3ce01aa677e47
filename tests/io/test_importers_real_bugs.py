"""Bugs seen on real files (issue 16 item 3) and the Kineto traces of PyTorch before 2.1 (item 2).

Samples kept under tests/io/data/ say where they come from in tests/io/data/SOURCES.md. Expected numbers were
taken from the files with other tools, independently of the importers::

    zcat kineto_pre21/sampled_rank-0.json.gz | grep -o '"name": "nccl:[a-z_]*"' | sort | uniq -c
        -> 4 nccl:all_reduce, 4 nccl:all_to_all, 2 nccl:_all_gather_base      (10 ops; rank 1 likewise)
    grep -c '^ *[0-9]* *[0-9]* *float' rccl-tests_allreduce_8gpu_rccl-tests-version-line.txt  -> 29 rows (58 ops)
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared

from commscope.io.deepspeed import import_deepspeed_comms
from commscope.io.importers import import_records
from commscope.io.nccl_tests import parse_nccl_tests

DATA = Path(__file__).parent / "data"
REAL_LOGS = SHARED / "data" / "real-logs"
DS_VERBOSE = "deepspeed_comms_verbose_1_megatron-zero3.txt"
DS_SUMMARY = "deepspeed_comms_summary_1_megatron-zero3.txt"


@requires_shared("data", "real-logs", DS_VERBOSE)
@pytest.mark.parametrize("prefix", ["[default0]:", "0: ", "[1,0]<stdout>:"])
def test_deepspeed_verbose_lines_behind_a_launcher_prefix_keep_their_times(tmp_path, prefix):
    lines = (REAL_LOGS / DS_VERBOSE).read_text().splitlines()
    plain = import_deepspeed_comms(REAL_LOGS / DS_VERBOSE)
    path = tmp_path / "prefixed.log"
    path.write_text("".join(prefix + line + "\n" for line in lines))
    got = import_deepspeed_comms(path)
    assert [op.t_end_ns for op in got.ops] == [op.t_end_ns for op in plain.ops]
    assert all(op.t_end_ns is not None and op.t_start_ns is not None for op in got.ops)
    assert [op.rank for op in got.ops] == [0, 0, 0]


def test_deepspeed_verbose_line_without_timestamp_says_so(tmp_path):
    path = tmp_path / "v.log"
    path.write_text("rank=0 | comm op: all_reduce | time (ms): 1.50 | msg size: 2.0 MB | algbw (Gbps): 1.0  "
                    "| busbw (Gbps): 1.0\n")
    result = import_deepspeed_comms(path)
    assert result.ops[0].t_end_ns is None
    assert any("v.log line 1: no [YYYY-MM-DD HH:MM:SS,mmm] timestamp" in p for p in result.problems)


@requires_shared("data", "real-logs", DS_SUMMARY)
def test_deepspeed_summary_rows_without_leading_whitespace_are_read(tmp_path):
    text = (REAL_LOGS / DS_SUMMARY).read_text()
    path = tmp_path / "stripped.txt"
    path.write_text("\n".join(line.lstrip() for line in text.splitlines()) + "\n")
    plain, stripped = import_deepspeed_comms(REAL_LOGS / DS_SUMMARY), import_deepspeed_comms(path)
    assert len(stripped.ops) == len(plain.ops) == 38
    assert [(o.op, o.size_bytes, o.count) for o in stripped.ops] == [(o.op, o.size_bytes, o.count) for o in plain.ops]
    assert any("without their leading whitespace" in p for p in stripped.problems)


def test_deepspeed_table_with_nothing_readable_is_an_error(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("Comm. Op            Message Size        Count               Total Latency(ms)   Avg Latency(ms)"
                    "     tput_avg (Gbps)     busbw_avg (Gbps)\nfrobnicate\n                    2.0 KB              146"
                    "                 11.12               0.08                0.43                0.41\n")
    with pytest.raises(ValueError, match=r"t\.txt: nothing importable: the summary table at line 1 gave no op "
                                         r"\(.*unknown DeepSpeed op 'frobnicate'"):
        import_records(path)


def test_rccl_tests_version_line_is_read():
    path = DATA / "rccl-tests_allreduce_8gpu_rccl-tests-version-line.txt"
    parsed = parse_nccl_tests(path)
    assert parsed.meta["rccl_tests_version"] == "2.17.9-develop:2596ca5f71"
    assert parsed.meta["rccl_version"] == "2.27.7"  # rccl-library=22707
    assert parsed.meta["nccl_tests_version"] is None
    result = import_records(path)
    assert result.format == "nccl_tests" and len(result.ops) == 58
    assert {op.group for op in result.ops} == {tuple(range(8))}


def test_kineto_before_pytorch_2_1_recovers_ops_from_annotations():
    result = import_records(DATA / "kineto_pre21" / "sampled_rank-0.json.gz")
    assert result.format == "kineto" and result.meta["recovered_from"] == "nccl_annotations"
    kinds = collections.Counter(op.op for op in result.ops)
    assert kinds == {"all_reduce": 4, "all_to_all": 4, "all_gather": 2}
    # nccl:all_reduce Input Dims [[19618307]] 'float'
    assert 19618307 * 4 in {op.size_bytes for op in result.ops if op.op == "all_reduce"}
    # c10d::_allgather_base_ Input Dims [[1073741824], [16777216]] 'signed char': the gathered output
    assert {(op.size_bytes, op.dtype) for op in result.ops if op.op == "all_gather"} == {(1073741824, "int8")}
    # c10d::alltoall_base_ [[382132224], [419430400]] 'unsigned char': the send buffer is the input
    assert (419430400, "uint8") in {(op.size_bytes, op.dtype) for op in result.ops if op.op == "all_to_all"}
    assert all(op.rank == 0 and op.group == () for op in result.ops)
    assert "group" in result.missing_fields
    assert any("PyTorch before 2.1" in p and "not recoverable: the process group" in p for p in result.problems)


def test_kineto_before_2_1_all_gather_without_its_c10d_call_is_skipped_with_a_reason(tmp_path):
    import json

    ev = {"ph": "X", "cat": "user_annotation", "name": "nccl:_all_gather_base", "pid": 1, "tid": 1, "ts": 10.0,
          "dur": 5.0, "args": {"Input Dims": [[1024]], "Input type": ["float"]}}
    ar = {**ev, "name": "nccl:all_reduce", "ts": 20.0}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"traceEvents": [ev, ar]}))
    result = import_records(path)
    assert [(op.op, op.size_bytes) for op in result.ops] == [("all_reduce", 4096)]
    assert any("old.json event 0: nccl:_all_gather_base: the gathered size is not in the trace" in p
               for p in result.problems)
