"""The dense workload against closed forms (DESIGN.md, the seed talk) and invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from strategies import jobs

from commscope.errors import ConfigError
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.spec.params import embedding_params, layer_params
from commscope.pattern.traffic import traffic_of
from commscope.units import dtype_bytes
from commscope.pattern.workload.dense import build_workload
from commscope.pattern.workload.framework import grad_dtype
from commscope.pattern.workload.stages import virtual_stage_layers

GPT = ModelSpec(name="gpt-1.5b", num_layers=24, hidden_size=2304, num_heads=24, vocab_size=50257, seq_len=1024)


def _dp_copies(model: ModelSpec, parallel: ParallelSpec) -> int:
    """Parameters summed over one rank of every (pp, tp) position: replicated ones t times, the tied copy twice."""
    t = parallel.tp
    total = 0
    for layer in range(model.num_layers):
        lp = layer_params(model, layer, tp=t, ep=1)
        total += lp.tp_sharded + t * lp.replicated
    emb = embedding_params(model, tp=t)
    total += emb.input_embedding + t * emb.position_embedding + t * emb.final_norm
    if not model.tied_embeddings or parallel.pp > 1:
        total += emb.output_layer
    return total


@pytest.mark.parametrize("tp,pp,dp", [(2, 4, 4), (1, 1, 8), (4, 2, 3), (8, 3, 2)])
def test_dp_bytes_closed_form(tp, pp, dp):
    parallel = ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=24 * dp, micro_batch_size=2)
    tm = traffic_of(build_workload(GPT, parallel), 8)
    grad_bytes = dtype_bytes(grad_dtype(GPT, parallel))
    assert tm.bytes_by_axis()["dp"] == 2 * (dp - 1) * _dp_copies(GPT, parallel) * grad_bytes


@pytest.mark.parametrize("tp,pp,dp,mb,gb", [(2, 4, 4, 4, 512), (4, 1, 2, 1, 8), (8, 2, 1, 2, 16)])
def test_tp_bytes_closed_form_without_sp(tp, pp, dp, mb, gb):
    parallel = ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=gb, micro_batch_size=mb)
    m = parallel.num_micro_batches
    b, s, h, B = mb, GPT.seq_len, GPT.hidden_size, 2
    act = b * s * h * B
    # per TP group and micro-batch: 4 all-reduces per layer (2 fwd, 2 bwd), 1 embedding, 1 logits-input
    # gradient, and 3 fp32 cross-entropy all-reduces of (b, s). Ring all-reduce wire bytes = 2 (t-1) S.
    expected = 2 * (tp - 1) * dp * m * ((4 * GPT.num_layers + 2) * act + 3 * b * s * 4)
    tm = traffic_of(build_workload(GPT, parallel), 8)
    assert tm.bytes_by_axis()["tp"] == expected


def test_full_recompute_adds_two_forward_all_reduces_per_layer():
    base = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=8, micro_batch_size=1)
    full = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=8, micro_batch_size=1, recompute="full")
    sel = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=8, micro_batch_size=1, recompute="selective")
    tp = {p.recompute: traffic_of(build_workload(GPT, p), 8).bytes_by_axis()["tp"] for p in (base, full, sel)}
    act = GPT.seq_len * GPT.hidden_size * 2
    extra = 2 * (2 - 1) * 2 * base.num_micro_batches * 2 * GPT.num_layers * act
    assert tp["full"] - tp["none"] == extra
    assert tp["selective"] == tp["none"]


def test_sequence_parallel_keeps_layer_volume():
    # all-gather + reduce-scatter move the same wire bytes as the all-reduce they replace
    no_sp = ParallelSpec(tp=4, pp=1, dp=1, global_batch_size=2, micro_batch_size=1)
    sp = ParallelSpec(tp=4, pp=1, dp=1, global_batch_size=2, micro_batch_size=1, sequence_parallel=True)
    w_no, w_sp = build_workload(GPT, no_sp), build_workload(GPT, sp)
    layer_ops = lambda w: sum(traffic_of(type(w)(model=w.model, parallel=w.parallel, layout=w.layout,
                                                   opsets=tuple(s for s in w.opsets if s.layers)), 8).total_bytes
                              for _ in [0])
    assert layer_ops(w_no) == layer_ops(w_sp)
    ops = {s.op for s in w_sp.opsets if s.axis == "tp" and s.layers}
    assert ops == {"all_gather", "reduce_scatter"}


@pytest.mark.parametrize("sp,v", [(False, 1), (True, 1), (False, 2), (True, 3)])
def test_pp_bytes_closed_form(sp, v):
    model = ModelSpec(name="x", num_layers=24, hidden_size=512, num_heads=8, seq_len=256)
    tp, pp, dp, mb = 2, 4, 2, 2
    parallel = ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=16 * dp * mb, micro_batch_size=mb,
                            sequence_parallel=sp, virtual_pipeline_size=v)
    m = parallel.num_micro_batches
    act = mb * model.seq_len * model.hidden_size * 2
    # (p v - 1) boundaries x t d lanes x (activation + gradient) x m; with SP each TP rank sends act / t.
    expected = (pp * v - 1) * (dp * (1 if sp else tp)) * 2 * m * act
    tm = traffic_of(build_workload(model, parallel), 8)
    assert tm.bytes_by_axis()["pp"] == expected


@pytest.mark.parametrize("v", [1, 2])
def test_scatter_gather_pipeline_messages(v):
    """Megatron-LM's scatter/gather: each TP rank sends act / t over the stage boundary and the receiving TP
    group all-gathers the pieces, in both directions; sequence parallelism makes it a no-op."""
    model = ModelSpec(name="x", num_layers=24, hidden_size=512, num_heads=8, seq_len=256)
    tp, pp, dp, mb = 4, 4, 2, 2
    base = dict(tp=tp, pp=pp, dp=dp, global_batch_size=16 * dp * mb, micro_batch_size=mb, virtual_pipeline_size=v)
    plain = build_workload(model, ParallelSpec(**base))
    sg = build_workload(model, ParallelSpec(**base, scatter_gather_tensors_in_pipeline=True))
    act = mb * model.seq_len * model.hidden_size * 2
    m, boundaries = plain.parallel.num_micro_batches, pp * v - 1
    sends = [s for s in sg.opsets if s.axis == "pp" and s.op == "send"]
    gathers = [s for s in sg.opsets if s.axis == "pp" and s.op == "all_gather"]
    assert {s.size_bytes for s in sends} == {act // tp}
    assert sum(s.num_ops for s in sends) == sum(s.num_ops for s in plain.opsets if s.axis == "pp" and s.op == "send")
    # one gather per boundary, direction and micro-batch on each of the receiving stage's d TP groups
    assert len(gathers) == 2 * boundaries
    assert all(g.size_bytes == act and g.group_size == tp and g.groups.shape[0] == dp for g in gathers)
    assert sum(g.count for g in gathers) == 2 * boundaries * m
    # the bytes on the wire: sends (t d lanes x act/t) plus ring all-gathers ((t-1)/t act per rank)
    tm = traffic_of(sg, 8)
    assert tm.bytes_by_axis()["pp"] == boundaries * 2 * m * dp * (act + (tp - 1) * act)
    with_sp = dict(base, sequence_parallel=True)
    a = build_workload(model, ParallelSpec(**with_sp, scatter_gather_tensors_in_pipeline=True)).opsets
    b = build_workload(model, ParallelSpec(**with_sp)).opsets
    assert [(s.op, s.name, s.size_bytes, s.groups.tolist()) for s in a] == [
        (s.op, s.name, s.size_bytes, s.groups.tolist()) for s in b]


def test_scatter_gather_needs_megatron():
    with pytest.raises(ConfigError, match="scatter_gather_tensors_in_pipeline"):
        ParallelSpec(tp=2, pp=2, framework="torch-ddp", scatter_gather_tensors_in_pipeline=True)


def test_tied_embedding_sync():
    parallel = ParallelSpec(tp=2, pp=4, dp=2, global_batch_size=8)
    tm = traffic_of(build_workload(GPT, parallel), 8)
    vocab = GPT.padded_vocab_size(2)
    assert vocab == 50432  # 50257 padded to a multiple of 128 x 2
    # one all-reduce per (tp, dp) lane between first and last stage; a ring of 2 sends S each way
    assert tm.bytes_by_axis()["emb"] == 2 * 2 * 2 * (vocab * GPT.hidden_size // 2) * 4
    untied = build_workload(ModelSpec(**{**_fields(GPT), "tied_embeddings": False}), parallel)
    assert traffic_of(untied, 8).bytes_by_axis()["emb"] == 0


def _fields(spec):
    from dataclasses import fields

    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def test_zero_stages():
    parallel0 = ParallelSpec(tp=1, pp=1, dp=4, global_batch_size=8)
    p1 = ParallelSpec(tp=1, pp=1, dp=4, global_batch_size=8, zero_stage=1)
    p3 = ParallelSpec(tp=1, pp=1, dp=4, global_batch_size=8, zero_stage=3)
    w0, w1, w3 = (build_workload(GPT, p) for p in (parallel0, p1, p3))
    assert {s.op for s in w0.opsets if s.axis == "dp"} == {"all_reduce"}
    assert {s.op for s in w1.opsets if s.axis == "dp"} == {"reduce_scatter", "all_gather"}
    # ZeRO-1: grads (fp32) reduce-scattered, params (bf16) all-gathered: (d-1)/d x N x (4 + 2) per rank
    n = GPT.num_parameters(padded_vocab=True)
    assert traffic_of(w1, 8).bytes_by_axis()["dp"] == 3 * n * (4 + 2)
    # ZeRO-3 gathers every micro-batch forward and backward: far more than ZeRO-1
    assert traffic_of(w3, 8).bytes_by_axis()["dp"] > 2 * traffic_of(w1, 8).bytes_by_axis()["dp"]
    assert all(s.micro_batches == p3.num_micro_batches for s in w3.opsets if s.axis == "dp")


def test_context_parallel_ring():
    model = ModelSpec(name="x", num_layers=4, hidden_size=256, num_heads=8, num_query_groups=2, seq_len=1024)
    parallel = ParallelSpec(cp=4, dp=2, global_batch_size=4, micro_batch_size=1)
    w = build_workload(model, parallel)
    tm = traffic_of(w, 8)
    kv = 2 * 1 * (1024 // 4) * 2 * 32 * 2  # 2 (K, V) x b x s/c x g x d_h x B
    # per layer, micro-batch and rank: c-1 sends forward, 2(c-1) backward
    per_rank = 4 * parallel.num_micro_batches * 3 * (4 - 1) * kv
    assert tm.bytes_by_axis()["cp"] == per_rank * parallel.world_size
    # the DP gradient group spans dp x cp
    assert {s.group_size for s in w.opsets if s.axis == "dp"} == {8}


@settings(max_examples=80, deadline=None)
@given(jobs(moe=None))
def test_invariants(job):
    model, parallel = job
    w = build_workload(model, parallel)
    for alg in ("ring", "direct", "tree", "hierarchical"):
        tm = traffic_of(w, 4, algorithm=alg)
        assert (tm.src != tm.dst).all()  # the diagonal is zero
        assert (tm.bytes > 0).all()
        assert tm.sent_by_rank().sum() == tm.total_bytes == tm.received_by_rank().sum()
        assert sum(tm.bytes_by_link().values()) == tm.total_bytes
        if alg == "ring":
            ring_total = tm.total_bytes
            ring_axes = tm.bytes_by_axis()
        else:  # every algorithm moves the same total volume for these ops
            assert tm.total_bytes == ring_total, alg
            assert tm.bytes_by_axis() == ring_axes
    axes = {s.axis for s in w.opsets}
    assert ("tp" in axes) == (parallel.tp > 1)
    assert ("pp" in axes) == (parallel.pp > 1)
    assert ("cp" in axes) == (parallel.cp > 1)
    assert ("dp" in axes) == (parallel.dp * parallel.cp > 1 or (parallel.expert_dp > 1 and model.is_moe))
    assert ("ep" in axes) == (parallel.ep > 1)
    # sends and recvs pair up
    sends = sum(s.num_ops for s in w.opsets if s.op == "send")
    recvs = sum(s.num_ops for s in w.opsets if s.op == "recv")
    assert sends == recvs
    # every CommOp carries the fields the record promises
    for op in w.ops("group"):
        assert op.axis and op.group and op.phase and op.dtype
        break


@settings(max_examples=40, deadline=None)
@given(jobs())
def test_ring_all_reduce_symmetric_within_groups(job):
    model, parallel = job
    w = build_workload(model, parallel)
    tm = traffic_of(w, 8)
    if parallel.tp == 1:
        return
    s, _d, b = tm.pairs("tp")
    sent = np.bincount(s, weights=b.astype(float), minlength=tm.world_size)
    for g in w.layout.groups("tp"):
        vals = sent[g]
        # equal up to chunk rounding (a few elements per op)
        assert vals.max() - vals.min() <= 0.01 * vals.max() + 64 * 1000


@pytest.mark.parametrize(
    "change, field, message",
    [
        (dict(tp=5), "tp", "tp=5: must divide num_heads=24"),
        (dict(pp=25), "pp", "pp=25: is larger than num_layers=24"),
        (dict(ep=2), "ep", "ep=2: needs an MoE model"),
    ],
)
def test_invalid_jobs_name_the_field(change, field, message):
    kwargs = dict(tp=1, pp=1, dp=2, global_batch_size=40)
    kwargs.update(change)
    with pytest.raises(ConfigError) as info:
        build_workload(GPT, ParallelSpec(**kwargs))
    assert info.value.field == field
    assert message in str(info.value)


def test_explicit_pipeline_split():
    model = ModelSpec(name="x", num_layers=10, hidden_size=256, num_heads=8, seq_len=64)
    # pp=4 does not divide 10 layers: a balanced split is chosen and noted, the lighter stages first and last
    # (Megatron-core's split with the embedding and the loss counted as a layer each)
    auto = build_workload(model, ParallelSpec(pp=4, global_batch_size=4))
    assert [len(r) for r in virtual_stage_layers(model, ParallelSpec(pp=4, global_batch_size=4))] == [2, 3, 3, 2]
    assert any("pipeline split 2,3,3,2" in n for n in auto.notes)
    w = build_workload(model, ParallelSpec(pp=4, global_batch_size=4, pipeline_layers=(2, 3, 3, 2)))
    tp_layers = [s.layers for s in w.opsets if s.layers]
    assert tp_layers == []  # tp=1
    with pytest.raises(ConfigError, match="pipeline_layers=.*: sums to 11; must sum to num_layers=10"):
        build_workload(model, ParallelSpec(pp=4, global_batch_size=4, pipeline_layers=(2, 3, 3, 3)))


def test_expanded_ops_match_aggregates():
    parallel = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=8, micro_batch_size=2)
    w = build_workload(GPT, parallel)
    full = list(w.ops("full"))
    group = list(w.ops("group"))
    assert len(full) == w.num_ops("full") and len(group) == w.num_ops("group")
    assert sum(o.count for o in full) == sum(o.count for o in group) == sum(s.num_ops for s in w.opsets)
    layered = [o for o in full if o.axis == "tp" and o.layer is not None]
    assert {o.micro_batch for o in layered} == set(range(parallel.num_micro_batches))
    assert {o.layer for o in layered} == set(range(GPT.num_layers))


@settings(max_examples=120, deadline=None)
@given(jobs(moe=None))
def test_closed_form_volumes_match_the_op_engine(job):
    from commscope.pattern.volumes import axis_volumes

    model, p = job
    if p.grad_bucket_size is not None:
        p = ParallelSpec(**{**_fields(p), "grad_bucket_size": None})
    tm = traffic_of(build_workload(model, p), 8)
    vol = axis_volumes(model, tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, micro_batch_size=p.micro_batch_size,
                       global_batch_size=p.global_batch_size, virtual_pipeline_size=p.virtual_pipeline_size,
                       sequence_parallel=p.sequence_parallel, recompute_full=p.recompute == "full",
                       zero_stage=p.zero_stage, distributed_optimizer=p.distributed_optimizer)
    exact = tm.bytes_by_axis()
    assert {k: int(v) for k, v in vol.items()} == {k: exact[k] for k in vol}


def test_rooted_ops_flow_from_the_root_their_record_names():
    """A measured rooted collective keeps its group as called and its root apart (``extra["root"]``); its flows were
    drawn from the group's first rank whatever the root. They now start (or end) at the root, ring order kept; an op
    that names no root (a predicted one) starts at its group's first rank as before."""
    from commscope.commop import CommOp
    from commscope.pattern.traffic import flows_of_op, root_first

    def flows(op: str, root: int | None, size: int = 400) -> set[tuple[int, int, int]]:
        extra = (("root", root),) if root is not None else ()
        return set(flows_of_op(CommOp(op=op, axis="other", group=(0, 1, 2, 3), size_bytes=size, dtype="fp32",
                                      extra=extra)))

    assert root_first("broadcast", (0, 1, 2, 3), 2) == (2, 3, 0, 1)
    assert root_first("all_reduce", (0, 1, 2, 3), 2) == (0, 1, 2, 3)
    assert root_first("reduce", (4, 6), 9) == (4, 6)  # no member: as called
    assert flows("broadcast", 2) == {(2, 3, 400), (3, 0, 400), (0, 1, 400)}
    assert flows("reduce", 2) == {(3, 0, 400), (0, 1, 400), (1, 2, 400)}
    assert flows("gather", 1) == {(2, 1, 100), (3, 1, 100), (0, 1, 100)}
    assert flows("scatter", 3) == {(3, 0, 100), (3, 1, 100), (3, 2, 100)}
    assert flows("broadcast", None) == flows("broadcast", 0) == {(0, 1, 400), (1, 2, 400), (2, 3, 400)}
