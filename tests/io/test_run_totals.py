"""Recorded runs read rank file by rank file into totals: the same summary and comparison as the run read into
memory, in memory that does not grow with the records."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest

from commscope.measure.capture.analysis import compare, summary
from commscope.measure.capture.synthetic import synthetic_parallel, write_synthetic_rank
from commscope.io.runs import read_run, read_run_totals, run_totals
from commscope.pattern.layout import Layout
from commscope.spec.parallel import ParallelSpec


def _layout(ranks: int) -> Layout:
    tp, pp, dp = synthetic_parallel(ranks)
    return Layout(ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=dp * 8))


def _write(logdir: Path, ranks: int, ops: int, *, gz: bool = True, **kwargs: int) -> Path:
    logdir.mkdir()
    for r in range(ranks):
        write_synthetic_rank(logdir, r, ranks, ops, gz=gz, **kwargs)
    return logdir


def test_totals_equal_the_run_in_memory(tmp_path: Path) -> None:
    logs = _write(tmp_path / "logs", 32, 200)
    layout = _layout(32)
    streamed = read_run_totals(logs, layout=layout)
    in_memory = read_run(logs, layout=layout)
    assert streamed == run_totals(in_memory, layout=layout)
    assert summary(streamed, layout=layout) == summary(in_memory, layout=layout)
    assert read_run_totals(logs, layout=layout, jobs=2) == streamed
    assert streamed.num_records == sum(len(v) for v in in_memory.ops_by_rank.values()) > 32 * 150
    assert {a for a, _, _, _, _ in streamed.by_step} == {"tp", "pp", "dp"} and not streamed.problems


def test_bad_and_odd_lines_are_found_as_the_in_memory_reader_finds_them(tmp_path: Path) -> None:
    logs = _write(tmp_path / "logs", 8, 200, gz=False)
    f = logs / "rank00003.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    # a record whose end is before its start (of a kind seen before), a corrupt line, a record without times
    bad = lines[5].replace('"t_end_ns":', '"t_end_ns":1', 1).replace('"t_start_ns":', '"t_start_ns":9', 1)
    lines[7:7] = [bad, '{"op":"all_reduce","axis":\n', lines[6].replace(',"t_start_ns":', ',"x_start":')]
    f.write_text("".join(lines))
    (logs / "rank00005.done").unlink()
    (logs / "rank00009.jsonl").write_bytes((logs / "rank00002.jsonl").read_bytes())  # rank 2 again
    streamed, in_memory = read_run_totals(logs), read_run(logs)
    assert streamed == run_totals(in_memory)
    assert any("t_end_ns=" in p for p in streamed.problems) and any("rank 2 again" in p for p in streamed.problems)
    assert streamed.unfinished_ranks == (5,)


def test_real_recorded_run_streams_to_the_same_comparison(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from commscope.api import predict
    from commscope.measure.capture import pg as cpg
    from commscope.measure.launch import spawn
    from commscope.spec.cluster import ClusterSpec, LinkTier
    from commscope.spec.model import ModelSpec

    from tests.measure.capture.test_compare import _flat_grads_job

    del torch
    cpg.register()
    model = ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=2, seq_len=16, vocab_size=100,
                      make_vocab_size_divisible_by=1, dtype="fp32")
    cluster = ClusterSpec(name="cpu", intra_node=LinkTier(name="shm", bandwidth_bytes_per_s=1e9),
                          inter_node=LinkTier(name="tcp", bandwidth_bytes_per_s=1e8), peak_flops={"fp32": 1e11})
    pred = predict(model, ParallelSpec(dp=2, global_batch_size=2), cluster)
    spawn(_flat_grads_job, 2, args=(str(tmp_path), 1000, 3), backend="commscope",
          env={cpg.INNER_BACKEND_ENV: "gloo"}, timeout_s=120)
    layout = pred.workload.layout
    streamed = read_run_totals(tmp_path, layout=layout)
    assert streamed.num_records == 2 * 4
    assert compare(pred, streamed) == compare(pred, read_run(tmp_path, layout=layout))
    assert summary(streamed, layout=layout) == summary(read_run(tmp_path), layout=layout)


def _lines(path: Path) -> int:
    with gzip.open(path) as fh:
        return sum(1 for _ in fh)


def _peak_bytes(logs: Path) -> int:
    tracemalloc.start()
    read_run_totals(logs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_memory_does_not_grow_with_the_records(tmp_path: Path) -> None:
    few = _write(tmp_path / "few", 16, 0, layers=1, steps=6)
    many = _write(tmp_path / "many", 16, 0, layers=16, steps=6)  # the same ranks and steps, 10x the records
    assert _lines(many / "rank00000.jsonl.gz") > 9 * _lines(few / "rank00000.jsonl.gz")
    peak_few, peak_many = _peak_bytes(few), _peak_bytes(many)
    # the in-memory reader holds every record: 10x the records would take about 10x the memory
    assert peak_many < 1.5 * peak_few, (peak_few, peak_many)
