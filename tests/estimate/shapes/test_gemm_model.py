"""The GEMM model on shapes with known answers, computed by hand in each test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commscope.estimate.gpus import GpuSpec, gpu_preset
from commscope.estimate.shapes import alignment_factor, gemm_timing

PEAK = 312e12
ACHIEVABLE = 0.8


def one_tile_gpu(**overrides) -> GpuSpec:
    """An A100-like GPU with a single 128x128 tile, no split-K and no kernel overhead: every loss is visible."""
    kwargs = dict(name="test-a100", num_sms=108, peak_flops={"bf16": PEAK}, memory_bandwidth_bytes_per_s=2039e9,
                  tile_sizes=((128, 128),), tile_k=32, split_k=(1,), kernel_overhead_s=0.0,
                  achievable_fraction=ACHIEVABLE)
    kwargs.update(overrides)
    return GpuSpec(**kwargs)


def cta_time(tm: int, tn: int, k: int, *, sms: int = 108, align: float = 1.0) -> float:
    """Time of one CTA: 2 tm tn K FLOP at achievable x peak / SMs."""
    return 2 * tm * tn * k / (ACHIEVABLE * PEAK / sms * align)


def test_perfectly_aligned_shape_has_no_tile_or_wave_loss():
    gpu = one_tile_gpu()
    # 12 x 9 = 108 tiles of 128x128 = exactly one wave on 108 SMs; every dimension a multiple of 64 elements
    t = gemm_timing(gpu, 1536, 1152, 4096, dtype="bf16")
    assert t.tile_efficiency[()] == 1.0
    assert t.wave_efficiency[()] == 1.0
    assert t.k_efficiency[()] == 1.0
    assert t.alignment_factor[()] == 1.0
    assert t.num_tiles[()] == 108 and t.num_waves[()] == 1
    assert not t.memory_bound[()]
    assert t.time_s[()] == pytest.approx(cta_time(128, 128, 4096))
    assert t.efficiency[()] == pytest.approx(ACHIEVABLE)


def test_aligned_shape_on_the_a100_preset_has_no_loss():
    gpu = gpu_preset("a100")
    # 256x128 tiles: 12 x 9 = 108 tiles, one wave; the preset's other tiles cannot beat that
    t = gemm_timing(gpu, 3072, 1152, 4096, dtype="bf16")
    assert (t.tile_m[()], t.tile_n[()]) == (256, 128)
    assert t.tile_efficiency[()] == 1.0 and t.wave_efficiency[()] == 1.0 and t.alignment_factor[()] == 1.0
    # one CTA runs K / tile_k main-loop steps plus the preset's pipeline fill and epilogue, at its achievable fraction
    steps = 4096 // gpu.tile_k + gpu.cta_fill_steps
    compute = 2 * 256 * 128 * steps * gpu.tile_k / (gpu.achievable_fraction * PEAK / 108)
    assert t.time_s[()] == pytest.approx(compute + gpu.kernel_overhead_s)
    ideal = 2 * 3072 * 1152 * 4096 / (gpu.achievable_fraction * PEAK)
    assert t.efficiency[()] == pytest.approx(gpu.achievable_fraction * ideal / (compute + gpu.kernel_overhead_s))


def test_cta_fill_steps_cost_short_k_gemms_more():
    slow, fast = one_tile_gpu(cta_fill_steps=4), one_tile_gpu()
    ratio = [float(gemm_timing(slow, 1536, 1152, k).time_s[()] / gemm_timing(fast, 1536, 1152, k).time_s[()])
             for k in (512, 4096)]
    assert ratio[0] == pytest.approx((16 + 4) / 16) and ratio[1] == pytest.approx((128 + 4) / 128)


def test_one_element_past_a_tile_boundary():
    gpu = one_tile_gpu()
    m, n, k = 1536 + 1, 1152, 4096
    t = gemm_timing(gpu, m, n, k, dtype="bf16")
    # by hand: ceil(1537/128) = 13 row tiles x 9 = 117 tiles -> 2 waves of 108; the last row tile holds 1 row of 128;
    # 1537 x 2 bytes is not a multiple of 16 bytes -> unaligned factor 0.5
    assert t.num_tiles[()] == 117 and t.num_waves[()] == 2
    assert t.tile_efficiency[()] == pytest.approx(1537 / (13 * 128))
    assert t.wave_efficiency[()] == pytest.approx(117 / 216)
    assert t.alignment_factor[()] == gpu.unaligned_factor == 0.5
    expected = 2 * cta_time(128, 128, k, align=0.5)
    assert t.time_s[()] == pytest.approx(expected)
    assert t.efficiency[()] == pytest.approx(2 * m * n * k / (expected * PEAK))
    assert t.efficiency[()] == pytest.approx(ACHIEVABLE * 1537 / 1536 / 4)  # 2 waves x half speed


def test_64_elements_past_a_tile_boundary_costs_tiles_and_waves_only():
    gpu = one_tile_gpu()
    t = gemm_timing(gpu, 1536 + 64, 1152, 4096, dtype="bf16")
    # 1600 = 12.5 tiles -> 13; 117 tiles -> 2 waves; 1600 x 2 B = 25 x 128 B: aligned
    assert t.alignment_factor[()] == 1.0
    assert t.tile_efficiency[()] == pytest.approx(1600 / 1664)
    assert t.time_s[()] == pytest.approx(2 * cta_time(128, 128, 4096))
    assert t.efficiency[()] == pytest.approx(ACHIEVABLE * 1600 / 1536 / 2)


def test_eight_elements_past_is_tensor_core_aligned_but_not_optimal():
    gpu = one_tile_gpu()
    t = gemm_timing(gpu, 1536 + 8, 1152, 4096, dtype="bf16")
    # 1544 x 2 B = 3088 B: a multiple of 16 B, not of 128 B
    assert t.alignment_factor[()] == gpu.partial_alignment_factor
    assert t.time_s[()] == pytest.approx(2 * cta_time(128, 128, 4096, align=gpu.partial_alignment_factor))


def test_k_is_padded_to_the_tile_k_step():
    gpu = one_tile_gpu()
    t = gemm_timing(gpu, 1536, 1152, 4096 + 64, dtype="bf16")  # 4160 = 130 steps of 32: no K loss
    assert t.k_efficiency[()] == 1.0
    t = gemm_timing(gpu, 1536, 1152, 80, dtype="bf16")  # 80 -> 3 steps of 32 = 96
    assert t.k_efficiency[()] == pytest.approx(80 / 96)


def test_docstring_worked_example():
    gpu = gpu_preset("a100")
    t = gemm_timing(gpu, 4096, 4096, 4096, dtype="bf16")
    # 256x128: 16 x 32 = 512 tiles, ceil(512 / 108) = 5 waves; one CTA 120 us (128 + 4 K steps at 0.80 of peak)
    assert t.num_waves[()] == 5
    assert t.wave_efficiency[()] == pytest.approx(512 / 540)
    one_cta = 2 * 256 * 128 * (128 + 4) * 32 / (0.80 * PEAK / 108)
    assert one_cta * 1e6 == pytest.approx(120, abs=0.5)
    assert t.time_s[()] == pytest.approx(5 * one_cta + 4e-6)
    assert t.time_s[()] * 1e6 == pytest.approx(603, abs=1)
    assert 2 * 4096**3 / t.time_s[()] / 1e12 == pytest.approx(228, abs=1)


def test_memory_roofline_for_a_thin_gemm():
    gpu = one_tile_gpu(tile_sizes=((64, 64),))
    # a skinny GEMM: 8192 x 64 x 8192 moves the 8192 x 8192 matrix (134 MB, 78 us) for 2 waves of 64x64 tiles (58 us)
    m, n, k = 8192, 64, 8192
    t = gemm_timing(gpu, m, n, k, dtype="bf16")
    bytes_ = 2 * (m * k + k * n + m * n)
    assert t.memory_bound[()]
    assert t.arithmetic_intensity[()] == pytest.approx(2 * m * n * k / bytes_)
    assert t.time_s[()] == pytest.approx(bytes_ / (2039e9 * gpu.memory_efficiency))


def test_io_elements_override_drops_the_score_matrix():
    gpu = one_tile_gpu()
    full = gemm_timing(gpu, 2048, 2048, 64, 32, dtype="bf16")
    fused = gemm_timing(gpu, 2048, 2048, 64, 32, dtype="bf16", io_elements=2048 * 64 * 2)
    assert fused.memory_time_s[()] < full.memory_time_s[()]
    assert fused.time_s[()] <= full.time_s[()]


def test_split_k_fills_the_machine_when_tiles_are_few():
    gpu = one_tile_gpu(split_k=(1, 2, 4, 8))
    # 2 x 2 = 4 tiles on 108 SMs with a long K: split-K spreads K over more CTAs
    t = gemm_timing(gpu, 256, 256, 65536, dtype="bf16")
    assert t.split_k[()] > 1
    no_split = gemm_timing(one_tile_gpu(), 256, 256, 65536, dtype="bf16")
    assert t.time_s[()] < no_split.time_s[()]


def test_vectorised_and_broadcast():
    gpu = gpu_preset("h100")
    m = np.array([1024, 1025, 4096])
    t = gemm_timing(gpu, m, 4096, 4096, dtype="bf16")
    assert t.time_s.shape == (3,)
    for i, mi in enumerate(m):
        one = gemm_timing(gpu, int(mi), 4096, 4096, dtype="bf16")
        assert t.time_s[i] == pytest.approx(one.time_s[()])


def test_time_grows_with_work_and_efficiency_is_bounded():
    gpu = gpu_preset("a100")
    ms = np.arange(64, 8193, 64)
    t = gemm_timing(gpu, ms, 4096, 4096, dtype="bf16")
    assert np.all(np.diff(t.time_s) >= -1e-12)  # tile quantisation: efficiency may drop, time never does
    assert np.all(t.efficiency <= gpu.achievable_fraction + 1e-12)
    assert np.all(t.efficiency > 0)


def test_alignment_factor_rule():
    a100, v100 = gpu_preset("a100"), gpu_preset("v100")
    assert alignment_factor(a100, 2, 4096, 4096, 4096) == 1.0
    assert alignment_factor(a100, 2, 4096, 4104, 4096) == a100.partial_alignment_factor  # 8 fp16 = 16 B
    assert alignment_factor(a100, 2, 4096, 4097, 4096) == a100.unaligned_factor
    assert alignment_factor(v100, 2, 4096, 4104, 4096) == 1.0  # Volta's optimum is the 16-byte rule itself
    assert alignment_factor(a100, 4, 4096, 4128, 4096) == 1.0  # 32 fp32 elements = 128 B


def test_bad_dimensions_raise():
    from commscope.errors import ConfigError

    with pytest.raises(ConfigError):
        gemm_timing(one_tile_gpu(), 0, 8, 8)


def test_tile_throughput_formula():
    gpu = gpu_preset("a100")
    thr = dict(zip(gpu.tile_sizes, gpu.tile_throughputs))
    assert thr[(256, 128)] == 1.0
    assert thr[(64, 64)] == pytest.approx(math.sqrt(32 / (256 * 128 / 384)))
    assert thr[(128, 128)] == pytest.approx(math.sqrt(0.75))
