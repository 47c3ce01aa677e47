"""In-training effects (commscope.estimate.compute.effects) and stacks: each one does what its mechanism says, and only that."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from commscope.api import predict
from commscope.estimate.compute.attention import fused_attention_time_s
from commscope.estimate.compute.effects import NCCL_CTAS, TE_PIPELINE_SPLITS, comm_sm_share, launch_gap_s, overlap_chunks
from commscope.estimate.compute.model import stage_compute
from commscope.errors import ConfigError
from commscope.estimate.iteration import estimate
from commscope.estimate.gpus import gpu_preset
from commscope.presets import cluster_preset, model_preset
from commscope.spec.parallel import ParallelSpec
from commscope.estimate.stacks import stack_names, stack_preset

H100 = gpu_preset("h100")
LLAMA70 = model_preset("llama3-70b")
JOB = ParallelSpec(tp=8, pp=2, dp=4, global_batch_size=32, sequence_parallel=True)


def test_the_sustained_clock_slows_compute_bound_kernels_only():
    unclocked = replace(H100, kernel_clock_MHz=None, sustained_clock_MHz=None)
    a, b = stage_compute(LLAMA70, JOB, unclocked), stage_compute(LLAMA70, JOB, H100)
    factor = H100.kernel_clock_MHz / H100.sustained_clock_MHz
    assert factor == pytest.approx(1607 / 1575)
    np.testing.assert_allclose(b.gemm_s, a.gemm_s * factor, rtol=1e-12)
    np.testing.assert_allclose(b.attention_s, a.attention_s * factor, rtol=1e-12)
    np.testing.assert_allclose(b.memory_s, a.memory_s, rtol=1e-12)  # HBM does not follow the SM clock
    np.testing.assert_allclose(b.clock_s, (b.gemm_s + b.attention_s) - (a.gemm_s + a.attention_s), rtol=1e-9)
    assert not a.clock_s.any()
    assert any("sustained clock (1575 MHz" in n for n in b.notes)


def test_tp_comm_overlap_cuts_transformer_engines_gemms_into_pieces():
    overlapped = replace(JOB, tp_comm_overlap=True)
    assert overlap_chunks("qkv", "fwd", overlapped) == 8  # ring exchange: tp pieces
    assert overlap_chunks("mlp_up", "fwd", overlapped) == 8
    assert overlap_chunks("attn_proj", "dgrad", overlapped) == 8
    assert overlap_chunks("attn_proj", "fwd", overlapped) == TE_PIPELINE_SPLITS == 4  # pipelined reduce-scatter
    assert overlap_chunks("mlp_down", "fwd", overlapped) == 4
    assert overlap_chunks("qkv", "wgrad", overlapped) == 1  # bulk overlap: not cut
    assert overlap_chunks("qkv", "fwd", JOB) == 1  # no overlap, no pieces
    assert overlap_chunks("router", "fwd", overlapped) == 1
    a, b = stage_compute(LLAMA70, JOB, H100), stage_compute(LLAMA70, overlapped, H100)
    assert not a.chunks_s.any()
    # pieces of 1/8 of the tokens lose a little to tiles and waves, never gain; the fixed cost is paid once per GEMM
    assert np.all(b.chunks_s > 0) and np.all(b.chunks_s < 0.05 * b.gemm_s)
    np.testing.assert_allclose(b.gemm_s - a.gemm_s, b.chunks_s, rtol=1e-9)


def test_overlapped_communication_takes_its_sms_from_compute():
    cluster = cluster_preset("dgx-h100")
    plain = estimate(predict(LLAMA70, JOB, cluster))
    overlapped = estimate(predict(LLAMA70, replace(JOB, tp_comm_overlap=True), cluster))
    assert plain.compute_breakdown_s["comm_sms_s"] == 0.0  # nothing overlaps, nothing is taken
    hidden_tp = overlapped.hidden_s["tp"]
    # TE's userbuffers take 16 SMs for the reduce-scatter half of the TP traffic: 8 of 132 on average
    assert comm_sm_share(H100, "tp") == pytest.approx(8 / 132)
    assert comm_sm_share(H100, "dp") == pytest.approx(NCCL_CTAS / 132)
    assert overlapped.compute_breakdown_s["comm_sms_s"] == pytest.approx(hidden_tp * 8 / 132, rel=1e-6)
    assert overlapped.iteration_time_s == pytest.approx(
        overlapped.compute_s + overlapped.comm_s + overlapped.bubble_s + overlapped.optimizer_s, rel=1e-12)


def test_host_launch_gaps_show_on_tiny_layers_only():
    assert launch_gap_s(10, 1e-3) == 0.0
    assert launch_gap_s(10, 20e-6) == pytest.approx(60e-6)
    a100 = gpu_preset("a100")
    tiny = stage_compute(model_preset("ref-gpt"), ParallelSpec(global_batch_size=1), a100)
    big = stage_compute(LLAMA70, JOB, a100)
    assert tiny.gaps_s.sum() > 0.3 * (tiny.forward_s + tiny.backward_s).sum()  # a 262k-parameter model waits on Python
    assert not big.gaps_s.any()


def test_a_named_stack_scales_compute_and_nothing_else():
    cluster = cluster_preset("dgx-h100")
    plain = estimate(predict(LLAMA70, JOB, cluster))
    stacked = estimate(predict(LLAMA70, replace(JOB, stack="megatron-core-2024"), cluster))
    eff = stack_preset("megatron-core-2024").compute_efficiency
    assert stacked.compute_s == pytest.approx(plain.compute_s / eff, rel=1e-9)
    assert stacked.tp_s == plain.tp_s and stacked.dp_s == pytest.approx(plain.dp_s, rel=1e-9)
    optimizer_extra = stacked.compute_breakdown_s["optimizer_s"] - plain.compute_breakdown_s["optimizer_s"]
    assert stacked.compute_breakdown_s["stack_s"] == pytest.approx(
        stacked.compute_s - plain.compute_s + optimizer_extra, rel=1e-6)
    assert any("stack megatron-core-2024" in n for n in stacked.notes)
    # the cluster's own fitted efficiency multiplies the stack's
    fitted = replace(cluster, compute_efficiency=0.9)
    both = estimate(predict(LLAMA70, replace(JOB, stack="megatron-core-2024"), fitted))
    assert both.compute_s == pytest.approx(plain.compute_s / (eff * 0.9), rel=1e-9)


def test_stacks_are_presets_with_sources_and_a_bad_name_is_refused():
    assert set(stack_names()) >= {"megatron-core-2024", "megatron-deepspeed"}
    for name in stack_names():
        s = stack_preset(name)
        assert 0.2 <= s.compute_efficiency <= 1.2 and "fitted" in s.source and s.description
    with pytest.raises(ConfigError, match="stack='megatron'.*valid: megatron-core-2024"):
        ParallelSpec(stack="megatron")
    with pytest.raises(ConfigError, match="compute_efficiency"):
        replace(cluster_preset("dgx-h100"), compute_efficiency=3.0)


def test_fused_attention_worked_example():
    """The docstring of commscope.estimate.compute.attention: Llama 3 70B on t8, cuDNN forward, 314 us (319 measured)."""
    kernel = H100.attention_kernels["cudnn"]
    fwd, bwd, flop = fused_attention_time_s(kernel, H100, batch_heads=8, seq_q=8192, seq_k=8192, head_dim=128)
    assert fwd * 1e6 == pytest.approx(314, abs=1.5)
    assert flop == pytest.approx(0.5 * 4 * 8 * 8192 * 8192 * 128)
    assert bwd > 2.5 * (fwd - kernel.fwd_overhead_s)  # 2.5x the FLOP at a lower fraction, plus its own kernels


def test_attention_time_grows_with_work_and_few_long_problems_pay_their_tail():
    k = H100.attention_kernels["flash"]
    times = [float(fused_attention_time_s(k, H100, batch_heads=h, seq_q=s, seq_k=s, head_dim=128)[0])
             for h, s in ((6, 2048), (12, 2048), (24, 2048), (12, 4096), (12, 8192))]
    assert times == sorted(times)
    # 12 heads of 2,048 tokens: 192 query tiles on 132 SMs; the longest tile's tail is most of the balanced work
    balanced = 12 * 16 * 17 / 2 / 132
    assert k.fwd_tail * 16 > 0.5 * balanced
