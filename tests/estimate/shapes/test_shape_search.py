"""Suggestions keep the parameters within tolerance and are no slower; sweeps; the shape-aware estimate."""

from __future__ import annotations

import dataclasses

import pytest

from commscope.estimate.gpus import gpu_preset
from commscope.presets import cluster_preset, model_preset
from commscope.estimate.shapes import analyse_shapes, shape_util, suggest_shapes, sweep_shapes
from commscope.spec.parallel import ParallelSpec

PAR = ParallelSpec(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4)


@pytest.fixture(scope="module")
def gpt3b_a100():
    return suggest_shapes(model_preset("gpt-3b"), PAR, cluster_preset("dgx-a100"), tolerance=0.05, top=10)


def test_suggestions_keep_parameters_within_tolerance(gpt3b_a100):
    s = gpt3b_a100
    n0 = model_preset("gpt-3b").num_parameters()
    assert s.entries, "gpt-3b's head size 96 leaves room for faster shapes"
    for e in s.entries:
        assert abs(e.model.num_parameters() / n0 - 1) <= 0.05
        assert e.param_change == pytest.approx(e.model.num_parameters() / n0 - 1)
        assert e.model.num_layers % PAR.pp == 0
        assert e.model.num_heads % PAR.tp == 0


def test_suggestions_are_no_slower_and_sorted(gpt3b_a100):
    s = gpt3b_a100
    t0 = s.original.estimate.iteration_time_s
    times = [e.estimate.iteration_time_s for e in s.entries]
    assert all(t <= t0 for t in times)
    assert times == sorted(times)
    assert all(e.iteration_speedup >= 1 for e in s.entries)
    assert s.original.changes == "original" and s.original.iteration_speedup == 1.0


def test_suggestions_report_communication(gpt3b_a100):
    for e in gpt3b_a100.entries:
        assert set(e.comm_bytes) >= {"tp", "pp", "dp"}
        total0 = sum(gpt3b_a100.original.comm_bytes.values())
        assert e.comm_bytes_change == pytest.approx(sum(e.comm_bytes.values()) / total0 - 1)
        assert e.comm_time_change_s == pytest.approx(e.estimate.comm_s - gpt3b_a100.original.estimate.comm_s)
        d = e.to_dict()
        assert {"iteration_speedup", "compute_speedup", "comm_bytes_change", "comm_time_change_s", "changes"} <= set(d)


def test_zero_tolerance_keeps_the_exact_parameter_count():
    s = suggest_shapes(model_preset("gpt-3b"), PAR, cluster_preset("dgx-a100"), tolerance=0.0)
    n0 = model_preset("gpt-3b").num_parameters()
    assert all(e.model.num_parameters() == n0 for e in s.entries)


def test_rank_by_time_per_parameter():
    s = suggest_shapes(model_preset("gpt-3b"), PAR, cluster_preset("dgx-a100"), rank_by="time_per_param", top=10)
    keys = [e.estimate.iteration_time_s / e.num_parameters for e in s.entries]
    assert keys == sorted(keys)
    ref = s.original.estimate.iteration_time_s / s.original.num_parameters
    assert all(k <= ref for k in keys)


def test_shape_aware_estimate():
    model, cluster = model_preset("gpt-3b"), cluster_preset("dgx-a100")
    r = analyse_shapes(model, PAR, cluster)
    assert 0 < r.gemm_efficiency <= r.gpu.achievable_fraction
    # the estimate times this shape's kernels with the compute model; the baseline is the cluster's flat u
    assert r.estimate.compute_model == "gpu" and r.baseline_estimate.compute_model == "flops"
    assert r.estimate.gpu_util == pytest.approx(r.gpu_util)
    assert 0 < r.gpu_util < r.gpu.achievable_fraction  # attention and memory-bound kernels run below the GEMM rate
    assert r.baseline_estimate.gpu_util == cluster.gpu_util
    assert r.estimate.compute_breakdown_s["gemm_s"] > 0
    assert [x.rule for x in r.broken_rules] == ["head_size"]
    heads = [g for g in r.gemms if g.gemm.name == "attn_values"]
    assert all("head_size" in g.broken_rules for g in heads)


def test_shape_util_worked_example():
    gpu = dataclasses.replace(gpu_preset("a100"), achievable_fraction=0.8)
    assert shape_util(0.5, 0.72, gpu) == pytest.approx(0.45)
    assert shape_util(0.9, 0.8, gpu) == 0.9
    assert shape_util(1.0, 0.8, gpu) == 1.0


def test_sweep_hidden():
    model, cluster = model_preset("gpt-3b"), cluster_preset("dgx-a100")
    values = [3008, 3050, 3072, 3100]  # 3050 and 3100 are not divisible by 32 heads
    r = sweep_shapes(model, PAR, cluster, values, key="hidden")
    assert r.valid.tolist() == [True, False, True, False]
    assert len(r.skipped) == 2 and "3050" in r.skipped[0]
    assert r.gemm_tflops_per_gpu[2] > r.gemm_tflops_per_gpu[0]  # 3072 (d 96) beats 3008 (d 94, unaligned)
    assert "head_size" in r.broken_rules[0]
    d = r.to_dict()
    assert d["gemm_tflops_per_gpu"][1] is None and d["values"] == values


def test_sweep_other_keys_and_errors():
    from commscope.errors import ConfigError

    model, cluster = model_preset("gpt-3b"), cluster_preset("dgx-a100")
    r = sweep_shapes(model, PAR, cluster, [1, 2, 4], key="micro_batch")
    assert r.valid.all()
    with pytest.raises(ConfigError, match="valid keys"):
        sweep_shapes(model, PAR, cluster, [1], key="width")


def test_refine_below_one_is_refused():
    """Estimating none of the screened shapes said 'no nearby shape is faster', which the default refutes."""
    from commscope.errors import ConfigError

    with pytest.raises(ConfigError, match="refine=0: must be >= 1"):
        suggest_shapes(model_preset("gpt-3b"), PAR, cluster_preset("dgx-a100"), refine=0)


@pytest.mark.parametrize(("name", "moe_layer_freq"), [("gpt-3b", None), ("llama3-8b", None), ("mixtral-8x7b", None),
                                                      ("mixtral-8x7b", 2), ("deepseek-moe-16b", None),
                                                      ("deepseek-moe-16b", 3)])
@pytest.mark.parametrize("num_layers", [2, 3, 7, 2400])
def test_layer_counts_in_closed_form_are_the_layer_by_layer_ones(name, num_layers, moe_layer_freq):
    """The search counts parameters and GEMM time of thousands of candidates of up to num_layers layers; it counts
    one layer of each kind and multiplies (once layer by layer: gpt-1.5b with 2,400 layers took 8.8 s, 1.3 s now).
    The closed forms must give what the layer-by-layer counts give, for every MoE layer pattern."""
    from commscope.estimate.shapes import model_gemms, time_gemms
    from commscope.estimate.shapes_rules import _totals
    from commscope.estimate.shapes_search import _gemm_times_s
    from commscope.spec.params import embedding_params, layer_params

    model = dataclasses.replace(model_preset(name), num_layers=num_layers)
    if moe_layer_freq is not None:  # dense layers between the MoE ones (deepseek: after a first dense layer)
        model = dataclasses.replace(model, moe_layer_freq=moe_layer_freq)
    par, gpu = ParallelSpec(), gpu_preset("a100")
    emb = embedding_params(model, tp=1, padded_vocab=False)
    by_layer = (sum(layer_params(model, i, tp=1, ep=1).total for i in range(num_layers)) + emb.input_embedding
                + emb.position_embedding + emb.final_norm + (0 if model.tied_embeddings else emb.output_layer))
    assert model.num_parameters() == by_layer  # ModelSpec counts one layer of each kind and multiplies
    assert model.num_moe_layers == sum(model.is_moe_layer(i) for i in range(num_layers))  # ModelSpec's closed form
    variants = [dataclasses.replace(model, num_layers=n) for n in (num_layers, num_layers + 1, num_layers + 5)]
    expected = [_totals(time_gemms(model_gemms(m, par), gpu, m.dtype))[1] for m in variants]
    assert _gemm_times_s(variants, par, gpu, model.dtype, "flash") == pytest.approx(expected, rel=1e-12)
