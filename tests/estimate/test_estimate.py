"""Properties of the iteration-time model (issue: estimate)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commscope.api import predict
from commscope.estimate.bandwidth import AlphaBeta, GroupSpan, MeasuredTable, TableRow, busbw_factor
from commscope.errors import ConfigError
from commscope.estimate.iteration import estimate
from commscope.spec.cluster import ClusterSpec, LinkTier
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from strategies import jobs

CLUSTER = ClusterSpec(name="test", gpu="X", gpus_per_node=4, peak_flops={"bf16": 100e12, "fp16": 100e12, "fp32": 20e12},
                      gpu_util=0.5, intra_node=LinkTier(name="nv", bandwidth_bytes_per_s=100e9, latency_s=3e-6),
                      inter_node=LinkTier(name="ib", bandwidth_bytes_per_s=10e9, latency_s=8e-6))


def _slower(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    return replace(cluster,
                   intra_node=replace(cluster.intra_node, bandwidth_bytes_per_s=cluster.intra_node.bandwidth_bytes_per_s / factor),
                   inter_node=replace(cluster.inter_node, bandwidth_bytes_per_s=cluster.inter_node.bandwidth_bytes_per_s / factor))


def test_nccl_tests_factors():
    assert busbw_factor("all_reduce", 8) == 1.75
    assert busbw_factor("all_gather", 4) == 0.75
    assert busbw_factor("reduce_scatter", 2) == 0.5
    assert busbw_factor("all_to_all", 8) == 0.875
    assert busbw_factor("broadcast", 8) == busbw_factor("send", 2) == 1.0


def test_time_grows_with_bytes_and_falls_with_bandwidth():
    ab = AlphaBeta(CLUSTER)
    for span in (GroupSpan(4, 1, 4), GroupSpan(8, 2, 4), GroupSpan(2, 2, 1)):
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "broadcast"):
            times = [ab.op_time_s(op, s, span) for s in (1, 1 << 10, 1 << 20, 1 << 30)]
            assert times == sorted(times) and times[0] > 0, (op, span)
            assert AlphaBeta(_slower(CLUSTER, 2)).op_time_s(op, 1 << 24, span) > ab.op_time_s(op, 1 << 24, span)


@settings(max_examples=40, deadline=None)
@given(jobs(max_world=32), st.sampled_from(["refined", "seed"]))
def test_ratios_and_monotonicity(job, method):
    model, parallel = job
    pred = predict(model, parallel, CLUSTER)
    e = estimate(pred, method=method)
    terms = e.compute_s + e.tp_s + e.pp_s + e.dp_s + e.ep_s + e.cp_s + e.emb_s + e.bubble_s
    assert e.iteration_time_s == pytest.approx(terms)
    assert 0 <= e.comm_ratio <= 1 and 0 <= e.bubble_ratio <= 1
    assert e.comm_ratio + e.bubble_ratio <= 1 + 1e-12
    assert e.comm_ratio == pytest.approx(e.comm_s / e.iteration_time_s)
    if parallel.pp == 1:
        assert e.bubble_s == 0
    if method == "seed":
        m = parallel.num_micro_batches
        # R_bubble ~= (p-1)/(p-1+m) exactly when communication is small; bounded by it in general
        assert e.bubble_s == pytest.approx((parallel.pp - 1) * (e.compute_s + e.pp_s + e.tp_s) / m)
    # slower links never make the iteration faster
    slow = estimate(predict(model, parallel, _slower(CLUSTER, 4)), method=method)
    assert slow.iteration_time_s >= e.iteration_time_s - 1e-12


def test_seed_bubble_ratio_matches_closed_form():
    model = ModelSpec(name="x", num_layers=8, hidden_size=256, num_heads=8, seq_len=128)
    fast = replace(CLUSTER, intra_node=replace(CLUSTER.intra_node, bandwidth_bytes_per_s=1e18, latency_s=0),
                   inter_node=replace(CLUSTER.inter_node, bandwidth_bytes_per_s=1e18, latency_s=0))
    for p, m in ((2, 8), (4, 4), (4, 16), (8, 32)):
        parallel = ParallelSpec(pp=p, dp=1, global_batch_size=m, micro_batch_size=1)
        e = estimate(predict(model, parallel, fast), method="seed")
        assert e.bubble_ratio == pytest.approx((p - 1) / (p - 1 + m), rel=1e-6)


def test_interleaving_shrinks_the_bubble():
    model = ModelSpec(name="x", num_layers=16, hidden_size=512, num_heads=8, seq_len=256)
    base = ParallelSpec(pp=4, dp=1, global_batch_size=8)
    e1 = estimate(predict(model, base, CLUSTER))
    e2 = estimate(predict(model, replace(base, virtual_pipeline_size=2), CLUSTER))
    assert e2.bubble_s == pytest.approx(e1.bubble_s / 2, rel=0.2)


def test_fill_and_drain_pass_through_the_other_stages_not_the_slowest_one_p_times():
    """A last stage made heavy by a large vocabulary's logits lengthens every micro-batch of the steady state;
    the fill and the drain pass through the three lighter stages, so the bubble barely moves."""
    small = ModelSpec(name="x", num_layers=8, hidden_size=1024, num_heads=8, seq_len=512, vocab_size=4096)
    big = replace(small, vocab_size=262144)
    parallel = ParallelSpec(pp=4, dp=1, global_batch_size=16)
    e_small, e_big = (estimate(predict(m, parallel, CLUSTER)) for m in (small, big))
    assert e_big.critical_stage == 3
    grown = e_big.micro_batch_s - e_small.micro_batch_s
    assert grown > 0.2 * e_small.micro_batch_s
    assert abs(e_big.bubble_s - e_small.bubble_s) < 0.1 * (parallel.pp - 1) * grown
    assert 0 < e_big.bubble_s < (parallel.pp - 1) * e_big.micro_batch_s


def test_interleaved_pipeline_overlaps_its_sends_with_the_other_chunks():
    """--overlap-p2p-communication (Megatron's default) hides pipeline traffic of the interleaved schedule under
    compute and says so; without interleaving, or with the flag off, the 1F1B exchanges stay exposed."""
    model = ModelSpec(name="x", num_layers=16, hidden_size=2048, num_heads=16, seq_len=1024)
    cluster = replace(CLUSTER, gpus_per_node=1)  # every pipeline stage on its own node: sends on the slow link
    base = ParallelSpec(pp=4, dp=1, global_batch_size=16, virtual_pipeline_size=2)
    on = estimate(predict(model, base, cluster))
    off = estimate(predict(model, replace(base, overlap_p2p_comm=False), cluster))
    assert off.pp_s > 0 and on.pp_s < off.pp_s
    assert on.hidden_s["pp"] == pytest.approx(off.pp_s - on.pp_s)
    assert on.iteration_time_s < off.iteration_time_s
    assert any("--overlap-p2p-communication" in n for n in on.notes)
    plain = ParallelSpec(pp=4, dp=1, global_batch_size=16)
    assert estimate(predict(model, plain, cluster)).pp_s == estimate(
        predict(model, replace(plain, overlap_p2p_comm=False), cluster)).pp_s


def test_scatter_gather_moves_pipeline_bytes_onto_nvlink():
    """TP inside a node, PP across nodes: with the scatter/gather each rank sends 1/t over the slow link and the
    all-gather runs on the fast one, so the pipeline's time falls (by less than t: the gather is not free)."""
    model = ModelSpec(name="x", num_layers=8, hidden_size=2048, num_heads=16, seq_len=1024)
    base = ParallelSpec(tp=4, pp=2, global_batch_size=8)
    plain = estimate(predict(model, base, CLUSTER))
    sg = estimate(predict(model, replace(base, scatter_gather_tensors_in_pipeline=True), CLUSTER))
    assert plain.pp_s / 4 < sg.pp_s < plain.pp_s
    assert sg.iteration_time_s < plain.iteration_time_s


def test_overlap_hides_dp_time():
    model = ModelSpec(name="x", num_layers=8, hidden_size=1024, num_heads=8, seq_len=512)
    base = ParallelSpec(dp=8, global_batch_size=64)
    plain = estimate(predict(model, base, CLUSTER))
    overlapped = estimate(predict(model, replace(base, overlap_grad_reduce=True), CLUSTER))
    assert overlapped.dp_s < plain.dp_s


def test_measured_table_interpolates_and_notes_extrapolation():
    rows = [TableRow(op="all_reduce", group_size=4, size_bytes=s, busbw_bytes_per_s=b)
            for s, b in ((1 << 20, 10e9), (1 << 24, 50e9), (1 << 28, 90e9))]
    table = MeasuredTable(rows=rows, source="t.json")
    span = GroupSpan(4, 1, 4)
    assert table.busbw_bytes_per_s("all_reduce", 1 << 22, span) == pytest.approx(30e9)
    assert table.notes == ["t.json: all_reduce over 4 ranks inside one node timed from the table"]
    table.busbw_bytes_per_s("all_reduce", 1 << 30, span)
    assert "outside the measured" in table.notes[-1]
    with pytest.raises(ConfigError, match="lacks all_gather"):
        table.op_time_s("all_gather", 1 << 20, span)


def test_measured_table_falls_back_to_the_whole_alpha_beta_time():
    """Ops the table lacks (here: groups that leave the node, measured only inside one) take the preset's time,
    latency included: one 64 KiB all_reduce over 16 GPUs on 2 nodes is latency-bound, not 64 KiB / busbw."""
    rows = [TableRow(op="all_reduce", group_size=8, size_bytes=s, busbw_bytes_per_s=b, intra_node=True)
            for s, b in ((1 << 20, 20e9), (1 << 30, 230e9))]
    fallback = AlphaBeta(CLUSTER)
    table = MeasuredTable(rows=rows, source="t.json", fallback=fallback)
    across = GroupSpan(16, 2, 8)
    assert table.op_time_s("all_reduce", 1 << 16, across) == fallback.op_time_s("all_reduce", 1 << 16, across)
    assert table.op_time_s("all_reduce", 1 << 16, across) > (1 << 16) * busbw_factor("all_reduce", 16) / \
        fallback.busbw_bytes_per_s("all_reduce", 1 << 16, across)
    assert any("alpha-beta" in n for n in table.notes)
    inside = GroupSpan(8, 1, 8)
    assert table.op_time_s("all_reduce", 1 << 30, inside) == pytest.approx((1 << 30) * 1.75 / 230e9)


def test_bad_gpu_util():
    pred = predict(ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=2, seq_len=16),
                   ParallelSpec(global_batch_size=1), CLUSTER)
    with pytest.raises(ConfigError, match="gpu_util=1.5"):
        estimate(pred, gpu_util=1.5)


def test_measured_rows_of_unknown_placement_do_not_stand_for_other_groups_across_nodes(tmp_path):
    """A table without intra_node (nccl-tests on one node, say): its 8-rank rows time 8 or 4 GPUs inside a node, but
    not 16 GPUs on two nodes, which the preset times (noted); rows of that very size would. nccl-tests' op names
    (allreduce) read as commscope's."""
    from commscope.io.bandwidth_file import read_bandwidth

    path = tmp_path / "t.csv"
    path.write_text("op,group_size,size_bytes,busbw_GBps\nallreduce,8,1048576,100\nallreduce,8,1073741824,230\n")
    fallback = AlphaBeta(CLUSTER)
    table = read_bandwidth(path, fallback=fallback)
    inside, across = GroupSpan(4, 1, 4), GroupSpan(16, 2, 8)
    assert table.busbw_bytes_per_s("all_reduce", 1 << 30, inside) == pytest.approx(230e9)
    assert table.op_time_s("all_reduce", 1 << 30, across) == fallback.op_time_s("all_reduce", 1 << 30, across)
    assert any("no all_reduce measured across nodes (over 16 ranks)" in n for n in table.notes)
    path.write_text("op,group_size,size_bytes,busbw_GBps\nall_reduce,16,1048576,50\nall_reduce,16,1073741824,180\n")
    assert read_bandwidth(path, fallback=fallback).busbw_bytes_per_s("all_reduce", 1 << 30, across) == pytest.approx(180e9)
