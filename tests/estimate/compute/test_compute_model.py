"""The compute model and the overlaps of the refined estimate: properties, worked examples, the user's flags."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commscope.api import predict
from commscope.estimate.compute.kernels import (
    fused_softmax_available,
    grad_accumulation_bytes_per_param,
    grad_accumulation_note,
    layer_kernels,
    optimizer_step_time_s,
)
from commscope.estimate.compute.model import stage_compute
from commscope.errors import ConfigError
from commscope.estimate.iteration import estimate
from commscope.estimate.overlap import _late_gathers, _overlapped_buckets
from commscope.estimate.gpus import gpu_for_cluster, gpu_preset
from commscope.presets import cluster_preset, model_preset
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.workload.stages import pipeline_split
from strategies import estimate_jobs

H100 = cluster_preset("dgx-h100")
A100 = cluster_preset("dgx-a100")


def small(**changes) -> ModelSpec:
    base = dict(name="m", num_layers=8, hidden_size=2048, num_heads=16, seq_len=2048, vocab_size=32000)
    base.update(changes)
    return ModelSpec(**base)


PAR = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=16, micro_batch_size=2, sequence_parallel=True,
                   distributed_optimizer=True)


def iteration(model: ModelSpec, parallel: ParallelSpec = PAR, cluster=H100, **kw) -> float:
    return estimate(predict(model, parallel, cluster), **kw).iteration_time_s


# ----------------------------------------------------------------------------------------------- properties


@settings(max_examples=15, deadline=None)
@given(layers=st.integers(1, 4), width=st.sampled_from([1024, 2048, 3072]), seq=st.sampled_from([1024, 2048]))
def test_time_never_falls_when_flops_grow(layers, width, seq):
    model = small(num_layers=2 * layers, hidden_size=width, seq_len=seq)
    for bigger in (replace(model, num_layers=model.num_layers + 2), replace(model, hidden_size=width + 1024),
                   replace(model, seq_len=2 * seq), replace(model, ffn_hidden_size=8 * width)):
        assert iteration(bigger) >= iteration(model)


@settings(max_examples=10, deadline=None)
@given(scale=st.floats(0.2, 0.95))
def test_time_never_falls_when_peak_or_bandwidth_falls(scale):
    model = small()
    pred = predict(model, PAR, H100)
    gpu = gpu_for_cluster(H100)
    base = estimate(pred, gpu=gpu).iteration_time_s
    slower = replace(gpu, peak_flops={k: v * scale for k, v in gpu.peak_flops.items()})
    assert estimate(pred, gpu=slower).iteration_time_s >= base
    narrower = replace(gpu, memory_bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s * scale)
    assert estimate(pred, gpu=narrower).iteration_time_s >= base
    slow_net = replace(H100, intra_node=replace(H100.intra_node, bandwidth_bytes_per_s=H100.intra_node.bandwidth_bytes_per_s * scale),
                       inter_node=replace(H100.inter_node, bandwidth_bytes_per_s=H100.inter_node.bandwidth_bytes_per_s * scale))
    assert estimate(predict(model, PAR, slow_net), gpu=gpu).iteration_time_s >= base


@settings(max_examples=10, deadline=None)
@given(tp=st.sampled_from([2, 4, 8]), mb=st.sampled_from([1, 2, 4]))
def test_hidden_time_never_exceeds_the_compute_it_hides_under(tp, mb):
    model = small(num_heads=32)
    plain = ParallelSpec(tp=tp, dp=2, global_batch_size=8 * mb, micro_batch_size=mb, sequence_parallel=True,
                         distributed_optimizer=True)
    overlapped = replace(plain, tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True)
    a, b = estimate(predict(model, plain, H100)), estimate(predict(model, overlapped, H100))
    assert b.iteration_time_s <= a.iteration_time_s
    # exposed + hidden is the communication the plain run exposes, and nothing hides more than the compute
    assert b.tp_s + b.hidden_s.get("tp", 0.0) == pytest.approx(a.tp_s)
    assert b.hidden_s.get("tp", 0.0) <= b.compute_s
    assert b.hidden_s.get("dp", 0.0) <= b.compute_s
    assert all(v >= 0 for v in b.hidden_s.values())


def test_the_iteration_is_the_sum_of_its_terms():
    est = estimate(predict(small(), replace(PAR, overlap_grad_reduce=True, tp_comm_overlap=True), H100))
    terms = (est.compute_s + est.tp_s + est.pp_s + est.dp_s + est.ep_s + est.cp_s + est.emb_s + est.bubble_s
             + est.optimizer_s)
    assert terms == pytest.approx(est.iteration_time_s)
    m, p, v = PAR.num_micro_batches, PAR.pp, PAR.virtual_pipeline_size
    assert m * est.micro_batch_s + est.bubble_s + est.tail_s == pytest.approx(est.iteration_time_s)
    # the fill and drain pass through the other stages, none slower than the critical one
    assert 0 < est.bubble_s <= (p - 1) / v * est.micro_batch_s * (1 + 1e-12)


def test_seed_method_ignores_the_compute_model_and_the_overlap_flags():
    model = small()
    seed = estimate(predict(model, PAR, H100), method="seed")
    for changed in (replace(PAR, tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True),
                    replace(PAR, attention="unfused"), replace(PAR, fp8_format="hybrid")):
        other = estimate(predict(model, changed, H100), method="seed")
        assert other.iteration_time_s == seed.iteration_time_s
    # the talk's compute term, by hand: 6 N/(p t) b s per micro-batch at u x peak
    n = model.num_parameters(padded_vocab=True)
    comp = PAR.num_micro_batches * 6 * n / (PAR.pp * PAR.tp) * PAR.micro_batch_size * model.seq_len / (0.45 * 989e12)
    assert seed.compute_s == pytest.approx(comp)


# ----------------------------------------------------------------------------------------------- the compute model


def test_gpu_util_is_an_explicit_override():
    pred = predict(small(), PAR, H100)
    assert estimate(pred).compute_model == "gpu"
    flat = estimate(pred, gpu_util=0.5)
    assert flat.compute_model == "flops" and flat.gpu_util == 0.5
    assert any("--gpu-util" in n for n in flat.notes)


def test_a_cluster_without_a_gpu_preset_falls_back_with_a_note():
    custom = replace(H100, gpu="MysteryAccelerator")
    est = estimate(predict(small(), PAR, custom))
    assert est.compute_model == "flops"
    assert any("no GPU preset matches" in n for n in est.notes)


def test_big_gemms_run_closer_to_the_achievable_fraction_than_small_ones():
    gpu = gpu_for_cluster(H100)
    big = stage_compute(small(hidden_size=8192, num_heads=64), ParallelSpec(global_batch_size=8), gpu)
    tiny = stage_compute(small(hidden_size=512, num_heads=8), ParallelSpec(global_batch_size=8), gpu)
    assert tiny.gemm_efficiency < big.gemm_efficiency <= gpu.achievable_fraction


def test_recomputation_repeats_what_it_repeats():
    gpu = gpu_for_cluster(A100)
    model = small()
    none = stage_compute(model, ParallelSpec(global_batch_size=8, attention="unfused"), gpu)
    full = stage_compute(model, ParallelSpec(global_batch_size=8, recompute="full", attention="unfused"), gpu)
    sel = stage_compute(model, ParallelSpec(global_batch_size=8, recompute="selective", attention="unfused"), gpu)
    flash_sel = stage_compute(model, ParallelSpec(global_batch_size=8, recompute="selective"), gpu)
    assert none.recompute_s[0] == 0
    assert full.recompute_s[0] == pytest.approx(none.forward_s[0] - _extra_fwd(model, gpu), rel=1e-9)
    assert 0 < sel.recompute_s[0] < full.recompute_s[0]
    # Megatron-core's selective recomputation checkpoints the core attention: the fused kernel's forward again,
    # once per layer, and its FLOPs are counted with it
    flash_fwd = layer_kernels(model, ParallelSpec(global_batch_size=8), gpu).attention_fwd_s
    assert flash_sel.recompute_s[0] == pytest.approx(model.num_layers * flash_fwd, rel=1e-9)
    flash_none = stage_compute(model, ParallelSpec(global_batch_size=8), gpu)
    assert flash_sel.flop[0] > flash_none.flop[0]


def _extra_fwd(model, gpu):
    """The first and last stage's embedding, logits and loss: run once, not recomputed per layer."""
    one = stage_compute(replace(model, num_layers=1), ParallelSpec(global_batch_size=8, attention="unfused"), gpu)
    layer = stage_compute(replace(model, num_layers=2), ParallelSpec(global_batch_size=8, attention="unfused"), gpu)
    return one.forward_s[0] - (layer.forward_s[0] - one.forward_s[0])


def test_fp8_speeds_up_the_linear_gemms_on_h100_and_is_refused_on_a100():
    model = small(hidden_size=4096, num_heads=32)
    bf16 = estimate(predict(model, PAR, H100))
    fp8 = estimate(predict(model, replace(PAR, fp8_format="hybrid"), H100))
    assert fp8.compute_breakdown_s["gemm_s"] < 0.75 * bf16.compute_breakdown_s["gemm_s"]
    assert fp8.compute_breakdown_s["memory_bound_s"] > bf16.compute_breakdown_s["memory_bound_s"]  # the casts
    with pytest.raises(ConfigError, match="fp8"):
        estimate(predict(model, replace(PAR, fp8_format="hybrid"), A100))


def test_flash_attention_beats_unfused_on_long_sequences():
    gpu = gpu_for_cluster(A100)
    model = small(seq_len=8192)
    flash = layer_kernels(model, ParallelSpec(global_batch_size=8), gpu)
    unfused = layer_kernels(model, ParallelSpec(global_batch_size=8, attention="unfused"), gpu)
    assert flash.attention_flop > 0 and unfused.attention_flop == 0
    assert unfused.attention_fwd_s > 0 and flash.attention_fwd_s > 0


GPT_18B = ModelSpec(name="GPT 18.4B", num_layers=40, hidden_size=6144, num_heads=48, seq_len=2048, vocab_size=50257,
                    dtype="fp16")


def test_megatrons_fused_softmax_runs_only_where_its_kernel_can():
    """FusedScaleMaskSoftmax.is_kernel_available: fp16/bf16, 16 < s <= 4096, b x heads/t a multiple of 4 and of the
    kernel's rows per block (8 at s <= 128). vTrain's GPT 18.4B on t 16 at micro-batch 2: 6 rows, PyTorch's softmax."""
    def available(model, b, t, c=1):
        return fused_softmax_available(model, micro_batch_size=b, tp=t, cp=c)

    assert not available(GPT_18B, 2, 16)
    assert available(GPT_18B, 4, 16) and available(GPT_18B, 4, 4) and available(GPT_18B, 2, 8)
    assert not available(replace(GPT_18B, seq_len=8192), 4, 4)
    assert not available(replace(GPT_18B, dtype="fp32"), 4, 4) and available(replace(GPT_18B, dtype="bf16"), 4, 4)
    short = replace(GPT_18B, seq_len=128)  # 4 heads per rank on t 12: 4 rows at b 1, 8 at b 2
    assert not available(short, 1, 12) and available(short, 2, 12)
    assert available(GPT_18B, np.array([1, 2, 4]), np.array([16, 16, 16])).tolist() == [False, False, True]
    assert available(replace(GPT_18B, seq_len=8192), np.array([4]), 4).tolist() == [False]


def test_unfused_attention_pays_pytorchs_softmax_where_the_kernel_does_not_run():
    """Its bytes per score element: fp32 upcast, scale, masked_fill, softmax, downcast (36 against the kernel's 4
    forward, 40 against 6 backward, fp16); the estimate says why in a note."""
    gpu = gpu_for_cluster(A100)
    bw = gpu.streaming_bandwidth_bytes_per_s
    for b, fused in ((2, False), (4, True)):
        par = ParallelSpec(tp=16, dp=1, global_batch_size=b, micro_batch_size=b, attention="unfused")
        k = layer_kernels(GPT_18B, par, gpu)
        scores = b * 3 * 2048 * 2048
        assert k.attention_fwd_s * bw == pytest.approx((9 + (0 if fused else 32)) * scores, rel=1e-12)
        assert k.attention_bwd_s * bw == pytest.approx((11.5 + (0 if fused else 34)) * scores, rel=1e-12)
        notes = " ".join(stage_compute(GPT_18B, par, gpu).notes)
        assert ("fused softmax kernel does not run (micro-batch 2 x 3 heads per rank = 6" in notes) is not fused
    flash = ParallelSpec(tp=16, dp=1, global_batch_size=2, micro_batch_size=2)  # no softmax kernel to fall back from
    assert "softmax" not in " ".join(stage_compute(GPT_18B, flash, gpu).notes)


def test_optimizer_step_worked_example_and_sharding():
    # GPT-3 175B on t8 p16 d8 with the distributed optimizer: 1.37 G parameters per rank (docstring of kernels)
    model = model_preset("gpt3-175b")
    gpu = gpu_preset("a100")
    par = ParallelSpec(tp=8, pp=16, dp=8, global_batch_size=1536, distributed_optimizer=True)
    n = 1_370_000_000
    t = optimizer_step_time_s(model, par, gpu, dense_params=n, expert_params=0)
    assert model.dtype == "bf16"
    hbm = gpu.memory_efficiency * 2039e9  # the preset's 0.85 of the datasheet bandwidth
    assert gpu.memory_efficiency == 0.85
    assert t == pytest.approx((n / 8 * 38 + n * 4) / hbm + gpu.kernel_overhead_s, rel=1e-9)
    assert t * 1e3 == pytest.approx(6.9, abs=0.05)
    unsharded = optimizer_step_time_s(model, replace(par, distributed_optimizer=False), gpu, dense_params=n, expert_params=0)
    assert unsharded == pytest.approx(n * 42 / hbm + gpu.kernel_overhead_s, rel=1e-9)  # 4.8x


def test_without_gradient_accumulation_fusion_each_micro_batch_adds_its_weight_gradients():
    """Worked example of compute.kernels: GPT 18.4B (fp16) on t4 p2, 8 micro-batches: 6 bytes per parameter of the
    rank per micro-batch (2.36 G on the first stage: 8.2 ms), in backward only, and said in a note; bf16 models
    accumulate in fp32 (10 bytes), or in bf16 where their gradients are reduced in bf16 (6)."""
    gpu = gpu_preset("a100")
    bw = gpu.streaming_bandwidth_bytes_per_s
    fused = ParallelSpec(tp=4, pp=2, dp=32, global_batch_size=1024, micro_batch_size=4, attention="unfused")
    unfused = replace(fused, gradient_accumulation_fusion=False)
    assert grad_accumulation_bytes_per_param(GPT_18B, fused) == 0
    assert grad_accumulation_bytes_per_param(GPT_18B, unfused) == 6
    bf16 = replace(GPT_18B, dtype="bf16")
    assert grad_accumulation_bytes_per_param(bf16, unfused) == 10
    assert grad_accumulation_bytes_per_param(bf16, replace(unfused, grad_reduce_dtype="bf16")) == 6
    a, b = stage_compute(GPT_18B, fused, gpu), stage_compute(GPT_18B, unfused, gpu)
    np.testing.assert_array_equal(a.forward_s, b.forward_s)
    added = b.backward_s - a.backward_s
    params = np.array([2_356_316_160, 2_343_745_536])  # the first stage holds the embedding, the last its norm
    np.testing.assert_allclose(added, params * 6 / bw, rtol=1e-12)
    np.testing.assert_allclose(b.memory_s - a.memory_s, added, rtol=1e-12)
    assert added[0] * 1e3 == pytest.approx(8.2, abs=0.05)
    note = "separate kernel each micro-batch (--no-gradient-accumulation-fusion): 6 bytes per parameter of the rank, 8 times"
    assert note in " ".join(b.notes) and "gradient" not in " ".join(a.notes)
    one = replace(unfused, global_batch_size=128)  # one micro-batch: said "once", not "1 times"
    assert grad_accumulation_note(GPT_18B, one) == (
        "weight gradients added into the accumulated gradients by a separate kernel each micro-batch "
        "(--no-gradient-accumulation-fusion): 6 bytes per parameter of the rank, once per iteration")
    cluster = replace(A100, inter_node=replace(A100.inter_node, bandwidth_bytes_per_s=12.5e9))
    grew = iteration(GPT_18B, unfused, cluster) - iteration(GPT_18B, fused, cluster)
    # the critical stage's 8 micro-batches, and at most one of the other stage's in the pipeline's fill and drain
    assert 8 * added[0] < grew <= 8 * added[0] + added[1]


# ----------------------------------------------------------------------------------------------- overlap arithmetic


def test_one_bucket_cannot_overlap_the_backward_that_fills_it():
    assert _overlapped_buckets([0.3], window=1.0) == pytest.approx(0.3)
    assert _overlapped_buckets([], window=1.0) == 0.0


def test_buckets_reduce_while_later_ones_fill():
    # two equal buckets of 0.2 s in a 1 s backward: the first is ready at 0.5 s, done at 0.7 s; the second is
    # ready at 1 s and done at 1.2 s: 0.2 s exposed. Four buckets of 0.1 s: only the last one's 0.1 s shows.
    assert _overlapped_buckets([0.2, 0.2], window=1.0) == pytest.approx(0.2)
    assert _overlapped_buckets([0.1] * 4, window=1.0) == pytest.approx(0.1)
    # comm longer than the backward: the queue runs past it
    assert _overlapped_buckets([0.5, 0.5, 0.5], window=0.3) == pytest.approx(1.5 - 0.3 + 0.1, abs=0.11)


def test_parameter_gathers_delay_the_forward_only_when_late():
    assert _late_gathers([0.01] * 4, window=1.0) == pytest.approx(0.01)  # the first bucket is needed at once
    assert _late_gathers([0.5, 0.5], window=0.2) == pytest.approx(0.9)


# ----------------------------------------------------------------------------------------------- pipelines


def test_llama3_405b_on_pp16_gets_megatrons_split_and_an_estimate():
    model = model_preset("llama3-405b")
    par = ParallelSpec(tp=8, pp=16, dp=128, global_batch_size=2048, sequence_parallel=True, distributed_optimizer=True)
    assert pipeline_split(model, par) == [7] + [8] * 14 + [7]
    est = estimate(predict(model, par, H100))
    assert any("pipeline split 7,8x14,7: pp=16 does not divide num_layers=126" in n for n in est.notes)
    assert est.hidden_s == {} or all(v >= 0 for v in est.hidden_s.values())


def test_interleaved_pipeline_that_does_not_divide_the_layers_gets_lighter_end_chunks():
    """Llama 3 405B's 126 layers on pp = 16 with 2 chunks per stage (Meta's interleaved run): stages of 7, 8 x 14, 7
    as without interleaving, each spread over its chunks, the lighter chunk first on the first stage and last on
    the last (was: an error asking for --pipeline-layers)."""
    model = model_preset("llama3-405b")
    par = ParallelSpec(tp=8, pp=16, dp=128, global_batch_size=2048, sequence_parallel=True, distributed_optimizer=True,
                       virtual_pipeline_size=2)
    assert pipeline_split(model, par) == [3] + [4] * 30 + [3]
    three = pipeline_split(model, replace(par, virtual_pipeline_size=3))
    stages = [sum(three[c * 16 + s] for c in range(3)) for s in range(16)]
    assert stages == [7] + [8] * 14 + [7] and max(three) - min(three) == 1
    assert three[0] == 2 and three[-1] == 2  # the pipeline's first and last chunks are the light ones
    est = estimate(predict(model, par, H100))
    note = next(n for n in est.notes if n.startswith("pipeline split"))
    assert note.startswith("pipeline split 3,4x30,3 (chunks in chunk x pp + stage order; the stages hold 7,8x14,7)")
    assert "2 stages hold 7 layers and 14 hold 8, the first and last among the lighter" in note
    assert "as Megatron-core splits it with --account-for-embedding-in-pipeline-split" in note
    with pytest.raises(ConfigError, match=r"virtual_pipeline_size=9: pp x virtual_pipeline_size = 144 pipeline chunks is "
                                          r"more than num_layers=126 \(with pp=16: virtual_pipeline_size <= 7\)"):
        pipeline_split(model, replace(par, virtual_pipeline_size=9))
    # pp divides the layers, pp x v does not: equal stages, each spread over its chunks; no "lighter" stages
    even = estimate(predict(model_preset("llama3-70b"), ParallelSpec(tp=8, pp=16, dp=4, global_batch_size=64,
                                                                       virtual_pipeline_size=3), H100))
    note = next(n for n in even.notes if n.startswith("pipeline split"))
    assert "the stages hold 5x16" in note and "lighter" not in note


def test_decoder_first_and_last_layers_with_interleaving_split_each_stage_over_its_chunks():
    """Megatron-core: with --num-virtual-stages-per-pipeline-rank every stage's layers, the first and last stage's
    given by --decoder-first/last-pipeline-num-layers, split evenly over its chunks."""
    model = model_preset("llama3-405b")
    par = ParallelSpec(tp=8, pp=16, dp=1, global_batch_size=16, virtual_pipeline_size=2,
                       decoder_first_pipeline_num_layers=6, decoder_last_pipeline_num_layers=8)
    assert pipeline_split(model, par) == [3] + [4] * 15 + [3] + [4] * 15
    with pytest.raises(ConfigError, match="decoder_first_pipeline_num_layers=7: every pipeline stage's layers must "
                                          "split evenly over its virtual_pipeline_size=2 chunks"):
        pipeline_split(model, replace(par, decoder_first_pipeline_num_layers=7, decoder_last_pipeline_num_layers=7))


def test_decoder_first_and_last_pipeline_layers():
    model = model_preset("llama3-405b")
    par = ParallelSpec(tp=8, pp=16, dp=1, global_batch_size=16, decoder_first_pipeline_num_layers=6,
                       decoder_last_pipeline_num_layers=8)
    assert pipeline_split(model, par) == [6] + [8] * 15
    with pytest.raises(ConfigError, match="decoder_first_pipeline_num_layers=5: leaves 113 of num_layers=126 for the "
                                          "other 14 stage.s., which must hold at least 1 layer each, evenly; valid "
                                          "here: 6, 20, 34, 48, 62, 76, ..."):
        pipeline_split(model, replace(par, decoder_first_pipeline_num_layers=5))
    # the whole model in the first stage leaves nothing for the others (was: "the remaining 0 ... must split evenly")
    with pytest.raises(ConfigError, match="=118: leaves 0 of num_layers=126 for the other 14 stage"):
        pipeline_split(model, replace(par, decoder_first_pipeline_num_layers=118))
    with pytest.raises(ConfigError, match="not both"):
        ParallelSpec(pp=2, global_batch_size=2, pipeline_layers=(1, 1), decoder_first_pipeline_num_layers=1)


def test_overlap_flags_refuse_what_megatron_refuses():
    with pytest.raises(ConfigError, match="tp_comm_overlap.*sequence parallelism"):
        ParallelSpec(tp=2, global_batch_size=2, tp_comm_overlap=True)
    with pytest.raises(ConfigError, match="overlap_param_gather.*distributed optimizer"):
        ParallelSpec(global_batch_size=2, overlap_param_gather=True)
    with pytest.raises(ConfigError, match="fp8_format"):
        ParallelSpec(global_batch_size=2, fp8_format="e5m2")


def test_a_gpu_without_flash_attention_runs_it_unfused():
    v100 = cluster_preset("dgx1-v100")
    est = estimate(predict(small(), PAR, v100))
    assert any("no fused (flash) attention" in n for n in est.notes)
    unfused = estimate(predict(small(), replace(PAR, attention="unfused"), v100))
    assert est.iteration_time_s == pytest.approx(unfused.iteration_time_s)


def test_run_lengths_write_long_runs_as_value_x_count():
    from commscope.pattern.workload.stages import run_lengths

    assert run_lengths([7] + [8] * 14 + [7]) == "7,8x14,7"
    assert run_lengths([3, 3, 4, 4, 4]) == "3,3,4x3"
    assert run_lengths([]) == ""


@settings(max_examples=40, deadline=None)
@given(estimate_jobs(max_world=128))
def test_stage_layers_count_what_the_stage_params_of_each_chunk_hold(job):
    """stage_compute reads each stage's layers and parameters in closed form (_stage_layers, no loop over stages or
    layers); they are what the per-chunk definition gives: virtual_stage_layers, is_moe_layer and stage_params
    summed over the stage's chunks (the first chunk of stage 0 holds the embedding, the last of the last stage the
    output layer), for uneven splits, interleaving and MoE layer patterns."""
    from commscope.estimate.compute.model import _stage_layers
    from commscope.pattern.workload.stages import virtual_stage_layers
    from commscope.spec.params import stage_params

    model, parallels = job
    for par in parallels:
        p, v = par.pp, par.virtual_pipeline_size
        virtual = virtual_stage_layers(model, par)
        dense, moe, dense_params, expert_params = _stage_layers(model, par)
        for stage in range(p):
            chunks = [virtual[c * p + stage] for c in range(v)]
            held = [stage_params(model, chunk, tp=par.tp, ep=par.ep, first=stage == 0 and i == 0,
                                 last=stage == p - 1 and i == v - 1) for i, chunk in enumerate(chunks)]
            num_moe = sum(model.is_moe_layer(layer) for chunk in chunks for layer in chunk)
            assert moe[stage] == num_moe
            assert dense[stage] == sum(len(chunk) for chunk in chunks) - num_moe
            assert dense_params[stage] == sum(s.dense for s in held)
            assert expert_params[stage] == sum(s.expert for s in held)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40_000), st.integers(1, 40_000), st.integers(1, 40_000),
                          st.integers(1, 64)), min_size=1, max_size=12),
       st.sampled_from(["A100", "H100", "V100"]), st.sampled_from(["bf16", "fp32"]))
def test_a_gemm_timer_times_each_gemm_as_time_gemms_does(shapes, gpu_name, dtype):
    """stage_compute announces every GEMM of a job to one GemmTimer and reads plain times back (times_s); each is
    the time_s of time_gemms' result, bit for bit, however many other shapes were timed in the same call, and the
    timer's own results (__call__) are time_gemms' too."""
    from commscope.estimate.compute.gemm import Gemm, GemmTimer, time_gemms

    gpu = gpu_preset(gpu_name)
    gemms = [Gemm(name="qkv", pass_="fwd", m=m, n=n, k=k, count=count, dims=(("tokens", 1), ("hidden", 1), ("hidden", 1)),
                  part="attention", io_elements=m * k + k * n + m * n) for m, n, k, count in shapes]
    want = time_gemms([(g, 1) for g in gemms], gpu, dtype)
    timer = GemmTimer(gpu)
    timer.prefetch(gemms[::-1], dtype)
    assert timer.times_s(gemms, dtype) == [r.time_s for r in want]
    assert timer.times_s(gemms[:1], dtype) == [want[0].time_s]
    assert timer([(g, 1) for g in gemms], gpu, dtype) == want


def test_a_gemm_timer_times_shapes_announced_after_it_has_timed_others():
    """A shape the timer has not seen (asked for, or announced after a first timing) is timed with those it has:
    every shape's time stays time_gemms', those timed first included."""
    from commscope.estimate.compute.gemm import Gemm, GemmTimer, time_gemms

    gpu = gpu_preset("H100")
    dims = (("tokens", 1), ("hidden", 1), ("hidden", 1))
    gemms = [Gemm(name="qkv", pass_="fwd", m=m, n=n, k=k, count=2, dims=dims, part="attention",
                  io_elements=m * k + k * n + m * n) for m, n, k in ((4096, 4096, 4096), (8, 100, 7), (512, 3072, 1024))]
    want = [r.time_s for r in time_gemms([(g, 1) for g in gemms], gpu, "bf16")]
    timer = GemmTimer(gpu)
    timer.prefetch(gemms[:1], "bf16")
    assert timer.times_s(gemms[:1], "bf16") == want[:1]
    assert timer.times_s(gemms[1:2], "bf16") == want[1:2]  # never announced
    timer.prefetch(gemms[2:], "bf16")
    assert timer.times_s(gemms, "bf16") == want


def test_first_max_of_one_row_is_that_row_among_many():
    """first_max of one configuration (a row read as numbers) picks the stage it picks for that row among others
    (numpy on the stacked rows): near-ties within 1e-9 go to the first, as the scalar and many paths need."""
    from commscope.estimate.compute.model import first_max

    rng = np.random.default_rng(0)
    for _ in range(2000):
        p = int(rng.integers(1, 20))
        row = np.round(rng.random(p), int(rng.integers(0, 3))) * rng.choice([1.0, -1.0, 1e-6])
        row[int(rng.integers(0, p))] *= 1 + 1e-12  # a near-tie with a rounding difference
        many = first_max(np.stack([row, rng.random(p)]))
        assert int(first_max(row)) == int(first_max(row[None, :])[0]) == int(many[0])
    assert first_max(np.array([[1.0, 3.0, 3.0 - 1e-12, 2.0]])).tolist() == [1]


@settings(max_examples=40, deadline=None)
@given(estimate_jobs(max_world=128))
def test_the_estimate_paths_gemm_rows_are_the_gemms_layer_gemms_lists(job):
    """stage_compute and estimate_many read a job's GEMMs as light rows (_gemm_rows: the attention's made once for
    every layer kind, each forward GEMM's sizes once for its three passes); each row is the Gemm layer_gemms lists
    in its place (name, pass, M, N, K, batch, elements moved, calls, FLOP), for both attentions, every layer kind and
    the output layer; and the stage ends' bytes (stage_ends_bytes) are stage_extra_bytes of each end, to the bit."""
    from commscope.estimate.compute.gemm import _gemm_rows, layer_dims, layer_gemms
    from commscope.estimate.compute.kernels import stage_extra_bytes
    from commscope.estimate.compute.model import stage_ends_bytes
    from commscope.estimate.stage_structure import _layer_kinds

    def as_rows(gemms):
        return [(g.name, g.pass_, (g.m, g.n, g.k, g.batch, g.io_elements), g.count, g.flop) for g in gemms]

    model, parallels = job
    for par in parallels:
        dims = layer_dims(model, tp=par.tp, cp=par.cp, ep=par.ep, micro_batch_size=par.micro_batch_size)
        for attention in ("flash", "unfused"):
            core = _gemm_rows(model, par, dims, part="attention", attention=attention)
            for kind in _layer_kinds(model):
                rows = core + _gemm_rows(model, par, dims, part=kind, attention=attention)
                assert [tuple(r) for r in rows] == as_rows(layer_gemms(model, par, layer_kind=kind, attention=attention))
        assert [tuple(r) for r in _gemm_rows(model, par, dims, part="logits")] == as_rows(
            layer_gemms(model, par, logits=True))
        ends = [stage_extra_bytes(model, par, first=f, last=la)
                for f, la in ((True, False), (False, False), (False, True), (True, True))]
        assert stage_ends_bytes(model, par) == ends


def test_a_gemm_is_timed_with_the_constants_of_the_gpu_object_it_is_given():
    """The GEMM model's table of a GPU's kernels (_pick's candidates and their K-step times) is made once per GPU
    object: a GPU made anew with other constants, even where it takes the place (and the id) of one dropped, is timed
    with its own; a compute-bound GEMM takes longer at every lower achievable fraction."""
    from commscope.estimate.compute.gemm import gemm_timing

    base = gpu_preset("h100")
    times = []
    for fraction in np.linspace(0.9, 0.3, 25):
        gpu = replace(base, achievable_fraction=float(fraction))
        times.append(float(gemm_timing(gpu, 8192, 8192, 8192, dtype="bf16").time_s))
        del gpu
    assert all(a < b for a, b in pairwise(times))
    same = replace(base, achievable_fraction=0.6)
    assert float(gemm_timing(same, 8192, 8192, 8192, dtype="bf16").time_s) == times[12]
