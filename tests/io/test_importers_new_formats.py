"""PyTorch Flight Recorder dumps and NCCL_DEBUG=INFO collective lines (issue 16 item 2), on real output.

Samples and their sources: tests/io/data/SOURCES.md. Expected values were read off the files by hand:
the tutorial dump holds one all_reduce of a (3, 4) Float tensor (48 bytes) on pg 0 = ranks [0, 1]; the gloo
dumps (PyTorch 2.13, 3 ranks) all_reduce 1024 Float, all_gather 1024 -> (3, 1024) Float, broadcast 16 BFloat16,
an all_reduce of 8 Double on a 2-rank subgroup (ranks 0 and 1 only) and a barrier; torchtitan#1369's log has
AllGather / ReduceScatter with count 2097152 of datatype 7 (fp32) on nranks=2.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from commscope.io.flight_recorder import import_flight_recorder, load_dump
from commscope.io.importers import detect_format, import_records
from commscope.io.runs import read_run

DATA = Path(__file__).parent / "data"
FR = DATA / "flight_recorder"
NCCL = DATA / "nccl_debug"


def test_flight_recorder_nccl_dump_from_the_pytorch_tutorial():
    result = import_records(FR / "tutorial" / "trace_0.json")
    assert result.format == "flight_recorder"
    (op,) = result.ops
    assert (op.op, op.size_bytes, op.dtype, op.group, op.rank) == ("all_reduce", 48, "fp32", (0, 1), 0)
    assert (op.t_start_ns, op.t_end_ns) == (1724779239936775119, 1724779239975811724)
    assert dict(op.extra)["state"] == "completed" and dict(op.extra)["pg_desc"] == "default_pg"
    assert result.problems == [] and result.meta["not_completed"] == 0


def test_flight_recorder_gloo_pickles_of_three_ranks():
    assert detect_format(FR / "gloo" / "fr_trace_rank0") == "flight_recorder"
    by_rank = {r: import_flight_recorder(FR / "gloo" / f"fr_trace_rank{r}") for r in range(3)}
    kinds = [(o.op, o.size_bytes, o.dtype) for o in by_rank[0].ops]
    assert kinds == [("all_reduce", 4096, "fp32"), ("all_gather", 12288, "fp32"), ("broadcast", 32, "bf16"),
                     ("all_reduce", 64, "fp64"), ("barrier", 0, "uint8")]
    assert [o.op for o in by_rank[2].ops] == ["all_reduce", "all_gather", "broadcast", "barrier"]  # not in [0, 1]
    assert all(o.rank == r for r, res in by_rank.items() for o in res.ops)
    # gloo's dumps leave pg_config empty and never mark an op completed: both are said
    assert "group" in by_rank[0].missing_fields
    assert any("had not completed when the dump was written" in p for p in by_rank[0].problems)
    run = read_run(FR / "gloo")
    assert sorted(run.ops_by_rank) == [0, 1, 2] and run.matrix_omitted is not None


def test_flight_recorder_refuses_pickles_that_name_classes(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    path = tmp_path / "trace_0"
    path.write_bytes(pickle.dumps({"version": "2.5", "pg_config": {}, "entries": [Evil()]}, protocol=2))
    with pytest.raises(ValueError, match=r"trace_0: not a readable Flight Recorder pickle \(the pickle asks for "
                                         r"__builtin__\.print"):
        import_records(path)
    with pytest.raises(ValueError, match="no 'entries' list"):
        load_dump("x", pickle.dumps({"a": 1}, protocol=2))


def test_flight_recorder_entries_that_cannot_be_read_are_problems(tmp_path):
    dump = {"version": "2.10", "pg_config": {"0": {"ranks": "[0, 1]"}},
            "entries": [{"profiling_name": "nccl:frobnicate", "process_group": ("0", "default_pg")},
                        {"profiling_name": "nccl:send 0->1", "process_group": ("0", "default_pg"),
                         "input_sizes": [[10]], "input_dtypes": ["Half"], "state": "started", "is_p2p": True},
                        "junk"]}
    path = tmp_path / "dump_rank0.pkl"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    result = import_records(path)
    (op,) = result.ops
    assert (op.op, op.size_bytes, op.rank, op.peer, op.group) == ("send", 20, 0, 1, (0, 1))
    text = "\n".join(result.problems)
    assert "dump_rank0.pkl entry 0: unknown collective 'nccl:frobnicate'" in text
    assert "dump_rank0.pkl entry 2: not a dict" in text and "1 op(s) had not completed" in text


def test_nccl_debug_torchtitan_tp_log():
    result = import_records(NCCL / "torchtitan-1369_tp2_allgather-reducescatter.log")
    assert result.format == "nccl_debug" and result.meta["world_size"] == 2
    # 7 lines of 2 processes, no Init lines: the lines of one process are kept (3), the other's 4 dropped
    kinds = sorted((o.op, o.size_bytes) for o in result.ops)
    assert kinds == [("all_gather", 2097152 * 4 * 2), ("all_gather", 2097152 * 4 * 2),
                     ("reduce_scatter", 2097152 * 4 * 2)]
    assert all(o.group == (0, 1) and o.dtype == "fp32" for o in result.ops)
    assert result.meta["duplicates_dropped"] == 4 and any("left out" in p for p in result.problems)


def test_nccl_debug_send_recv_and_rccl_global_ranks():
    sr = import_records(NCCL / "nccl-584_sendrecv_2ranks.log")
    assert [o.op for o in sr.ops].count("send") == 6 and [o.op for o in sr.ops].count("recv") == 1
    assert {o.size_bytes for o in sr.ops} == {2420736 * 4}
    assert {o.peer for o in sr.ops if o.op == "send"} == {0, 1}
    rccl = import_records(NCCL / "rccl_globalrank_8ranks.log")
    assert sorted(o.rank for o in rccl.ops) == list(range(8))
    assert {(o.op, o.size_bytes, o.dtype, o.group) for o in rccl.ops} == {("all_reduce", 268435456 * 2, "fp16",
                                                                           tuple(range(8)))}
    run = read_run(NCCL / "rccl_globalrank_8ranks.log")
    assert run.world_size == 8 and run.matrix_omitted is None


def test_nccl_debug_init_lines_give_ranks(tmp_path):
    lines = (NCCL / "torchtitan-1369_tp2_allgather-reducescatter.log").read_text()
    init = ("hopper01:191369:191369 [0] NCCL INFO comm 0x55e290bd32d0 rank 0 nranks 2 cudaDev 0 busId 18000 - "
            "Init COMPLETE\nhopper01:191370:191370 [1] NCCL INFO comm 0x55fca23fc0f0 rank 1 nranks 2 cudaDev 1 "
            "busId 2a000 - Init COMPLETE\n")
    path = tmp_path / "with_init.log"
    path.write_text(init + lines)
    result = import_records(path)
    assert len(result.ops) == 7 and sorted({o.rank for o in result.ops}) == [0, 1]
    assert result.meta["duplicates_dropped"] == 0


def test_nccl_debug_nothing_importable(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("host:1:1 [0] NCCL INFO AllReduce: opCount zz garbage\n")
    with pytest.raises(ValueError, match="x.log: nothing importable"):
        import_records(path, format="nccl_debug")


def test_damaged_dumps_and_logs_raise_only_value_errors(tmp_path):
    import random

    rng = random.Random(16)
    for source in (FR / "gloo" / "fr_trace_rank0", NCCL / "torchtitan-1369_tp2_allgather-reducescatter.log"):
        base = source.read_bytes()
        for _ in range(150):
            data = bytearray(base)
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            path = tmp_path / source.name
            path.write_bytes(bytes(data[: rng.randrange(1, len(data) + 1)]))
            try:
                import_records(path)
            except ValueError:
                pass
