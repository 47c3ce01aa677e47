"""GPU presets: every file loads with its sources, matches its clusters, and rejects bad files clearly."""

from __future__ import annotations

import pytest

from commscope.errors import ConfigError
from commscope.estimate.gpus import gpu_for_cluster, gpu_from_mapping, gpu_names, gpu_preset, load_gpu
from commscope.presets import cluster_preset

#: (preset, SMs, bf16-or-fp16 dense TFLOP/s, HBM GB/s) from the datasheets and white papers cited in the files.
DATASHEET = {"a100": (108, 312, 2039), "h100": (132, 989, 3350), "h200": (132, 989, 4800), "v100": (80, 125, 900),
             "rtx3090": (82, 71, 936)}


def test_presets_match_their_datasheets():
    assert set(gpu_names()) == set(DATASHEET) | {"cpu"}  # cpu: no datasheet, `commscope calibrate` measures it
    for name, (sms, tflops, gbps) in DATASHEET.items():
        gpu = gpu_preset(name)
        assert gpu.num_sms == sms
        assert gpu.peak_flops_for("bf16") == tflops * 1e12
        assert gpu.memory_bandwidth_bytes_per_s == gbps * 1e9
        assert gpu.l2_cache_bytes > 0
        assert "white paper" in gpu.source
        # the GEMM model's structure is cited: NVIDIA's matmul guide, or (Hopper) the presets' own kernel measurements
        assert "Matrix Multiplication Background" in gpu.source or "measurements" in gpu.source
        assert 0 < gpu.achievable_fraction <= 1


@pytest.mark.parametrize("cluster,gpu", [("dgx-a100", "a100"), ("dgx-h100", "h100"), ("dgx-h200", "h200"), ("dgx1-v100", "v100"),
                                         ("rtx3090-pcie", "rtx3090")])
def test_clusters_find_their_gpu(cluster, gpu):
    c = cluster_preset(cluster)
    g = gpu_for_cluster(c)
    assert g.name == gpu_preset(gpu).name
    assert g.peak_flops_for("fp16") == c.peak_flops_for("fp16")  # the cluster's peak wins, as the estimate uses it


def test_explicit_gpu_and_aliases():
    assert gpu_preset("A100-SXM4-40GB").num_sms == 108
    assert load_gpu("h100").num_sms == 132
    assert gpu_for_cluster(cluster_preset("dgx-a100"), "h100").num_sms == 132


def test_gpu_file(tmp_path):
    path = tmp_path / "mygpu.toml"
    path.write_text('num_sms = 114\nmemory_bandwidth_GBps = 2000\nkernel_overhead_us = 3\n[peak_tflops]\nbf16 = 756\n')
    gpu = load_gpu(path)
    assert gpu.name == "mygpu" and gpu.num_sms == 114
    assert gpu.kernel_overhead_s == pytest.approx(3e-6)
    assert gpu.peak_flops_for("fp16") == 756e12


@pytest.mark.parametrize("mapping,match", [
    ({"name": "x", "num_sms": 10}, "memory_bandwidth"),
    ({"name": "x", "num_sms": 10, "memory_bandwidth_GBps": 1, "tile_size": [[1, 1]]}, "did you mean 'tile_sizes'"),
    ({"name": "x", "num_sms": "ten", "memory_bandwidth_GBps": 1}, "integer"),
    ({"name": "x", "num_sms": 10, "memory_bandwidth_GBps": 1, "tile_sizes": [[128]]}, "pairs"),
    ({"name": "x", "num_sms": 10, "memory_bandwidth_GBps": 1, "achievable_fraction": 1.5}, r"\(0, 1\]"),
    ({"name": "x", "num_sms": 10, "memory_bandwidth_GBps": 1, "split_k": [2, 4]}, "contains 1"),
])
def test_bad_gpu_files(mapping, match):
    with pytest.raises(ConfigError, match=match):
        gpu_from_mapping(mapping, source="bad.toml")


def test_unknown_gpu_names():
    with pytest.raises(ConfigError, match="valid presets"):
        gpu_preset("b200")
    with pytest.raises(ConfigError, match="no such file"):
        load_gpu("missing/gpu.toml")
    with pytest.raises(ConfigError, match="dtype"):
        gpu_preset("v100").peak_flops_for("fp8")
