"""Importers of other tools' records: Kineto traces, DeepSpeed comms-logger output, nccl-tests output, JSONL.

The real files are read where they lie (``../shared/data/real-logs``, see SOURCES.md there); they are never copied
into the repository. The expected counts were taken from the files independently of the importers::

    zcat kineto_...json.gz | grep -o '"Collective name": "[a-z_]*"' | sort | uniq -c
        -> 30 allreduce, 12 broadcast, 6 wait: 15 + 6 record_param_comms (each also named on its kernel) + 6 waits
    grep -cE '^ {20}[0-9.]+ ?[KMG]?B +[0-9]' deepspeed_comms_summary_*.txt         -> 38, 41, 8 rows
    (sum of their Count column with awk)                                            -> 3314, 5606, 14
    grep -c 'comm op:' deepspeed_comms_verbose_1_megatron-zero3.txt                 -> 3

and the nccl-tests rows are the data lines x 2 halves counted in test_nccl_tests.py.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import re
from datetime import datetime, UTC
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared, shared_or_skip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import commscope.io.deepspeed as deepspeed_mod
import commscope.io.importers as importers_mod
import commscope.io.kineto as kineto_mod
from commscope.io.deepspeed import import_deepspeed_comms, parse_deepspeed_size
from commscope.io.importers import ImportResult, detect_format, import_nccl_tests, import_records
from commscope.io.kineto import import_kineto
from commscope.io.oplog import write_ops_jsonl
from commscope.commop import CommOp

REAL_LOGS = SHARED / "data" / "real-logs"
needs_logs = requires_shared("data", "real-logs")

KINETO = "kineto_trace_a100x2_nccl-allreduce-broadcast_rank0.json.gz"
DS_SUMMARY = "deepspeed_comms_summary_1_megatron-zero3.txt"
DS_DEBUG = "deepspeed_comms_summary_2_megatron-zero3_debug-caller-func.txt"
DS_TRUNCATED = "deepspeed_comms_summary_3_issue7019_trailing-ws_TRUNCATED-excerpt.txt"
DS_VERBOSE = "deepspeed_comms_verbose_1_megatron-zero3.txt"

#: file -> (format, ops, sum of counts)
EXPECTED = {
    KINETO: ("kineto", 21, 21),
    DS_SUMMARY: ("deepspeed", 38, 3314),
    DS_DEBUG: ("deepspeed", 41, 5606),
    DS_TRUNCATED: ("deepspeed", 8, 14),
    DS_VERBOSE: ("deepspeed", 3, 3),
    # nccl-tests: one op per half row; count = iters (x agg iters) of the parameter line
    "nccl-tests_allgather-allreduce-broadcast-reduce-reducescatter_v100x12_dgx2_old-format_errors.txt":
        ("nccl_tests", 310, 310 * 20),
    "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt": ("nccl_tests", 50, 50 * 20),
    "nccl-tests_allreduce_h100x16_2node_gcp-a3mega.txt": ("nccl_tests", 62, 62 * 20),
    "nccl-tests_allreduce_rtx3090x1_single-gpu_column-overflow.txt": ("nccl_tests", 54, 54 * 20),
    "nccl-tests_allreduce_rtx3090x2_2node_wrong-nonzero_FAILED.txt": ("nccl_tests", 54, 54 * 20),
    "nccl-tests_allreduce_t4x2_2node_efa_nccl-info.txt": ("nccl_tests", 62, 62 * 100),
    "nccl-tests_allreduce_t4x3_3node_old-format_error-NA_step-bytes.txt": ("nccl_tests", 22, 22 * 1),
    "nccl-tests_alltoall_a100x16_2node_in-place-NA_pasted-artifacts.txt": ("nccl_tests", 18, 18 * 20),
    "rccl-tests_allreduce_mi300x8_single-node_rccl-version-block.txt": ("nccl_tests", 64, 64 * 20),
}

#: What each format cannot give, on the fixtures.
MISSING = {
    "kineto": ("axis", "phase", "micro_batch", "layer"),
    "deepspeed_summary": ("axis", "group", "dtype", "rank", "peer", "splits", "phase", "micro_batch", "layer",
                          "t_start_ns", "t_end_ns"),
    "deepspeed_verbose": ("axis", "group", "dtype", "peer", "splits", "phase", "micro_batch", "layer"),
    "nccl_tests": ("axis", "rank", "phase", "micro_batch", "layer", "t_start_ns", "t_end_ns"),
}


def _log(name: str) -> Path:
    return REAL_LOGS / name


def _extra(op: CommOp) -> dict:
    return dict(op.extra)


@pytest.fixture(scope="module")
def kineto_trace() -> dict:
    with gzip.open(shared_or_skip("data", "real-logs", KINETO), "rt") as fh:
        return json.load(fh)


def _write_trace(tmp_path: Path, trace, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(trace, indent=1))
    return path


# ---------------------------------------------------------------------------------------------------------------------
# API
# ---------------------------------------------------------------------------------------------------------------------


def test_public_api():
    assert set(importers_mod.__all__) == {"FORMATS", "ImportResult", "detect_format", "import_nccl_tests",
                                          "import_records"}
    assert set(kineto_mod.__all__) == {"DTYPES", "OP_NAMES", "import_kineto"}
    assert set(deepspeed_mod.__all__) == {"OP_NAMES", "import_deepspeed_comms", "parse_deepspeed_size"}
    for mod in (importers_mod, kineto_mod, deepspeed_mod):
        for name in mod.__all__:
            assert hasattr(mod, name)
    # every op name maps to a CommOp op
    from commscope.commop import OP_NAMES

    assert set(kineto_mod.OP_NAMES.values()) <= set(OP_NAMES)
    assert set(deepspeed_mod.OP_NAMES.values()) <= set(OP_NAMES)


def test_import_result_is_frozen():
    r = ImportResult(ops=[], source="x", format="jsonl", missing_fields=())
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.source = "y"  # type: ignore[misc]
    assert r.ok and r.problems == [] and r.meta == {}


# ---------------------------------------------------------------------------------------------------------------------
# Every real fixture
# ---------------------------------------------------------------------------------------------------------------------


@needs_logs
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_fixture_imports_with_the_expected_number_of_ops(name):
    fmt, num_ops, total_count = EXPECTED[name]
    assert detect_format(_log(name)) == fmt
    result = import_records(_log(name))
    assert result.format == fmt
    assert result.source == str(_log(name))
    assert len(result.ops) == num_ops
    assert sum(op.count for op in result.ops) == total_count
    assert all(op.axis == "other" for op in result.ops)
    assert "axis" in result.missing_fields
    assert all(isinstance(p, str) and p.startswith(name) for p in result.problems)
    # explicit format gives the same
    again = import_records(_log(name), format=fmt)
    assert again.ops == result.ops


# ---------------------------------------------------------------------------------------------------------------------
# Kineto
# ---------------------------------------------------------------------------------------------------------------------


@needs_logs
def test_kineto_fixture_ops_sizes_and_times(kineto_trace):
    result = import_kineto(_log(KINETO))
    assert result.ok, result.problems
    assert result.missing_fields == MISSING["kineto"]
    ops = result.ops
    assert [op.op for op in ops].count("all_reduce") == 15
    assert [op.op for op in ops].count("broadcast") == 6
    assert all(op.group == (0, 1) and op.rank == 0 for op in ops)
    assert [op.t_start_ns for op in ops] == sorted(op.t_start_ns for op in ops)
    assert result.meta["skipped"] == {"wait": 6}
    assert result.meta["pairing"] == {"external_id": 21, "correlation": 0, "order": 0, "none": 0}
    assert result.meta["rank"] == 0 and result.meta["world_size"] == 2 and result.meta["time_base"] == "unix_ns"

    by_event = {_extra(op)["event_index"]: op for op in ops}
    # event 57: allreduce of 2,049,000 Float -> 8,196,000 bytes; its kernel (event 23010) starts at
    # 4458676524716.094 us and runs 3306.963 us; baseTimeNanoseconds 1711964646000000000.
    ar = by_event[57]
    assert (ar.op, ar.dtype, ar.size_bytes) == ("all_reduce", "fp32", 2_049_000 * 4)
    base = 1_711_964_646_000_000_000
    assert ar.t_start_ns == base + 4_458_676_524_648_797
    assert ar.t_end_ns == base + 4_458_676_524_716_094 + 3_306_963
    assert _extra(ar)["kernel_name"] == "ncclKernel_AllReduce_RING_LL_Sum_float"
    assert _extra(ar)["kernel_duration_ns"] == 3_306_963
    # 2024-05-23 00:15 UTC = 2024-05-22 17:15 in the trace's INFO lines (US Pacific)
    assert datetime.fromtimestamp(ar.t_start_ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M") == \
        "2024-05-23 00:15"
    # event 7914: broadcast of 53 Long -> 424 bytes (NCCL runs it as int8 bytes; the size is the same)
    bc = by_event[7914]
    assert (bc.op, bc.dtype, bc.size_bytes) == ("broadcast", "int64", 424)
    assert by_event[7856].size_bytes == 53_120 * 4
    assert all(op.t_end_ns > op.t_start_ns for op in ops)
    # In == Out for all_reduce and broadcast on this trace
    assert all(_extra(op)["in_msg_nelems"] == _extra(op)["out_msg_nelems"] for op in ops)


@needs_logs
def test_kineto_pairs_by_correlation_without_external_ids(kineto_trace, tmp_path):
    reference = {_extra(op)["event_index"]: op.t_end_ns for op in import_kineto(_log(KINETO)).ops}
    trace = copy.deepcopy(kineto_trace)
    for ev in trace["traceEvents"]:
        if ev.get("cat") == "kernel":
            ev["args"].pop("External id", None)
    result = import_kineto(_write_trace(tmp_path, trace))
    assert result.meta["pairing"]["correlation"] == 21
    assert {_extra(op)["event_index"]: op.t_end_ns for op in result.ops} == reference
    assert result.ok


@needs_logs
def test_kineto_pairs_by_order_as_last_resort(kineto_trace, tmp_path):
    reference = {_extra(op)["event_index"]: op.t_end_ns for op in import_kineto(_log(KINETO)).ops}
    trace = copy.deepcopy(kineto_trace)
    for ev in trace["traceEvents"]:
        if ev.get("cat") == "kernel":
            ev["args"].pop("External id", None)
            ev["args"].pop("correlation", None)
            ev["args"].pop("Collective name", None)
    result = import_kineto(_write_trace(tmp_path, trace))
    assert result.meta["pairing"]["order"] == 21
    assert {_extra(op)["event_index"]: op.t_end_ns for op in result.ops} == reference
    assert any("by order" in p for p in result.problems)
    assert all(_extra(op)["pairing"] == "order" for op in result.ops)


@needs_logs
def test_kineto_without_kernels_leaves_end_times_empty(kineto_trace, tmp_path):
    trace = copy.deepcopy(kineto_trace)
    trace["traceEvents"] = [ev for ev in trace["traceEvents"] if ev.get("cat") != "kernel"]
    result = import_kineto(_write_trace(tmp_path, trace))
    assert len(result.ops) == 21
    assert all(op.t_end_ns is None for op in result.ops)
    assert "t_end_ns" in result.missing_fields
    assert any("no NCCL kernel found for 21" in p for p in result.problems)


def _rpc(i: int, coll: str, in_n: int, out_n: int, dtype: str = "Float", *, ts: float | None = None,
         dur: float = 5.0, tid: int = 1, **extra_args) -> dict:
    args = {"External id": 1000 + i, "Collective name": coll, "In msg nelems": in_n, "Out msg nelems": out_n,
            "dtype": dtype, "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
            "In split size": "[]", "Out split size": "[]"}
    args.update(extra_args)
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 7, "tid": tid,
            "ts": 100.0 * i if ts is None else ts, "dur": dur, "args": args}


def _kernel(i: int, func: str, ext: int | None, *, ts: float, dur: float = 10.0) -> dict:
    args: dict = {"stream": 20, "correlation": 5000 + i}
    if ext is not None:
        args["External id"] = ext
    return {"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{func}_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "pid": 0, "tid": 20, "ts": ts, "dur": dur, "args": args}


def _synthetic_trace() -> dict:
    events = [
        _rpc(1, "_allgather_base", 1024, 2048, "BFloat16"),
        _kernel(1, "AllGather", 1001, ts=101.0),
        _rpc(2, "_reduce_scatter_base", 2048, 1024, "BFloat16"),
        _kernel(2, "ReduceScatter", 1002, ts=201.0),
        _rpc(3, "alltoall_base", 400, 400, "Float", **{"In split size": "[1, 3]", "Out split size": "[2, 2]"}),
        _kernel(3, "SendRecv", 1003, ts=301.0),
        _rpc(4, "send", 10, 10, "Half", Rank=1, **{"Dst Rank": 1}),
        _rpc(5, "recv", 10, 10, "Half", Rank=1),
        _rpc(6, "barrier", 0, 0, "Byte", dur=50.0),
        _rpc(7, "allreduce", 1, 1, "Int", ts=610.0, dur=5.0),  # inside the barrier
        _kernel(7, "AllReduce", 1007, ts=612.0),
        _rpc(8, "allreduce_coalesced", 3000, 3000, "Float",
             **{"Process Group Ranks": "[0, 2, ...]", "Global rank start": 0, "Global rank stride": 2,
                "Group size": 4, "Process Group Name": "7"}),
        _rpc(9, "wait", 0, 0, "Byte"),
        _rpc(10, "frobnicate", 1, 1, "Float"),
        "not an event",
        _rpc(11, "allgather_into_tensor_coalesced", 8, 16, "Float8_e4m3fn", Seq=42),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
            "traceEvents": events}


def test_kineto_field_semantics_on_a_synthetic_trace(tmp_path):
    result = import_kineto(_write_trace(tmp_path, _synthetic_trace()))
    by_coll = {_extra(op)["collective_name"]: op for op in result.ops}
    assert len(result.ops) == 9
    ag = by_coll["_allgather_base"]  # size = Out msg nelems x 2 bytes: the gathered output
    assert (ag.op, ag.size_bytes, ag.dtype, ag.group, ag.rank) == ("all_gather", 4096, "bf16", (0, 1), 0)
    assert ag.t_end_ns == round(111.0 * 1000) and ag.t_start_ns == 100_000
    rs = by_coll["_reduce_scatter_base"]  # size = In msg nelems: the input, n x the output
    assert (rs.op, rs.size_bytes) == ("reduce_scatter", 4096)
    a2a = by_coll["alltoall_base"]  # 1600 bytes; splits in dim-0 rows [1, 3] -> 400 bytes per row
    assert (a2a.op, a2a.size_bytes, a2a.splits, a2a.backend_op) == ("all_to_all", 1600, (400, 1200), "sendrecv")
    send, recv = by_coll["send"], by_coll["recv"]
    assert (send.op, send.size_bytes, send.peer, send.group) == ("send", 20, 1, (0, 1))
    assert (recv.op, recv.peer, recv.group) == ("recv", 1, (1, 0))  # peer from 'Rank' (group-local) -> global
    barrier, inner = by_coll["barrier"], by_coll["allreduce"]
    assert (barrier.op, barrier.size_bytes) == ("barrier", 0)
    assert _extra(inner)["inside"] == "barrier" and inner.t_end_ns is not None
    co = by_coll["allreduce_coalesced"]  # a truncated rank list rebuilt from start and stride
    assert (co.op, co.size_bytes, co.group) == ("all_reduce", 12_000, (0, 2, 4, 6))
    fp8 = by_coll["allgather_into_tensor_coalesced"]
    assert (fp8.op, fp8.size_bytes, fp8.dtype, _extra(fp8)["seq"]) == ("all_gather", 16, "fp8_e4m3", 42)
    assert result.meta["skipped"] == {"wait": 1}
    text = "\n".join(result.problems)
    assert "event 13: unknown collective 'frobnicate'" in text
    assert "event 14: not a JSON object" in text
    assert len(result.problems) == 3
    # send, recv, the coalesced all_reduce and the fp8 all_gather have no kernels in this trace
    assert "events 6, 7, 11, 15: no NCCL kernel found for 4 record_param_comms" in text
    assert result.meta["pairing"] == {"external_id": 4, "correlation": 0, "order": 0, "none": 5}
    assert result.missing_fields == ("axis", "phase", "micro_batch", "layer")


def test_kineto_strict_raises_at_the_first_bad_event(tmp_path):
    with pytest.raises(ValueError, match=r"trace\.json event 13: unknown collective 'frobnicate'"):
        import_kineto(_write_trace(tmp_path, _synthetic_trace()), strict=True)


def test_kineto_absurd_times_are_problems_not_crashes(tmp_path):
    trace = _synthetic_trace()
    trace["traceEvents"][0]["ts"] = 1e300
    trace["traceEvents"][1]["dur"] = -5.0
    result = import_kineto(_write_trace(tmp_path, trace))
    assert "trace.json event 0: 'ts'=1e+300 is not a time in microseconds, skipped" in result.problems
    assert any(p.startswith("trace.json event 1: NCCL kernel without a valid 'ts' / 'dur'") for p in result.problems)


def test_kineto_chrome_array_and_no_comms(tmp_path):
    """One rule for every format: an input with nothing importable is an error that says why."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]
    with pytest.raises(ValueError, match=r"trace\.json: nothing importable: no communication events"):
        import_kineto(_write_trace(tmp_path, events))
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "pid": 0,
              "tid": 7, "ts": 5.0, "dur": 3.0, "args": {"correlation": 9}}
    with pytest.raises(ValueError, match=r"1 NCCL kernels \(AllReduce\) but no event that gives their sizes"):
        import_kineto(_write_trace(tmp_path, [*events, kernel]))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b'{"traceEvents": [\n  {"ph": "X",\n  "name": }\n]}', r"bad\.json line 3 column 11: invalid JSON"),
        (b'{"schemaVersion": 1}', r"bad\.json: no 'traceEvents' list"),
        (b"42", r"bad\.json: the JSON holds a int"),
        (b"", r"bad\.json line 1 column 1: invalid JSON"),
        (gzip.compress(b'{"traceEvents": []}')[:-6], r"bad\.json: not a valid gzip file"),
    ],
)
def test_kineto_malformed_files_raise_value_errors_naming_the_file(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        import_kineto(path)


def test_kineto_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        import_kineto(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="is a directory"):
        import_kineto(tmp_path)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_RPC_KEYS = ["Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Ranks",
             "Process Group Name", "In split size", "Rank", "Dst Rank", "Src Rank", "Global rank start",
             "Global rank stride", "External id", "Seq"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_kineto_fuzz_odd_values_never_crash(tmp_path, data):
    trace = _synthetic_trace()
    events = trace["traceEvents"]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(events) - 1))
        ev = events[i]
        if not isinstance(ev, dict):
            continue
        where = data.draw(st.sampled_from(["args", "ts", "dur", "name", "cat", "event", "top"]))
        if where == "args" and isinstance(ev.get("args"), dict):
            ev["args"][data.draw(st.sampled_from(_RPC_KEYS))] = data.draw(_json_values)
        elif where == "event":
            events[i] = data.draw(_json_values)
        elif where == "top":
            trace[data.draw(st.sampled_from(["distributedInfo", "baseTimeNanoseconds"]))] = data.draw(_json_values)
        else:
            ev[where] = data.draw(_json_values)
    path = _write_trace(tmp_path, trace, "fuzz.json")
    try:
        result = import_kineto(path)
    except ValueError as exc:
        assert "fuzz.json" in str(exc)
    else:
        assert all(isinstance(op, CommOp) for op in result.ops)


@st.composite
def _mutations(draw, text: str) -> str:
    """``text`` with a few characters or lines deleted, duplicated or replaced."""
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        kind = draw(st.sampled_from(["delete", "insert", "replace", "drop_line", "dup_line", "truncate"]))
        pos = draw(st.integers(0, len(text) - 1))
        if kind == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 20)):]
        elif kind == "insert":
            text = text[:pos] + draw(st.text(st.sampled_from(list("{}[],:\"0123456789.- |\nabcKMGB\t")),
                                             min_size=1, max_size=8)) + text[pos:]
        elif kind == "replace":
            text = text[:pos] + draw(st.characters(codec="utf-8")) + text[pos + 1:]
        elif kind == "truncate":
            text = text[:pos]
        else:
            lines = text.split("\n")
            j = draw(st.integers(0, len(lines) - 1))
            lines = lines[:j] + lines[j + 1:] if kind == "drop_line" else lines[:j + 1] + lines[j:]
            text = "\n".join(lines)
    return text


_SMALL_TRACE = json.dumps(_synthetic_trace(), indent=1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_mutations(_SMALL_TRACE))
def test_kineto_fuzz_mutated_text_raises_only_value_errors(tmp_path, text):
    path = tmp_path / "mutated.json"
    path.write_text(text)
    try:
        import_kineto(path)
    except ValueError as exc:
        assert "mutated.json" in str(exc)


# ---------------------------------------------------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------------------------------------------------


def _by_line(result: ImportResult) -> dict[int, CommOp]:
    return {_extra(op)["line"]: op for op in result.ops}


@needs_logs
def test_deepspeed_summary_table():
    result = import_deepspeed_comms(_log(DS_SUMMARY))
    assert result.ok, result.problems
    assert result.missing_fields == MISSING["deepspeed_summary"]
    assert result.meta["world_size"] == 16 and result.meta["world_size_from"] == "bandwidths"
    counts: dict[str, int] = {}
    for op in result.ops:
        counts[_extra(op)["op_name"]] = counts.get(_extra(op)["op_name"], 0) + 1
    assert counts == {"broadcast": 10, "barrier": 1, "all_gather": 8, "all_gather_base": 15,
                      "reduce_scatter_base": 1, "all_reduce": 2, "log_summary_barrier": 1}
    ops = _by_line(result)
    # line 6: broadcast '6.31 KB' x 1 -> round(6.31 x 1024) = 6461 bytes; latency columns in seconds
    bc = ops[6]
    assert (bc.op, bc.size_bytes, bc.count, bc.group, bc.dtype, bc.rank) == ("broadcast", 6461, 1, (), "unknown", None)
    assert _extra(bc)["total_latency_s"] == pytest.approx(0.12e-3)
    assert _extra(bc)["msg_size_text"] == "6.31 KB"
    # line 12: broadcast 98.25 MB, 8317.12 ms in total
    assert ops[12].size_bytes == round(98.25 * 2**20) and _extra(ops[12])["total_latency_s"] == pytest.approx(8.31712)
    # line 36: all_gather_base '6.0 MB' x 219: DeepSpeed logs the per-rank input; x 16 ranks = the gathered output
    ag = ops[36]
    assert (ag.op, ag.count, ag.size_bytes) == ("all_gather", 219, 6 * 2**20 * 16)
    assert _extra(ag)["msg_size_bytes"] == 6 * 2**20 and _extra(ag)["world_size"] == 16
    assert _extra(ag)["busbw_avg_bytes_per_s"] == pytest.approx(1313.66e9 / 8)
    assert _extra(ag)["tput_avg_bytes_per_s"] == pytest.approx(1401.24e9 / 8)
    assert _extra(ag)["avg_latency_s"] == pytest.approx(0.07e-3)
    # the same printed size twice (two true sizes that round alike) stays two ops
    assert ops[37].size_bytes == ag.size_bytes and ops[37].count == 6
    # line 41: reduce_scatter_base 678.86 MB: the input, nccl-tests' size already
    rs = ops[41]
    assert (rs.op, rs.count, rs.size_bytes) == ("reduce_scatter", 40, round(678.86 * 2**20))
    # barrier rows: size 0
    assert ops[14].op == "barrier" and ops[14].size_bytes == 0 and ops[14].count == 3
    assert ops[46].op == "barrier" and _extra(ops[46])["op_name"] == "log_summary_barrier"


@needs_logs
def test_deepspeed_debug_caller_names():
    result = import_deepspeed_comms(_log(DS_DEBUG))
    assert result.ok, result.problems
    assert result.missing_fields == MISSING["deepspeed_summary"]
    callers = {op.name for op in result.ops}
    assert {"_broadcast_model", "_allgather_params", "allgather_fn", "reduce_scatter_fn", "has_overflow",
            "_model_parallel_all_reduce", "get_grad_norm_direct", "_allgather_params_coalesced",
            "log_summary", "get_lst_from_rank0"} <= callers
    ar = [op for op in result.ops if op.op == "all_reduce"]
    assert [(op.name, op.size_bytes, op.count) for op in ar] == [
        ("has_overflow", 1, 20), ("_model_parallel_all_reduce", 1, 20), ("_model_parallel_all_reduce", 8, 40),
        ("get_grad_norm_direct", 8, 40)]
    assert all(_extra(op)["caller"] == op.name for op in result.ops)


@needs_logs
def test_deepspeed_truncated_excerpt_with_trailing_whitespace():
    result = import_deepspeed_comms(_log(DS_TRUNCATED))
    assert [op.op for op in result.ops] == ["broadcast"] * 7 + ["barrier"]
    assert result.ops[-2].size_bytes == round(1.45 * 2**30) and result.ops[-2].count == 2
    assert result.ops[2].size_bytes == round(22.21 * 1024)
    assert len(result.problems) == 2
    assert "line 13: row cut short ('128.0 B'" in result.problems[0]
    assert "line 12: op 'all_gather_into_tensor' has no rows" in result.problems[1]
    assert result.meta["world_size"] is None  # only broadcast rows: busbw = tput says nothing of n
    with pytest.raises(ValueError, match=r"TRUNCATED-excerpt\.txt line 13: row cut short"):
        import_deepspeed_comms(_log(DS_TRUNCATED), strict=True)


@needs_logs
def test_deepspeed_verbose_lines():
    result = import_deepspeed_comms(_log(DS_VERBOSE))
    assert result.ok, result.problems
    assert result.missing_fields == MISSING["deepspeed_verbose"]
    rs, ag1, ag2 = result.ops
    assert (rs.op, rs.rank, rs.count, rs.size_bytes) == ("reduce_scatter", 0, 1, round(678.86 * 2**20))
    end = int(datetime(2022, 6, 26, 1, 39, 55, tzinfo=UTC).timestamp()) * 10**9 + 722 * 10**6
    assert rs.t_end_ns == end and rs.t_start_ns == end - 9_460_000
    assert _extra(rs)["latency_s"] == pytest.approx(9.46e-3)
    assert _extra(rs)["busbw_bytes_per_s"] == pytest.approx(1129.23e9 / 8)
    assert (ag1.op, ag1.size_bytes) == ("all_gather", 6 * 2**20 * 16)
    assert ag2.t_end_ns - ag1.t_end_ns == 1_000_000
    assert result.meta["part"] == "verbose" and result.meta["world_size"] == 16


@needs_logs
def test_deepspeed_world_size_given(tmp_path):
    result = import_deepspeed_comms(_log(DS_SUMMARY), world_size=8)
    assert _by_line(result)[36].size_bytes == 6 * 2**20 * 8
    assert any("world_size=8 was given, but the logged bandwidths say 16" in p for p in result.problems)
    with pytest.raises(ValueError, match="world_size"):
        import_deepspeed_comms(_log(DS_SUMMARY), world_size=0)


HEADER = ("Comm. Op            Message Size        Count               Total Latency(ms)   Avg Latency(ms)     "
          "tput_avg (Gbps)     busbw_avg (Gbps)    ")


def _row(size: str, count: int, total: float, avg: float, tput: float, busbw: float) -> str:
    return " " * 20 + "".join(f"{v: <20}" for v in (size, count, f"{total:.2f}", f"{avg:.2f}", f"{tput:.2f}",
                                                      f"{busbw:.2f}"))


def test_deepspeed_unknown_world_size_keeps_per_rank_gather_sizes(tmp_path):
    path = tmp_path / "ds.log"
    path.write_text("\n".join([HEADER, "all_gather_into_tensor", _row("128.0 B", 4, 1.0, 0.25, 0.01, 0.01)]) + "\n")
    result = import_deepspeed_comms(path)
    op = result.ops[0]
    assert op.size_bytes == 128 and _extra(op)["size_convention"] == "per_rank_input"
    assert any("world size unknown (pass world_size=)" in p for p in result.problems)
    fixed = import_deepspeed_comms(path, world_size=4)
    assert fixed.ops[0].size_bytes == 512 and fixed.ok


def test_deepspeed_prefixes_several_tables_both_parts_and_unknown_ops(tmp_path):
    table1 = [HEADER, "all_reduce", _row("8.0 B", 2, 1.0, 0.5, 0.0, 0.0)]
    table2 = [HEADER, "all_reduce", _row("8.0 B", 5, 2.0, 0.4, 0.0, 0.0), "frobnicate",
              _row("1.0 KB", 1, 1.0, 1.0, 1.0, 1.0), "all_to_all_single", _row("1.0 MB", 3, 3.0, 1.0, 100.0, 87.5)]
    verbose = ("[2024-01-02 03:04:05,006] [INFO] [logging.py:96:log_dist] [Rank 0] comm op: all_gather_into_tensor "
               "| [Caller Func: fetch] | time (ms): 0.50 | msg size: 1.0 MB | algbw (Gbps): 100.00 | "
               "busbw (Gbps): 87.50 ")
    lines = [f"worker-3: {line}" for line in table1] + ["[INFO] training step 1"] + \
        [f"worker-3: {line}" for line in table2] + [verbose, "comm op: garbage"]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    assert detect_format(path) == "deepspeed"

    summary = import_deepspeed_comms(path, part="summary")
    assert [(op.op, op.size_bytes, op.count) for op in summary.ops] == [("all_reduce", 8, 5),
                                                                        ("all_to_all", 2**20, 3)]
    assert summary.meta["world_size"] == 8  # 87.5 / 100 = 7/8
    text = "\n".join(summary.problems)
    assert "train.log line 5: 2 summary tables (at lines 1, 5)" in text
    assert "train.log line 8: unknown DeepSpeed op 'frobnicate'" in text
    assert "train.log line 13: a 'comm op:' line that cannot be read" in text

    verbose_result = import_deepspeed_comms(path)  # auto: the verbose lines win
    assert verbose_result.meta["part"] == "verbose"
    (op,) = verbose_result.ops
    assert (op.op, op.name, op.rank, op.size_bytes) == ("all_gather", "fetch", 0, 8 * 2**20)
    assert any("also holds a summary table" in p for p in verbose_result.problems)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0B", 0), ("1.0 B", 1), ("128.0 B", 128), ("6.31 KB", 6461), ("128.12 KB", 131195), ("678.86 MB", 711836303),
     ("1.45 GB", 1556925645)],
)
def test_parse_deepspeed_size(text, expected):
    assert parse_deepspeed_size(text) == expected


@pytest.mark.parametrize("text", ["", "12", "1.0 XB", "KB", "-1 B"])
def test_parse_deepspeed_size_rejects(text):
    with pytest.raises(ValueError, match="cannot read DeepSpeed message size"):
        parse_deepspeed_size(text)


def test_deepspeed_absurd_numbers_are_problems_not_crashes(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("comm op: all_reduce | time (ms): 1.0 | msg size: " + "9" * 400 + " MB | algbw (Gbps): 1.0 | "
                    "busbw (Gbps): 1.0\ncomm op: broadcast | time (ms): " + "9" * 400 + " | msg size: 1.0 KB | "
                    "algbw (Gbps): 1.0 | busbw (Gbps): 1.0\n")
    result = import_deepspeed_comms(path)
    assert len(result.ops) == 1 and result.ops[0].t_start_ns is None
    assert result.problems[0].startswith("big.log line 1: cannot read DeepSpeed message size")


def test_deepspeed_no_content(tmp_path):
    path = tmp_path / "empty.log"
    path.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match=r"empty\.log: no DeepSpeed comms-logger output found"):
        import_deepspeed_comms(path)
    with pytest.raises(ValueError, match="part="):
        import_deepspeed_comms(path, part="both")  # type: ignore[arg-type]


def _ds_texts() -> list[str]:
    if not REAL_LOGS.is_dir():
        return [HEADER + "\nall_reduce\n" + _row("8.0 B", 2, 1.0, 0.5, 0.0, 0.0) + "\n"]
    return [_log(n).read_text() for n in (DS_SUMMARY, DS_DEBUG, DS_TRUNCATED, DS_VERBOSE)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_deepspeed_fuzz_mutated_text_raises_only_value_errors(tmp_path, data):
    text = data.draw(_mutations(data.draw(st.sampled_from(_ds_texts()))))
    path = tmp_path / "mutated.log"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        result = import_deepspeed_comms(path)
    except ValueError as exc:
        assert "mutated.log" in str(exc)
    else:
        assert all(op.size_bytes >= 0 and op.count >= 1 for op in result.ops)


# ---------------------------------------------------------------------------------------------------------------------
# nccl-tests
# ---------------------------------------------------------------------------------------------------------------------


@needs_logs
def test_nccl_tests_conversion():
    result = import_nccl_tests(_log("nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"))
    assert result.format == "nccl_tests" and result.ok
    assert result.missing_fields == MISSING["nccl_tests"]
    first = result.ops[0]
    assert (first.op, first.size_bytes, first.dtype, first.group, first.count, first.rank) == \
        ("all_reduce", 8, "fp32", tuple(range(8)), 20, None)
    assert _extra(first)["in_place"] is False and result.ops[1].extra and _extra(result.ops[1])["in_place"] is True
    assert re.fullmatch(r"nccl-tests_allreduce_a100x8_single-node_v2\.19\.4\.txt:\d+", _extra(first)["source"])
    assert result.ops[-1].size_bytes == 134217728

    a2a = import_nccl_tests(_log("nccl-tests_alltoall_a100x16_2node_in-place-NA_pasted-artifacts.txt"))
    op = a2a.ops[0]
    assert (op.op, op.size_bytes, len(op.group)) == ("all_to_all", 33554432, 16)
    assert op.splits == (33554432 // 16,) * 16
    assert len(a2a.problems) == 2  # the parser's own notes on the pasted parameter line come through

    failed = import_nccl_tests(_log("nccl-tests_allreduce_rtx3090x2_2node_wrong-nonzero_FAILED.txt"))
    assert any(_extra(op).get("failed_check") for op in failed.ops)
    assert len(failed.problems) == 55

    dgx2 = import_nccl_tests(
        _log("nccl-tests_allgather-allreduce-broadcast-reduce-reducescatter_v100x12_dgx2_old-format_errors.txt"))
    kinds = {op.op for op in dgx2.ops}
    assert kinds == {"all_gather", "all_reduce", "broadcast", "reduce", "reduce_scatter"}
    assert all(op.group == tuple(range(12)) for op in dgx2.ops)


@needs_logs
def test_an_nccl_tests_half_whose_time_is_no_measurement_is_skipped_and_said(tmp_path, capsys):
    """A real log with one line's out-of-place time damaged to 0.00 us: that half is skipped and named (file, line,
    op, size), as fit and estimate --bandwidth skip it; its in-place half, measured, is kept. summarize counted it."""
    from commscope.cli.main import main

    name = "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
    lines = _log(name).read_text().splitlines(keepends=True)
    i = next(j for j, line in enumerate(lines) if line.split()[:1] == ["1048576"])
    assert "    67.31 " in lines[i]
    lines[i] = lines[i].replace("    67.31 ", "     0.00 ", 1)
    damaged = tmp_path / name
    damaged.write_text("".join(lines))
    whole, result = import_nccl_tests(_log(name)), import_nccl_tests(damaged)
    assert len(result.ops) == len(whole.ops) - 1
    assert f"{name}:{i + 1}: all_reduce 1048576 B out-of-place time=0.00 us is no measurement (must be > 0); " \
           "skipped" in result.problems
    at_size = [op for op in result.ops if op.size_bytes == 1048576]
    assert [_extra(op)["in_place"] for op in at_size] == [True]
    assert main(["summarize", str(damaged)]) == 0
    assert f"{name}:{i + 1}: all_reduce 1048576 B out-of-place time=0.00 us" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# import_records: detection, JSONL, errors
# ---------------------------------------------------------------------------------------------------------------------


def test_import_records_reads_commscope_jsonl(tmp_path):
    ops = [CommOp(op="all_reduce", axis="dp", group=(0, 1), size_bytes=64, rank=0, phase="bwd", t_start_ns=1,
                  t_end_ns=5),
           CommOp(op="send", axis="pp", group=(0, 2), size_bytes=8, rank=0, peer=2, phase="fwd", t_start_ns=2,
                  t_end_ns=4)]
    for name, header in (("ops.jsonl", {"world_size": 4}), ("ops.jsonl.gz", None)):
        path = tmp_path / name
        write_ops_jsonl(path, ops, header=header)
        result = import_records(path)
        assert result.format == "jsonl" and result.ops == ops
        assert result.missing_fields == ("micro_batch", "layer")  # splits: no all_to_all here, so not missing
        assert detect_format(path) == "jsonl"


@needs_logs
def test_import_records_detects_gzipped_text(tmp_path):
    path = tmp_path / "ds.txt.gz"
    path.write_bytes(gzip.compress(_log(DS_SUMMARY).read_bytes()))
    result = import_records(path)
    assert result.format == "deepspeed" and len(result.ops) == 38


@pytest.mark.parametrize(
    ("content", "match"),
    [(b"", r"x\.txt: empty file"), (b"just some words\n", r"x\.txt: cannot tell the format from the content")],
)
def test_import_records_unknown_content(tmp_path, content, match):
    path = tmp_path / "x.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        import_records(path)


def test_import_records_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="format='csv'"):
        import_records(tmp_path / "x", format="csv")
    with pytest.raises(ValueError, match="no such file"):
        import_records(tmp_path / "missing.json")
    path = tmp_path / "text.json"
    path.write_text("not json at all\n")
    with pytest.raises(ValueError, match=r"text\.json line 1 column 1: invalid JSON"):
        import_records(path, format="kineto")


def test_import_records_strict_on_jsonl(tmp_path):
    path = tmp_path / "ops.jsonl"
    path.write_text('{"op":"all_reduce","axis":"dp","group":[0,1],"size_bytes":4}\n{"op":"all_red\n')
    assert len(import_records(path).problems) == 1
    with pytest.raises(ValueError, match=r"ops\.jsonl line 2"):
        import_records(path, strict=True)


def _all_small_texts() -> list[str]:
    texts = _ds_texts()
    if REAL_LOGS.is_dir():
        texts += [_log(n).read_text() for n in EXPECTED if n.startswith(("nccl", "rccl"))][:4]
    texts.append(_SMALL_TRACE)
    texts.append('{"op":"all_reduce","axis":"dp","group":[0,1],"size_bytes":4}\n')
    return texts


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_import_records_fuzz_raises_only_value_errors(tmp_path, data):
    text = data.draw(_mutations(data.draw(st.sampled_from(_all_small_texts()))))
    path = tmp_path / "mutated.txt"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        result = import_records(path)
    except ValueError as exc:
        assert "mutated.txt" in str(exc)
    else:
        assert result.format in importers_mod.FORMATS
        assert re.fullmatch(r"[a-z_]+", result.format)
