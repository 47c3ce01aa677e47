"""Reading a CSV of measured runs (commscope.estimate.validate.read_runs) and comparing predictions with it (validate)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from conftest import SHARED, requires_shared
from runs_csv import HEADER, ROWS, write_runs

import commscope.estimate.validate as validate_module
from commscope.errors import ConfigError
from commscope.estimate.flops import iteration_flops
from commscope.units import GB, TFLOP
from commscope.estimate.validate import COLUMNS, Run, Validation, read_runs, validate

A100_CSV = SHARED / "data" / "measured_iteration_times.csv"
H100_CSV = SHARED / "data" / "measured_iteration_times_h100.csv"



def test_public_names():
    assert set(validate_module.__all__) <= set(dir(validate_module))


@requires_shared("data", "measured_iteration_times.csv")
def test_reads_the_a100_file():
    runs = read_runs(A100_CSV, {"dtype": "fp16"})
    with A100_CSV.open() as f:
        rows = list(csv.DictReader(f))
    assert len(runs) == len(rows) == 10
    for run, row in zip(runs, rows, strict=True):
        assert run.case_id == row["case_id"]
        assert (run.parallel.tp, run.parallel.pp, run.parallel.dp) == (int(row["t"]), int(row["p"]), int(row["d"]))
        assert run.parallel.world_size == int(row["gpus"])
        assert run.measured_iteration_time_s == float(row["measured_iter_time_s"])
        assert run.parallel.recompute == "full"  # "yes (use_checkpoint=true in vTrain configs)"
        assert run.parallel.micro_batch_size == int(row["microbatch"])
        assert run.model.dtype == "fp16" and run.model.vocab_size == 50257
        assert run.cluster.name == "dgx-a100"
        assert run.extra["status"] == row["status"] and run.extra["source"] == row["source"]
        assert any("dtype=fp16" in n for n in run.notes)
        assert any("vocab_size=50257" in n for n in run.notes)


@requires_shared("data", "measured_iteration_times_h100.csv")
def test_reads_the_h100_file():
    runs = read_runs(H100_CSV)
    with H100_CSV.open() as f:
        rows = list(csv.DictReader(f))
    assert len(runs) == len(rows) == 9
    for run, row in zip(runs, rows, strict=True):
        assert (run.parallel.tp, run.parallel.pp, run.parallel.dp, run.parallel.cp) == (
            int(row["t"]), int(row["p"]), int(row["d"]), int(row["cp"]))
        assert run.measured_iteration_time_s == float(row["measured_iter_time_s"])
        assert run.measured_tflops_per_gpu == float(row["measured_tflops_per_gpu"])
        assert run.parallel.sequence_parallel is (row["seq_parallel"] == "yes")
        assert run.parallel.distributed_optimizer is True
        assert run.model.ffn == int(row["ffn_hidden"]) and run.model.vocab_size == 131072
        assert run.cluster.name == "dgx-h100" and run.cluster.gpus_per_node == 8
        assert run.extra["mfu"] == row["mfu"]
        # the file's time is Megatron's model FLOPs over its TFLOP/s: the two columns agree, so no note
        assert not any("implies" in n for n in run.notes)
    assert [r.parallel.sequence_parallel for r in runs][:2] == [False, True]


def test_time_and_tflops_forms_and_defaults(tmp_path):
    path = write_runs(tmp_path / "runs.csv")
    runs = read_runs(path, {"micro_batch_size": 4, "recompute": "selective"})
    a, b = runs
    assert isinstance(a, Run)
    assert a.measured_iteration_time_s == 0.5 and a.measured_tflops_per_gpu is None
    # cells win over the defaults; blank cells take them
    assert a.parallel.micro_batch_size == 2 and a.parallel.recompute == "full"
    assert b.parallel.micro_batch_size == 4 and b.parallel.recompute == "selective"
    assert b.parallel.sequence_parallel is False
    assert any("micro_batch_size=4" in n and "defaults given" in n for n in b.notes)
    assert any("sequence_parallel=no" in n and "commscope's defaults" in n for n in b.notes)
    # TFLOP/s per GPU -> seconds by the hardware FLOPs Megatron counts (recomputation included)
    flop = iteration_flops(b.model, 64 * 2048, recompute="selective")["hardware"]
    assert b.measured_iteration_time_s == pytest.approx(flop / (120 * TFLOP * 8))
    assert any("derived from measured_tflops_per_gpu=120" in n and "selective" in n for n in b.notes)
    assert a.cluster.name == b.cluster.name == "dgx-a100"
    assert a.model.name == "GPT small" and a.model.num_layers == 12 and a.model.ffn == 4 * 1024
    assert a.extra == {"source": "lab notebook"}
    assert "row 1 (line 2, case 'a')" in a.where


def test_spellings_presets_gpus_and_cluster_files(tmp_path):
    (tmp_path / "mine.toml").write_text(
        'gpu = "H100-SXM5-80GB"\ngpus_per_node = 4\ngpu_util = 0.4\n[peak_tflops]\nbf16 = 989\n'
        '[intra_node]\nname = "nv"\nbandwidth_GBps = 300\n[inter_node]\nname = "ib"\nbandwidth_GBps = 40\n')
    header = ["Name", "MODEL", "Seq-Length", "TP", "PP", "GPUs", "Global Batch Size", "Cluster", "GPU_type",
              "inter_node_GBps", "Iteration_Time_s", "Scatter-Gather", "Status"]
    rows = [["p1", "gpt3-1.3b", "1024", "2", "2", "16", "32", "mine.toml", "", "25", "1.5", "yes", "ok"],
            ["p2", "gpt3-1.3b", "", "1", "1", "8", "32", "", "H100 80GB HBM3", "", "0.9", "", ""]]
    runs = read_runs(write_runs(tmp_path / "runs.csv", rows, header))
    p1, p2 = runs
    assert p1.model.num_layers == 24 and p1.model.seq_len == 1024 and p2.model.seq_len == 2048
    assert any("model shape from 'gpt3-1.3b'" in n and "seq_len=1024" in n for n in p1.notes)
    assert p1.parallel.dp == 4 and p2.parallel.dp == 8  # d = gpus / (t x p x cp)
    assert p1.parallel.scatter_gather_tensors_in_pipeline and not p2.parallel.scatter_gather_tensors_in_pipeline
    assert p1.cluster.name == "mine" and p1.cluster.gpus_per_node == 4
    assert p1.cluster.inter_node.bandwidth_bytes_per_s == 25 * GB
    assert p1.cluster.intra_node.bandwidth_bytes_per_s == 300 * GB
    assert p2.cluster.name == "dgx-h100"
    assert p1.extra == {"Status": "ok"} and p2.extra == {"Status": ""}


def test_validate_rows_and_summary(tmp_path):
    runs = read_runs(write_runs(tmp_path / "runs.csv"))
    result = validate(runs)
    assert isinstance(result, Validation)
    assert [r.case_id for r in result.rows] == ["a", "b"]
    for row, run in zip(result.rows, runs, strict=True):
        assert row.measured_s == run.measured_iteration_time_s
        assert row.error == pytest.approx(row.predicted_s / row.measured_s - 1)
        terms = (row.compute_s + row.tp_s + row.pp_s + row.dp_s + row.cp_s + row.ep_s + row.emb_s + row.bubble_s
                 + row.optimizer_s)
        assert terms == pytest.approx(row.predicted_s)
        assert row.compute_s > 0
    assert result.mean_abs_error == pytest.approx(sum(abs(r.error) for r in result.rows) / 2)
    worst = max(result.rows, key=lambda r: abs(r.error))
    assert result.worst_case == worst.case_id and result.worst_abs_error == abs(worst.error)
    d = json.loads(json.dumps(result.to_dict()))
    assert d["num_runs"] == 2 and {"mean_abs_error", "worst_abs_error", "worst_case", "mean_error"} <= set(d)
    assert {"measured_s", "predicted_s", "error", "compute_s", "optimizer_s", "hidden_s", "notes"} <= set(d["rows"][0])


def test_validate_with_a_bandwidth_table(tmp_path):
    table = tmp_path / "bw.json"
    table.write_text(json.dumps([{"op": "all_reduce", "group_size": 4, "size_bytes": 1 << 20, "busbw_GBps": 1}]))
    runs = read_runs(write_runs(tmp_path / "runs.csv"))
    slow = validate(runs, bandwidth=table)
    fast = validate(runs)
    assert slow.rows[0].dp_s > fast.rows[0].dp_s
    assert any("no send measured" in n for n in slow.rows[1].notes)


def test_no_runs_to_validate():
    with pytest.raises(ConfigError, match="no runs"):
        validate([])


def test_every_column_has_a_reader():
    for name, (spellings, parse) in COLUMNS.items():
        assert spellings and callable(parse), name
        assert all(s == s.lower() and " " not in s and "-" not in s for s in spellings), name


@pytest.mark.parametrize("text, expected", [("yes (use_checkpoint=true)", "full"), ("Full", "full"),
                                            ("selective", "selective"), ("no", "none"), ("None", "none")])
def test_recompute_spellings(tmp_path, text, expected):
    rows = [list(ROWS[0])]
    rows[0][HEADER.index("recompute")] = text
    assert read_runs(write_runs(tmp_path / "runs.csv", rows))[0].parallel.recompute == expected


def test_bad_default_names_the_default(tmp_path):
    path = write_runs(tmp_path / "runs.csv")
    with pytest.raises(ConfigError, match=r"default dtype='fp17'"):
        read_runs(path, {"dtype": "fp17"})
    with pytest.raises(ConfigError, match=r"defaults\.colour"):
        read_runs(path, {"colour": "red"})


def test_reading_and_validating_import_neither_torch_nor_plotting():
    code = ("import sys, commscope.estimate.validate, commscope.cli.validate_cmd, commscope.report.validation_plot; "
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
