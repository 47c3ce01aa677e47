"""Memory per GPU against ZeRO's and Korthikanti et al.'s closed forms, invariants, and the vectorised twin."""

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings

from commscope.estimate import memory
from commscope.errors import ConfigError
from commscope.estimate.memory import (
    MemoryBreakdown,
    layer_activation_bytes,
    memory_per_gpu,
    memory_per_stage,
    optimizer_bytes_per_param,
    total_memory_bytes,
)
from commscope.spec.files import load_model
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.spec.params import stage_params
from commscope.units import GB, GiB
from strategies import jobs

# Shapes written out here (not read from presets) so that the expected numbers stay next to their source.
GPT3_175B = ModelSpec(name="gpt3-175b", num_layers=96, hidden_size=12288, num_heads=96, vocab_size=50257, seq_len=2048)
"""Brown et al. 2020 Table 2.1; the model of [korthikanti-2022]'s Table 3 (t 8, p 8)."""
GPT_1_5B = ModelSpec(name="gpt-1.5b", num_layers=24, hidden_size=2304, num_heads=24, vocab_size=50257, seq_len=1024)
LLAMA2_7B = ModelSpec(
    name="llama2-7b", num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=11008, vocab_size=32000,
    seq_len=4096, tied_embeddings=False, position_embedding="rope", gated_mlp=True, bias=False,
    normalization="rmsnorm",
)
LLAMA3_70B = ModelSpec(
    name="llama3-70b", num_layers=80, hidden_size=8192, num_heads=64, num_query_groups=8, ffn_hidden_size=28672,
    vocab_size=128256, seq_len=8192, tied_embeddings=False, position_embedding="rope", gated_mlp=True, bias=False,
    normalization="rmsnorm",
)
MIXTRAL = ModelSpec(
    name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_query_groups=8, ffn_hidden_size=14336,
    vocab_size=32000, seq_len=4096, tied_embeddings=False, position_embedding="rope", gated_mlp=True, bias=False,
    normalization="rmsnorm", num_experts=8, top_k=2, moe_ffn_hidden_size=14336,
)
DEEPSEEK_LIKE = ModelSpec(
    name="deepseek-moe-like", num_layers=28, hidden_size=2048, num_heads=16, ffn_hidden_size=10944,
    vocab_size=102400, seq_len=4096, tied_embeddings=False, position_embedding="rope", gated_mlp=True, bias=False,
    normalization="rmsnorm", num_experts=64, top_k=6, moe_ffn_hidden_size=1408, num_shared_experts=2,
    first_k_dense_layers=1,
)


def _parallel(**kw) -> ParallelSpec:
    kw.setdefault("global_batch_size", kw.get("micro_batch_size", 1) * kw.get("dp", 1) * 8)
    return ParallelSpec(**kw)


def _states(mb: MemoryBreakdown) -> float:
    return mb.weights_bytes + mb.grads_bytes + mb.optimizer_bytes


def _vectorised(model: ModelSpec, parallel: ParallelSpec, **kw) -> float:
    return float(total_memory_bytes(
        model, tp=parallel.tp, pp=parallel.pp, dp=parallel.dp, cp=parallel.cp, ep=parallel.ep,
        micro_batch_size=parallel.micro_batch_size, global_batch_size=parallel.global_batch_size,
        virtual_pipeline_size=parallel.virtual_pipeline_size, sequence_parallel=parallel.sequence_parallel,
        recompute=parallel.recompute, zero_stage=parallel.zero_stage,
        distributed_optimizer=parallel.distributed_optimizer, schedule=parallel.schedule,
        grad_reduce_dtype=parallel.grad_reduce_dtype, attention=parallel.attention, **kw,
    ))


def test_public_api():
    for name in memory.__all__:
        assert hasattr(memory, name), name


def test_breakdown_is_frozen_and_serialisable():
    mb = MemoryBreakdown(weights_bytes=1.0, grads_bytes=2.0, optimizer_bytes=3.0, activations_bytes=4.0, stage=1)
    assert mb.total_bytes == 10.0
    assert mb.to_dict() == {"weights_bytes": 1.0, "grads_bytes": 2.0, "optimizer_bytes": 3.0,
                            "activations_bytes": 4.0, "stage": 1, "total_bytes": 10.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        mb.stage = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        MemoryBreakdown(1.0, 2.0, 3.0, 4.0, 0)  # type: ignore[misc]  # keyword-only


# ----- model states [zero-2020] ---------------------------------------------------------------------------------


def test_unsharded_model_states_are_18_bytes_per_parameter_for_bf16():
    """bf16 weights 2 B + fp32 main grads 4 B + Adam's fp32 master, momentum, variance 12 B."""
    n = LLAMA2_7B.num_parameters(padded_vocab=True)
    assert n == 6_738_415_616  # Llama 2 7B, as Hugging Face counts it (32000 is already a multiple of 128)
    mb = memory_per_gpu(LLAMA2_7B, _parallel())
    assert mb.weights_bytes == 2 * n
    assert mb.grads_bytes == 4 * n
    assert mb.optimizer_bytes == 12 * n
    assert _states(mb) == 18 * n == 121_291_481_088


@pytest.mark.parametrize("dtype,optimizer,per_param", [
    ("fp16", "adam", 2 + 2 + 12),  # the [zero-2020] figure: 16 Psi
    ("fp32", "adam", 4 + 4 + 8),  # no master copy: the weights are fp32 already
    ("bf16", "sgd", 2 + 4 + 8),  # master copy + momentum
    ("bf16", "adamw", 2 + 4 + 12),
])
def test_model_states_per_dtype_and_optimizer(dtype, optimizer, per_param):
    model = dataclasses.replace(GPT_1_5B, dtype=dtype)
    n = model.num_parameters(padded_vocab=True)
    assert _states(memory_per_gpu(model, _parallel(), optimizer=optimizer)) == per_param * n


def test_zero_figure_1_of_the_paper():
    """[zero-2020] Figure 1: Psi = 7.5B, N_d = 64, K = 12, fp16: 120 / 31.4 / 16.6 / 1.9 GB per GPU."""
    model = dataclasses.replace(GPT_1_5B, dtype="fp16")
    n = model.num_parameters(padded_vocab=True)
    psi = 7.5e9
    expected_gb = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected_gb.items():
        mb = memory_per_gpu(model, _parallel(dp=64, zero_stage=stage))
        assert _states(mb) / n * psi / GB == pytest.approx(gb, abs=0.05)


def test_zero_stages_reduce_memory_monotonically():
    totals = [memory_per_gpu(LLAMA2_7B, _parallel(tp=2, dp=8, zero_stage=z)).total_bytes for z in range(4)]
    assert totals[0] > totals[1] > totals[2] > totals[3]
    dist_opt = memory_per_gpu(LLAMA2_7B, _parallel(tp=2, dp=8, distributed_optimizer=True))
    assert dist_opt.total_bytes == totals[1]  # the distributed optimizer shards like ZeRO-1
    # with one data-parallel rank there is nothing to shard over
    single = {memory_per_gpu(LLAMA2_7B, _parallel(zero_stage=z)).total_bytes for z in range(4)}
    assert len(single) == 1


def test_zero_shards_over_dp_times_cp_and_experts_over_expert_dp():
    dense = memory_per_gpu(LLAMA2_7B, _parallel(dp=2, cp=4, zero_stage=3))
    n = LLAMA2_7B.num_parameters(padded_vocab=True)
    assert _states(dense) == pytest.approx(18 * n / 8)
    parallel = _parallel(dp=4, cp=2, ep=8, zero_stage=3)  # expert-data-parallel size 4 x 2 / 8 = 1
    stage = memory_per_stage(MIXTRAL, parallel)[0]
    unsharded = memory_per_stage(MIXTRAL, dataclasses.replace(parallel, zero_stage=0))[0]
    sp = stage_params(MIXTRAL, range(MIXTRAL.num_layers), tp=1, ep=8, first=True, last=True)
    assert _states(unsharded) == 18 * sp.total
    assert _states(stage) == pytest.approx(18 * (sp.dense / 8 + sp.expert / 1))


def test_invalid_optimizer_is_named():
    with pytest.raises(ValueError, match="optimizer='lion'"):
        memory_per_gpu(GPT_1_5B, _parallel(), optimizer="lion")
    with pytest.raises(ValueError, match="lion.*valid: adam"):
        total_memory_bytes(GPT_1_5B, tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=8, optimizer="lion")
    with pytest.raises(ValueError, match="lion"):
        optimizer_bytes_per_param(GPT_1_5B, "lion")


def test_invalid_recompute_code_name_is_named():
    with pytest.raises(ConfigError, match="recompute='sometimes'"):
        total_memory_bytes(GPT_1_5B, tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=8,
                           recompute=np.array(["none", "sometimes"]))


def test_invalid_job_is_refused():
    with pytest.raises(ConfigError, match="tp=5: must divide num_heads=24"):
        memory_per_gpu(GPT_1_5B, _parallel(tp=5))


# ----- activations [korthikanti-2022] ---------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_per_layer_activations_are_the_papers_table_2(t):
    """GPT shape (multi-head attention, f = 4h, 16-bit): the five rows of Table 2 and full recomputation. The paper's
    runs used unfused attention (Megatron-LM 2022), whose s x s scores are the 5 a s / h term."""
    model = GPT3_175B
    s, b, h, a = model.seq_len, 2, model.hidden_size, model.num_heads
    sbh = s * b * h
    table = {
        (False, "none"): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        (True, "none"): sbh * (34 / t + 5 * a * s / (h * t)),
        (False, "selective"): sbh * (10 + 24 / t),
        (True, "selective"): sbh * 34 / t,
        (False, "full"): sbh * 2,
        (True, "full"): sbh * 2 / t,
    }
    for (sp, recompute), expected in table.items():
        parallel = _parallel(tp=t, micro_batch_size=b, sequence_parallel=sp, recompute=recompute, attention="unfused")
        assert layer_activation_bytes(model, parallel, 0) == pytest.approx(expected, rel=1e-12), (sp, recompute)
        # flash attention keeps no scores: one fp32 log-sum-exp per head and token instead, split over t
        flash = _parallel(tp=t, micro_batch_size=b, sequence_parallel=sp, recompute=recompute)
        lse = s * b * 4 * a / t if recompute == "none" else 0.0
        no_scores = expected - (sbh * 5 * a * s / (h * t) if recompute == "none" else 0.0)
        assert layer_activation_bytes(model, flash, 0) == pytest.approx(no_scores + lse, rel=1e-12), (sp, recompute)
    if t == 1:  # no parallelism: s b h (34 + 5 a s / h)
        assert layer_activation_bytes(model, _parallel(micro_batch_size=b, attention="unfused"), 0) == pytest.approx(
            sbh * (34 + 5 * a * s / h), rel=1e-12)


def test_pytorchs_softmax_keeps_its_output_in_fp32():
    """Where Megatron's fused softmax kernel does not run (b x heads/t = 6 here), PyTorch's fp32 softmax saves its
    output in fp32: 2 more bytes per score element than the kernel's fp16 (without recomputation only)."""
    model = ModelSpec(name="GPT 18.4B", num_layers=40, hidden_size=6144, num_heads=48, seq_len=2048,
                      vocab_size=50257, dtype="fp16")
    s, h, a, t = model.seq_len, model.hidden_size, model.num_heads, 16
    for b, extra in ((2, 2 * a * s / t), (4, 0.0)):
        par = _parallel(tp=t, micro_batch_size=b, attention="unfused")
        assert layer_activation_bytes(model, par, 0) == pytest.approx(
            s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + s * b * extra, rel=1e-12)
        assert _vectorised(model, par) == pytest.approx(memory_per_gpu(model, par).total_bytes, rel=1e-12)
        full = _parallel(tp=t, micro_batch_size=b, attention="unfused", recompute="full")
        assert layer_activation_bytes(model, full, 0) == s * b * h * 2


def test_flash_attention_run_fits_where_unfused_does_not():
    """llama3-405b, t8 p16 with SP and no recomputation, s = 8192: the unfused score matrices alone would take
    a s^2 (2B + 1) / t per layer and micro-batch; with flash attention (Megatron-core's default) they are gone, so
    the memory model must not count them (it once reported 681 GiB for this job, 81 GiB without them)."""
    model = load_model("llama3-405b")
    kw = dict(tp=8, pp=16, dp=128, micro_batch_size=1, global_batch_size=2048, sequence_parallel=True,
              distributed_optimizer=True)
    flash = memory_per_gpu(model, ParallelSpec(**kw)).total_bytes
    unfused = memory_per_gpu(model, ParallelSpec(**kw, attention="unfused")).total_bytes
    a, s = model.num_heads, model.seq_len
    scores_per_layer = a * s * s * 5 / 8  # 2 B + 1 = 5 bytes per score, split over t = 8
    assert unfused - flash > scores_per_layer  # at least one layer's scores, held for one micro-batch
    selective = memory_per_gpu(model, ParallelSpec(**kw, recompute="selective")).total_bytes
    # flash without recomputation keeps what selective recomputation keeps, plus the 4 a bytes per token
    assert 0 < flash - selective < 0.01 * selective
    assert unfused > 5 * flash
    even = load_model("llama3-70b")  # the closed form is for even splits: 80 layers over pp = 4
    kw.update(pp=4, dp=32, global_batch_size=512)
    for recompute in ("none", "selective", "full"):
        for attention in ("flash", "unfused"):
            par = ParallelSpec(**kw, recompute=recompute, attention=attention)
            assert _vectorised(even, par) == pytest.approx(memory_per_gpu(even, par).total_bytes, rel=1e-9)


def test_gpt3_175b_worked_example():
    parallel = _parallel(tp=8, pp=8, sequence_parallel=True, recompute="selective", global_batch_size=64)
    per_layer = layer_activation_bytes(GPT3_175B, parallel, 0)
    assert per_layer == 34 * 2048 * 12288 / 8 == 106_954_752
    stage0 = memory_per_stage(GPT3_175B, parallel)[0]
    embedding_mask = 2048 * 12288 / 8  # s b h / t, [korthikanti-2022] section 4.3
    assert stage0.activations_bytes == pytest.approx(8 * (12 * per_layer + embedding_mask))
    assert stage0.activations_bytes / GiB == pytest.approx(9.6, abs=0.05)


def test_context_parallel_uses_s_over_c():
    base = _parallel(tp=2, micro_batch_size=1)
    with_cp = _parallel(tp=2, cp=4, micro_batch_size=1)
    short = dataclasses.replace(GPT_1_5B, seq_len=GPT_1_5B.seq_len // 4)
    assert layer_activation_bytes(GPT_1_5B, with_cp, 0) == pytest.approx(layer_activation_bytes(short, base, 0))


def test_recompute_full_below_selective_below_none():
    for model in (GPT3_175B, LLAMA3_70B, MIXTRAL):
        acts = {rc: memory_per_gpu(model, _parallel(tp=8, pp=4, dp=2, recompute=rc, sequence_parallel=True,
                                                     ep=2 if model.is_moe else 1)).activations_bytes
                for rc in ("none", "selective", "full")}
        assert acts["full"] < acts["selective"] < acts["none"], model.name


def test_sequence_parallel_reduces_activations():
    for model, t in ((GPT3_175B, 8), (LLAMA3_70B, 4), (MIXTRAL, 2)):
        for rc in ("none", "selective", "full"):
            off = memory_per_gpu(model, _parallel(tp=t, pp=2, recompute=rc)).activations_bytes
            on = memory_per_gpu(model, _parallel(tp=t, pp=2, recompute=rc, sequence_parallel=True)).activations_bytes
            assert on < off, (model.name, rc)
    # without tensor parallelism sequence parallelism is a no-op
    assert (memory_per_gpu(GPT_1_5B, _parallel(sequence_parallel=True)).total_bytes
            == memory_per_gpu(GPT_1_5B, _parallel()).total_bytes)


def test_moe_expert_activations_scale_with_top_k():
    t = 2
    parallel = _parallel(tp=t, dp=2, ep=2, recompute="selective")
    one, two = (layer_activation_bytes(dataclasses.replace(MIXTRAL, top_k=k), parallel, 0) for k in (1, 2))
    tokens, h, f, B = MIXTRAL.seq_len, MIXTRAL.hidden_size, MIXTRAL.moe_ffn, 2
    # one more copy of each token: its dispatched input (h B) and the expert's SwiGLU tensors (3 f B / t)
    assert two - one == tokens * (h * B + 3 * f * B / t)


def test_gated_mlp_and_gqa_generalise_the_34():
    """Llama shape, selective + SP: per token (10 h + (2 a d_h + 2 g d_h) B + 3 f B) / t."""
    m = LLAMA3_70B
    parallel = _parallel(tp=8, sequence_parallel=True, recompute="selective")
    h, f, kv = m.hidden_size, m.ffn, m.kv_heads * m.head_size
    per_token = (10 * h + (2 * h + 2 * kv) * 2 + 3 * f * 2) / 8
    assert layer_activation_bytes(m, parallel, 0) == m.seq_len * per_token == 297_795_584


# ----- pipeline schedules ---------------------------------------------------------------------------------------


def _layer(model, parallel):
    return layer_activation_bytes(model, parallel, 0)


def test_1f1b_stage_i_holds_min_p_minus_i_micro_batches():
    for m in (2, 8):
        parallel = _parallel(tp=2, pp=4, micro_batch_size=1, global_batch_size=m, recompute="selective")
        per_layer = _layer(GPT_1_5B, parallel)
        stages = memory_per_stage(GPT_1_5B, parallel)
        for i in (1, 2):  # no embedding or output terms in the middle
            assert stages[i].activations_bytes == pytest.approx(min(4 - i, m) * 6 * per_layer)
        assert memory_per_gpu(GPT_1_5B, parallel).stage == 0


def test_gpipe_holds_all_micro_batches():
    parallel = _parallel(tp=2, pp=4, global_batch_size=16, schedule="gpipe")
    stage1 = memory_per_stage(GPT_1_5B, parallel)[1]
    assert stage1.activations_bytes == pytest.approx(16 * 6 * _layer(GPT_1_5B, parallel))


def test_interleaved_first_stage_penalty():
    """First stage: p micro-batches of its L/p layers x (1 + (p - 1) / (p v)) [korthikanti-2022] 4.2.3."""
    p, v = 4, 2
    parallel = _parallel(tp=2, pp=p, virtual_pipeline_size=v, global_batch_size=16, sequence_parallel=True,
                         recompute="selective")
    model = dataclasses.replace(GPT_1_5B, num_layers=16)
    stage0 = memory_per_stage(model, parallel)[0]
    layers = p * (16 // p) * (1 + (p - 1) / (p * v)) * _layer(model, parallel)
    embedding_passes = 2 * p - 1  # of the p v + p - 1 chunk passes in flight, those of chunk 0
    embedding = model.seq_len * model.hidden_size / 2
    assert stage0.activations_bytes == pytest.approx(layers + embedding_passes * embedding)


def test_output_layer_activations_on_the_last_stage():
    """Last stage: 2 s b h B / t of norm and output-layer inputs, 4 s b V / t of fp32 logits (SP)."""
    parallel = _parallel(tp=4, pp=4, global_batch_size=8, sequence_parallel=True)
    model = GPT_1_5B
    last = memory_per_stage(model, parallel)[3]
    s, h, V = model.seq_len, model.hidden_size, model.padded_vocab_size(4)
    assert last.activations_bytes == pytest.approx(6 * _layer(model, parallel) + s * (2 * h * 2 + 4 * V) / 4)


def test_worst_stage_is_taken():
    """A large untied vocabulary and one micro-batch make the last stage (output layer, logits) the worst."""
    model = ModelSpec(name="wide-vocab", num_layers=4, hidden_size=512, num_heads=8, vocab_size=256_000,
                      seq_len=2048, tied_embeddings=False, position_embedding="rope")
    parallel = _parallel(pp=2, global_batch_size=1, micro_batch_size=1)
    stages = memory_per_stage(model, parallel)
    worst = memory_per_gpu(model, parallel)
    assert worst.stage == 1
    assert worst.total_bytes == max(st.total_bytes for st in stages) > stages[0].total_bytes
    assert _vectorised(model, parallel) == pytest.approx(worst.total_bytes, rel=1e-9)


def test_moe_middle_stage_can_be_the_worst():
    """DeepSeek-like: layer 0 is dense, so stage 1 holds more expert weights than stage 0."""
    parallel = _parallel(pp=4, global_batch_size=8, recompute="selective")
    worst = memory_per_gpu(DEEPSEEK_LIKE, parallel)
    assert worst.stage == 1
    assert _vectorised(DEEPSEEK_LIKE, parallel) == pytest.approx(worst.total_bytes, rel=1e-9)


# ----- sanity: Llama 3 70B --------------------------------------------------------------------------------------


def test_llama3_70b_fits_with_3d_parallelism_but_not_with_plain_data_parallelism():
    fits = _parallel(tp=8, pp=8, dp=8, micro_batch_size=1, global_batch_size=512, sequence_parallel=True,
                     recompute="selective", distributed_optimizer=True)
    mb = memory_per_gpu(LLAMA3_70B, fits)
    assert mb.total_bytes < 80 * GiB
    assert mb.total_bytes / GiB == pytest.approx(30.6, abs=0.1)  # the docstring's worked example
    assert mb.stage == 0
    plain = _parallel(dp=512, micro_batch_size=1, global_batch_size=512)
    assert memory_per_gpu(LLAMA3_70B, plain).total_bytes > 80 * GiB
    assert _states(memory_per_gpu(LLAMA3_70B, plain)) == 18 * LLAMA3_70B.num_parameters(padded_vocab=True)
    both = total_memory_bytes(LLAMA3_70B, tp=[8, 1], pp=[8, 1], dp=[8, 512], micro_batch_size=1,
                              global_batch_size=512, sequence_parallel=[True, False],
                              recompute=["selective", "none"], distributed_optimizer=[True, False])
    assert list(both < 80 * GiB) == [True, False]


# ----- the vectorised twin --------------------------------------------------------------------------------------


GRID_MODELS = (GPT_1_5B, LLAMA3_70B, MIXTRAL, DEEPSEEK_LIKE)


@pytest.mark.parametrize("model", GRID_MODELS, ids=lambda m: m.name)
def test_vectorised_agrees_with_scalar_on_a_grid(model):
    rows = []
    for tp, pp, dp, cp, v, sp, rc, z, dist, sched, b in itertools.product(
        [1, 2, 8], [1, 2, 4], [1, 8], [1, 2], [1, 2], [False, True], ["none", "selective", "full"], [0, 1, 3],
        [False, True], ["1f1b", "gpipe"], [1, 2] if model is GPT_1_5B else [1],
    ):
        if (v > 1 and sched == "gpipe") or (z == 3 and dist):
            continue
        ep = min(8, dp * cp) if model.is_moe else 1
        try:
            parallel = ParallelSpec(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, virtual_pipeline_size=v,
                                    sequence_parallel=sp, recompute=rc, zero_stage=z, distributed_optimizer=dist,
                                    schedule=sched, micro_batch_size=b, global_batch_size=b * dp * pp * 2)
            scalar = memory_per_gpu(model, parallel).total_bytes
        except ConfigError:
            continue
        rows.append((tp, pp, dp, cp, ep, v, sp, memory.RECOMPUTE_CODES[rc], z, dist,
                     memory.SCHEDULE_CODES[sched], b, b * dp * pp * 2, scalar))
    assert len(rows) > 100
    cols = [np.array(c) for c in zip(*rows, strict=True)]
    tp, pp, dp, cp, ep, v, sp, rc, z, dist, sched, b, gb, scalar = cols
    vec = total_memory_bytes(model, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, virtual_pipeline_size=v,
                             sequence_parallel=sp, recompute=rc, zero_stage=z, distributed_optimizer=dist,
                             schedule=sched, micro_batch_size=b, global_batch_size=gb)
    assert vec.shape == scalar.shape
    np.testing.assert_allclose(vec, scalar, rtol=1e-9)  # the contract is 1%; it is exact for even splits


def test_vectorised_counts_the_uneven_split_the_workload_uses():
    """Llama 3 405B on pp = 16 (stages of 7, 8 x 14, 7): the most loaded GPU is on stage 1, with 8 layers and 15
    micro-batches in flight. The vectorised twin (plan's memory filter) took L // pp = 7 layers for every stage
    and looked only at the first and last: 80.7 GiB against the scalar model's 85.6."""
    model = load_model("llama3-405b")
    for pp, v in ((16, 1), (16, 2), (16, 3), (5, 1)):
        par = ParallelSpec(tp=8, pp=pp, dp=8, global_batch_size=pp * 32, sequence_parallel=True,
                           distributed_optimizer=True, virtual_pipeline_size=v)
        assert _vectorised(model, par) == pytest.approx(memory_per_gpu(model, par).total_bytes, rel=1e-12), (pp, v)
    par = ParallelSpec(tp=8, pp=16, dp=8, global_batch_size=512, sequence_parallel=True, distributed_optimizer=True)
    stages = [stage.total_bytes for stage in memory_per_stage(model, par)]
    assert max(stages) == stages[1] > stages[0]
    assert _vectorised(model, par) / GiB == pytest.approx(85.6, abs=0.05)


@settings(max_examples=80, deadline=None)
@given(jobs(moe=None))
def test_vectorised_agrees_with_scalar_on_random_jobs(job):
    model, parallel = job
    for optimizer in ("adam", "sgd"):
        scalar = memory_per_gpu(model, parallel, optimizer=optimizer).total_bytes
        assert _vectorised(model, parallel, optimizer=optimizer) == pytest.approx(scalar, rel=1e-3)


def test_vectorised_broadcasts_scalars_and_accepts_names():
    out = total_memory_bytes(GPT_1_5B, tp=np.array([1, 2, 4]), pp=2, dp=4, micro_batch_size=1,
                             global_batch_size=64, recompute="selective", schedule="1f1b")
    assert out.shape == (3,) and out.dtype == np.float64
    assert out[0] > out[1] > out[2]
    assert total_memory_bytes(GPT_1_5B, tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=8).shape == ()


def test_vectorised_memory_of_no_configurations_is_empty():
    """plan hands over the valid configurations; when there are none the answer is an empty array, not numpy's
    'zero-size array to reduction operation maximum'."""
    empty = np.zeros(0, dtype=np.int64)
    out = total_memory_bytes(load_model("gpt3-1.3b"), tp=empty, pp=empty, dp=empty, micro_batch_size=empty,
                             global_batch_size=empty, virtual_pipeline_size=empty)
    assert out.shape == (0,) and out.dtype == np.float64
