"""nccl-tests / rccl-tests stdout: real logs from other people's clusters, synthetic edge cases, and fuzzing.

The real logs are read where they lie (``../shared/data/real-logs``, see SOURCES.md there); they are never copied
into the repository. The expected row counts were counted by hand from the files (data lines x 2 halves) and are
cross-checked below with a plain regular expression that knows nothing of the parser.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commscope.io import nccl_tests
from commscope.io.nccl_tests import BusbwRow, NcclTestsResult, algbw, busbw_factor, canonical_op, parse_nccl_tests
from commscope.units import GB, US

REAL_LOGS = SHARED / "data" / "real-logs"
needs_logs = requires_shared("data", "real-logs")

DGX2 = "nccl-tests_allgather-allreduce-broadcast-reduce-reducescatter_v100x12_dgx2_old-format_errors.txt"
A100X8 = "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
H100X16 = "nccl-tests_allreduce_h100x16_2node_gcp-a3mega.txt"
RTX1 = "nccl-tests_allreduce_rtx3090x1_single-gpu_column-overflow.txt"
RTX2 = "nccl-tests_allreduce_rtx3090x2_2node_wrong-nonzero_FAILED.txt"
T4X2 = "nccl-tests_allreduce_t4x2_2node_efa_nccl-info.txt"
T4X3 = "nccl-tests_allreduce_t4x3_3node_old-format_error-NA_step-bytes.txt"
A100X16 = "nccl-tests_alltoall_a100x16_2node_in-place-NA_pasted-artifacts.txt"
MI300X = "rccl-tests_allreduce_mi300x8_single-node_rccl-version-block.txt"

#: file -> (data lines, [(op, data lines) per run], nranks, num_nodes, [avg busbw GB/s per run], [out of bounds per run])
EXPECTED = {
    DGX2: (155, [("all_gather", 31), ("all_reduce", 31), ("broadcast", 31), ("reduce", 31), ("reduce_scatter", 31)],
           12, 1, [30.2993, 42.5578, 41.2456, 41.3386, 20.3609], [4, 0, 0, 0, 0]),
    A100X8: (25, [("all_reduce", 25)], 8, 1, [34.9024], [0]),
    H100X16: (31, [("all_reduce", 31)], 16, 2, [70.742], [0]),
    RTX1: (27, [("all_reduce", 27)], 1, 1, [0.0], [0]),
    RTX2: (27, [("all_reduce", 27)], 2, 2, [3.02663], [108]),
    T4X2: (31, [("all_reduce", 31)], 2, 2, [1.15327], [0]),
    T4X3: (11, [("all_reduce", 11)], 3, 3, [0.58536], [0]),
    A100X16: (9, [("all_to_all", 9)], 16, 2, [35.7955], [0]),
    MI300X: (32, [("all_reduce", 32)], 8, 1, [116.669], [0]),
}


def _log(name: str) -> Path:
    return REAL_LOGS / name


# ---------------------------------------------------------------------------------------------------------------------
# Formulas
# ---------------------------------------------------------------------------------------------------------------------


def test_public_api() -> None:
    assert sorted(nccl_tests.__all__) == [
        "BusbwRow", "NcclTestsResult", "QuickRow", "algbw", "busbw_factor", "canonical_op", "parse_nccl_tests",
    ]


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 8, 1.75),
        ("all_reduce", 1, 0.0),
        ("all_reduce", 2, 1.0),
        ("reduce_scatter", 4, 0.75),
        ("all_gather", 16, 15 / 16),
        ("all_to_all", 16, 15 / 16),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("sendrecv", 8, 1.0),
        ("gather", 4, 0.75),
        ("scatter", 4, 0.75),
        ("AllReduce", 8, 1.75),
        ("all_reduce_perf", 8, 1.75),
        ("alltoall_perf", 2, 0.5),
    ],
)
def test_busbw_factor_is_nccl_tests_definition(op: str, n: int, factor: float) -> None:
    assert busbw_factor(op, n) == pytest.approx(factor)


@pytest.mark.parametrize(("op", "n"), [("all_reduce", 0), ("all_reduce", -2), ("all_reduce", 2.0), ("warp", 8)])
def test_busbw_factor_rejects_bad_input(op, n) -> None:
    with pytest.raises(ValueError):
        busbw_factor(op, n)


def test_algbw() -> None:
    assert algbw(1e9, 0.01) == pytest.approx(100 * GB)
    assert algbw(0, 1.0) == 0.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="time_s"):
            algbw(1, bad)


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("all_reduce_perf", "all_reduce"), ("./build/all_gather_perf", "all_gather"), ("AllGather", "all_gather"),
        ("reduce_scatter_perf", "reduce_scatter"), ("ReduceScatter", "reduce_scatter"), ("alltoall_perf", "all_to_all"),
        ("AlltoAll", "all_to_all"), ("broadcast_perf", "broadcast"), ("Broadcast", "broadcast"), ("reduce_perf", "reduce"),
        ("sendrecv_perf", "sendrecv"), ("SendRecv", "sendrecv"), ("all_reduce_perf_mpi", "all_reduce"),
        ("all_reduce", "all_reduce"), ("all_to_all", "all_to_all"), ("gather_perf", "gather"),
    ],
)
def test_canonical_op(name: str, op: str) -> None:
    assert canonical_op(name) == op


def test_canonical_op_unknown() -> None:
    with pytest.raises(ValueError, match="unknown nccl-tests collective 'warp_perf'"):
        canonical_op("warp_perf")


# ---------------------------------------------------------------------------------------------------------------------
# Real logs
# ---------------------------------------------------------------------------------------------------------------------


def _data_lines_by_regex(text: str) -> int:
    """Data lines counted without the parser: an optional mpirun prefix, two integers, a type name."""
    rx = re.compile(r"^(?:\[\d+,\d+\]<stdout>:)?\s*\d+\s+\d+\s+[a-z][a-z0-9]*\s")
    return sum(1 for line in text.splitlines() if rx.match(line))


@needs_logs
def test_every_nccl_tests_fixture_is_covered() -> None:
    names = {p.name for p in REAL_LOGS.glob("*.txt") if p.name.startswith(("nccl-tests_", "rccl-tests_"))}
    assert names == set(EXPECTED)


@needs_logs
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_log_rows_and_meta(name: str) -> None:
    lines, runs, nranks, num_nodes, avgs, oobs = EXPECTED[name]
    assert _data_lines_by_regex(_log(name).read_text()) == lines  # the hand count, checked independently
    result = parse_nccl_tests(_log(name))
    assert isinstance(result, NcclTestsResult)
    # Every data line of these files has both halves printed.
    assert len(result.rows) == 2 * lines
    assert sum(r.in_place for r in result.rows) == lines
    assert [(m["op"], m["num_rows"]) for m in result.meta["runs"]] == [(op, 2 * k) for op, k in runs]
    assert result.meta["ops"] == list(dict.fromkeys(op for op, _ in runs))
    assert result.meta["nranks"] == nranks
    assert result.meta["num_nodes"] == num_nodes
    assert [m["avg_busbw_GBps"] for m in result.meta["runs"]] == avgs
    assert [m["out_of_bounds"] for m in result.meta["runs"]] == oobs
    if len(runs) == 1:
        assert result.meta["op"] == runs[0][0]
        assert result.meta["avg_busbw_GBps"] == avgs[0]
    assert result.meta["out_of_bounds"] == sum(oobs)
    for row in result.rows:
        assert isinstance(row, BusbwRow)
        assert row.group_size == nranks
        assert row.intra_node == (num_nodes == 1)
        assert row.source.startswith(f"{name}:")
        assert row.dtype == "fp32"
        line_no = int(row.source.rsplit(":", 1)[1])
        assert str(row.size_bytes) in _log(name).read_text().splitlines()[line_no - 1]


@needs_logs
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_avg_bus_bandwidth_is_the_mean_of_the_rows(name: str) -> None:
    """nccl-tests' summary averages busbw over every half it printed: no row lost, none invented."""
    result = parse_nccl_tests(_log(name))
    for run in result.meta["runs"]:
        rows = [r for r in result.rows if run["first_line"] <= int(r.source.rsplit(":", 1)[1]) <= run["last_line"]]
        mean = sum(r.busbw_GBps for r in rows) / len(rows)
        assert mean == pytest.approx(run["avg_busbw_GBps"], abs=0.005), run["op"]


def _half_unit_of(value: float, limits: tuple[float, float]) -> float:
    """Half the last printed digit of a value nccl-tests printed with 2/1/0 decimals below/above ``limits``."""
    if value < limits[0]:
        return 0.005
    return 0.05 if value < limits[1] else 0.5


def _within(printed: float, size: int, time_us: float, factor: float) -> bool:
    """printed (GB/s) == size / time x factor, allowing for the rounding of time and of the printed value."""
    dt = _half_unit_of(time_us, (100.0, 10000.0))
    dv = _half_unit_of(printed, (1000.0, 10000.0))
    lo = size * factor / (time_us + dt) / 1e3 - dv
    hi = (size * factor / (time_us - dt) / 1e3 if time_us > dt else math.inf) + dv
    return lo - 1e-9 <= printed <= hi + 1e-9


@needs_logs
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_printed_busbw_rederived_from_size_time_and_n(name: str) -> None:
    """busbw = size / time x f(op, n) for every real row, within print precision: checks rows, op, n and f."""
    result = parse_nccl_tests(_log(name))
    for row in result.rows:
        time_us = row.time_s / US
        f = busbw_factor(row.op, row.group_size)
        assert _within(row.busbw_bytes_per_s / GB, row.size_bytes, time_us, f), row
        # algbw = size / time, except the pre-2019 all_gather / reduce_scatter convention of the DGX-2 log.
        old = name == DGX2 and row.op in ("all_gather", "reduce_scatter")
        af = (row.group_size - 1) / row.group_size if old else 1.0
        assert _within(row.algbw_bytes_per_s / GB, row.size_bytes, time_us, af), row
        assert not _within(row.busbw_bytes_per_s / GB, row.size_bytes, time_us, f * 1.1) or row.busbw_bytes_per_s < 1e8


@needs_logs
def test_dgx2_old_format_errors_and_column_sets() -> None:
    result = parse_nccl_tests(_log(DGX2))
    by_op = {}
    for row in result.rows:
        by_op.setdefault(row.op, []).append(row)
    assert [m["algbw_convention"] for m in result.meta["runs"]] == [
        "size*(n-1)/n/time", "size/time", "size/time", "size/time", "size*(n-1)/n/time",
    ]
    # Old 'error' column: a max error, not a count.
    assert all(r.wrong is None and r.max_error is not None for r in result.rows)
    assert {(r.redop, r.root) for r in by_op["all_gather"]} == {(None, None)}
    assert {(r.redop, r.root) for r in by_op["all_reduce"]} == {("sum", None)}
    assert {(r.redop, r.root) for r in by_op["broadcast"]} == {(None, 0)}
    assert {(r.redop, r.root) for r in by_op["reduce"]} == {("sum", 0)}
    assert {(r.redop, r.root) for r in by_op["reduce_scatter"]} == {("sum", None)}
    assert sum(r.size_bytes == 0 for r in by_op["all_gather"]) == 6  # three size-0 lines, two halves each
    failed = [r for r in result.rows if r.failed_check]
    assert [(r.op, r.size_bytes, r.in_place) for r in failed] == [
        ("all_gather", 4294967280, False), ("all_gather", 4294967280, True),
        ("all_gather", 8589934560, False), ("all_gather", 8589934560, True),
    ]
    assert result.meta["args"] == {"b": "8", "e": "10240M", "f": "2", "g": "12"}
    assert result.meta["params"]["ngpus"] == 12
    assert result.meta["command"] is None  # five different commands
    assert len(result.meta["devices"]) == 12
    assert result.meta["devices"][0]["name"] == "Tesla V100-SXM3-32GB"
    problems = result.problems
    assert len(problems) == 5
    assert sum("exceeds nccl-tests' bound" in p for p in problems) == 4
    assert any(p.startswith(f"{DGX2}:52: ") and "4 out-of-bounds values" in p for p in problems)


@needs_logs
def test_wrong_rows_are_problems() -> None:
    result = parse_nccl_tests(_log(RTX2))
    assert all(r.wrong and r.wrong > 0 and r.failed_check for r in result.rows)
    assert [r.wrong for r in result.rows[:2]] == [4, 4]
    assert result.rows[-1].wrong == 268435000  # printed with %g as 2.68435e+08
    wrong_problems = [p for p in result.problems if "#wrong" in p]
    assert len(wrong_problems) == 54
    assert wrong_problems[0] == f"{RTX2}:11: all_reduce 8 B out-of-place: #wrong = 4 (the data check found wrong elements)"
    assert any("108 out-of-bounds values" in p for p in result.problems)
    assert len(result.problems) == 55


@needs_logs
@pytest.mark.parametrize("name", [A100X8, H100X16, T4X2, T4X3, MI300X])
def test_clean_logs_have_no_problems(name: str) -> None:
    result = parse_nccl_tests(_log(name))
    assert result.problems == []
    assert result.ok
    assert not any(r.failed_check for r in result.rows)


@needs_logs
def test_interleaved_nccl_info_and_mpirun_prefixes() -> None:
    result = parse_nccl_tests(_log(T4X2))
    assert result.meta["nccl_version"] == "2.12.7+cuda11.4"
    assert result.meta["hosts"] == ["test-nccl-efa-worker-0", "test-nccl-efa-worker-1"]
    assert result.rows[0].size_bytes == 0 and result.rows[0].source == f"{T4X2}:58"
    assert result.rows[-1].size_bytes == 1073741824
    assert result.meta["params"] == {
        "nthreads": 1, "ngpus": 1, "min_bytes": 1, "max_bytes": 1073741824, "warmup_iters": 5, "iters": 100,
        "agg_iters": 1, "validation": 1, "graph": 0, "step_factor": 2,
    }


@needs_logs
def test_newest_format_versions_and_two_decimal_times() -> None:
    result = parse_nccl_tests(_log(A100X8))
    assert result.meta["nccl_tests_version"] == "2.19.4"
    assert result.meta["nccl_version"] == "2.19.3"  # nccl-library=21903
    big = next(r for r in result.rows if r.size_bytes == 134217728 and not r.in_place)
    assert big.time_s == pytest.approx(1295.41 * US)
    assert big.busbw_bytes_per_s == pytest.approx(181.32 * GB)
    assert big.algbw_bytes_per_s == pytest.approx(103.61 * GB)
    assert big.count == 33554432 and big.redop == "sum" and big.root is None and big.wrong == 0


@needs_logs
def test_column_overflow_is_read_by_whitespace() -> None:
    result = parse_nccl_tests(_log(RTX1))
    last_in_place = [r for r in result.rows if r.in_place][-1]
    assert last_in_place.algbw_bytes_per_s == pytest.approx(2375009.56 * GB)
    assert last_in_place.busbw_bytes_per_s == 0.0 and last_in_place.wrong == 0
    assert last_in_place.time_s == pytest.approx(0.23 * US)
    # One rank: all_reduce and reduce_scatter rows are the same; the assumption is stated. The in-place times of
    # 0.2 us that give the overflowing algbw (up to 2.4 PB/s) are no measurement: said for each of the 8 rows.
    assert "could be all_reduce or reduce_scatter" in result.problems[0]
    too_fast = [p for p in result.problems[1:] if "above any real link (10,000 GB/s)" in p]
    assert len(too_fast) == 8 == len(result.problems) - 1
    assert ":36: all_reduce 536870912 B in-place: time 0.23 us gives 2,375,009.56 GB/s" in too_fast[-1]
    assert parse_nccl_tests(_log(RTX1), op="all_reduce").problems == result.problems[1:]


@needs_logs
def test_step_bytes_and_na_errors() -> None:
    result = parse_nccl_tests(_log(T4X3))
    assert result.meta["params"]["step_bytes"] == 1048576 and "step_factor" not in result.meta["params"]
    assert all(r.wrong is None and r.max_error is None for r in result.rows)
    sizes = [r.size_bytes for r in result.rows if not r.in_place]
    assert sizes == [104857600 + i * 1048576 for i in range(11)]


@needs_logs
def test_alltoall_with_pasted_artifacts() -> None:
    result = parse_nccl_tests(_log(A100X16))
    assert {r.op for r in result.rows} == {"all_to_all"}
    assert result.rows[0].source == f"{A100X16}:26"  # the row that lost its leading spaces
    assert all(r.wrong == 0 for r in result.rows if not r.in_place)
    assert all(r.wrong is None for r in result.rows if r.in_place)  # N/A
    assert all(r.redop is None and r.root is None for r in result.rows)
    assert result.meta["params"]["ngpus"] == 8  # the second parameter line
    assert len(result.problems) == 2
    assert "second parameter line" in result.problems[0] and "line 1" in result.problems[0]
    assert "minBytes 536870912" in result.problems[1]


@needs_logs
def test_command_naming_another_collective_is_overruled() -> None:
    """The author's prose says ./all_reduce_perf, but the rows are alltoall: the rows win, and that is reported."""
    text = "$ ./all_reduce_perf -b 32M -e 8G -g 8\n" + _log(A100X16).read_text()
    result = parse_nccl_tests(text)
    assert {r.op for r in result.rows} == {"all_to_all"}
    assert result.meta["args"] == {"b": "32M", "e": "8G", "g": "8"}
    [msg] = [p for p in result.problems if "names all_reduce" in p]
    assert msg.startswith("<text>:27: line 1 names all_reduce_perf, but the rows are not all_reduce output")
    assert "reading them as all_to_all" in msg
    # An explicit op= is kept even so, and the mismatch is reported.
    forced = parse_nccl_tests(_log(A100X16), op="all_gather")
    assert {r.op for r in forced.rows} == {"all_gather"}
    assert not any("do not look like" in p for p in forced.problems)  # the rows fit all_gather too
    forced = parse_nccl_tests(_log(A100X16), op="AllReduce")
    assert {r.op for r in forced.rows} == {"all_reduce"}
    assert any("do not look like all_reduce output" in p for p in forced.problems)


@needs_logs
def test_rccl_version_block() -> None:
    result = parse_nccl_tests(_log(MI300X))
    m = result.meta
    assert (m["rccl_tests_version"], m["rccl_version"]) == ("develop:448c4c7", "2.22.3-develop:f5b15f2")
    assert (m["hip_version"], m["rocm_version"]) == ("6.3.42131-fa1d09cbd", "6.3.0.0-39-ce2be3b")
    assert m["devices"][0]["bus_id"] == "0000:0c:00.0" and m["devices"][0]["name"] == "AMD Instinct MI300X"
    assert result.rows[-1].size_bytes == 17179869184  # the last row lost its leading space


@needs_logs
def test_path_text_and_gzip_agree(tmp_path: Path) -> None:
    from_path = parse_nccl_tests(_log(H100X16))
    from_str_path = parse_nccl_tests(str(_log(H100X16)))
    from_text = parse_nccl_tests(_log(H100X16).read_text())
    gz = tmp_path / "h100.txt.gz"
    gz.write_bytes(gzip.compress(_log(H100X16).read_bytes()))
    from_gz = parse_nccl_tests(gz)
    strip = lambda rows: [(r.size_bytes, r.time_s, r.busbw_bytes_per_s, r.in_place) for r in rows]
    assert strip(from_path.rows) == strip(from_text.rows) == strip(from_gz.rows) == strip(from_str_path.rows)
    assert from_text.rows[0].source == "<text>:24"
    assert from_gz.rows[0].source == "h100.txt.gz:24"


@needs_logs
def test_truncated_output_is_reported() -> None:
    lines = _log(H100X16).read_text().splitlines()
    # Cut in the in-place half of the 8th data row (line 31): 7 whole rows and one out-of-place half remain.
    toks = lines[30].split()
    cut = lines[:30] + ["  ".join(toks[:9]) + "    12"]
    result = parse_nccl_tests("\n".join(cut) + "\n")
    assert len(result.rows) == 2 * 7 + 1
    assert any(":31: data row" in p and "in-place half '12' cannot be read" in p for p in result.problems)
    assert any("stops without nccl-tests' summary" in p for p in result.problems)
    assert result.meta["avg_busbw_GBps"] is None and result.meta["runs"][0]["complete"] is False


@needs_logs
def test_failure_message_after_half_a_row() -> None:
    lines = _log(H100X16).read_text().splitlines()
    toks = lines[30].split()
    failure = "ztan-mig-235z: Test NCCL failure common.cu:393 'unhandled system error'"
    broken = lines[:30] + ["  ".join(toks[:9]) + "  " + failure]
    result = parse_nccl_tests("\n".join(broken) + "\n")
    assert len(result.rows) == 2 * 7 + 1  # the out-of-place half printed before the failure is kept
    assert any(":31: data row" in p and "in-place half is missing" in p for p in result.problems)
    assert any("reports a failure" in p and "unhandled system error" in p for p in result.problems)


# ---------------------------------------------------------------------------------------------------------------------
# Synthetic outputs, built with nccl-tests' own printf formats
# ---------------------------------------------------------------------------------------------------------------------


def _preamble(size, count, type_name, redop, root) -> str:
    return "%12li  %12li  %8s  %6s  %6s" % (size, count, type_name, redop, "%6i" % root)  # noqa: UP031 - nccl-tests' own printf formats


def _half(time_us, alg, bus, wrong) -> str:
    return "  %7s  %6.2f  %6.2f  %6s" % ("%7.2f" % time_us, alg, bus, wrong)  # noqa: UP031 - nccl-tests' own printf formats


def _devices(n: int, hosts: int = 1) -> list[str]:
    per = n // hosts
    return [
        "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"  # noqa: UP031 - nccl-tests' own printf formats
        % (r, 0, 1000 + r, f"node{r // per}", r % per, 0, r, 0, "NVIDIA H100 80GB HBM3")
        for r in range(n)
    ]


HEADER = [
    "#                                                              out-of-place                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
]


def _allreduce_rows(n: int, dtype: str = "float", elem: int = 4) -> list[str]:
    out = []
    for size, t in ((1048576, 67.31), (2097152, 81.12)):
        alg = size / t / 1e3
        out.append(_preamble(size, size // elem, dtype, "sum", -1) + _half(t, alg, alg * 2 * (n - 1) / n, 0)
                   + _half(t, alg, alg * 2 * (n - 1) / n, 0))
    return out


def _output(rows: list[str], n: int = 8, hosts: int = 1, summary: bool = True) -> str:
    lines = [("# nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0"), "#", "# Using devices", *_devices(n, hosts), *HEADER, *rows]
    if summary:
        lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 30 ", "#"]
    return "\n".join(lines) + "\n"


def test_synthetic_all_reduce_two_nodes() -> None:
    result = parse_nccl_tests(_output(_allreduce_rows(16), n=16, hosts=2))
    assert result.problems == []
    assert result.meta["op"] == "all_reduce" and result.meta["nranks"] == 16 and result.meta["num_nodes"] == 2
    assert all(r.intra_node is False for r in result.rows)
    assert len(result.rows) == 4


@pytest.mark.parametrize(("name", "canonical"), [("half", "fp16"), ("bfloat16", "bf16"), ("double", "fp64"),
                                                 ("int8", "int8"), ("uint64", "uint64")])
def test_dtype_names(name: str, canonical: str) -> None:
    elem = {"fp16": 2, "bf16": 2, "fp64": 8, "int8": 1, "uint64": 8}[canonical]
    result = parse_nccl_tests(_output(_allreduce_rows(8, name, elem)))
    assert {r.dtype for r in result.rows} == {canonical}
    assert result.problems == []


def test_per_iteration_and_timestamp_columns() -> None:
    """The newest nccl-tests: per-iteration stats after each half, a timestamp at the end of the row."""
    header = [
        "#                                                     out-of-place (+ per-iteration)      in-place (+ per-iteration)",
        ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99"
        "    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%           timestamp"),
        ("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)     (us)     (us)"
        "      (%)     (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)   %Y-%m-%d %H:%M:%S"),
    ]
    stats = "  %7s  %7s  %7s  %7s" % ("60.10", "70.20", "69.90", "3.10")  # noqa: UP031 - nccl-tests' own printf formats
    row = (_preamble(1048576, 262144, "float", "sum", -1) + _half(67.31, 15.58, 27.26, 0) + stats
           + _half(65.27, 16.07, 28.11, 0) + stats + "%21s" % "2025-06-01 12:00:00")  # noqa: UP031 - nccl-tests' own printf formats
    text = "\n".join(["# Using devices", *_devices(8), *header, row, "# Avg bus bandwidth    : 27.685 "]) + "\n"
    result = parse_nccl_tests(text)
    assert result.problems == []
    assert [(r.in_place, r.busbw_GBps) for r in result.rows] == [(False, 27.26), (True, 28.11)]


def test_row_split_by_nccl_info_line() -> None:
    """NCCL's log shares rank 0's stdout: an INFO line can land inside a row; the row is put back together."""
    a, b = _allreduce_rows(8)
    head, tail = a[:54], a[54:]
    rows = [head + "node0:1000:1001 [0] NCCL INFO Launch mode Parallel", tail, b]
    result = parse_nccl_tests(_output(rows))
    assert [r.size_bytes for r in result.rows] == [1048576, 1048576, 2097152, 2097152]
    assert len(result.problems) == 1 and "split by other output" in result.problems[0]


def test_a_run_that_failed_before_its_rows_does_not_lend_its_name() -> None:
    failed = "\n".join(["Running: ./build/all_gather_perf -b 8 -e 128M -f 2 -g 8", *_devices(8), *HEADER,
                        "node0: Test NCCL failure common.cu:1279 'unhandled cuda error'"])
    ok = "Running: ./build/all_reduce_perf -b 1M -e 2M -f 2 -g 8\n" + _output(_allreduce_rows(8))
    result = parse_nccl_tests(failed + "\n" + ok)
    assert result.meta["ops"] == ["all_reduce"]
    assert result.meta["args"] == {"b": "1M", "e": "2M", "f": "2", "g": "8"}
    assert result.meta["command"] == "Running: ./build/all_reduce_perf -b 1M -e 2M -f 2 -g 8"
    assert len(result.problems) == 1 and "unhandled cuda error" in result.problems[0]


def test_srun_labels_and_timestamps_before_rows() -> None:
    text = _output(_allreduce_rows(8))
    labelled = "".join(f"0: {line}\n" for line in text.splitlines())
    stamped = "".join(f"2025-06-01T12:00:00.123Z {line}\n" for line in text.splitlines())
    for variant in (labelled, stamped):
        result = parse_nccl_tests(variant)
        assert [r.size_bytes for r in result.rows] == [1048576, 1048576, 2097152, 2097152]
        assert result.meta["nranks"] == 8 and result.meta["avg_busbw_GBps"] == 30
        assert result.problems == []


def test_rows_from_several_mpi_processes_are_reported() -> None:
    """nccl-tests built without MPI: every process runs its own 1-rank test and prints its own table."""
    single = _output(_allreduce_rows(1), n=1).splitlines()
    text = "\n".join([f"[1,0]<stdout>:{x}" for x in single] + [f"[1,1]<stdout>:{x}" for x in single]) + "\n"
    result = parse_nccl_tests(text)
    assert len(result.meta["runs"]) == 2
    assert any("several MPI processes" in p for p in result.problems)


def test_wrong_in_place_na_and_star() -> None:
    rows = _allreduce_rows(8)
    rows[0] = rows[0][: -6] + "    N/A"
    rows[1] = rows[1][: -6] + "     3*"
    result = parse_nccl_tests(_output(rows))
    assert [r.wrong for r in result.rows] == [0, None, 0, 3]
    assert any("#wrong = 3" in p for p in result.problems)


def test_unreadable_row_like_lines_are_problems() -> None:
    rows = _allreduce_rows(8)
    rows.insert(1, "     4194304       1048576     float     sum      -1    abc   1.00   1.00   0   1.0   1.0   1.0   0")
    rows.insert(2, "     8388608")
    result = parse_nccl_tests(_output(rows))
    assert len(result.rows) == 4
    assert sum("cannot read data row" in p for p in result.problems) == 2


def test_failure_and_warning_lines_are_problems() -> None:
    rows = _allreduce_rows(8)
    rows.insert(1, "node0:1000:1001 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 0")
    rows.insert(2, "node0: Test NCCL failure common.cu:1279 'remote process exited or there was a network error'")
    rows.insert(3, "--------------------------------------------------------------------------")
    rows.insert(4, "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD")
    result = parse_nccl_tests(_output(rows, summary=False))
    text = "\n".join(result.problems)
    assert "NCCL warning" in text and "remote process exited" in text and "MPI_ABORT" in text
    assert "stops without nccl-tests' summary" in text
    assert len(result.rows) == 4


def test_no_rows_is_a_value_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("# nThread 1 nGpus 8 minBytes 8 maxBytes 128M\n#\n# Using devices\n")
    with pytest.raises(ValueError, match=r"^x\.txt: no nccl-tests data rows found \(expected lines like '  1048576"):
        parse_nccl_tests(path)
    path.write_text("")
    with pytest.raises(ValueError, match="x.txt: no nccl-tests data rows"):
        parse_nccl_tests(path)


def test_no_rows_says_why_when_the_run_failed() -> None:
    text = "# Using devices\nnode0: Test CUDA failure common.cu:892 'out of memory'\n"
    with pytest.raises(ValueError, match="out of memory"):
        parse_nccl_tests(text)


def test_missing_file_and_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        parse_nccl_tests(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="no such file"):
        parse_nccl_tests("missing.txt")
    with pytest.raises(ValueError, match="is a directory, expected a file"):  # not 'no such file'
        parse_nccl_tests(tmp_path)
    with pytest.raises(ValueError, match="unknown nccl-tests collective"):
        parse_nccl_tests("8 2 float sum -1 1 1 1 0\n", op="warp")


# ---------------------------------------------------------------------------------------------------------------------
# A rooted collective over every root (-r -1): one table, every size once per root
# ---------------------------------------------------------------------------------------------------------------------

#: broadcast_perf -b 1M -e 32M -f 2 -g 4 -r -1 as nccl-tests 2.19.4 prints it (tests/io/data/SOURCES.md): roots 2 and 3
#: slower than 0 and 1.
ALL_ROOTS = Path(__file__).parent / "data" / "nccl-tests_broadcast_4gpu_all-roots_constructed.txt"


def _root_blocks(roots: list[int], *, repeat: bool = False) -> str:
    """ALL_ROOTS cut into one run per root of ``roots`` (``broadcast_perf -r R`` run once per root, the outputs pasted
    together), or the whole file twice with ``repeat``."""
    lines = ALL_ROOTS.read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("     1048576"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("# Out of bounds"))
    if repeat:
        return "\n".join(lines * 2) + "\n"
    out: list[str] = []
    for root in roots:
        out += lines[:first] + [ln for ln in lines[first:end] if int(ln.split()[4]) == root] + lines[end:]
    return "\n".join(out) + "\n"


def test_a_table_over_every_root_keeps_each_rows_root() -> None:
    """nccl-tests' -r -1 loops over every root of one table (broadcast.cu: ``for j in begin_root..end_root``), so the
    same sizes come once per root, the root column holding the root's rank. The reader kept each row's root but said
    nowhere which roots a run timed; ``meta["runs"][i]["roots"]`` now does."""
    result = parse_nccl_tests(ALL_ROOTS)
    assert result.problems == []
    assert result.meta["op"] == "broadcast" and result.meta["nranks"] == 4 and len(result.meta["runs"]) == 1
    assert result.meta["runs"][0]["roots"] == result.meta["roots"] == [0, 1, 2, 3]
    assert len(result.rows) == 4 * 6 * 2
    lines = ALL_ROOTS.read_text().splitlines()
    for row in result.rows:
        assert row.root == int(lines[int(row.source.rsplit(":", 1)[1]) - 1].split()[4])
    big = {r.root: r.time_s for r in result.rows if r.size_bytes == 1 << 25 and not r.in_place}
    assert big == pytest.approx({0: 1617.45 * US, 1: 1633.33 * US, 2: 1943.34 * US, 3: 1966.03 * US})
    mean = sum(r.busbw_GBps for r in result.rows) / len(result.rows)
    assert mean == pytest.approx(result.meta["avg_busbw_GBps"], abs=0.005)  # every root's rows, as nccl-tests averages
    assert parse_nccl_tests(_output(_allreduce_rows(8))).meta["roots"] == []  # all_reduce prints root -1


def test_runs_from_other_roots_are_no_repeat_but_the_same_root_twice_is() -> None:
    """``broadcast_perf -r 0`` and ``-r 1`` pasted into one file were said to be 'pooled as one measurement (a run
    repeated ...)', though every row keeps its root and fit and --bandwidth take one root at a time."""
    result = parse_nccl_tests(_root_blocks([0, 1]))
    assert [r["roots"] for r in result.meta["runs"]] == [[0], [1]]
    assert result.meta["roots"] is None  # the runs do not share one
    assert result.problems == []
    twice = parse_nccl_tests(_root_blocks([], repeat=True))
    assert len(twice.problems) == 1
    overlap = parse_nccl_tests(_root_blocks([0, 1]) + _root_blocks([1]))
    assert [p.split(": ", 1)[1] for p in overlap.problems] == [
        ("the tables from line 38 and from line 62 both time broadcast over 4 ranks from root 1: their rows are pooled "
         "as one measurement, each size's median (a run repeated, or one output pasted twice?)")]
    assert twice.problems[0].endswith(":56: the tables from line 14 and from line 56 both time broadcast over 4 ranks "
                                      "from roots 0, 1, 2, 3: their rows are pooled as one measurement, each size's "
                                      "median (a run repeated, or one output pasted twice?)")


def test_summarize_counts_every_roots_rows(capsys) -> None:
    """summarize adds up ops and bytes, which do not depend on the root: all 4 roots' rows are counted (48 halves x
    20 iterations), each op keeping its root. This held before the fix too; it guards that summarize, which times
    nothing, keeps every root while fit and --bandwidth take one."""
    from commscope.cli.main import main
    from commscope.io.importers import import_nccl_tests

    ops = import_nccl_tests(ALL_ROOTS).ops
    assert sorted({dict(op.extra)["root"] for op in ops}) == [0, 1, 2, 3] and len(ops) == 48
    assert main(["summarize", str(ALL_ROOTS)]) == 0
    out = capsys.readouterr().out
    assert "48 records, 960 ops" in out and "problem" not in out


ROOT_2 = Path(__file__).parent / "data" / "nccl-tests_broadcast_4gpu_root-2_constructed.txt"


def _measured_pairs(tmp_path: Path, path: Path, jobs: list[str]) -> dict[tuple[int, int], int]:
    """(src, dst) -> bytes of the logical matrix `summarize --out` writes for ``path``."""
    from commscope.cli.main import main

    out = tmp_path / f"out{len(jobs)}-{path.stem}"
    assert main(["summarize", str(path), "--out", str(out), *jobs]) == 0
    rows = [line.split(",") for line in (out / "measured_logical.csv").read_text().splitlines()[1:]]
    return {(int(r[0]), int(r[1])): int(r[3]) for r in rows}


@pytest.mark.parametrize("jobs", [[], ["--jobs", "1"]])
def test_summarize_draws_a_broadcast_from_the_root_it_ran_from(tmp_path, capsys, jobs) -> None:
    """nccl-tests keeps a broadcast's group as 0..n-1 and its root in the root column, but the traffic matrix started
    every broadcast at the group's first rank: `broadcast_perf -r 2` was drawn 0 -> 1 -> 2 -> 3. The chain now
    starts at the recorded root, ring order kept (2 -> 3 -> 0 -> 1), in the totals read rank by rank (--jobs) too;
    and under -r -1 each root's rows start at their own root, so every ring link but the one into each root
    carries them."""
    sizes = 20 * 2 * sum(1 << k for k in range(20, 26))  # 20 iterations x both halves of 1-32 MiB
    assert _measured_pairs(tmp_path, ROOT_2, jobs) == {(2, 3): sizes, (3, 0): sizes, (0, 1): sizes}
    assert _measured_pairs(tmp_path, ALL_ROOTS, jobs) == {(0, 1): 3 * sizes, (1, 2): 3 * sizes, (2, 3): 3 * sizes,
                                                          (3, 0): 3 * sizes}


KINETO = ("data", "real-logs", "kineto_trace_a100x2_nccl-allreduce-broadcast_rank0.json.gz")


@requires_shared(*KINETO)
def test_broadcasts_whose_records_name_no_root_are_said(capsys) -> None:
    """A Kineto trace records its broadcasts without their root, so the matrix draws them from the group's first
    rank: `summarize` says so (it drew them in silence); logs that name their roots get no such note."""
    from commscope.cli.main import main

    assert main(["summarize", str(SHARED.joinpath(*KINETO)), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert ("6 broadcast op(s) name no root (these records do not say which rank it was): the traffic matrix draws "
            "each from (or into) the first rank of its group") in notes
    assert main(["summarize", str(ROOT_2)]) == 0
    assert "name no root" not in capsys.readouterr().out


def test_a_root_outside_the_group_is_said(tmp_path) -> None:
    """A root column naming no rank of the group (a damaged or hand-edited table) could not be placed by the traffic
    matrix, which starts such an op at rank 0: the reader says so."""
    path = tmp_path / "root7.txt"
    path.write_text(ROOT_2.read_text().replace("    none       2  ", "    none       7  ", 1))
    assert parse_nccl_tests(path).problems == [("root7.txt:14: root 7 is not a rank of the 4-rank group (0 to 3): a "
                                                "traffic matrix takes rank 0 for it")]


# ---------------------------------------------------------------------------------------------------------------------
# Fuzzing: odd input only ever gives a result or a ValueError
# ---------------------------------------------------------------------------------------------------------------------

_ODD_TOKENS = [
    "N/A", "-1", "nan", "inf", "-inf", "1e+999", "0", "", "#", "float", "sum", "none", "1.04858e+06", "2e-07", "*",
    "99999999999999999999999999", "NCCL INFO", "NCCL WARN", "Test NCCL failure", "[1,0]<stdout>:", ":", "\t", "é",
    "# Avg bus bandwidth    : x", "# Out of bounds values : 9 FAILED", "#  Rank 99 Group 0 Pid 1 on h device 0 [0] G",
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 8", "./alltoall_perf -b", "\x00", "1_000", "0x10",
]


@st.composite
def mutated_logs(draw) -> str:
    name = draw(st.sampled_from(sorted(EXPECTED)))
    lines = _log(name).read_text().splitlines()
    token = st.sampled_from(_ODD_TOKENS) | st.text(max_size=12)
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["delete", "duplicate", "truncate", "token", "insert", "swap", "char", "join"]))
        if not lines:
            lines.append(draw(token))
            continue
        i = draw(st.integers(0, len(lines) - 1))
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "truncate":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif kind == "token":
            toks = lines[i].split() or [""]
            toks[draw(st.integers(0, len(toks) - 1))] = draw(token)
            lines[i] = "  ".join(toks)
        elif kind == "insert":
            lines.insert(i, draw(token))
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "char":
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.characters()) + lines[i][pos + 1:]
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i] = lines[i] + lines[j]
    return "\n".join(lines) + "\n"


def _check_result_or_value_error(text: str) -> None:
    try:
        result = parse_nccl_tests(text)
    except ValueError:
        return
    assert result.rows
    for row in result.rows:
        for v in (row.time_s, row.algbw_bytes_per_s, row.busbw_bytes_per_s):
            assert math.isfinite(v) and v >= 0
        assert row.size_bytes >= 0 and row.count >= 0
        assert row.wrong is None or row.wrong >= 0
        assert re.fullmatch(r"<text>:\d+", row.source)
        assert isinstance(row.op, str) and isinstance(row.in_place, bool)
    assert all(isinstance(p, str) and p.startswith("<text>") for p in result.problems)


@needs_logs
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_logs())
def test_fuzz_mutated_real_logs(text: str) -> None:
    _check_result_or_value_error(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_ODD_TOKENS), st.text(max_size=40),
                          st.lists(st.sampled_from(["8", "2", "float", "sum", "-1", "1.5", "0", "N/A", "x"]),
                                   max_size=16).map("  ".join)), max_size=30))
def test_fuzz_arbitrary_lines(lines: list[str]) -> None:
    _check_result_or_value_error("\n".join(lines) + "\n")


@needs_logs
def test_a_real_sweep_is_a_bandwidth_table_its_zero_busbw_rows_left_out():
    """nccl-tests prints busbw 0.00 for its smallest sizes (8 B over 8 A100s: 34.8 us); a bandwidth table of the log
    leaves those rows out instead of refusing the whole file, and interpolates the rest."""
    from commscope.estimate.bandwidth import GroupSpan
    from commscope.io.bandwidth_file import read_bandwidth

    path = REAL_LOGS / A100X8
    zero = [r for r in parse_nccl_tests(path).rows if not r.in_place and r.busbw_bytes_per_s == 0]
    assert zero and zero[0].size_bytes == 8
    table = read_bandwidth(path)
    rows = [r for r in table.rows if r.size_bytes == 1 << 27]
    assert min(r.size_bytes for r in table.rows) > zero[-1].size_bytes and len(rows) == 1
    assert table.busbw_bytes_per_s("all_reduce", 1 << 27, GroupSpan(8, 1, 8)) == rows[0].busbw_bytes_per_s


def test_quick_rows_are_the_rows() -> None:
    """parse_nccl_tests(quick=True), which `commscope fit` reads a million-line table with, gives the same rows as
    named tuples: every field equal, and the data check read alike."""
    for path in [*sorted(Path(__file__).parent.joinpath("data").glob("*cl-tests*")),
                 *sorted(SHARED.joinpath("data", "real-logs").glob("*cl-tests*"))]:
        slow, quick = parse_nccl_tests(path), parse_nccl_tests(path, quick=True)
        assert [tuple(getattr(r, f) for f in BusbwRow.__slots__) for r in slow.rows] == [tuple(r) for r in quick.rows]
        assert [r.failed_check for r in slow.rows] == [r.failed_check for r in quick.rows]
        assert slow.problems == quick.problems and slow.meta == quick.meta
