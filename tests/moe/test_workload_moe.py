"""EP all-to-alls that follow the router: per layer and micro-batch sizes, bytes conservation, capacity dropping."""

from dataclasses import replace

import numpy as np
import pytest

from commscope.api import predict
from commscope.errors import ConfigError
from commscope.estimate.iteration import estimate
from commscope.moe import RoutingTrace, apply_capacity, generate, rank_tokens, routing_for_job, save_trace
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.traffic import traffic_of
from commscope.pattern.workload.dense import build_workload

# MoE layers 1, 2, 3 (layer 0 dense); stage 0 holds layer 1, stage 1 layers 2 and 3; m = 2 micro-batches
MODEL = ModelSpec(name="moe-s", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=256, num_experts=8,
                  top_k=2, first_k_dense_layers=1)
PARALLEL = ParallelSpec(pp=2, dp=4, ep=4, global_batch_size=8, micro_batch_size=1)
TOKEN_BYTES = 64 * 2  # h x bf16


def trace_for(spec="zipf:1.3", *, micro_batches=2, num_layers=3, iterations=3, **kw):
    return generate(spec, iterations=iterations, ep=4, num_experts=8, top_k=2, tokens_per_rank=32,
                    micro_batches=micro_batches, num_layers=num_layers, seed=5, **kw)


def ep_opsets(wl):
    return [s for s in wl.opsets if s.axis == "ep" and s.op == "all_to_all"]


def test_per_layer_and_micro_batch_sizes_follow_the_trace():
    trace = trace_for()
    wl = build_workload(MODEL, PARALLEL, routing=trace, routing_iteration=2)
    sets = ep_opsets(wl)
    assert len(sets) == 4 * 3 * 2  # 4 all-to-alls x 3 MoE layers x 2 micro-batches
    for s in sets:
        (layer,) = s.layers
        mb = s.micro_batch
        expected = rank_tokens(trace.counts[2, mb, layer - 1], trace.placement, 4) * TOKEN_BYTES
        assert np.array_equal(s.splits, expected if s.name.startswith("dispatch") else expected.T), (s.name, layer, mb)
        assert s.size_bytes == s.splits.sum(axis=1).max() and s.count == 1
    ops = [op for op in wl.ops() if op.axis == "ep" and op.op == "all_to_all"]
    assert len(ops) == wl.num_ops() - sum(1 for op in wl.ops() if op.axis != "ep" or op.op != "all_to_all")
    # before each dispatch the EP ranks gather everyone's per-expert token counts (int64)
    gathers = [s for s in wl.opsets if s.axis == "ep" and s.op == "all_gather"]
    assert len(gathers) == 3 * 2 and all(s.size_bytes == 4 * 8 * 8 and s.dtype == "int64" for s in gathers)
    assert {(op.layer, op.micro_batch) for op in ops} == {(layer, mb) for layer in (1, 2, 3) for mb in (0, 1)}
    first = next(op for op in ops if op.name == "dispatch" and op.layer == 2 and op.micro_batch == 1)
    assert first.splits == tuple(int(x) for x in (rank_tokens(trace.counts[2, 1, 1], trace.placement, 4)
                                                  * TOKEN_BYTES)[first.group.index(first.rank)])
    assert any("follow the routing of zipf:1.3, seed 5, iteration 2" in n for n in wl.notes)


def test_bytes_are_conserved():
    trace = trace_for()
    wl = build_workload(MODEL, PARALLEL, routing=trace, routing_iteration=1)
    routed = trace.counts[1].sum()  # token-to-expert assignments of the iteration, all layers and micro-batches
    for name in ("dispatch", "combine", "dispatch_grad", "combine_grad"):
        sent = sum(sum(op.splits) * op.count for op in wl.ops() if op.name == name)
        assert sent == routed * TOKEN_BYTES, name
    # the traffic matrix carries what leaves a rank: 4 all-to-alls x the off-diagonal tokens
    tokens = rank_tokens(trace.counts[1], trace.placement, 4)
    off = tokens.sum() - np.trace(tokens, axis1=-2, axis2=-1).sum()
    # plus the ring all-gathers of the int64 counts: (ep - 1) x ep x E x 8 per op; one EP group per stage holds
    # the 3 MoE layers, 2 micro-batches each
    counts_wire = 3 * 2 * 3 * 4 * 8 * 8
    assert traffic_of(wl, 8).bytes_by_axis()["ep"] == 4 * off * TOKEN_BYTES + counts_wire


def test_capacity_dropping_is_not_sent():
    trace = trace_for("hot:3:0.9")
    model = replace(MODEL, capacity_factor=1.0)
    wl = build_workload(model, PARALLEL, routing=trace)
    kept, dropped = apply_capacity(trace.counts[0], 1.0)
    assert dropped.sum() > 0
    sent = sum(sum(op.splits) * op.count for op in wl.ops() if op.name == "dispatch")
    assert sent == kept.sum() * TOKEN_BYTES == (trace.counts[0].sum() - dropped.sum()) * TOKEN_BYTES
    assert any(f"{int(dropped.sum()):,} of {int(trace.counts[0].sum()):,} token assignments dropped" in n
               for n in wl.notes)


def test_capacity_with_balanced_routing_goes_through_the_experts():
    # C = ceil(0.5 x 64 / 8) = 4 of the 8 tokens each expert gets: half the assignments are dropped
    wl = build_workload(replace(MODEL, capacity_factor=0.5), PARALLEL)
    sent = sum(sum(op.splits) * op.count for op in wl.ops() if op.name == "dispatch")
    assert sent == 3 * 2 * 4 * 32 * 2 // 2 * TOKEN_BYTES  # layers x micro-batches x ranks x T top_k / 2


def test_a_one_layer_one_micro_batch_trace_keeps_the_balanced_structure():
    balanced = ep_opsets(build_workload(MODEL, PARALLEL))
    traced = ep_opsets(build_workload(MODEL, PARALLEL, routing=trace_for("balanced", micro_batches=1, num_layers=1)))
    assert [(s.name, s.layers, s.micro_batches, s.phase) for s in traced] == \
           [(s.name, s.layers, s.micro_batches, s.phase) for s in balanced]
    for a, b in zip(balanced, traced):
        assert np.array_equal(a.splits, b.splits)  # 32 x 2 / 4 = 16 tokens to every rank either way


def test_fewer_trace_micro_batches_are_cycled():
    trace = trace_for(micro_batches=1)
    assert all(s.micro_batches == 2 for s in ep_opsets(build_workload(MODEL, PARALLEL, routing=trace)))
    par = replace(PARALLEL, global_batch_size=12)  # m = 3 with a 2-micro-batch trace
    wl = build_workload(MODEL, par, routing=trace_for())
    assert any("micro-batch k uses the routing's micro-batch k mod 2" in n for n in wl.notes)
    mb2 = [s for s in ep_opsets(wl) if s.micro_batch == 2 and s.name == "dispatch" and s.layers == (1,)]
    mb0 = [s for s in ep_opsets(wl) if s.micro_batch == 0 and s.name == "dispatch" and s.layers == (1,)]
    assert np.array_equal(mb2[0].splits, mb0[0].splits)


def test_one_iteration_of_counts_as_an_array():
    trace = trace_for()
    a = build_workload(MODEL, PARALLEL, routing=trace.counts[0])
    b = build_workload(MODEL, PARALLEL, routing=trace)
    assert all(np.array_equal(x.splits, y.splits) for x, y in zip(ep_opsets(a), ep_opsets(b)))


@pytest.mark.parametrize("routing,kw,pattern", [
    (lambda: generate("uniform", iterations=1, ep=2, num_experts=8, top_k=2, tokens_per_rank=32), {},
     r"ep=4: the routing trace has 2 EP ranks"),
    (lambda: generate("uniform", iterations=1, ep=4, num_experts=4, top_k=2, tokens_per_rank=32), {},
     r"num_experts=8: the routing trace has 4 experts"),
    (lambda: trace_for(num_layers=2), {}, r"has 2 MoE layers; moe-s has 3: give 1 \(shared by every layer\) or 3"),
    (lambda: trace_for(), {"routing_iteration": 3}, r"routing_iteration=3: must be in 0..2"),
    (lambda: np.ones((2, 3, 4, 6), dtype=int), {}, r"routing=\(2, 3, 4, 6\): counts must have shape"),
    (lambda: np.ones((3, 3), dtype=int), {}, r"routing=\(3, 3\): must be an \(ep, ep\) = \(4, 4\) token matrix"),
    (lambda: -np.ones((4, 4), dtype=int), {}, r"routing matrix, rank 0, to rank 0: routing=-1: must be >= 0"),
])
def test_routing_that_does_not_fit_the_job(routing, kw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_workload(MODEL, PARALLEL, routing=routing(), **kw)


def test_estimate_sees_the_slowest_rank():
    pred = predict(MODEL, PARALLEL, "dgx-a100", routing=trace_for("hot:0:1"))
    base = predict(MODEL, PARALLEL, "dgx-a100")
    assert pred.traffic.bytes_by_axis()["ep"] != base.traffic.bytes_by_axis()["ep"]
    assert estimate(pred).ep_s > estimate(base).ep_s


def test_routing_for_job(tmp_path):
    trace = routing_for_job("drift", MODEL, PARALLEL, first_iteration=7, seed=2)
    assert trace.counts.shape == (1, 2, 3, 4, 8) and trace.layer_ids == (1, 2, 3) and trace.tokens_per_rank == 32
    longer = routing_for_job("drift", MODEL, PARALLEL, iterations=8, seed=2)
    assert np.array_equal(longer.counts[7], trace.counts[0])
    path = save_trace(longer, tmp_path / "r.npz")
    cut = routing_for_job(str(path), MODEL, PARALLEL, first_iteration=7)
    assert np.array_equal(cut.counts, trace.counts)
    with pytest.raises(ConfigError, match="needs an MoE model"):
        routing_for_job("uniform", replace(MODEL, num_experts=0), replace(PARALLEL, ep=1))
    with pytest.raises(ConfigError, match=r"needs expert parallelism \(--ep > 1\)"):
        routing_for_job("uniform", MODEL, replace(PARALLEL, ep=1))
    with pytest.raises(ConfigError, match="ep=2: the routing trace has 4 EP ranks"):
        routing_for_job(str(path), MODEL, replace(PARALLEL, ep=2))
    with pytest.raises(ConfigError, match=r"routing_iteration=9: must be within"):
        routing_for_job(str(path), MODEL, PARALLEL, first_iteration=9)


def test_trace_keeps_its_placement():
    trace = trace_for(placement=np.array([3, 3, 2, 2, 1, 1, 0, 0]))
    s = next(s for s in ep_opsets(build_workload(MODEL, PARALLEL, routing=trace)) if s.name == "dispatch")
    counts = trace.counts[0, s.micro_batch, s.layers[0] - 1]
    assert s.splits[:, 3].tolist() == ((counts[:, 0] + counts[:, 1]) * TOKEN_BYTES).tolist()
    assert isinstance(trace, RoutingTrace)


def test_routed_traffic_merged_per_group_equals_op_set_by_op_set():
    """build_traffic merges the op sets of a group array before expanding them: the matrix is the sum of each
    op set's own matrix (routed all-to-alls per layer and micro-batch, ring collectives, p2p, hierarchical)."""
    from commscope.spec.files import load_model
    from commscope.pattern.traffic import build_traffic

    model = load_model("mixtral-8x7b")
    par = ParallelSpec(tp=2, pp=2, dp=8, ep=4, global_batch_size=32, sequence_parallel=True)
    routing = routing_for_job("zipf:1.2", model, par, seed=3)
    for algorithm in ("ring", "hierarchical"):
        pred = predict(model, par, "dgx-h100", routing=routing, algorithm=algorithm)
        whole = pred.traffic.to_dense()
        parts = np.zeros_like(whole)
        for s in pred.workload.opsets:
            parts += build_traffic([s], par.world_size, 8, algorithm=algorithm).to_dense()
        assert np.array_equal(whole, parts)
        assert pred.summary()["num_pairs"] == int((whole > 0).sum())
        assert pred.summary()["max_pair_bytes"] == int(whole.max())
