"""estimate_many (many configurations at once) equals the scalar op-by-op estimate (issue 17)."""

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from estimates_alike import CLUSTER, assert_same
from strategies import estimate_jobs

from commscope.api import predict
from commscope.estimate.iteration import estimate, estimate_op_by_op
from commscope.estimate.many import estimate_many
from commscope.spec.files import load_cluster, load_model
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

@settings(max_examples=60, deadline=None)
@given(estimate_jobs(), st.sampled_from(["X", "A100", "H100", "V100"]), st.sampled_from([2, 4, 8]),
       st.sampled_from([None, 0.45]), st.sampled_from([1.0, 1.0, 0.9]))
def test_estimate_many_equals_the_scalar_path(job, gpu, gpus_per_node, gpu_util, compute_efficiency):
    model, parallels = job
    if gpu != "H100":  # FP8 GEMMs need a GPU with FP8 tensor cores
        parallels = [replace(p, fp8_format=None) for p in parallels]
    cluster = replace(CLUSTER, gpu=gpu, gpus_per_node=gpus_per_node, compute_efficiency=compute_efficiency)
    batch = estimate_many(model, cluster, parallels, gpu_util=gpu_util)
    assert len(batch) == len(parallels)
    for par, got in zip(parallels, batch):
        want = estimate(predict(model, par, cluster), gpu_util=gpu_util)
        assert_same(want.to_dict(), got.to_dict())


@settings(max_examples=60, deadline=None)
@given(estimate_jobs(), st.sampled_from(["X", "A100", "H100"]), st.sampled_from([2, 3, 8]),
       st.sampled_from([None, 0.45]))
def test_one_estimate_is_its_row_of_estimate_many_to_the_bit(job, gpu, gpus_per_node, gpu_util):
    """One configuration's closed form computes on numbers where many configurations' computes on columns (its
    parallelism as numpy scalars, its spans as its groups' numbers, the times of a number as floats): the same
    operations in the same order, so every field is the same float as in estimate_many's row, not only within 1e-12."""
    model, parallels = job
    if gpu != "H100":
        parallels = [replace(p, fp8_format=None) for p in parallels]
    cluster = replace(CLUSTER, gpu=gpu, gpus_per_node=gpus_per_node)
    for par, got in zip(parallels, estimate_many(model, cluster, parallels, gpu_util=gpu_util)):
        want = estimate(predict(model, par, cluster), gpu_util=gpu_util).to_dict()
        assert want == got.to_dict(), par


def test_one_estimate_is_its_row_of_estimate_many_to_the_bit_on_presets():
    """The same on real models and clusters (sizes and bandwidths whose roundings the toy cluster rarely meets):
    dense and MoE presets, each at the per-preset benchmark's layout and an interleaved one with the overlaps on."""
    for model_name, cluster_name in (("gpt3-175b", "dgx-a100"), ("llama3-70b", "dgx-h100"),
                                     ("deepseek-moe-16b", "dgx-h100"), ("mixtral-8x7b", "dgx-h100")):
        model, cluster = load_model(model_name), load_cluster(cluster_name)
        ep = 8 if model.is_moe else 1
        parallels = [ParallelSpec(tp=8, pp=4, dp=8, ep=ep, global_batch_size=256, sequence_parallel=True,
                                  distributed_optimizer=True),
                     ParallelSpec(tp=4, pp=2, dp=16, ep=ep, global_batch_size=512, micro_batch_size=2,
                                  virtual_pipeline_size=2, sequence_parallel=True, tp_comm_overlap=True,
                                  distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
                                  recompute="selective")]
        for par, got in zip(parallels, estimate_many(model, cluster, parallels)):
            assert estimate(predict(model, par, cluster)).to_dict() == got.to_dict(), (model_name, par)


def test_one_zero3_estimate_is_its_row_of_a_mixed_estimate_many_to_the_bit():
    """One ZeRO-3 configuration's closed form leaves the data-parallel step's buckets out (ZeRO-3 reduces and gathers
    in the passes), where a sweep that mixes ZeRO stages times them and masks them to 0 s: both must come to the same
    floats, MoE presets (dense and expert gathers) and a dense one, with buckets and their overlaps asked for."""
    for model_name in ("deepseek-moe-16b", "mixtral-8x7b", "gpt3-175b"):
        model, cluster = load_model(model_name), load_cluster("dgx-h100")
        ep = 8 if model.is_moe else 1
        parallels = [ParallelSpec(tp=tp, pp=pp, dp=8, ep=e, global_batch_size=256, sequence_parallel=tp > 1,
                                  zero_stage=zero, virtual_pipeline_size=v, recompute=recompute,
                                  grad_bucket_size=bucket, overlap_grad_reduce=bucket is not None)
                     for tp, pp, e, v, recompute, bucket in ((2, 8, 1, 1, "selective", None), (8, 4, ep, 2, "full", None),
                                                             (2, 4, ep, 1, "none", 40_000_000))
                     for zero in (3, 0, 1)]
        for par, got in zip(parallels, estimate_many(model, cluster, parallels)):
            assert estimate(predict(model, par, cluster)).to_dict() == got.to_dict(), (model_name, par)


@settings(max_examples=60, deadline=None)
@given(estimate_jobs(), st.sampled_from(["X", "A100", "H100", "V100"]), st.sampled_from([2, 3, 4, 8]),
       st.sampled_from([None, 0.45]), st.sampled_from([1.0, 1.0, 0.9]))
def test_the_closed_form_estimate_equals_the_op_by_op_one(job, gpu, gpus_per_node, gpu_util, compute_efficiency):
    """estimate() computes a Megatron job in closed form over its stages, without the op list; estimate_op_by_op()
    times every op set of the workload. Both must give the same Estimate, notes and dictionaries' order included
    (the CLI prints them in that order). 3 GPUs per node: groups that straddle nodes unevenly."""
    model, parallels = job
    if gpu != "H100":
        parallels = [replace(p, fp8_format=None) for p in parallels]
    cluster = replace(CLUSTER, gpu=gpu, gpus_per_node=gpus_per_node, compute_efficiency=compute_efficiency)
    for par in parallels:
        pred = predict(model, par, cluster)
        want, got = estimate_op_by_op(pred, gpu_util=gpu_util).to_dict(), estimate(pred, gpu_util=gpu_util).to_dict()
        assert_same(want, got)
        for key in ("effective_bandwidth_bytes_per_s", "hidden_s", "compute_breakdown_s"):
            assert list(want[key]) == list(got[key]), (key, want[key], got[key])


def test_estimate_reads_no_op_list():
    """The closed form builds neither the workload nor the traffic matrix (what made its cost grow with pp)."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100")
    pred = predict(model, ParallelSpec(tp=8, pp=16, dp=8, global_batch_size=1536, sequence_parallel=True), cluster)
    est = estimate(pred)
    assert pred._workload is None and pred._traffic is None
    assert_same(estimate_op_by_op(pred).to_dict(), est.to_dict())
    assert pred._workload is not None and pred._traffic is None  # the op-by-op path reads the op list, not the matrix


def test_scatter_gather_pipeline_messages_in_many():
    """estimate_many timed pipeline messages whole under Megatron's scatter/gather (0.40 s of PP where the op list
    says 0.09 s): each TP rank sends 1/t of the activation and the receiver all-gathers it over NVLink."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100")
    par = ParallelSpec(tp=8, pp=16, dp=8, global_batch_size=1536, scatter_gather_tensors_in_pipeline=True)
    want = estimate_op_by_op(predict(model, par, cluster))
    assert_same(want.to_dict(), estimate_many(model, cluster, [par])[0].to_dict())
    assert want.pp_s < 0.1


def test_estimate_many_on_presets_and_a_fallback():
    """GPT-3 175B on 1,024 A100s, Mixtral with EP, and a configuration the batch path hands to the scalar one."""
    cases = [("gpt3-175b", "dgx-a100", ParallelSpec(tp=8, pp=16, dp=8, global_batch_size=1536, sequence_parallel=True)),
             ("gpt3-175b", "dgx-a100", ParallelSpec(tp=8, pp=8, dp=16, global_batch_size=1536, virtual_pipeline_size=2,
                                                    zero_stage=3, micro_batch_size=2)),
             ("mixtral-8x7b", "dgx-h100", ParallelSpec(tp=2, pp=4, dp=8, ep=8, global_batch_size=64, sequence_parallel=True,
                                                       distributed_optimizer=True)),
             ("gpt3-13b", "dgx-a100", ParallelSpec(tp=2, pp=2, dp=4, global_batch_size=64, grad_bucket_size=10**7,
                                                   overlap_grad_reduce=True))]
    for model_name, cluster_name, par in cases:
        model, cluster = load_model(model_name), load_cluster(cluster_name)
        want = estimate(predict(model, par, cluster))
        got = estimate_many(model, cluster, [par, par])
        assert_same(want.to_dict(), got[0].to_dict())
        assert_same(want.to_dict(), got[1].to_dict())


def test_a_mixed_sweep_equals_the_scalar_path_row_by_row():
    """Dozens of configurations of one pipeline depth at once, mixing what each Estimate's dicts hold (no TP axis at
    tp 1, hidden DP only with the distributed optimizer, ...): the many path builds those dicts a pattern of present
    keys at a time and puts every row back in its place."""
    import itertools

    model, cluster = load_model("gpt3-13b"), load_cluster("dgx-a100")
    pars = [ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=256, micro_batch_size=mb, sequence_parallel=sp and tp > 1,
                         recompute=rc, distributed_optimizer=do, overlap_grad_reduce=do, overlap_param_gather=do)
            for tp, pp, dp, mb, sp, rc, do in itertools.product((1, 2, 8), (1, 4), (2, 8), (1, 2), (False, True),
                                                                ("none", "full"), (False, True))]
    got = estimate_many(model, cluster, pars)
    assert len({tuple(e.effective_bandwidth_bytes_per_s) for e in got}) > 1  # the rows do differ in their keys
    assert len({tuple(e.hidden_s) for e in got}) > 1
    for par, est in zip(pars, got):
        assert_same(estimate(predict(model, par, cluster)).to_dict(), est.to_dict())


def test_the_last_stage_counts_each_of_its_tp_all_reduces():
    """Found by the property test in CI: with SP the last stage has a cross-entropy and a sequence-parallel
    gradient all-reduce; numpy added the two boolean masks as a logical or and counted them once, which moved the
    reported TP bus bandwidth when stages' TP groups sit on different links (data-parallel innermost)."""
    model = ModelSpec(name="rand", num_layers=2, hidden_size=16, num_heads=2, vocab_size=100,
                      make_vocab_size_divisible_by=1, seq_len=8, tied_embeddings=False, dtype="bf16")
    par = ParallelSpec(tp=2, pp=2, dp=3, global_batch_size=3, order="dp-tp-cp-ep-pp", sequence_parallel=True)
    want = estimate(predict(model, par, CLUSTER))
    assert_same(want.to_dict(), estimate_many(model, CLUSTER, [par])[0].to_dict())


def test_an_op_set_is_timed_by_its_slowest_group():
    """tp 2 on nodes of 3 GPUs: the first TP group (0, 1) sits in one node, but (2, 3) spans two, and every layer
    waits for it. Both paths time the op set by that group (they timed the first group: all TP at NVLink speed,
    while `traffic` counted a third of the TP bytes as inter-node)."""
    from commscope.estimate.bandwidth import GroupSpan

    assert GroupSpan.slowest(np.arange(12).reshape(6, 2), 3) == GroupSpan(n=2, num_nodes=2, per_node=1)
    assert GroupSpan.slowest(np.arange(12).reshape(6, 2), 4) == GroupSpan(n=2, num_nodes=1, per_node=2)
    # the fewest members on one node carry a spanning group's inter-node traffic
    assert GroupSpan.slowest(np.array([[0, 1, 2, 8, 9], [3, 4, 5, 6, 7]]), 8) == GroupSpan(n=5, num_nodes=2, per_node=2)
    model = ModelSpec(name="m", num_layers=4, hidden_size=256, num_heads=8, seq_len=128, vocab_size=1000)
    par = ParallelSpec(tp=2, dp=6, global_batch_size=12)
    for gpn, link in ((3, CLUSTER.inter_node), (4, CLUSTER.intra_node)):
        cluster = replace(CLUSTER, gpus_per_node=gpn)
        want = estimate(predict(model, par, cluster))
        assert want.effective_bandwidth_bytes_per_s["tp"] == link.bandwidth_bytes_per_s
        assert_same(want.to_dict(), estimate_many(model, cluster, [par])[0].to_dict())


def test_the_vectorised_spans_of_groups_are_each_groups_own():
    """GroupSpan.row_spans (every group's nodes and fewest members on a node at once) against GroupSpan.of, one group
    at a time, on random groups of random ranks."""
    from commscope.estimate.bandwidth import GroupSpan

    rng = np.random.default_rng(0)
    for _ in range(300):
        rows, n, gpn = int(rng.integers(1, 6)), int(rng.integers(2, 9)), int(rng.integers(1, 9))
        groups = rng.permutation(rows * n * 2)[:rows * n].reshape(rows, n)
        num_nodes, per_node = GroupSpan.row_spans(groups, gpn)
        assert [GroupSpan.of(g, gpn) for g in groups] == [GroupSpan(n, a, b) for a, b in zip(num_nodes, per_node)]


def test_alpha_beta_on_numbers_is_alpha_beta_on_arrays():
    """The closed form times one configuration's op sets with bandwidth._alpha_beta_numbers, the number twin of
    _alpha_beta_terms: every op on random groups (inside a node and across nodes, groups of one included) gives
    the same steps, latency, bus factor and bus bandwidth, to the bit."""
    from commscope.estimate.bandwidth import _alpha_beta_numbers, _alpha_beta_terms

    rng = np.random.default_rng(0)
    for cluster in (CLUSTER, load_cluster("dgx-h100"), load_cluster("dgx1-v100")):
        for _ in range(300):
            n = int(rng.integers(1, 65))
            nodes = int(rng.integers(1, n + 1))
            k = int(rng.integers(1, -(-n // nodes) + 1))
            for op in ("send", "recv", "sendrecv", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                       "broadcast"):
                arrays = _alpha_beta_terms(cluster, op, np.ones(()), n, nodes, k)
                numbers = _alpha_beta_numbers(cluster, op, n, nodes, k)
                assert [float(x) for x in arrays] == [float(x) for x in numbers], (op, n, nodes, k)


def test_the_span_of_a_progression_of_ranks_is_that_of_its_groups():
    """Stage 0's groups that are one arithmetic progression of ranks are spanned from their stride alone
    (stage_structure._progression_span); on random orders, sizes and node sizes that equals the span of the groups
    themselves wherever it answers, and it answers for the common layouts."""
    import random

    from commscope.estimate.stage_structure import _progression_span, _stage_spans
    from commscope.pattern.layout import Layout

    rng = random.Random(0)
    answered = 0
    for _ in range(400):
        order = "-".join([*rng.sample(["tp", "cp", "ep", "dp"], 4), "pp"])
        tp, cp, dp, ep = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8, 16]), rng.choice([1, 2, 4])
        gpn = rng.choice([1, 2, 4, 8, 16])
        if (dp * cp) % ep:
            continue
        layout = Layout(ParallelSpec(tp=tp, cp=cp, dp=dp, ep=ep, pp=2, order=order, global_batch_size=64 * dp))
        if layout.stage_stride % gpn:
            continue
        for kind in ("tp", "dp-cp", "ep", "expert-dp"):
            groups = layout.first_stage_groups(kind)
            quick = _progression_span(layout, kind, gpn)
            if quick is None or groups.shape[1] < 2:
                continue
            answered += 1
            assert quick.tolist() == _stage_spans(groups, np.zeros(len(groups), dtype=np.int64), 1, gpn).tolist()
    assert answered > 300
    megatron = Layout(ParallelSpec(tp=8, dp=8, pp=16, global_batch_size=1536))
    assert _progression_span(megatron, "tp", 8).tolist() == [[8], [1], [8]]
    assert _progression_span(megatron, "dp-cp", 8).tolist() == [[8], [8], [1]]


def test_estimates_built_in_bulk_are_the_frozen_dataclass():
    """finish_many fills a plain slotted twin of Estimate and gives it Estimate's class (issue 38: the frozen
    constructor was most of estimate_many's cost): what comes out must be the Estimate the constructor builds,
    frozen, and copy, pickle and replace like it."""
    import copy
    import pickle
    from dataclasses import FrozenInstanceError, fields

    import pytest

    from commscope.estimate.terms import Estimate

    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100")
    got = estimate_many(model, cluster, [ParallelSpec(tp=8, pp=4, dp=4, global_batch_size=64, sequence_parallel=True)])[0]
    built = Estimate(**{f.name: getattr(got, f.name) for f in fields(Estimate)})
    assert type(got) is Estimate and got == built and got.to_dict() == built.to_dict()
    assert got.iteration_time_s > 0 and got.notes and got.compute_breakdown_s
    with pytest.raises(FrozenInstanceError):
        got.tp_s = 0.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(got)) == got and copy.deepcopy(got) == got
    assert replace(got, tp_s=1.0).tp_s == 1.0 and got.tp_s != 1.0
    # the GEMMs every estimate builds go the same way (estimate.plain): each the Gemm its constructor builds
    from commscope.estimate.compute.gemm import Gemm, layer_gemms

    for g in layer_gemms(model, ParallelSpec(tp=8, global_batch_size=8)):
        same = Gemm(**{f.name: getattr(g, f.name) for f in fields(Gemm)})
        assert type(g) is Gemm and g == same and hash(g) == hash(same) and g.to_dict() == same.to_dict()
        with pytest.raises(FrozenInstanceError):
            g.m = 1  # type: ignore[misc]
        assert pickle.loads(pickle.dumps(g)) == g and replace(g, m=1).m == 1


#: The Estimate fields the compute model alone decides.
COMPUTE_FIELDS = ("optimizer_s", "compute_model", "critical_stage")


@settings(max_examples=40, deadline=None)
@given(estimate_jobs(), st.sampled_from(["A100", "H100", "V100"]), st.sampled_from([1.0, 0.9]))
def test_estimate_many_computes_what_the_scalar_path_computes_bit_for_bit(job, gpu, compute_efficiency):
    """Both paths fill their per-stage compute arrays with one function (compute.model.stage_arrays), so a
    configuration's compute is the same floats either way, not only within 1e-12: estimate_many summed a layer's
    terms in another order (the layers times the forward plus the layers times the backward, where stage_compute
    multiplies their sum) and differed in 48 of 672 GPT-3 estimates' fields by rounding."""
    model, parallels = job
    if gpu != "H100":
        parallels = [replace(p, fp8_format=None) for p in parallels]
    cluster = replace(CLUSTER, gpu=gpu, compute_efficiency=compute_efficiency)
    for par, got in zip(parallels, estimate_many(model, cluster, parallels)):
        want, have = estimate(predict(model, par, cluster)).to_dict(), got.to_dict()
        for key in COMPUTE_FIELDS:
            assert want[key] == have[key], (key, want[key], have[key])
        breakdown = {k: v for k, v in want["compute_breakdown_s"].items() if k != "comm_sms_s"}
        assert breakdown == {k: have["compute_breakdown_s"][k] for k in breakdown}


def test_estimate_many_on_gpt3_computes_what_the_scalar_path_computes_bit_for_bit():
    """The sweep's shape (tp x pp x micro-batch x recomputation on 1,024 A100s), where the old sums differed."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100")
    parallels = [ParallelSpec(tp=tp, pp=pp, dp=1024 // (tp * pp), global_batch_size=1536, micro_batch_size=mb,
                              sequence_parallel=tp > 1, recompute=rc)
                 for tp, pp in ((8, 16), (4, 8), (2, 32)) for mb in (1, 2) for rc in ("none", "selective", "full")]
    for par, got in zip(parallels, estimate_many(model, cluster, parallels)):
        want, have = estimate(predict(model, par, cluster)).to_dict(), got.to_dict()
        assert [want[k] for k in COMPUTE_FIELDS] == [have[k] for k in COMPUTE_FIELDS]
        assert want["compute_breakdown_s"] == have["compute_breakdown_s"], par
