"""The commands as a user runs them: exit codes, files written, JSON keys, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from commscope.cli.main import main

JSON_KEYS = {"world_size", "num_ops", "total_bytes", "bytes_by_axis", "bytes_by_link", "num_pairs", "max_pair_bytes"}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_traffic_defaults_json(capsys):
    code, out, err = run(capsys, "traffic", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert JSON_KEYS <= set(s)
    assert set(s["bytes_by_axis"]) >= {"tp", "pp", "dp", "emb", "cp", "ep"}
    assert set(s["bytes_by_link"]) == {"intra_node", "inter_node"}
    assert s["world_size"] == 32
    assert s["total_bytes"] == sum(s["bytes_by_axis"].values()) == sum(s["bytes_by_link"].values())
    assert s["bytes_by_axis"]["cp"] == 0 and s["bytes_by_axis"]["ep"] == 0


def test_traffic_issue_example_writes_outputs(capsys, tmp_path):
    out_dir = tmp_path / "run"
    code, _out, err = run(capsys, "traffic", "--model", "gpt-1.5b", "--tp", "2", "--pp", "4", "--dp", "4",
                         "--global-batch-size", "512", "--micro-batch-size", "4", "--cluster", "dgx1-v100",
                         "--out", str(out_dir))
    assert code == 0, err
    for name in ("ops.jsonl", "ops.csv", "traffic.csv", "traffic.npz", "summary.json", "inputs.json"):
        assert (out_dir / name).stat().st_size > 0, name
    pytest.importorskip("matplotlib")
    assert (out_dir / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the triplet file sums to the summary's total
    summary = json.loads((out_dir / "summary.json").read_text())
    rows = np.loadtxt(out_dir / "traffic.csv", delimiter=",", skiprows=1, usecols=(0, 1, 3), dtype=np.int64)
    assert rows[:, 2].sum() == summary["total_bytes"]
    assert (rows[:, 0] != rows[:, 1]).all()
    # the op list holds every op of the iteration with its fields
    from commscope.io.oplog import read_ops_jsonl

    log = read_ops_jsonl(out_dir / "ops.jsonl")
    assert not log.problems
    assert sum(op.count for op in log.ops) == summary["num_ops"]
    first = log.ops[0]
    assert first.axis and first.group and first.phase and first.dtype


def test_flags_override_preset_and_aliases(capsys):
    code, out, _ = run(capsys, "traffic", "--model", "gpt-1.5b", "--tensor-model-parallel-size", "4",
                       "--pipeline-model-parallel-size", "2", "--num-layers", "8", "--gpus", "64", "--json")
    assert code == 0
    s = json.loads(out)
    assert s["parallel"]["tp"] == 4 and s["parallel"]["pp"] == 2 and s["parallel"]["dp"] == 8


def test_a_changed_hidden_size_carries_the_derived_widths(capsys):
    """gpt-1.5b spells out ffn_hidden_size = 4 h: --hidden-size 12288 must give 4 x 12288, not 2304's 9216 (which
    made a 175B-shaped run a model of a third of the size, still labelled gpt-1.5b)."""
    from commscope.api import predict
    from commscope.spec.files import load_cluster
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec

    code, out, err = run(capsys, "traffic", "--model", "gpt-1.5b", "--num-layers", "16", "--hidden-size", "12288",
                         "--num-attention-heads", "96", "--tp", "8", "--pp", "8", "--gpus", "64", "--micro-batch-size",
                         "1", "--global-batch-size", "64", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["model"] == "gpt-1.5b (num_layers=16, hidden_size=12288, num_heads=96)"
    ref = ModelSpec(name="ref", num_layers=16, hidden_size=12288, num_heads=96, vocab_size=50257, seq_len=1024,
                    dtype="fp16")  # ffn_hidden_size unset: 4 h
    par = ParallelSpec(tp=8, pp=8, dp=1, micro_batch_size=1, global_batch_size=64)
    assert s["total_bytes"] == predict(ref, par, load_cluster(s["cluster"])).summary()["total_bytes"]
    # a width the preset sets otherwise (SwiGLU's) is kept, and said
    code, out, err = run(capsys, "traffic", "--model", "llama3-8b", "--hidden-size", "8192", "--json")
    assert code == 0, err
    assert "llama3-8b's ffn_hidden_size 14336 is kept (give --ffn-hidden-size to change it)" in err
    # run settings leave the label alone
    code, out, err = run(capsys, "traffic", "--model", "llama3-8b", "--seq-length", "4096", "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == "llama3-8b"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--tp", "5"], "tp=5: must divide num_heads=24"),
        (["--tp", "2", "--pp", "4", "--dp", "4", "--gpus", "64"], "gpus=64: does not match"),
        (["--pp", "30", "--dp", "1"], "pp=30: is larger than num_layers=24"),
        (["--global-batch-size", "102"], "global_batch_size=102: must be divisible by micro_batch_size x dp = 1 x 4"),
        (["--order", "tp-dp-pp"], "order='tp-dp-pp'"),
        (["--model", "gpt-15b"], "model='gpt-15b'"),
        (["--cluster", "dgx-z100"], "cluster='dgx-z100'"),
        (["--zero-stage", "4"], "zero_stage=4"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, needle):
    code, _out, err = run(capsys, "traffic", *argv)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_malformed_model_file(capsys, tmp_path):
    bad = tmp_path / "model.toml"
    bad.write_text("num_layers = 4\nhidden_size = = 3\n")
    code, _, err = run(capsys, "traffic", "--model", str(bad))
    assert code == 2 and "model.toml" in err and "Traceback" not in err


def test_estimate_json_and_seed(capsys):
    code, out, err = run(capsys, "estimate", "--model", "gpt-3b", "--tp", "2", "--pp", "4", "--dp", "4",
                         "--global-batch-size", "512", "--micro-batch-size", "4", "--cluster", "dgx1-v100", "--json")
    assert code == 0, err
    e = json.loads(out)
    for key in ("iteration_time_s", "compute_s", "tp_s", "pp_s", "dp_s", "ep_s", "cp_s", "bubble_s", "comm_ratio",
                "bubble_ratio", "tokens_per_s", "tflops_per_gpu", "mfu", "method"):
        assert key in e
    code, out, _ = run(capsys, "estimate", "--method", "seed", "--gpu-util", "0.4", "--json")
    seed = json.loads(out)
    assert seed["method"] == "seed"
    m = 512 // (1 * 4)  # the default job: gb 512, micro-batch 1 (Megatron's scripts), dp 4
    assert seed["bubble_ratio"] == pytest.approx((4 - 1) / (4 - 1 + m), rel=0.02)
    code, out, _ = run(capsys, "estimate")
    assert code == 0 and "bubble ratio" in out and "iteration" in out


def test_estimate_bandwidth_file_missing_op(capsys, tmp_path):
    table = tmp_path / "bw.json"
    table.write_text(json.dumps([{"op": "all_reduce", "group_size": 2, "size_bytes": 1 << 20, "busbw_GBps": 50}]))
    code, out, err = run(capsys, "estimate", "--bandwidth", str(table), "--json")
    assert code == 0, err  # ops it lacks fall back to the preset, with a note
    assert any("no send measured" in n for n in json.loads(out)["notes"])
    bad = tmp_path / "bw2.json"
    bad.write_text(json.dumps([{"op": "all_reduce", "size_bytes": 10}]))
    code, _, err = run(capsys, "estimate", "--bandwidth", str(bad))
    assert code == 2 and "group_size" in err and "bw2.json" in err


def test_presets_lists_required_names(capsys):
    code, out, _ = run(capsys, "presets", "--json")
    assert code == 0
    table = json.loads(out)
    models = {r["name"] for r in table["models"]}
    clusters = {r["name"] for r in table["clusters"]}
    assert {"gpt-1.5b", "gpt-3b", "gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
            "deepseek-moe-16b"} <= models
    assert {"rtx3090-pcie", "dgx1-v100", "dgx-a100", "dgx-h100"} <= clusters


def test_console_script_installed():
    proc = subprocess.run([sys.executable, "-m", "commscope.cli.main", "traffic", "--tp", "3", "--pp", "30"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_a_node_larger_than_any_nvlink_domain_is_warned_about(capsys):
    code, _out, err = run(capsys, "traffic", "--gpus-per-node", "1000", "--json")
    assert code == 0
    assert "gpus_per_node=1000: more GPUs than any NVLink domain built (72, GB200 NVL72)" in err
    code, _out, err = run(capsys, "traffic", "--gpus-per-node", "72", "--json")
    assert code == 0 and "gpus_per_node" not in err


def test_gpus_that_do_not_fill_whole_nodes_are_warned_about(capsys):
    code, _out, err = run(capsys, "estimate", "--gpus", "32", "--gpus-per-node", "3", "--json")
    assert code == 0
    assert ("32 GPUs do not fill whole nodes of gpus_per_node=3: the last of 11 nodes holds 2" in err
            and "--gpus-per-node" in err)
    code, _out, err = run(capsys, "plan", "--model", "gpt3-1.3b", "--gpus", "12", "--cluster", "dgx-a100", "--json")
    assert code == 0 and "12 GPUs do not fill whole nodes of gpus_per_node=8" in err
    for gpus in ("32", "4"):  # whole nodes, or less than one node
        code, _out, err = run(capsys, "estimate", "--tp", "1", "--pp", "1", "--gpus", gpus, "--json")
        assert code == 0 and "whole nodes" not in err


def test_more_gpus_than_any_cluster_are_warned_about(capsys):
    from commscope.cli.common import check_nodes
    from commscope.spec.files import load_cluster

    check_nodes(None, 8_000_000, load_cluster("dgx-a100"))  # (the command itself takes seconds at this size)
    assert "8,000,000 GPUs: more than any cluster built or planned" in capsys.readouterr().err
    code, _out, err = run(capsys, "traffic", "--gpus", "1024", "--json")
    assert code == 0 and "any cluster built" not in err


def test_tensor_parallel_groups_across_nodes_are_warned_about(capsys):
    code, _out, err = run(capsys, "estimate", "--model", "gpt-1.5b", "--tp", "3", "--gpus", "48", "--json")
    assert code == 0 and "tp=3 does not divide gpus_per_node=8: some tensor-parallel groups span two nodes" in err
    for model, tp, gpus in (("gpt-1.5b", "4", "64"), ("gpt3-175b", "16", "64"), ("gpt-1.5b", "3", "6")):  # divides, a
        # whole multiple of a node, or one node only
        code, _out, err = run(capsys, "estimate", "--model", model, "--tp", tp, "--pp", "1", "--gpus", gpus, "--json")
        assert code == 0 and "tensor-parallel groups span" not in err, (tp, err)


def test_p2p_overlap_flag_without_interleaving_says_it_changes_nothing(capsys):
    """Megatron overlaps pipeline p2p only in its interleaved schedule; the flag alone used to pass in silence."""
    for flag in ("--no-overlap-p2p-communication", "--overlap-p2p-communication"):
        code, _out, err = run(capsys, "estimate", flag, "--json")
        assert code == 0 and f"{flag} changes nothing here" in err and "--virtual-pipeline-size > 1" in err
    code, _out, err = run(capsys, "estimate", "--no-overlap-p2p-communication", "--virtual-pipeline-size", "2",
                          "--num-layers", "48", "--json")
    assert code == 0 and "changes nothing" not in err
    code, _out, err = run(capsys, "traffic", "--no-overlap-p2p-communication", "--json")  # traffic never times it
    assert code == 0 and "changes nothing" not in err


def test_no_gradient_accumulation_fusion_reaches_the_estimate(capsys):
    code, out, err = run(capsys, "estimate", "--json")
    assert code == 0, err
    fused = json.loads(out)
    code, out, err = run(capsys, "estimate", "--no-gradient-accumulation-fusion", "--json")
    assert code == 0, err
    unfused = json.loads(out)
    assert unfused["parallel"]["gradient_accumulation_fusion"] is False and fused["parallel"]["gradient_accumulation_fusion"]
    assert unfused["iteration_time_s"] > fused["iteration_time_s"]
    assert unfused["compute_breakdown_s"]["memory_bound_s"] > fused["compute_breakdown_s"]["memory_bound_s"]
    assert any("(--no-gradient-accumulation-fusion)" in n for n in unfused["notes"])
    assert "changes nothing" not in err
    # where FLOP / (u x peak) replaces the compute model, the flag has nothing to act on: said, not ignored silently
    for extra, why in ((("--gpu-util", "0.5"), "--gpu-util replaces"), (("--method", "seed"), "the seed method")):
        code, out, err = run(capsys, "estimate", "--no-gradient-accumulation-fusion", *extra, "--json")
        assert code == 0 and f"--no-gradient-accumulation-fusion changes nothing here: {why}" in err, err


def test_plan_takes_the_jobs_gradient_accumulation_fusion(capsys, tmp_path):
    """Not a knob the plan searches but the job's framework: `plan` takes it (it was 'unrecognized arguments'), and
    `report --plan-gpus` ranks with the job's own, so that the job and the same configuration among the plan's
    entries have one time (the plan assumed fusion beside a job without it: 5.98 s against 6.13 s)."""
    import re

    job = ("--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--tp", "1", "--pp", "1", "--gpus", "8",
           "--global-batch-size", "512", "--micro-batch-size", "4")
    out = tmp_path / "r.html"
    code, _out, err = run(capsys, "report", *job, "--no-gradient-accumulation-fusion", "--plan-gpus", "8",
                          "--plan-top", "1000", "--out", str(out))
    assert code == 0, err
    data = json.loads(re.search(r'<script id="report-data" type="application/json">(.*?)</script>', out.read_text(),
                                re.DOTALL).group(1))["breakdown"]
    same = [e for e in data["plan"]["entries"] if e["label"] == data["label"]]
    assert same and same[0]["iteration_time_s"] == pytest.approx(data["iteration_time_s"], rel=1e-9)
    assert any("--no-gradient-accumulation-fusion" in n for n in data["plan"]["notes"])

    plan = ("plan", "--model", "gpt3-1.3b", "--gpus", "8", "--cluster", "dgx-a100", "--top", "1000", "--json")
    code, out_fused, err = run(capsys, *plan)
    assert code == 0, err
    code, out_unfused, err = run(capsys, *plan, "--no-gradient-accumulation-fusion")
    assert code == 0 and "changes nothing" not in err, err
    fused, unfused = json.loads(out_fused), json.loads(out_unfused)
    assert all(e["gradient_accumulation_fusion"] is False for e in unfused["top"])
    assert all(e["gradient_accumulation_fusion"] is True for e in fused["top"])
    key = lambda e: (e["tp"], e["pp"], e["dp"], e["micro_batch_size"], e["virtual_pipeline_size"],
                     e["sequence_parallel"], e["recompute"], e["zero_stage"], e["distributed_optimizer"])
    times = {key(e): e["iteration_time_s"] for e in fused["top"]}
    assert all(e["iteration_time_s"] > times[key(e)] for e in unfused["top"])
    code, out, _err = run(capsys, *plan[:-1], "--top", "1", "--no-gradient-accumulation-fusion")
    assert code == 0 and "note: every configuration without gradient accumulation fusion" in out
    # under --gpu-util, FLOP / (u x peak) has no kernel for it to add: said, as `estimate` says it
    code, out, err = run(capsys, *plan, "--no-gradient-accumulation-fusion", "--gpu-util", "0.5")
    assert code == 0 and "--no-gradient-accumulation-fusion changes nothing here: --gpu-util" in err, err
    assert json.loads(out)["notes"] == []
    # nor for a GPU commscope has no compute model of (it falls back to FLOP / (u x peak)): the plan noted the adds as
    # counted, and estimate took the flag without a word
    preset = Path(__file__).parents[2] / "src" / "commscope" / "presets" / "clusters" / "dgx-a100.toml"
    other = tmp_path / "mi.toml"
    other.write_text(preset.read_text().replace('gpu = "A100-SXM4-80GB"', 'gpu = "MI250X"', 1))
    for command in (plan[:5] + ("--cluster", str(other), "--json"), ("estimate", "--cluster", str(other), "--json")):
        code, out, err = run(capsys, *command, "--no-gradient-accumulation-fusion")
        said = "--no-gradient-accumulation-fusion changes nothing here: commscope has no compute model of the " \
               "cluster's GPU (MI250X)"
        assert code == 0 and said in err, err
        assert not any("without gradient accumulation fusion" in n or "separate kernel" in n
                       for n in json.loads(out)["notes"])


def test_report_carries_the_estimates_warnings(capsys, tmp_path):
    """A report of a job that does not fit in memory says so, as `estimate` does (it showed the times alone)."""
    out = tmp_path / "r.html"
    code, _out, err = run(capsys, "report", "--model", "gpt3-13b", "--tp", "1", "--pp", "1", "--gpus", "8",
                          "--global-batch-size", "8", "--micro-batch-size", "1", "--cluster", "dgx-a100", "--out", str(out))
    assert code == 0 and "this configuration does not fit in memory" in err
    assert "does not fit in memory" in out.read_text()


def test_estimate_json_names_the_configuration_and_the_header_its_interleaving(capsys):
    code, out, _err = run(capsys, "estimate", "--virtual-pipeline-size", "2", "--num-layers", "48", "--json")
    assert code == 0 and json.loads(out)["parallel"]["virtual_pipeline_size"] == 2
    code, out, _err = run(capsys, "estimate", "--virtual-pipeline-size", "2", "--num-layers", "48")
    assert code == 0 and "tp=2 pp=4 (v=2) dp=4" in out.splitlines()[0]


def test_an_implausible_gpu_util_is_warned_about(capsys):
    """--gpu-util is a fraction of peak; 1e-12 (or 0.0045 meant as 0.45%) gives a result no training run has."""
    code, _out, err = run(capsys, "estimate", "--gpu-util", "1e-12", "--json")
    assert code == 0
    assert "gpu_util=1e-12: below 0.05 of peak" in err
    code, _out, err = run(capsys, "estimate", "--gpu-util", "0.45", "--json")
    assert code == 0 and "gpu_util" not in err


def test_ctrl_c_is_one_line_and_status_130(capsys, monkeypatch):
    """An interrupted command (Ctrl-C: KeyboardInterrupt wherever it lands) says so in one line, no traceback."""
    from commscope.cli import traffic_cmd

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(traffic_cmd, "run", interrupted)
    assert main(["traffic", "--no-plot"]) == 130
    out, err = capsys.readouterr()
    assert err.strip() == "commscope traffic: interrupted" and "Traceback" not in out + err


def test_traffic_refuses_an_earlier_runs_files_unless_forced(capsys, tmp_path):
    """Re-running into the same --out is refused, naming the earlier run's files, and touches nothing (issue 36: it
    once replaced some and left a plot of another job beside them); with --force they are replaced and the ones this
    run does not write removed, said in one line. The user's own files are never touched."""
    (tmp_path / "heatmap.png").write_bytes(b"an earlier run's plot")
    (tmp_path / "notes.txt").write_text("the user's own file")
    assert main(["traffic", "--tp", "4", "--out", str(tmp_path), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert "already holds the files of an earlier run (heatmap.png); give --force" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heatmap.png", "notes.txt"]
    assert main(["traffic", "--tp", "4", "--out", str(tmp_path), "--no-plot", "--force"]) == 0
    err = capsys.readouterr().err
    assert "replaced the files of an earlier run in" in err and "(--force): heatmap.png" in err
    assert not (tmp_path / "heatmap.png").exists() and (tmp_path / "ops.jsonl").is_file()
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no lock or temporary file left


def test_plan_takes_the_jobs_attention_and_fp8(capsys, tmp_path):
    """Attention kernels and FP8 are the job's, not searched: `plan` takes them and `report --plan-gpus` ranks with
    the job's own (it took flash attention and no FP8 beside an unfused job, whose s x s scores it then left out of
    the memory check: the job's own configuration ranked beside itself at another time)."""
    import re

    plan = ("plan", "--model", "gpt3-1.3b", "--gpus", "8", "--cluster", "dgx-h100", "--top", "1000", "--json")
    code, out_flash, err = run(capsys, *plan)
    assert code == 0, err
    code, out_unfused, err = run(capsys, *plan, "--attention-backend", "unfused", "--fp8-format", "hybrid")
    assert code == 0, err
    flash, unfused = json.loads(out_flash), json.loads(out_unfused)
    assert {(e["attention"], e["fp8_format"]) for e in flash["top"]} == {("flash", None)}
    assert {(e["attention"], e["fp8_format"]) for e in unfused["top"]} == {("unfused", "hybrid")}
    key = lambda e: (e["tp"], e["pp"], e["dp"], e["micro_batch_size"], e["virtual_pipeline_size"],
                     e["sequence_parallel"], e["recompute"], e["zero_stage"], e["distributed_optimizer"])
    mem = {key(e): e["memory_GiB"] for e in flash["top"]}
    both = [e for e in unfused["top"] if key(e) in mem]
    assert all(e["memory_GiB"] >= mem[key(e)] for e in both)
    # the s x s scores, held unless recomputation drops them
    assert all(e["memory_GiB"] > mem[key(e)] for e in both if e["recompute"] == "none") and both
    assert len(unfused["top"]) < len(flash["top"])  # fewer fit
    assert any("--attention-backend unfused" in n for n in unfused["notes"])
    assert any("--fp8-format hybrid" in n for n in unfused["notes"])

    job = ("--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--tp", "1", "--pp", "1", "--gpus", "8",
           "--global-batch-size", "512", "--micro-batch-size", "1", "--attention-backend", "unfused",
           "--fp8-format", "hybrid")
    out = tmp_path / "r.html"
    code, _out, err = run(capsys, "report", *job, "--plan-gpus", "8", "--plan-top", "1000", "--out", str(out))
    assert code == 0, err
    data = json.loads(re.search(r'<script id="report-data" type="application/json">(.*?)</script>', out.read_text(),
                                re.DOTALL).group(1))["breakdown"]
    same = [e for e in data["plan"]["entries"] if e["label"] == data["label"]]
    assert same and same[0]["iteration_time_s"] == pytest.approx(data["iteration_time_s"], rel=1e-9)


def test_what_a_new_user_tripped_on_reads_right_now(capsys):
    """Smaller things a new user met (issue 35): '1 nodes x 8', an nccl-tests summary of '0 rank(s)', shapes quiet
    about a bf16 peak on a V100 that estimate warns about."""
    assert main(["traffic", "--tp", "2", "--pp", "1", "--dp", "4", "--cluster", "dgx-a100"]) == 0
    assert "(1 node x 8)" in capsys.readouterr().out
    assert main(["shapes", "--model", "llama3-8b", "--cluster", "dgx1-v100", "--tp", "8", "--micro-batch-size", "1",
                 "--no-suggest"]) == 0
    out, err = capsys.readouterr()
    assert "commscope shapes: warning: dtype=bf16 on V100-SXM2-32GB" in err
    assert "125 TFLOP/s fp16 (no bf16 on this GPU) peak" in out


def test_a_summary_of_records_without_ranks_says_so():
    """nccl-tests output holds one row per size for the whole group: no rank logged, not '0 rank(s)'."""
    from conftest import shared_or_skip

    log = shared_or_skip("data", "real-logs", "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt")
    out = subprocess.run([sys.executable, "-m", "commscope.cli.main", "summarize", str(log)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    first = out.splitlines()[0]
    assert "0 rank(s)" not in first and "no per-rank records, world size 8" in first


def test_bench_curves_never_share_a_look():
    pytest.importorskip("matplotlib")
    from commscope.measure.bench.plot import curve_styles

    curves = [(op, n) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv", "broadcast",
                                 "reduce") for n in (2, 4, 8)]
    looks = curve_styles(curves)
    assert len(set(looks.values())) == len(curves) == 21
    assert len({looks[op, 2][0] for op, _ in curves}) == 7  # a colour per op


def test_plan_of_a_large_world_says_so_before_it_searches(capsys):
    """`plan --gpus 8388608` once printed nothing for 165 s: beyond 2^20 GPUs it is refused at once (test_bad_inputs),
    and from 2^16 on a line on stderr says what the search is doing before it starts."""
    assert main(["plan", "--gpus", "65536", "--global-batch-size", "65536", "--refine", "1", "--top", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("commscope plan: planning 65,536 GPUs: every configuration that fits is estimated")
