"""`commscope shapes` as a user runs it: exit codes, JSON keys, the sweep plot, --measure without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from commscope.cli.main import main

ISSUE_ARGS = ("shapes", "--model", "gpt-3b", "--cluster", "dgx-a100", "--tp", "2")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_issue_example_text(capsys):
    code, out, err = run(capsys, *ISSUE_ARGS)
    assert code == 0, err
    assert "A100-SXM4-80GB" in out and "108 SMs" in out
    for name in ("qkv", "attn_scores", "attn_values", "attn_proj", "mlp_up", "mlp_down", "logits"):
        assert name in out
    assert "BROKEN  head size" in out and "d = 128 (24 heads)" in out
    assert "nearby shapes within +-5% parameters" in out
    assert "shape-aware u" in out


def test_issue_example_json(capsys):
    code, out, err = run(capsys, *ISSUE_ARGS, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert {"model", "cluster", "gpu", "dtype", "parallel", "shape", "gemms", "rules", "summary", "estimate",
            "baseline_estimate", "suggestions", "notes"} <= set(d)
    gemm = d["gemms"][0]
    assert {"name", "pass", "m", "n", "k", "batch", "flop", "tile", "num_waves", "tile_efficiency", "wave_efficiency",
            "alignment_factor", "bound", "time_s", "efficiency", "broken_rules"} <= set(gemm)
    assert {g["pass"] for g in d["gemms"]} == {"fwd", "dgrad", "wgrad"}
    assert {"gemm_efficiency", "gpu_util", "broken_rules"} <= set(d["summary"])
    assert d["summary"]["broken_rules"] == ["head_size"]
    s = d["suggestions"]
    assert {"original", "suggestions", "tolerance", "num_candidates"} <= set(s)
    for row in s["suggestions"]:
        assert abs(row["param_change"]) <= 0.05
        assert row["iteration_time_s"] <= s["original"]["iteration_time_s"]


def test_no_suggest(capsys):
    code, out, _ = run(capsys, *ISSUE_ARGS, "--no-suggest", "--json")
    assert code == 0 and json.loads(out)["suggestions"] is None


def test_sweep_writes_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, err = run(capsys, "shapes", "--model", "gpt-3b", "--cluster", "dgx-a100", "--tp", "2",
                         "--sweep", "hidden=2560:3584:64", "--png", str(tmp_path / "plots"))
    assert code == 0, err
    png = tmp_path / "plots" / "gpt-3b-hidden-sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in out and "3072" in out


def test_sweep_from_a_model_file_json(capsys, tmp_path):
    from commscope.presets import model_preset
    from commscope.spec.files import model_to_mapping, write_mapping

    path = write_mapping(tmp_path / "my.json", model_to_mapping(model_preset("gpt-3b")))
    code, out, err = run(capsys, "shapes", "--model", str(path), "--cluster", "dgx-a100", "--sweep", "heads=16,24,32,48",
                         "--json")
    assert code == 0, err
    d = json.loads(out)["sweep"]
    assert d["key"] == "heads" and d["values"] == [16, 24, 32, 48]
    assert {"gemm_tflops_per_gpu", "model_tflops_per_gpu", "iteration_time_s", "valid", "broken_rules"} <= set(d)


@pytest.mark.parametrize("argv,message", [
    (("--png", "x.png"), "add --sweep"),
    (("--sweep", "hidden=abc"), "integers"),
    (("--sweep", "width=1:2"), "valid: hidden"),
    (("--sweep", "hidden=4096:2048:64"), "START <= STOP"),
    (("--gpu", "b200"), "valid presets"),
    (("--tp", "3"), "must divide num_heads=32"),
    (("--tolerance", "2"), "tolerance"),
    (("--refine", "0"), "refine=0: must be >= 1"),
    # once the bare OS error after the whole sweep, naming no field
    (("--sweep", "hidden=3008,3072", "--png", "/proc/x.png"), "png='/proc/x.png': cannot write into /proc"),
    (("--sweep", "hidden=3008,3072", "--png", "/proc/plots"), "png='/proc/plots': cannot create it in /proc"),
    # once the first sweep dropped silently
    (("--sweep", "layers=1,2", "--sweep", "heads=16,32"), "sweep='heads=16,32': one --sweep per run (already sweeping"),  # once: '0 estimated ... (no nearby shape is faster by the model)'
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    code, _out, err = run(capsys, "shapes", "--model", "gpt-3b", "--cluster", "dgx-a100", *argv)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_measure_without_a_gpu_exits_2_clearly(capsys):
    from commscope.estimate.shapes import cuda_available

    ok, _ = cuda_available()
    if ok:
        pytest.skip("this machine has a CUDA GPU; --measure would run")
    code, out, err = run(capsys, *ISSUE_ARGS, "--measure")
    assert code == 2
    assert out == ""
    assert "needs a CUDA GPU" in err and "without --measure" in err
    assert len(err.strip().splitlines()) == 1


def test_analytical_core_imports_neither_torch_nor_matplotlib():
    code = ("import sys, commscope.estimate.shapes, commscope.estimate.gpus, commscope.cli.shapes_cmd; "
            "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_public_api():
    import commscope.estimate.gpus
    import commscope.estimate.shapes

    for module in (commscope.estimate.shapes, commscope.estimate.gpus):
        for name in module.__all__:
            assert hasattr(module, name), name


def test_measure_code_path_on_cpu(tmp_path):
    """The torch timing path runs (on CPU, tiny shapes); on a GPU machine --measure uses the same code with CUDA. What
    --kernels-out writes is a kernel CSV that `calibrate --kernels` reads: one row per linear-layer GEMM, one call."""
    pytest.importorskip("torch")
    from commscope.cli.shapes_cmd import _write_kernels_csv, format_measured
    from commscope.estimate.compute.calibration import read_kernel_dir
    from commscope.estimate.gpus import gpu_preset
    from commscope.estimate.shapes import measure_gemms, measured_over_predicted, model_gemms, time_gemms
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec

    tiny = ModelSpec(name="tiny", num_layers=1, hidden_size=64, num_heads=2, seq_len=64, vocab_size=128, dtype="fp32")
    gpu = gpu_preset("a100")
    results = time_gemms(model_gemms(tiny), gpu, "fp32")
    measured = measure_gemms(results, "fp32", device="cpu", warmup=1, iters=2, load_s=0.001)
    assert len(measured) == len(results)
    assert all(m.measured_s > 0 for m in measured)
    d = measured[0].to_dict()
    assert {"measured_s", "measured_tflops", "predicted_over_measured"} <= set(d)
    assert measured_over_predicted(measured) is None  # nothing compute-bound above 1 GFLOP here
    path = tmp_path / "k" / "cpu_tiny_tp1_mb1_gemms.csv"
    _write_kernels_csv(path, measured, tiny, ParallelSpec())
    rows = read_kernel_dir(path.parent).gemms
    linear = [m for m in measured if m.result.gemm.name not in ("attn_scores", "attn_values")]
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(m.result.gemm.m, m.result.gemm.n, m.result.gemm.k) for m in linear]
    assert [r["measured_s"] for r in rows] == pytest.approx([m.measured_s / m.result.gemm.count for m in linear])
    text = format_measured(measured, gpu, csv_path=path, base="a100")
    assert "achievable_fraction" not in text  # no second calibration beside the estimate's GPU model
    assert f"wrote {path}" in text and f"commscope calibrate --kernels {path.parent} --gpu a100 --out GPU.toml" in text
    assert "--kernels-out DIR keeps them" in format_measured(measured, gpu)


def test_png_without_matplotlib_says_how_to_install(capsys, tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import matplotlib...` raise ImportError
    code, _out, err = run(capsys, "shapes", "--model", "gpt-3b", "--cluster", "dgx-a100", "--sweep", "hidden=3008,3072",
                         "--png", str(tmp_path))
    assert code == 2
    assert "commscope[plots]" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_kernels_out_adds_one_file_per_job_and_mixes_no_devices(tmp_path):
    from commscope.cli.shapes_cmd import _kernels_csv
    from commscope.errors import ConfigError
    from commscope.presets import model_preset
    from commscope.spec.parallel import ParallelSpec

    model, par = model_preset("llama3-8b"), ParallelSpec(tp=2, dp=4)
    path = _kernels_csv(tmp_path / "k", model, par)
    assert path.name.endswith("_llama3-8b_tp2_mb1_gemms.csv") and not path.parent.exists()  # nothing written yet
    path.parent.mkdir()
    path.write_text("model,tp,micro_batch,gemm,pass,m,n,k,measured_s\n")
    with pytest.raises(ConfigError, match="already holds this job's measurements"):
        _kernels_csv(path.parent, model, par)
    assert _kernels_csv(path.parent, model, ParallelSpec(tp=4, dp=2)).name.endswith("_tp4_mb1_gemms.csv")
    (path.parent / "h200_gemms.csv").write_text("model,tp,micro_batch,gemm,pass,m,n,k,measured_s\n")
    with pytest.raises(ConfigError, match="holds measurements of another device"):
        _kernels_csv(path.parent, model, ParallelSpec(tp=4, dp=2))
