"""Measured against predicted in time, on real gloo ranks: calibrate this machine, train the reference GPT with
tensor parallelism on 2 ranks, record it, and compare it in time with the calibrated cluster file."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from commscope.measure.bench.calibrate import calibrate, cluster_toml
from commscope.measure.bench.fit import _points_from_bench, fit
from commscope.measure.bench.sweep import SweepConfig
from commscope.measure.capture.timing import _union_s
from commscope.cli.main import main
from commscope.spec.files import load_cluster

torch = pytest.importorskip("torch")

#: Measured / predicted step time of the reference GPT (tp 2, 2 gloo ranks) against this machine's calibration
#: must lie in [1 / STEP_FACTOR, STEP_FACTOR]. On the shared 2-core VM (6 engineers' jobs, load average 6-17),
#: three repetitions each measured 20.6-23.5x for tp 2, 2.2-3.8x for dp 2 and 9.7-19.7x for the 8-rank 3D job
#: (README, "Measured against predicted in time"); a calibration taken at a quiet moment measures the matmul up to
#: 4x faster than one under load, which moves the prediction as much. The compute model prices each GEMM and
#: memory-bound kernel, not PyTorch's per-op eager, autograd and DTensor dispatch that dominates a 262k-parameter
#: model, and each gloo collective in training absorbs the two ranks' scheduling skew (effective-bandwidth
#: factor ~0.04 for tp all_reduce). 60 leaves room for that noise and still fails on a unit error (ms for s,
#: GFLOP/s for FLOP/s: 1000x and more) or a calibration that is not used.
STEP_FACTOR = 60.0


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    """A cluster file from a short calibration on 2 ranks (small sweep: the test stays short)."""
    sweep = SweepConfig(ops=("all_reduce", "all_gather", "sendrecv"), min_bytes=4096, max_bytes=256 * 1024,
                        step_factor=4.0, time_budget_s=0.01, warmup_iters=1, group_sizes=(2,))
    cal = calibrate(2, sweep=sweep, probe_budget_s=0.1)
    points, _ = _points_from_bench(cal.sweep.to_dict(), "test sweep")
    path = tmp_path_factory.mktemp("cal") / "local.toml"
    path.write_text(cluster_toml(cal, fit(points, source="test sweep", backend="gloo"), name="local"))
    return path


def test_calibrated_cluster_file(calibrated: Path) -> None:
    data = tomllib.loads(calibrated.read_text())
    cluster = load_cluster(calibrated)
    assert cluster.gpu == "CPU rank (calibrated)"
    # the measured matmul rate is the peak of the calibrated CPU "GPU" (achievable fraction 1), kept in [meta]
    rates = data["meta"]["measurements"]["matmul_GFLOPs_per_rank"]
    assert len(rates) == 2 and all(r > 0.1 for r in rates)
    assert cluster.peak_flops["fp32"] > 1e8
    assert cluster.memory_bandwidth_bytes_per_s > 1e8
    assert data["collectives"]["model"]["kind"] == "commscope-fitted-bandwidth"
    assert {c["op"] for c in data["collectives"]["curves"]} == {"all_reduce", "all_gather", "sendrecv"}


def test_union_of_intervals() -> None:
    assert _union_s([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-9)  # [0, 20) and [30, 40)
    assert _union_s([(0, 20), (5, 10)]) == pytest.approx(20e-9)  # nested
    assert _union_s([]) == 0.0


def test_recorded_gpt_compared_in_time(calibrated: Path, tmp_path: Path, capsys) -> None:
    logs = tmp_path / "logs"
    assert main(["workload", "gpt", "--tp", "2", "--dp", "1", "--steps", "3", "--record", str(logs)]) == 0
    capsys.readouterr()
    # the job saved beside the logs is found: no flags needed, and counts are integers
    assert main(["compare", str(logs), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["max_rel_error"] == 0 and all(isinstance(r["measured_count"], int) for r in plain["by_op"])
    # the wrong job for these logs (dp 2 instead of tp 2): the text output says the op counts differ
    assert main(["compare", str(logs), "--tp", "1", "--dp", "2"]) == 0
    wrong = capsys.readouterr().out
    assert "op counts differ" in wrong and "is the job the one that was recorded?" in wrong

    # without --bandwidth a gloo job is timed against the saved cluster's GPU links: the note says how to do better
    assert main(["compare", str(logs), "--time", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["time"]["notes"]
    assert any("the job ran on gloo (CPU)" in n and "commscope calibrate --nproc 2" in n for n in notes), notes

    assert main(["compare", str(logs), "--bandwidth", str(calibrated), "--time", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)["time"]
    assert not any("the job ran on gloo" in n for n in t["notes"])
    assert t["num_timed_records"] > 0 and t["records_without_prediction"] == 0
    kinds = {(r["axis"], r["op"]) for r in t["durations"]["by_op"]}
    assert ("tp", "all_reduce") in kinds
    for r in t["durations"]["by_bin"]:
        assert r["predicted_median_s"] > 0 and r["measured_p95_s"] >= r["measured_median_s"] > 0
        assert r["factor"] > 0
    # exposed communication: every rank and step, inside the step
    assert sorted({(e["rank"], e["step"]) for e in t["exposed"]}) == [(r, s) for r in (0, 1) for s in range(3)]
    assert all(0 < e["comm_s"] <= e["step_s"] for e in t["exposed"])
    assert t["step"]["num_steps"] == 3 and t["step"]["compute_model"] == "gpu"
    ratio = t["step"]["measured_median_s"] / t["step"]["predicted_s"]
    assert 1 / STEP_FACTOR <= ratio <= STEP_FACTOR, ratio
    assert [r["term"] for r in t["terms"]] == ["tp communication", "compute and the rest"]

    html = tmp_path / "r.html"
    assert main(["report", "--measured", str(logs), "--bandwidth", str(calibrated), "--out", str(html)]) == 0
    text = html.read_text()
    assert "drawTime" in text and '"time":{"series":' in text and "<script src" not in text
