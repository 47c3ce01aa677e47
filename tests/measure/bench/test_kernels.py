"""The kernel measurement of `commscope calibrate --model` (commscope.measure.bench.kernels), run for real on the CPU with a
tiny model: the files it writes are the shared H200 measurements' formats, and the fit reads them back."""

from __future__ import annotations

import csv
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import SHARED, requires_shared, shared_or_skip

torch = pytest.importorskip("torch")

from commscope.measure.bench.kernels import (  # noqa: E402  (after torch: the module measures with it)
    ATTENTION_COLUMNS, CPU_TEST_CONFIG, GEMMS_COLUMNS, MeasureConfig, gemm_operands, layer_flop, measure_kernels,
    smi_rows,
)
from commscope.estimate.compute.calibration import calibrate_kernels, read_kernel_dir  # noqa: E402
from commscope.estimate.compute.gemm import layer_gemms  # noqa: E402
from commscope.errors import ConfigError  # noqa: E402
from commscope.estimate.gpus import gpu_preset  # noqa: E402
from commscope.spec.files import load_model  # noqa: E402
from commscope.spec.model import ModelSpec  # noqa: E402
from commscope.spec.parallel import ParallelSpec  # noqa: E402

GPU_DATA = ("data", "gpu")
#: A tiny LLaMA-style model (grouped-query attention, SwiGLU, RMSNorm, no biases) in bf16, as GPU training runs.
TINY = ModelSpec(name="tiny gqa", num_layers=2, hidden_size=64, num_heads=4, num_query_groups=2, ffn_hidden_size=128,
                 vocab_size=256, make_vocab_size_divisible_by=64, seq_len=64, gated_mlp=True, normalization="rmsnorm",
                 bias=False, tied_embeddings=False, position_embedding="rope", dtype="bf16")


def cpu_base():
    """The cpu device with bf16 and fp8 peaks, so that every class of a CPU measurement can be fitted."""
    return replace(gpu_preset("cpu"), peak_flops={"bf16": 5e10, "fp8": 1e11, "fp32": 5e10})


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernels") / "tiny-kernels"
    said: list[str] = []
    run = measure_kernels(TINY, tp=2, micro_batch_size=2, directory=out, device="cpu", config=CPU_TEST_CONFIG,
                          progress=said.append, command="commscope calibrate --model tiny.toml --tp 2")
    return run, said


def header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@requires_shared(*GPU_DATA)
def test_every_file_has_the_columns_of_the_shared_measurements(measured):
    run, said = measured
    shared = SHARED.joinpath(*GPU_DATA)
    assert set(run.files) == {"gemms", "fp8_gemms", "attention", "copies", "layers", "sustained_layers"}
    for kind, path in run.files.items():
        assert path.name == f"cpu_tiny-gqa_tp2_mb2_{kind}.csv"  # device, model, tp, micro-batch
        if kind == "copies":  # the shared H200 data has no copies; the fit's documented format
            assert header(path) == ["copy_bytes", "measured_s"]
        elif kind == "attention":  # the shared columns, then micro_batch (the fit reads it)
            assert header(path) == header(shared / "h200_attention.csv") + ["micro_batch"] == list(ATTENTION_COLUMNS)
        else:
            assert header(path) == header(shared / f"h200_{kind}.csv"), kind
    assert header(run.files["gemms"]) == list(GEMMS_COLUMNS)
    assert said[0].startswith("gemm 1/15: qkv fwd")
    # cuDNN attention has no CPU kernel: said, not hidden
    assert any(n.startswith("attention cudnn: not measured") for n in run.notes)
    assert (run.directory / "SOURCES.md").read_text().count("| `cpu_tiny-gqa_tp2_mb2_") == len(run.files)


def test_the_rows_are_the_jobs_own_kernels(measured):
    run, _ = measured
    par = ParallelSpec(tp=2, micro_batch_size=2, global_batch_size=2)
    expected = [g for g in (*layer_gemms(TINY, par), *layer_gemms(TINY, par, logits=True))
                if g.name not in ("attn_scores", "attn_values")]
    got = rows(run.files["gemms"])
    assert [(r["gemm"], r["pass"], int(r["m"]), int(r["n"]), int(r["k"])) for r in got] == \
        [(g.name, g.pass_, g.m, g.n, g.k) for g in expected]
    assert all(int(r["flop"]) == 2 * int(r["m"]) * int(r["n"]) * int(r["k"]) and float(r["measured_s"]) > 0
               for r in got)
    assert {r["model"] for r in got} == {"tiny-gqa"} and {r["tp"] for r in got} == {"2"}
    att = rows(run.files["attention"])
    # 4 heads / tp 2 local heads, causal at half: 4 b a s^2 d / 2
    assert [(a["backend"], a["local_heads"], a["micro_batch"], int(a["causal_fwd_flop"])) for a in att] == \
        [("flash", "2", "2", 4 * 2 * 2 * 64 * 64 * 16 // 2)]
    (layer,) = rows(run.files["layers"])
    assert int(layer["flop_fwd_bwd_per_layer"]) == layer_flop(TINY, 2, 2)
    assert layer["mode"] == "eager" and float(layer["bwd_s_per_layer"]) > 0
    assert [int(r["copy_bytes"]) for r in rows(run.files["copies"])] == list(CPU_TEST_CONFIG.copy_sizes_bytes)


def test_a_model_that_is_no_preset_is_kept_beside_its_rows(measured):
    run, _ = measured
    assert load_model(run.directory / "tiny-gqa.model.toml") == TINY


def test_the_fit_reads_the_measurement_back(measured):
    """Every class is read and fitted from the CSVs alone (the layer's shape from the model file)."""
    run, _ = measured
    data = read_kernel_dir(run.directory)
    assert (len(data.gemms), len(data.fp8_gemms), len(data.attention), len(data.layers), len(data.copies)) == \
        (15, 4, 1, 1, 2)
    assert data.warnings == []
    cal = calibrate_kernels(run.directory, cpu_base())
    assert set(cal.classes) == {"gemm", "fp8_gemm", "attention", "layer"}
    assert cal.classes["layer"].n == 1  # found through tiny-gqa.model.toml
    assert cal.warnings == ()


def test_jobs_share_a_directory_but_are_never_counted_twice_or_mixed_with_another_device(tmp_path):
    """Another job of the same device adds its files (the fit then leaves each model out in turn); the same job again,
    another device's files or another model under the same name are refused before anything is timed."""
    out = tmp_path / "k"
    first = measure_kernels(TINY, directory=out, device="cpu", config=CPU_TEST_CONFIG)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "SOURCES.md"}
    with pytest.raises(ConfigError, match="already holds this job's measurements"):
        measure_kernels(TINY, directory=out, device="cpu", config=CPU_TEST_CONFIG)
    with pytest.raises(ConfigError, match="holds another model named 'tiny-gqa'"):
        measure_kernels(replace(TINY, hidden_size=128), tp=2, directory=out, device="cpu", config=CPU_TEST_CONFIG)
    second = measure_kernels(TINY, tp=2, directory=out, device="cpu", config=CPU_TEST_CONFIG)
    assert "sustained_layers" in first.files and "sustained_layers" not in second.files  # one clock per directory
    assert all((out / name).read_bytes() == data for name, data in before.items())  # the first job's files untouched
    assert (out / "SOURCES.md").read_text().count("## cpu_tiny-gqa_tp") == 2
    assert len(read_kernel_dir(out).gemms) == 30
    other = tmp_path / "shared"
    other.mkdir()
    (other / "h200_gemms.csv").write_text("model,tp,micro_batch,gemm,pass,m,n,k,batch,flop,measured_s\n")
    with pytest.raises(ConfigError, match=r"holds measurements of another device \(h200_gemms.csv\)"):
        measure_kernels(TINY, directory=other, device="cpu", config=CPU_TEST_CONFIG)
    assert [p.name for p in other.iterdir()] == ["h200_gemms.csv"]


@pytest.mark.parametrize(("changes", "kwargs", "message"), [
    ({"dtype": "fp32"}, {}, "bf16 or fp16"),
    ({}, {"tp": 3}, "tp=3: must divide num_heads=4"),
])
def test_a_job_it_cannot_time_is_refused_before_anything_runs(tmp_path, changes, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        measure_kernels(replace(TINY, **changes), directory=tmp_path / "k", device="cpu", config=CPU_TEST_CONFIG,
                        **kwargs)
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_gemm_layouts_are_those_of_linear_and_its_backward(pass_):
    """fwd X W^T (W stored [N, K]), dgrad dY W (W stored [K, N]), wgrad dY^T X (dY stored [K, N]): the operands
    torch.nn.Linear and its autograd hand to the GEMM, so cuBLAS picks the kernels training gets."""
    m, n, k = 48, 32, 16
    a, b, out = gemm_operands(pass_, m, n, k, dtype="fp32")
    assert torch.matmul(a, b).shape == out.shape
    x = torch.randn(8, 5)
    linear = torch.nn.Linear(5, 3, bias=False)
    if pass_ == "fwd":  # A (M x K) contiguous, B a transposed view of [N, K], like F.linear's weight
        assert (a.shape, a.is_contiguous(), b.shape, b.t().is_contiguous()) == ((m, k), True, (k, n), True)
        assert torch.allclose(torch.matmul(x, linear.weight.t()), linear(x))
    elif pass_ == "dgrad":  # dY (M x K) @ W stored [K, N] = [out, in]
        assert (a.shape, a.is_contiguous(), b.shape, b.is_contiguous()) == ((m, k), True, (k, n), True)
    else:  # dY^T (a view of dY stored [K, N]) @ X stored [K, M] -> dW (N x M) = [out, in]
        assert (a.shape, a.t().is_contiguous(), b.shape, b.is_contiguous(), out.shape) == \
            ((n, k), True, (k, m), True, (n, m))
        y = linear(x)
        dy = torch.randn_like(y)
        y.backward(dy)
        assert torch.allclose(torch.matmul(dy.t(), x), linear.weight.grad)


def test_measure_config_refuses_what_no_run_can_use():
    with pytest.raises(ConfigError, match="load_s"):
        MeasureConfig(load_s=-1)
    with pytest.raises(ConfigError, match="min_calls"):
        MeasureConfig(min_calls=0)


@requires_shared(*GPU_DATA)
def test_nvidia_smi_output_becomes_the_samples_the_fit_reads(tmp_path):
    """Real nvidia-smi lines (the H200's sustained run, as `nvidia-smi --format=csv,noheader` prints them) through
    smi_rows and the CSV writer give the fit the same clock as the shared file itself."""
    from commscope.measure.bench.kernels import SMI_COLUMNS, _write_csv

    shared = shared_or_skip(*GPU_DATA)
    lines = (shared / "h200_sustained_nvidia_smi.csv").read_text().splitlines()[1:]
    samples = smi_rows("\n".join(lines) + "\n")
    assert len(samples) == len(lines) and samples[0]["clocks_sm"] == " 1980 MHz"
    for name in ("h200_sustained_layers.csv", "h200_layers.csv"):
        shutil.copy(shared / name, tmp_path / name)
    _write_csv(tmp_path / "x_sustained_nvidia_smi.csv", SMI_COLUMNS, samples)
    mine = calibrate_kernels(tmp_path, gpu_preset("h200"), loo=False)
    assert mine.gpu.sustained_clock_MHz == 1575 and mine.gpu.kernel_clock_MHz is not None
    assert any("SM clock median 1575 MHz" in n for n in mine.notes)


@requires_shared(*GPU_DATA)
def test_the_sampler_keeps_every_line_its_queries_print():
    """The sampler runs one query process per sample in a thread and keeps each complete line; here the query is
    `cat` of one real nvidia-smi sample (no nvidia-smi on this machine), the command the sampler runs is its own."""
    import time

    from commscope.measure.bench.kernels import _SmiSampler

    line_file = shared_or_skip(*GPU_DATA, "h200_sustained_nvidia_smi.csv")
    sampler = _SmiSampler("GPU-0", ("clocks.sm", "power.draw"), 0.02)
    assert sampler.command[1:] == ["--query-gpu=clocks.sm,power.draw", "--format=csv,noheader", "-i", "GPU-0"]
    sampler.command = ["sed", "-n", "2p", str(line_file)]
    with sampler:
        time.sleep(0.3)
    assert len(sampler.lines) >= 2 and not sampler._thread.is_alive()
    assert {tuple(r.values()) for r in smi_rows("\n".join(sampler.lines))} == {
        ("2026/11/28 21:43:27.482", " 1980 MHz", " 89.76 W", " 43", " 0x0000000000000000")}
