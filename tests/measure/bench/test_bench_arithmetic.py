"""Sizes, counts, algbw and busbw against nccl-tests' definitions and real nccl-tests rows; the table; statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import SHARED, requires_shared

from commscope.estimate.bandwidth import busbw_factor
from commscope.measure.bench.sweep import (
    OPS,
    BenchRow,
    SweepConfig,
    SweepResult,
    backend_op,
    format_header,
    format_row,
    format_table,
    make_row,
    message_sizes,
    op_count,
    parse_dtype,
    row_stats,
)
from commscope.errors import ConfigError
from commscope.units import GB, US

LOGS = ("data", "real-logs")
A100_NAME = "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
V100_NAME = "nccl-tests_allgather-allreduce-broadcast-reduce-reducescatter_v100x12_dgx2_old-format_errors.txt"
A100 = SHARED.joinpath(*LOGS, A100_NAME)
V100 = SHARED.joinpath(*LOGS, V100_NAME)


def _data_rows(path):
    """The out-of-place columns of every data row: size, count, time_us, algbw, busbw (whitespace split only)."""
    rows = []
    for line in path.read_text().splitlines():
        toks = line.split()
        if len(toks) >= 9 and toks[0].isdigit() and toks[1].isdigit():
            rows.append((int(toks[0]), int(toks[1]), float(toks[5]), float(toks[6]), float(toks[7])))
    return rows


def test_busbw_factors_are_nccl_tests():
    # NVIDIA/nccl-tests doc/PERFORMANCE.md
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 8) == busbw_factor("reduce_scatter", 8) == busbw_factor("all_to_all", 8) == 0.875
    assert busbw_factor("broadcast", 8) == busbw_factor("reduce", 8) == busbw_factor("sendrecv", 8) == 1.0


@requires_shared(*LOGS, A100_NAME)
def test_a100_log_rows_rederive_from_size_time_and_n():
    rows = _data_rows(A100)
    assert len(rows) == 25
    n = 8
    for size, count, time_us, algbw_printed, busbw_printed in rows:
        assert op_count("all_reduce", size, n, 4) == (count, size)
        stats = {"time_s": time_us * US, "mean_time_s": time_us * US, "p50_s": time_us * US, "p95_s": time_us * US,
                 "p99_s": time_us * US, "cv": 0.0}
        row = make_row(op="all_reduce", n=n, size_bytes=size, count=count, dtype="fp32", redop="sum", root=0,
                       backend="nccl", stats=stats, iters=20, wrong=0, noisy_cv=0.2)
        # nccl-tests prints %6.2f GB/s (1e9); the time it prints is rounded too, hence half a unit plus 0.1%
        assert row.algbw_bytes_per_s / GB == pytest.approx(algbw_printed, abs=0.005 + 1e-3 * algbw_printed)
        assert row.busbw_bytes_per_s / GB == pytest.approx(busbw_printed, abs=0.005 + 1e-3 * busbw_printed)
    # the largest row by hand: 134217728 B in 1295.41 us -> 103.61 GB/s algbw, x 2*7/8 = 181.32 GB/s busbw
    size, _, t, _, busbw = rows[-1]
    assert size / (t * US) * 2 * 7 / 8 / GB == pytest.approx(181.32, abs=0.01) == busbw


def test_sizes_and_counts_follow_nccl_tests():
    # V100 x12 all_gather log: 64 B of fp32 = 16 floats -> 1 per rank, 48 B gathered; 32 B -> 0 (printed as 0 B)
    assert op_count("all_gather", 64, 12, 4) == (1, 48)
    assert op_count("all_gather", 32, 12, 4) == (0, 0)
    assert op_count("reduce_scatter", 4096, 12, 4) == (85, 4080)
    # A100 x16 all_to_all log: 33554432 B of fp32 over 16 ranks prints count 524288 (per peer)
    assert op_count("all_to_all", 33554432, 16, 4) == (524288, 33554432)
    assert op_count("all_reduce", 10, 4, 4) == (2, 8)
    assert op_count("sendrecv", 1024, 4, 2) == (512, 1024)
    with pytest.raises(ConfigError, match="op"):
        op_count("gather_everything", 8, 2, 4)


@requires_shared(*LOGS, V100_NAME)
def test_v100_all_gather_rows_match_op_count():
    lines = V100.read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if "all_reduce_perf" in line)
    requested = 8
    for line in lines[:end]:
        toks = line.split()
        if len(toks) >= 5 and toks[0].isdigit() and toks[1].isdigit():
            assert op_count("all_gather", requested, 12, 4) == (int(toks[1]), int(toks[0]))
            requested *= 2


def test_message_sizes_are_nccl_tests_loop():
    assert message_sizes(8, 64) == [8, 16, 32, 64]
    assert message_sizes(8, 100, 4) == [8, 32]
    assert message_sizes(1000, 3000, 1, 1000) == [1000, 2000, 3000]
    assert len(message_sizes(8, 64 << 20)) == 24
    with pytest.raises(ConfigError):
        message_sizes(64, 8)
    with pytest.raises(ConfigError):
        message_sizes(8, 64, 0.5)


def test_config_validation_and_dtype_names():
    assert parse_dtype("float") == "fp32" and parse_dtype("half") == "fp16" and parse_dtype("bfloat16") == "bf16"
    assert SweepConfig(dtype="double").dtype == "fp64"
    for bad in ({"ops": ("all_reduce", "gather")}, {"dtype": "complex64"}, {"redop": "xor"}, {"iters": 0},
                {"min_bytes": 64, "max_bytes": 8}, {"group_sizes": (1, 2)}, {"average": 4}):
        with pytest.raises(ConfigError):
            SweepConfig(**bad)


def test_backend_op_is_honest_about_gloo_reduce_scatter():
    assert backend_op("gloo", "reduce_scatter") == "all_reduce"
    assert backend_op("nccl", "reduce_scatter") == "reduce_scatter"
    assert all(backend_op("gloo", op) == op for op in OPS if op != "reduce_scatter")


def test_row_stats_median_percentiles_cv_and_max_over_ranks():
    # 2 ranks x 5 iterations; per iteration the slower rank counts (-a 3)
    laps = np.array([[1.0, 2.0, 3.0, 4.0, 100.0], [2.0, 1.0, 3.0, 5.0, 1.0]]) * 1e-6
    s = row_stats([laps], average=3)
    per_iter = np.array([2.0, 2.0, 3.0, 5.0, 100.0]) * 1e-6
    assert s["time_s"] == s["p50_s"] == pytest.approx(3e-6)
    assert s["p95_s"] == pytest.approx(np.percentile(per_iter, 95))
    assert s["cv"] == pytest.approx(per_iter.std() / per_iter.mean())
    assert s["mean_time_s"] == pytest.approx(max(laps[0].mean(), laps[1].mean()))
    assert row_stats([laps], average=1)["mean_time_s"] == pytest.approx(laps.mean())
    # two groups pool their iterations
    pooled = row_stats([laps[:1], laps[1:]], average=3)
    assert pooled["time_s"] == pytest.approx(np.median(laps.ravel()))


def _row(**kw) -> BenchRow:
    stats = {"time_s": 1e-3, "mean_time_s": 1.1e-3, "p50_s": 1e-3, "p95_s": 2e-3, "p99_s": 3e-3, "cv": kw.pop("cv", 0.1)}
    base = dict(op="all_gather", n=4, size_bytes=1 << 20, count=(1 << 20) // 16, dtype="fp32", redop="sum", root=0,
                backend="gloo", stats=stats, iters=10, wrong=0, noisy_cv=0.2)
    base.update(kw)
    return make_row(**base)


def test_rows_and_table_lines():
    row = _row()
    assert row.redop == "none" and row.root == -1 and not row.noisy and not row.in_place
    assert row.algbw_bytes_per_s == pytest.approx((1 << 20) / 1e-3)
    assert row.busbw_bytes_per_s == pytest.approx(row.algbw_bytes_per_s * 0.75)
    toks = format_row(row).split()
    assert toks[:5] == ["1048576", "65536", "float", "none", "-1"]
    assert float(toks[5]) == pytest.approx(1000.0) and float(toks[7]) == pytest.approx(0.79, abs=0.01)
    assert toks[8] == "0" and toks[9] == "2000.00" and toks[10] == "0.10"
    noisy = _row(cv=0.5, op="reduce_scatter")
    assert noisy.noisy and format_row(noisy).endswith("noisy") and noisy.backend_op == "all_reduce"
    header = format_header("reduce_scatter", 4, 2, backend="gloo", group_mode="concurrent", dtype="fp32",
                           redop="sum", iters_text="10 iterations")
    assert "2 groups of 4 ranks (concurrent)" in header and "gloo executes it as all_reduce" in header
    cols = header.splitlines()[-2].lstrip("#").split()
    assert cols == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "p95", "cv"]
    assert BenchRow.from_dict(row.to_dict()) == row
    assert math.isclose(row.busbw_GBps, row.busbw_bytes_per_s / GB)


def test_whole_table_blocks_and_footer():
    rows = (_row(), _row(size_bytes=2 << 20, cv=0.5), _row(op="all_reduce", n=2, wrong=3))
    text = format_table(SweepResult(rows=rows, meta={"group_mode": "concurrent", "iters_text": "10 iterations",
                                                     "noisy_cv": 0.2, "average": "max"}))
    assert text.count("# all_gather: 1 group of 4 ranks") == 1 and text.count("# all_reduce: 1 group of 2 ranks") == 1
    assert "# Out of bounds values : 3 FAILED" in text and "# Noisy rows (cv > 0.2): 1 of 3" in text
    assert SweepResult(rows=rows).num_wrong == 3


def test_sizes_that_hold_no_element_are_refused_up_front():
    """-b 3 -e 3 of fp32 measured no row and exited 0; gathered ops need one element per rank."""
    from commscope.measure.bench.sweep import check_world, smallest_size_bytes

    assert smallest_size_bytes("all_gather", 4, 4) == 16 and smallest_size_bytes("all_reduce", 4, 4) == 4
    with pytest.raises(ConfigError, match=r"sizes='-b 3 -e 3': all_reduce of float over 2 ranks needs messages of "
                                          r"at least 4 B \(one 4-byte element\)"):
        check_world(SweepConfig(ops=("all_reduce",), min_bytes=3, max_bytes=3), 2, "gloo")
    with pytest.raises(ConfigError, match=r"all_gather of float over 4 ranks needs .* at least 16 B .* per rank"):
        check_world(SweepConfig(ops=("all_reduce", "all_gather"), min_bytes=4, max_bytes=12), 4, "gloo")
    assert check_world(SweepConfig(ops=("all_gather",), min_bytes=4, max_bytes=16), 4, "gloo") == (4,)  # 16 B: one row


def test_buffers_are_counted_per_rank_and_ranks_on_the_host():
    """-e 100G got a rank killed by the kernel (SIGKILL) mid-sweep; the buffers are counted before any rank starts."""
    from commscope.measure.bench.sweep import buffer_bytes, check_memory

    assert buffer_bytes("all_reduce", 1024, 4, 4) == 1024  # in place
    assert buffer_bytes("all_gather", 1024, 4, 4) == 1024 + 256  # input 1/n, gathered output
    assert buffer_bytes("reduce_scatter", 1024, 4, 4) == 1024 + 256
    assert buffer_bytes("all_to_all", 1024, 4, 4) == 2048 and buffer_bytes("sendrecv", 1024, 4, 4) == 2048
    cfg = SweepConfig(ops=("all_reduce", "sendrecv"), min_bytes=1024, max_bytes=1 << 30)
    check_memory(cfg, (2,), 2, "gloo", available_bytes=4 << 30)  # 2 x 2 GiB fits in 4 GiB
    with pytest.raises(ConfigError, match=r"maxbytes=1073741824: the sweep.s largest size, 1.00 GiB: sendrecv over 2 ranks needs 2.00 GiB of "
                                          r"buffers per rank .* x 3 ranks on this host = 6.00 GiB, but this machine "
                                          r"has 4.00 GiB available"):
        check_memory(cfg, (2,), 3, "gloo", available_bytes=4 << 30)
    check_memory(cfg, (2,), 3, "nccl", available_bytes=4 << 30)  # NCCL's buffers are on the GPUs


def test_iterations_and_the_noise_threshold_are_bounded():
    for bad in ({"noisy_cv": -1.0}, {"noisy_cv": 0.0}, {"noisy_cv": float("nan")}, {"iters": 100_001},
                {"warmup_iters": 10**11}, {"time_budget_s": float("nan")}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SweepConfig(**bad)
    SweepConfig(iters=100_000, warmup_iters=100_000, noisy_cv=float("inf"))  # the bounds themselves are fine
