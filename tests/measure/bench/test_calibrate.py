"""`commscope calibrate`: the cluster file it writes is one `estimate --cluster` and `--bandwidth` accept, or none."""

from __future__ import annotations

from pathlib import Path

import pytest

from commscope.measure.bench.calibrate import default_sweep
from commscope.measure.bench.sweep import check_world
from commscope.cli.calibrate_cmd import _write_checked
from commscope.cli.main import main
from commscope.io.bandwidth_file import read_bandwidth
from commscope.spec.files import load_cluster


def _cluster_file(intra_gbps: float) -> str:
    """A cluster file as calibrate writes it: cluster keys, link tiers, the fitted collectives."""
    return (f'name = "local"\ngpu = "CPU rank (calibrated)"\ngpus_per_node = 8\n[peak_tflops]\nfp32 = 0.1\n'
            f'[intra_node]\nname = "gloo"\nbandwidth_GBps = {intra_gbps}\nlatency_us = 20\n'
            f'[inter_node]\nname = "gloo"\nbandwidth_GBps = {intra_gbps}\nlatency_us = 20\n'
            '[collectives.model]\nkind = "commscope-fitted-bandwidth"\nversion = 1\n'
            '[[collectives.curves]]\nop = "all_reduce"\ngroup_size = 2\n'
            'segments = [{ size_min_bytes = 1024, size_max_bytes = 4194304, alpha_us = 50.0, busbw_GBps = 2.0 }]\n')


def test_a_cluster_file_estimate_refuses_is_not_written(tmp_path: Path) -> None:
    """calibrate -e 4K once wrote intra_node.bandwidth_GBps = 0.009, which `estimate --cluster` refuses."""
    out = tmp_path / "w4k.toml"
    out.write_text("# an earlier, good calibration\n")
    why = _write_checked(_cluster_file(0.009), out)
    assert why is not None and why.startswith("intra_node.bandwidth_GBps=0.009: 0.009 GB/s is outside any real link")
    assert out.read_text() == "# an earlier, good calibration\n"  # left as it was
    assert [p.name for p in tmp_path.iterdir()] == ["w4k.toml"]  # no temporary file left behind
    assert _write_checked(_cluster_file(2.0), out) is None
    assert load_cluster(out).intra_node.bandwidth_bytes_per_s == 2e9
    assert [p.name for p in tmp_path.iterdir()] == ["w4k.toml"]


def test_the_default_groups_tile_any_number_of_ranks() -> None:
    """--nproc 3 asked for groups of 2 on 3 ranks: every rank died with a traceback."""
    assert default_sweep(3).group_sizes == (3,) and default_sweep(6).group_sizes == (2, 6)
    for nproc in range(2, 13):
        check_world(default_sweep(nproc), nproc, "gloo")


def test_calibrate_writes_a_file_that_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "local.toml"
    assert main(["calibrate", "--nproc", "2", "-e", "1M", "--time-budget", "0.005", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    cluster = load_cluster(out)
    assert cluster.name == "local" and cluster.intra_node.bandwidth_bytes_per_s >= 1e7
    read_bandwidth(out)
    assert [p.name for p in tmp_path.iterdir()] == ["local.toml"]


def test_on_gpus_the_fp32_probe_is_no_gpu_model(tmp_path: Path) -> None:
    """A cluster file of ranks on GPUs names the GPU with its datasheet; the fp32 512^3 matmul and the copy probe
    stay measurements in [meta] (the issue: "the fp32 512^3 probe is no GPU model"). The sweep is real (gloo ranks);
    the probes are relabelled as an H200's, which is all the file writer sees of the device."""
    import dataclasses
    import tomllib

    pytest.importorskip("torch")
    from commscope.measure.bench.calibrate import calibrate, cluster_toml
    from commscope.measure.bench.fit import _points_from_bench, fit
    from commscope.measure.bench.sweep import SweepConfig
    from commscope.estimate.gpus import gpu_for_cluster, gpu_preset

    sweep = SweepConfig(ops=("all_reduce",), min_bytes=4096, max_bytes=64 * 1024, step_factor=4.0, time_budget_s=0.005,
                        warmup_iters=1, group_sizes=(2,))
    cal = calibrate(2, sweep=sweep, probe_budget_s=0.05)
    gpu_cal = dataclasses.replace(cal, probes=tuple(dataclasses.replace(p, device="NVIDIA H200") for p in cal.probes))
    points, _ = _points_from_bench(cal.sweep.to_dict(), "test sweep")
    path = tmp_path / "gpus.toml"
    path.write_text(cluster_toml(gpu_cal, fit(points, source="test sweep", backend="gloo"), name="gpus"))
    cluster = load_cluster(path)
    h200 = gpu_preset("h200")
    assert cluster.gpu == h200.name
    assert cluster.peak_flops == pytest.approx(h200.peak_flops)  # the datasheet, not the probe over a fraction
    assert cluster.memory_bandwidth_bytes_per_s == h200.memory_bandwidth_bytes_per_s
    assert gpu_for_cluster(cluster).achievable_fraction == h200.achievable_fraction
    meta = tomllib.loads(path.read_text())["meta"]
    assert len(meta["measurements"]["matmul_GFLOPs_per_rank"]) == 2
    assert "no GPU model" in meta["source"] and "commscope calibrate --model" in meta["source"]
    # on CPU ranks the probes remain the cpu device's compute model
    cpu_path = tmp_path / "cpu.toml"
    cpu_path.write_text(cluster_toml(cal, fit(points, source="test sweep", backend="gloo"), name="cpu"))
    cpu = load_cluster(cpu_path)
    assert cpu.gpu == "CPU rank (calibrated)" and cpu.peak_flops["fp32"] == pytest.approx(
        cal.matmul_flops_per_s, rel=1e-3)


def test_a_sweep_fitted_with_no_alpha_still_gives_a_link_latency(tmp_path: Path) -> None:
    """A noisy sweep can fit its small sizes with an alpha of 0 (seen on a loaded 2-core machine): no real link has
    none, and the cluster file was refused when read back. The latency is then the smallest message's time."""
    import dataclasses

    pytest.importorskip("torch")
    from commscope.measure.bench.calibrate import calibrate, cluster_toml
    from commscope.measure.bench.fit import _points_from_bench, fit
    from commscope.measure.bench.sweep import SweepConfig

    sweep = SweepConfig(ops=("all_reduce",), min_bytes=4096, max_bytes=64 * 1024, step_factor=4.0, time_budget_s=0.005,
                        warmup_iters=1, group_sizes=(2,))
    cal = calibrate(2, sweep=sweep, probe_budget_s=0.05)
    points, _ = _points_from_bench(cal.sweep.to_dict(), "test sweep")
    fitted = fit(points, source="test sweep", backend="gloo")
    flat = dataclasses.replace(fitted, curves=tuple(
        dataclasses.replace(c, segments=tuple(dataclasses.replace(s, alpha_s=0.0) for s in c.segments))
        for c in fitted.curves))
    path = tmp_path / "flat.toml"
    path.write_text(cluster_toml(cal, flat, name="flat"))
    cluster = load_cluster(path)
    smallest = min((r for r in cal.sweep.rows if r.op == "all_reduce"), key=lambda r: r.size_bytes)
    assert cluster.intra_node.latency_s == pytest.approx(max(smallest.time_s / 2, 1e-7), rel=1e-3)
    assert "under any real link's" in cluster.intra_node.source
