"""commscope.estimate.compute.calibration on measurements it can check: kernels timed by a known GPU model come back, damaged
rows are named and skipped, and the fit stays inside its bounds. (The real H200's kernels: tests/golden.)"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from commscope.estimate.compute.attention import fused_attention_time_s
from commscope.estimate.compute.calibration import calibrate_kernels, minimize, read_kernel_dir
from commscope.estimate.compute.gemm import gemm_timing
from commscope.errors import ConfigError
from commscope.estimate.gpus import gpu_preset

TRUTH = gpu_preset("h200")
#: GEMM shapes of three "models" (m, n, k): aligned, a few waves each
SHAPES = {"a": [(4096, 4096, 4096), (4096, 12288, 4096), (12288, 4096, 4096), (4096, 4096, 1024)],
          "b": [(8192, 2560, 8192), (8192, 8192, 2560), (2560, 8192, 8192), (8192, 3072, 2048)],
          "c": [(2048, 6144, 12288), (2048, 12288, 6144), (6144, 12288, 2048), (2048, 1536, 12288)]}
ATTENTION = [("a", 16, 4096, 128), ("b", 8, 8192, 128), ("c", 12, 2048, 128), ("d", 32, 2048, 64)]


def _write(path: Path, header: list[str], rows: list[list[object]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _measured_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = []
    for model, shapes in SHAPES.items():
        for m, n, k in shapes:
            t = float(gemm_timing(TRUTH, m, n, k).time_s) * (1 + rng.normal(0, 0.01))
            rows.append([model, 1, 1, "g", "fwd", m, n, k, 1, 2 * m * n * k, t])
    _write(tmp_path / "x_gemms.csv", ["model", "tp", "micro_batch", "gemm", "pass", "m", "n", "k", "batch", "flop",
                                      "measured_s"], rows)
    kernel = TRUTH.attention_kernels["cudnn"]
    att = []
    for model, heads, seq, d in ATTENTION:
        f, b, _ = fused_attention_time_s(kernel, TRUTH, batch_heads=heads, seq_q=seq, seq_k=seq, head_dim=d)
        att.append([model, 1, heads, seq, d, 0, "cudnn", float(f), float(b)])
    _write(tmp_path / "x_attention.csv", ["model", "tp", "local_heads", "seq_len", "head_dim", "causal_fwd_flop",
                                          "backend", "fwd_s", "bwd_s"], att)
    _write(tmp_path / "x_copies.csv", ["copy_bytes", "measured_s"],
           [[b, 2 * b / (0.9 * TRUTH.memory_bandwidth_bytes_per_s)] for b in (1 << 26, 1 << 28, 1 << 30)])
    return tmp_path


def test_kernels_timed_by_a_known_model_are_predicted_back(tmp_path):
    base = replace(TRUTH, achievable_fraction=0.6, attention_kernels={}, memory_efficiency=0.5)
    cal = calibrate_kernels(_measured_dir(tmp_path), base)
    assert cal.classes["gemm"].mape < 0.02 and cal.classes["gemm"].loo_mape < 0.04
    assert cal.classes["attention"].mape < 0.02
    assert cal.gpu.memory_efficiency == pytest.approx(0.9)  # the copies measure it directly
    assert cal.gpu.achievable_fraction == pytest.approx(TRUTH.achievable_fraction, abs=0.05)
    assert set(cal.gpu.attention_kernels) == {"cudnn"}
    assert cal.to_dict()["classes"]["gemm"]["n"] == 12
    assert cal.warnings == ()


def test_damaged_rows_are_skipped_and_named(tmp_path):
    _write(tmp_path / "bad_gemms.csv", ["model", "m", "n", "k", "measured_s"],
           [["a", 4096, 4096, 4096, 0.0002], ["a", 4096, 4096, 4096, -1], ["a", 4096, "x", 4096, 0.001],
            ["a", 4096, 4096, 4096, "nan"], ["a", 4096, 4096, 4096, 5000]])
    data = read_kernel_dir(tmp_path)
    assert len(data.gemms) == 1
    assert [w.split(":")[0] for w in data.warnings] == [f"bad_gemms.csv line {n}" for n in (3, 4, 5, 6)]
    assert "measured_s '-1' must be a finite number > 0" in data.warnings[0]
    assert "n 'x' is not a number" in data.warnings[1]


def test_a_directory_without_usable_measurements_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        read_kernel_dir(tmp_path / "missing")
    with pytest.raises(ConfigError, match="holds no usable kernel measurement"):
        read_kernel_dir(tmp_path)
    _write(tmp_path / "y_gemms.csv", ["model", "m", "n"], [["a", 1, 2]])
    with pytest.raises(ConfigError, match=r"y_gemms.csv line 1.*header lacks k, measured_s"):
        read_kernel_dir(tmp_path)
    (tmp_path / "y_gemms.csv").write_bytes(b"\x89PNG\x00\xff")
    with pytest.raises(ConfigError, match="is not a text CSV file"):
        read_kernel_dir(tmp_path)


def test_minimize_never_leaves_its_bounds():
    seen = []

    def f(x):
        seen.append(x.copy())
        return float((x[0] - 5.0) ** 2 + (x[1] + 3.0) ** 2)  # the unconstrained minimum lies outside the box

    x = minimize(f, [0.5, 0.5], [0.0, 0.0], [1.0, 1.0])
    assert all(0.0 <= v[0] <= 1.0 and 0.0 <= v[1] <= 1.0 for v in seen)
    assert x[0] == pytest.approx(1.0, abs=1e-3) and x[1] == pytest.approx(0.0, abs=1e-3)
