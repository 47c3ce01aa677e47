"""validate --fit: a cluster's compute and network efficiency fitted to its runs, with leave-one-run-out errors.

The runs here are "measured" by commscope's own estimate on a cluster whose compute and links run at a known
fraction of the preset: the fit must find those fractions, predict every run again, and write a cluster file that
every command then estimates with."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from runs_csv import write_runs

from commscope.api import predict
from commscope.cli.main import main
from commscope.estimate.iteration import estimate
from commscope.presets import cluster_preset
from commscope.spec.files import load_cluster
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.estimate.validate import read_runs
from commscope.estimate.validate_fit import fit_runs, fitted_cluster

TRUE = {"compute_efficiency": 0.8, "network_efficiency": 0.7}
MODEL = ModelSpec(name="GPT 1.3B", num_layers=24, hidden_size=2048, num_heads=16, seq_len=2048)
#: (t, p, d, global batch, micro-batch): runs that differ in how much they communicate, across nodes too
JOBS = [(1, 1, 16, 64, 2), (2, 1, 8, 64, 2), (4, 2, 2, 64, 1), (8, 1, 2, 32, 1), (2, 2, 4, 64, 2)]
HEADER = ["case_id", "layers", "hidden", "heads", "seq_len", "cluster", "t", "p", "d", "global_batch", "microbatch",
          "measured_iter_time_s", "notes"]


def _rows():
    cluster = fitted_cluster(cluster_preset("dgx-a100"), TRUE)
    rows = []
    for i, (t, p, d, gb, mb) in enumerate(JOBS):
        par = ParallelSpec(tp=t, pp=p, dp=d, global_batch_size=gb, micro_batch_size=mb)
        time_s = estimate(predict(MODEL, par, cluster)).iteration_time_s
        rows.append([f"r{i}", 24, 2048, 16, 2048, "dgx-a100", t, p, d, gb, mb, f"{time_s:.9g}", "lab notebook"])
    return rows


def test_the_fit_finds_the_clusters_efficiencies_and_predicts_unseen_runs(tmp_path):
    runs = read_runs(write_runs(tmp_path / "runs.csv", _rows(), HEADER))
    fit = fit_runs(runs)
    assert fit.parameters["compute_efficiency"] == pytest.approx(0.8, abs=0.01)
    assert fit.parameters["network_efficiency"] == pytest.approx(0.7, abs=0.03)
    assert fit.default_mean_abs_error > 0.15  # the preset alone is far off
    assert fit.mean_abs_error < 0.005 and fit.loo_mean_abs_error < 0.01
    assert fit.to_dict()["loo_mean_abs_error"] == fit.loo_mean_abs_error


def test_a_run_that_asks_for_more_than_physics_allows_is_said(tmp_path):
    rows = _rows()
    for row in rows:
        row[11] = str(float(row[11]) / 1.6)  # compute 1.6 x 0.8 = 1.28 times faster than the kernels allow
    fit = fit_runs(read_runs(write_runs(tmp_path / "runs.csv", rows, HEADER)), parameters=["compute_efficiency"])
    assert fit.parameters["compute_efficiency"] == pytest.approx(1.2, abs=1e-3)
    assert any("sits at its bound" in n for n in fit.notes)


def test_validate_fit_writes_a_cluster_file_every_command_takes(tmp_path, capsys):
    runs_csv = write_runs(tmp_path / "runs.csv", _rows(), HEADER)
    out = tmp_path / "mine.toml"
    assert main(["validate", str(runs_csv), "--fit", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["fit"]["parameters"]["compute_efficiency"] == pytest.approx(0.8, abs=0.01)
    assert doc["fit"]["loo_mean_abs_error"] < 0.01
    assert "columns of" in captured.err and "notes" in captured.err  # the column it does not read is named
    cluster = load_cluster(out)
    assert cluster.compute_efficiency == pytest.approx(doc["fit"]["parameters"]["compute_efficiency"])
    assert "fitted by `commscope validate" in cluster.source
    # the written file reproduces the fitted estimate through the command line
    t, p, d, gb, mb = JOBS[2]
    args = ["estimate", "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
            "--seq-length", "2048", "--tp", str(t), "--pp", str(p), "--dp", str(d), "--global-batch-size", str(gb),
            "--micro-batch-size", str(mb), "--cluster", str(out), "--json"]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)["iteration_time_s"]
    measured = float(_rows()[2][11])
    assert got == pytest.approx(measured, rel=0.02)


def test_out_needs_fit_and_one_cluster(tmp_path, capsys):
    runs_csv = write_runs(tmp_path / "runs.csv", _rows(), HEADER)
    assert main(["validate", str(runs_csv), "--out", str(tmp_path / "x.toml")]) == 2
    assert "give --fit too" in capsys.readouterr().err
    rows = _rows()
    rows[0][5] = "dgx-h100"
    mixed = write_runs(tmp_path / "mixed.csv", rows, HEADER)
    assert main(["validate", str(mixed), "--fit", "--fit-parameters", "compute_efficiency", "--out",
                 str(tmp_path / "x.toml")]) == 2
    err = capsys.readouterr().err
    assert "different clusters" in err and "dgx-a100" in err and "dgx-h100" in err
    assert not (tmp_path / "x.toml").exists()
    assert main(["validate", str(runs_csv), "--fit", "--fit-parameters", "clock"]) == 2
    assert "fit='clock': valid: compute_efficiency, network_efficiency" in capsys.readouterr().err


def test_every_knob_of_the_estimate_is_a_column(tmp_path):
    header = HEADER[:-1] + ["stack", "grad_reduce_dtype", "zero_stage", "pipeline_layers", "head_dim"]
    rows = [r[:-1] + ["megatron-core-2024", "bf16", "1", "", "128"] for r in _rows()[:2]]
    rows[0][header.index("p")] = "2"
    rows[0][header.index("d")] = "8"
    rows[0][header.index("pipeline_layers")] = "11;13"
    runs = read_runs(write_runs(tmp_path / "runs.csv", rows, header))
    assert runs[0].parallel.stack == "megatron-core-2024" and runs[0].parallel.grad_reduce_dtype == "bf16"
    assert runs[0].parallel.zero_stage == 1 and runs[0].parallel.pipeline_layers == (11, 13)
    assert runs[0].extra == {}
    bad = [r[:] for r in rows]
    bad[1][header.index("stack")] = "deepspeed-zero"
    from commscope.errors import ConfigError

    with pytest.raises(ConfigError, match=r"row 2.*stack='deepspeed-zero': valid: megatron-core-2024"):
        read_runs(write_runs(tmp_path / "bad.csv", bad, header))


def test_fitted_cluster_scales_only_what_was_fitted():
    base = cluster_preset("dgx-h100")
    out = fitted_cluster(base, {"compute_efficiency": 0.9})
    assert out.compute_efficiency == 0.9 and out.inter_node == base.inter_node
    out = fitted_cluster(replace(base, compute_efficiency=0.5), {"compute_efficiency": 0.9, "network_efficiency": 0.5})
    assert out.compute_efficiency == pytest.approx(0.45)
    assert out.intra_node.bandwidth_bytes_per_s == base.intra_node.bandwidth_bytes_per_s * 0.5
