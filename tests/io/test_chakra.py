"""Prediction -> Chakra execution traces -> Chakra's own reader: every op of the op list on every rank it involves,
compute nodes a simulator can re-time, the estimate's schedule and overlap (issues 16 item 5 and 37)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="needs the chakra extra: pip install -e \".[chakra]\"")
from chakra.schema.protobuf.et_def_pb2 import (
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    COMP_NODE,
    GlobalMetadata,
    Node,
)
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

from commscope.api import predict
from commscope.cli.main import main
from commscope.estimate.compute.gemm import layer_gemms
from commscope.estimate.compute.model import stage_compute
from commscope.estimate.iteration import estimate
from commscope.estimate.gpus import gpu_for_cluster
from commscope.io.chakra import COMM_TYPES, export_chakra, write_chakra
from commscope.io.chakra_compute import KERNEL_CLASSES
from commscope.presets import cluster_preset, model_preset
from commscope.estimate.schedule import stage_order
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec


def _read(path):
    """Every message of an ET file, read as Chakra's jsonizer reads it."""
    fh = openFileRd(str(path))
    meta = GlobalMetadata()
    assert decodeMessage(fh, meta)
    nodes = []
    node = Node()
    while decodeMessage(fh, node):
        nodes.append(node)
        node = Node()
    fh.close()
    return meta, nodes


def _attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


#: A small dense model and its MoE sibling: every structure of a real one, fast to export.
TINY = ModelSpec(name="tiny", num_layers=8, hidden_size=256, num_heads=8, vocab_size=1000, seq_len=256)
TINY_MOE = replace(TINY, name="tiny-moe", num_experts=4, top_k=2)
INV = {code: op for op, code in COMM_TYPES.items()}

#: One job per kind of schedule and parallelism the exporter places ops for (issue 37: each once missed ops or
#: deadlocked).
JOBS = {
    "1f1b": (TINY, dict(tp=2, pp=2, dp=2, global_batch_size=16, micro_batch_size=2)),
    "interleaved": (TINY, dict(tp=2, pp=2, dp=1, virtual_pipeline_size=2, global_batch_size=8, micro_batch_size=1)),
    "cp_full_recompute": (TINY, dict(tp=2, pp=2, cp=2, recompute="full", global_batch_size=4, micro_batch_size=1)),
    "sp_zero3_tp_overlap": (TINY, dict(tp=2, pp=2, dp=2, sequence_parallel=True, zero_stage=3, tp_comm_overlap=True,
                                       global_batch_size=8, micro_batch_size=1)),
    "moe": (TINY_MOE, dict(tp=2, pp=2, dp=2, ep=2, sequence_parallel=True, global_batch_size=8, micro_batch_size=1)),
    "distributed_optimizer_overlaps": (TINY, dict(tp=2, pp=2, dp=2, distributed_optimizer=True, overlap_grad_reduce=True,
                                                  overlap_param_gather=True, grad_bucket_size=200_000,
                                                  global_batch_size=16, micro_batch_size=2)),
    "scatter_gather_selective": (TINY, dict(tp=2, pp=2, dp=1, scatter_gather_tensors_in_pipeline=True,
                                            recompute="selective", global_batch_size=4, micro_batch_size=1)),
    "uneven_gpipe": (replace(TINY, num_layers=7), dict(pp=3, dp=2, schedule="gpipe", global_batch_size=12,
                                                       micro_batch_size=2)),
    "torch_ddp": ("ref-gpt", dict(framework="torch-ddp", tp=2, pp=2, dp=2, sequence_parallel=True,
                                  global_batch_size=16, micro_batch_size=2)),
    "torch_fsdp2": ("ref-gpt", dict(framework="torch-fsdp2", tp=2, pp=1, dp=4, sequence_parallel=True,
                                    global_batch_size=16, micro_batch_size=2)),
}


def _export(tmp_path, model, parallel, cluster="dgx-h100", routing=None, **kw):
    model = model_preset(model) if isinstance(model, str) else model
    pred = predict(model, parallel, cluster_preset(cluster), routing=routing)
    est = estimate(pred, **kw)
    return pred, est, export_chakra(pred, est, tmp_path)


def _traces(out, world):
    groups = {k: tuple(v) for k, v in json.loads((out / "comm_group.json").read_text()).items()}
    return [_read(out / f"commscope.{rank}.et")[1] for rank in range(world)], groups


def _expected_ops(pred, rank) -> Counter:
    """The rank's op instances of the op list: collectives of its groups, its sends and receives, its all-to-alls."""
    out: Counter = Counter()
    for op in pred.workload.ops("full"):
        if op.op in ("send", "recv") or (op.op == "all_to_all" and op.rank is not None):
            if op.rank != rank:
                continue
            who = ((op.rank, op.peer) if op.op == "send" else (op.peer, op.rank)) if op.op != "all_to_all" else op.group
        elif rank in op.group:
            who = op.group
        else:
            continue
        out[(op.op, op.name, op.phase, op.micro_batch, op.layer, tuple(who), op.size_bytes)] += op.count
    return out


def _node_ops(nodes, groups) -> Counter:
    out: Counter = Counter()
    for n in nodes:
        a = _attrs(n)
        if n.type == COMM_COLL_NODE:
            op, who, size = INV[a["comm_type"]], groups[a["pg_name"]], a.get("commscope_send_bytes", a["comm_size"])
        elif n.type in (COMM_SEND_NODE, COMM_RECV_NODE):
            op = "send" if n.type == COMM_SEND_NODE else "recv"
            who, size = (a["comm_src"], a["comm_dst"]), a["comm_size"]
        else:
            continue
        out[(op, a["commscope_name"], a["commscope_phase"], a.get("commscope_micro_batch"), a.get("commscope_layer"),
             tuple(who), size)] += 1
    return out


@pytest.mark.parametrize("name", list(JOBS))
def test_every_op_of_the_op_list_is_on_every_rank_it_involves(tmp_path, name):
    """Ops with count > 1 were once exported once: the last stage missed its cross-entropy all-reduces, a CP job 96
    sends and receives per rank, ZeRO-3 its gathers, an MoE job 48 of its 69 collectives per rank."""
    model, kw = JOBS[name]
    pred, _, export = _export(tmp_path, model, ParallelSpec(**kw))
    world = pred.parallel.world_size
    traces, groups = _traces(tmp_path, world)
    assert export.unplaced == ()  # every op has its place by rule
    sends, recvs = Counter(), Counter()
    for rank, nodes in enumerate(traces):
        assert _node_ops(nodes, groups) == _expected_ops(pred, rank), f"rank {rank}"
        for k, n in enumerate(nodes):
            assert n.id == k and all(d < k for d in [*n.data_deps, *n.ctrl_deps])  # ids in order, parents first
            a = _attrs(n)
            if n.type == COMM_COLL_NODE:
                assert rank in groups[a["pg_name"]]
            elif n.type in (COMM_SEND_NODE, COMM_RECV_NODE):
                assert (a["comm_src"] if n.type == COMM_SEND_NODE else a["comm_dst"]) == rank
                (sends if n.type == COMM_SEND_NODE else recvs)[(a["comm_src"], a["comm_dst"], a["comm_tag"],
                                                                a["comm_size"])] += 1
    assert sends == recvs and set(sends.values()) <= {1}  # every send has its receive, each message its own tag
    assert export.num_nodes == tuple(len(n) for n in traces)


def test_an_all_to_all_carries_one_size_on_every_member(tmp_path):
    """A simulator runs one all-to-all per group: with uneven routing every member's comm_size is the group's largest
    send buffer (what the estimate times); each rank's own stays in commscope_send_bytes."""
    import numpy as np

    model, kw = JOBS["moe"]
    routing = np.array([[30, 2], [8, 24]])  # tokens from EP rank i to EP rank j
    pred, _, _ = _export(tmp_path, model, ParallelSpec(**kw), routing=routing)
    traces, _ = _traces(tmp_path, pred.parallel.world_size)
    sizes: dict = {}
    for nodes in traces:
        for n in nodes:
            a = _attrs(n)
            if n.type == COMM_COLL_NODE and INV[a["comm_type"]] == "all_to_all":
                key = (a["commscope_name"], a["commscope_micro_batch"], a["commscope_layer"], a["pg_name"])
                sizes.setdefault(key, []).append((a["comm_size"], a["commscope_send_bytes"]))
    assert sizes
    for members in sizes.values():
        assert len({c for c, _ in members}) == 1 and members[0][0] == max(s for _, s in members)
    assert any(len({s for _, s in members}) > 1 for members in sizes.values())  # the routing is uneven


@pytest.mark.parametrize("cluster", ["dgx-h100", "dgx1-v100"])  # flash attention; unfused (V100)
def test_compute_nodes_carry_the_compute_models_time_flop_and_bytes(tmp_path, cluster):
    """Compute nodes once carried only a duration, so ASTRA-sim's roofline mode stopped at the first one."""
    par = ParallelSpec(tp=2, pp=2, dp=1, gradient_accumulation_fusion=False, global_batch_size=4, micro_batch_size=2)
    pred, est, _ = _export(tmp_path, TINY, par, cluster)
    gpu = gpu_for_cluster(cluster_preset(cluster))
    sc = stage_compute(TINY, par, gpu)
    m = par.num_micro_batches
    traces, _ = _traces(tmp_path, par.world_size)
    stage_of = pred.workload.layout.stage_of()
    for rank, nodes in enumerate(traces):
        s = int(stage_of[rank])
        comp = [(n, _attrs(n)) for n in nodes if n.type == COMP_NODE]
        assert all(a["num_ops"] >= 1 and a["tensor_size"] >= 1 and a["commscope_kernel"] in KERNEL_CLASSES
                   for _, a in comp)
        # the rank's compute is the compute model's, rounded to a microsecond over the whole rank, not per node
        total_us = sum(n.duration_micros for n, _ in comp)
        assert abs(total_us - 1e6 * (m * (sc.forward_s[s] + sc.backward_s[s]) + sc.optimizer_s[s])) <= 1
        by_class = Counter()
        for n, a in comp:
            by_class[a["commscope_kernel"]] += n.duration_micros
        for cls, target_s in (("gemm", m * sc.gemm_s[s]), ("attention", m * sc.attention_s[s]),
                              ("memory_bound", m * sc.memory_s[s]), ("optimizer", sc.optimizer_s[s])):
            count = sum(1 for _, a in comp if a["commscope_kernel"] == cls)
            assert abs(by_class[cls] - 1e6 * target_s) <= count + 1, cls
        # FLOP: every forward GEMM of every layer of the stage, per micro-batch
        qkv = [a["num_ops"] for n, a in comp if n.name.endswith(":qkv") and a["commscope_phase"] == "fwd"]
        flop = sum(g.flop for g in layer_gemms(TINY, par) if g.name == "qkv" and g.pass_ == "fwd")
        assert qkv and all(abs(x - flop) <= 1 for x in qkv)
    # what a roofline needs: a GEMM is compute-dense, a norm is not
    a = {n.name.split(":")[-1]: _attrs(n) for n in traces[0] if n.type == COMP_NODE}
    assert a["qkv"]["num_ops"] / a["qkv"]["tensor_size"] > 10 * a["attn_norm"]["num_ops"] / a["attn_norm"]["tensor_size"]
    assert est.compute_model == "gpu"


def test_a_roofline_retimes_the_compute_nodes(tmp_path):
    """ASTRA-sim's roofline mode (num_ops / min(bandwidth x num_ops / tensor_size, peak)) gives every compute node a
    time from its FLOP and bytes: at the H100's bf16 peak and streaming bandwidth the iteration's compute comes out
    below the compute model's (a roofline has no tile, wave or launch losses: 53% of it on the H100), but of the
    same order."""
    from commscope.io.chakra_replay import bandwidth_timer, replay

    cluster = cluster_preset("dgx-h100")
    _export(tmp_path, "gpt-1.5b", ParallelSpec(tp=2, pp=2, global_batch_size=4, micro_batch_size=2))
    gpu = gpu_for_cluster(cluster)
    timed = replay(tmp_path, bandwidth_timer(cluster))
    roof = replay(tmp_path, bandwidth_timer(cluster),
                  roofline=(gpu.peak_flops_for("bf16"), gpu.streaming_bandwidth_bytes_per_s))
    assert roof.finished
    for r in range(4):
        assert 0.3 * timed.compute_s[r] < roof.compute_s[r] < timed.compute_s[r]


def test_compute_at_gpu_util_is_the_estimates(tmp_path):
    par = ParallelSpec(tp=2, pp=2, dp=1, global_batch_size=4, micro_batch_size=2)
    _, est, _ = _export(tmp_path, TINY, par, gpu_util=0.4)
    traces, _ = _traces(tmp_path, par.world_size)
    crit = [n for n in traces[est.critical_stage * 2] if n.type == COMP_NODE]  # tp ranks come first in the order
    assert est.compute_model == "flops"
    assert sum(n.duration_micros for n in crit) == pytest.approx(1e6 * est.compute_s, abs=1)


def _passes(nodes) -> list:
    """(kind, micro-batch, chunk) of each run of compute nodes, in trace order (the optimizer step apart)."""
    out: list = []
    for n in nodes:
        a = _attrs(n)
        if n.type != COMP_NODE or a["commscope_phase"] == "optim":
            continue
        key = (a["commscope_phase"], a["commscope_micro_batch"], a["commscope_chunk"])
        if not out or out[-1] != key:
            out.append(key)
    return out


@pytest.mark.parametrize("kw", [dict(pp=4, global_batch_size=12), dict(pp=2, virtual_pipeline_size=2, global_batch_size=8),
                                dict(pp=2, virtual_pipeline_size=4, global_batch_size=4),
                                dict(pp=4, schedule="gpipe", global_batch_size=8)], ids=["1f1b", "interleaved",
                                                                                          "interleaved_m_eq_p", "gpipe"])
def test_each_rank_runs_its_stages_schedule(tmp_path, kw):
    """Each rank was once one chain of all forwards, then all backwards, whatever the schedule."""
    par = ParallelSpec(micro_batch_size=1, **kw)
    _export(tmp_path, TINY, par)
    traces, _ = _traces(tmp_path, par.world_size)
    name = "interleaved" if par.virtual_pipeline_size > 1 else par.schedule
    for rank, nodes in enumerate(traces):
        assert _passes(nodes) == stage_order(name, par.pp, par.num_micro_batches, rank, par.virtual_pipeline_size)


class Graph:
    """One rank's trace by node name, with the ancestors of a node (what must finish before it may start)."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.by_name = {}
        for n in nodes:
            self.by_name.setdefault(n.name, n)
        self._anc: dict = {}

    def __getitem__(self, name):
        return self.by_name[name]

    def ancestors(self, name) -> set:
        start = self.by_name[name].id
        if start not in self._anc:
            seen: set = set()
            stack = list(self.nodes[start].data_deps) + list(self.nodes[start].ctrl_deps)
            while stack:
                d = stack.pop()
                if d not in seen:
                    seen.add(d)
                    stack += list(self.nodes[d].data_deps) + list(self.nodes[d].ctrl_deps)
            self._anc[start] = {self.nodes[i].name for i in seen}
        return self._anc[start]

    def waits_for(self, later, earlier) -> bool:
        return earlier in self.ancestors(later)


def _graph(tmp_path, model, rank=0, **kw):
    par = ParallelSpec(**kw)
    pred, _, _ = _export(tmp_path, model, par)
    return Graph(_read(tmp_path / f"commscope.{rank}.et")[1]), pred


@pytest.mark.parametrize("overlap", [False, True])
def test_tp_communication_runs_beside_its_gemm_with_tp_comm_overlap(tmp_path, overlap):
    g, _ = _graph(tmp_path, TINY, tp=2, sequence_parallel=True, tp_comm_overlap=overlap, global_batch_size=2,
                  micro_batch_size=1)
    for comm, gemm, after in (("tp:all_gather:fwd:mb0:layer1:attn_in", "fwd:mb0:layer1:qkv", "fwd:mb0:layer1:attention"),
                              ("tp:reduce_scatter:fwd:mb0:layer1:attn_out", "fwd:mb0:layer1:attn_proj",
                               "fwd:mb0:layer1:mlp_norm"),
                              ("tp:all_gather:bwd:mb0:layer1:mlp_out_grad", "bwd:mb0:layer1:mlp_down",
                               "bwd:mb0:layer1:mlp_act")):
        assert g.waits_for(after, comm) and g.waits_for(after, gemm)
        if overlap:  # side by side: neither waits for the other
            assert not g.waits_for(gemm, comm) and not g.waits_for(comm, gemm)
        else:  # exposed, as the estimate has it without --tp-comm-overlap
            assert g.waits_for(gemm, comm) or g.waits_for(comm, gemm)


@pytest.mark.parametrize("overlap", [False, True])
def test_gradient_buckets_reduce_during_the_last_backward_with_overlap_grad_reduce(tmp_path, overlap):
    g, pred = _graph(tmp_path, TINY, dp=2, overlap_grad_reduce=overlap, grad_bucket_size=300_000,
                     global_batch_size=8, micro_batch_size=2)
    m = pred.parallel.num_micro_batches
    buckets = [n for n in g.nodes if n.type == COMM_COLL_NODE and "grads_bucket" in n.name]
    assert len(buckets) >= 3
    last_bwd = [n for n in g.nodes if n.type == COMP_NODE and n.name.startswith(f"bwd:mb{m - 1}:")][-1]
    for b in buckets:
        assert g.waits_for("optim:mbNone:optimizer_step", b.name)
        (dep,) = b.data_deps
        assert g.nodes[dep].name.startswith(f"bwd:mb{m - 1}:")  # on the last micro-batch's backward
    firsts = {g.nodes[b.data_deps[0]].name for b in buckets}
    assert (firsts == {last_bwd.name}) is not overlap  # the first buckets start before the backward ends


@pytest.mark.parametrize("overlap", [False, True])
def test_parameter_gathers_start_the_iteration_with_overlap_param_gather(tmp_path, overlap):
    g, _ = _graph(tmp_path, TINY, tp=2, dp=2, distributed_optimizer=True, overlap_param_gather=overlap,
                  grad_bucket_size=300_000, global_batch_size=4, micro_batch_size=1)
    gathers = [n for n in g.nodes if n.type == COMM_COLL_NODE and "params_bucket" in n.name]
    first_fwd = next(n for n in g.nodes if n.type == COMP_NODE)
    assert len(gathers) >= 3
    if overlap:  # the previous optimizer step's gathers, each needed where its share of the first forward begins
        assert not any(a.startswith(("bwd", "optim")) for n in gathers for a in g.ancestors(n.name))
        waiting = [n for n in g.nodes if n.type == COMP_NODE and set(n.data_deps) & {x.id for x in gathers}]
        assert {w.name.split(":")[0] + ":" + w.name.split(":")[1] for w in waiting} == {"fwd:mb0"}
        assert len(waiting) >= 2 and waiting[0].name == first_fwd.name  # bucket 0 at once, the others later
    else:  # after the optimizer step, which waits for the gradients' reduce-scatters
        assert all(g.waits_for(n.name, "optim:mbNone:optimizer_step") for n in gathers)


def test_two_communication_streams_keep_dp_traffic_on_its_own_chain(tmp_path):
    par = ParallelSpec(tp=2, dp=2, overlap_grad_reduce=True, grad_bucket_size=300_000, global_batch_size=4,
                       micro_batch_size=1)
    pred = predict(TINY, par, cluster_preset("dgx-h100"))
    export_chakra(pred, estimate(pred), tmp_path, comm_streams=2)
    nodes = _read(tmp_path / "commscope.0.et")[1]
    axis = {n.id: _attrs(n).get("commscope_axis") for n in nodes}
    buckets = [n for n in nodes if n.type == COMM_COLL_NODE and axis[n.id] == "dp"]
    assert len(buckets) >= 3
    assert all(axis[d] == "dp" for n in buckets for d in n.ctrl_deps)  # chained to DP traffic only
    with pytest.raises(ValueError, match="comm_streams=3: valid: 1"):
        export_chakra(pred, estimate(pred), tmp_path / "x", comm_streams=3)


def test_zero3_gathers_a_layer_ahead_and_reduce_scatters_behind(tmp_path):
    g, _ = _graph(tmp_path, TINY, dp=2, zero_stage=3, global_batch_size=4, micro_batch_size=2)
    ag = "dp:all_gather:fwd:mb0:layer3:params_fwd"
    assert g.waits_for("fwd:mb0:layer3:attn_norm", ag)  # layer 3 needs its parameters
    assert "fwd:mb0:layer2:attn_norm" in g.ancestors(ag)  # issued when layer 2 starts ...
    assert not g.waits_for("fwd:mb0:layer2:residual", ag)  # ... and runs while it computes
    rs = "dp:reduce_scatter:bwd:mb0:layer3:grads"
    assert g.waits_for(rs, "bwd:mb0:layer3:attn_norm")
    assert not g.waits_for("bwd:mb0:layer2:attn_norm", rs)  # nothing but the optimizer step waits for it
    assert g.waits_for("optim:mbNone:optimizer_step", rs)


def test_context_parallel_ring_runs_under_attention(tmp_path):
    """A CP job once started every rank with 24 receives whose sends came later on the peer: it deadlocked."""
    g, _ = _graph(tmp_path, TINY, cp=4, global_batch_size=1, micro_batch_size=1)
    parts = [n for n in g.nodes if n.name == "fwd:mb0:layer0:attention"]
    sends = [n for n in g.nodes if n.type == COMM_SEND_NODE and n.name.startswith("cp:send:fwd:mb0:layer0:")]
    recvs = [n for n in g.nodes if n.type == COMM_RECV_NODE and n.name.startswith("cp:recv:fwd:mb0:layer0:")]
    assert len(parts) == 4 and len(sends) == len(recvs) == 3
    assert all(not r.data_deps and not r.ctrl_deps for r in recvs)  # posted at once: they wait for data only
    for step in range(1, 4):  # step k computes with the K/V that arrived in step k - 1, while the next ones travel
        assert recvs[step - 1].id in parts[step].data_deps
        if step < 3:
            assert sends[step].id not in {d for p in parts for d in p.data_deps}
            assert recvs[step - 1].id in sends[step].data_deps  # a rank passes on what it received


@pytest.mark.parametrize("kw", [dict(), dict(virtual_pipeline_size=2), dict(virtual_pipeline_size=2, overlap_p2p_comm=False)],
                         ids=["1f1b", "interleaved", "interleaved_blocking"])
def test_pipeline_sends_block_the_next_compute_unless_interleaving_overlaps_them(tmp_path, kw):
    g, _ = _graph(tmp_path, TINY, pp=2, global_batch_size=4, micro_batch_size=1, **kw)
    sends = {n.id for n in g.nodes if n.type == COMM_SEND_NODE}
    waited = {d for n in g.nodes if n.type == COMP_NODE for d in [*n.data_deps, *n.ctrl_deps]} & sends
    overlapped = kw.get("virtual_pipeline_size", 1) > 1 and kw.get("overlap_p2p_comm", True)
    assert sends and (waited == set() if overlapped else waited == sends)


def test_the_last_stages_head_ops_run_where_the_model_runs_them(tmp_path):
    """The cross-entropy all-reduces once sat before the first layer, the logits-gradient all-reduce after the
    backward layers."""
    g, _ = _graph(tmp_path, TINY, tp=2, pp=2, global_batch_size=2, micro_batch_size=1, rank=2)
    order = {n.name: n.id for n in g.nodes}
    ce = [f"tp:all_reduce:fwd:mb0:cross_entropy#{j}" for j in range(3)]
    assert order["fwd:mb0:layer7:residual"] < order["fwd:mb0:logits"] < order[ce[0]] < order[ce[1]] < order[ce[2]]
    assert order[ce[2]] < order["bwd:mb0:cross_entropy"]
    assert g.waits_for("bwd:mb0:cross_entropy", ce[2])
    grad = "tp:all_reduce:bwd:mb0:logits_in_grad"
    assert g.waits_for(grad, "bwd:mb0:logits") and g.waits_for("bwd:mb0:layer7:residual", grad)


def test_export_cli(tmp_path, capsys):
    code = main(["export", "chakra", "--model", "gpt-1.5b", "--tp", "2", "--pp", "1", "--dp", "2",
                 "--global-batch-size", "8", "--micro-batch-size", "2", "--cluster", "dgx1-v100",
                 "--out", str(tmp_path / "et")])
    assert code == 0 and "wrote 4 Chakra execution traces" in capsys.readouterr().out
    _, nodes = _read(tmp_path / "et" / "commscope.3.et")
    assert any(n.type == COMM_COLL_NODE for n in nodes)


def test_export_check_replays_and_prints_the_time_beside_the_estimate(tmp_path, capsys):
    code = main(["export", "chakra", "--model", "gpt-1.5b", "--tp", "2", "--pp", "2", "--dp", "2",
                 "--virtual-pipeline-size", "2", "--global-batch-size", "16", "--micro-batch-size", "2",
                 "--cluster", "dgx-h100", "--out", str(tmp_path / "et"), "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("replay:"))
    assert "every rank finished: simulated iteration" in line and "estimate" in line
    sim, est = (float(x.split(" ms")[0].replace(",", "")) for x in
                (line.split("simulated iteration ")[1], line.split("estimate ")[1]))
    assert sim == pytest.approx(est, rel=0.05)


def test_write_chakra_returns_the_traces_then_the_group_file(tmp_path):
    par = ParallelSpec(tp=2, dp=2, global_batch_size=4, micro_batch_size=1)
    pred = predict(TINY, par, cluster_preset("dgx-h100"))
    paths = write_chakra(pred, estimate(pred), tmp_path)
    assert [p.name for p in paths] == [f"commscope.{r}.et" for r in range(4)] + ["comm_group.json"]
    meta, _ = _read(paths[0])
    a = {x.name: getattr(x, x.WhichOneof("value")) for x in meta.attr}
    assert a["rank"] == 0 and a["world_size"] == 4 and a["schedule"] == "1f1b" and a["num_micro_batches"] == 2


_JOB = ["--model", "gpt-1.5b", "--global-batch-size", "8", "--micro-batch-size", "2", "--cluster", "dgx1-v100"]


def test_an_export_is_never_mixed_with_an_earlier_one(tmp_path, capsys):
    """A 4-rank export into the folder of an 8-rank one once left commscope.4-7.et beside a 4-rank comm_group.json."""
    out = tmp_path / "et"
    assert main(["export", "chakra", *_JOB, "--tp", "2", "--pp", "2", "--dp", "2", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for prefix in ("commscope", "other"):  # another prefix would still replace comm_group.json
        assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "4", "--out", str(out),
                     "--prefix", prefix]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"out='{out}': already holds an export of an earlier run (comm_group.json, commscope.0.et" in err
        assert "give --force to replace it, or choose another directory" in err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "comm_group.json").unlink()  # the traces alone are an export too
    assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "4", "--out", str(out)]) == 2
    assert "already holds an export of an earlier run (commscope.0.et, commscope.1.et" in capsys.readouterr().err
    # --force: the earlier export is removed whole, never a 4-rank export beside 8-rank traces
    assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "4", "--out", str(out), "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["comm_group.json", *(f"commscope.{r}.et" for r in range(4))]


def test_write_chakra_refuses_an_earlier_export(tmp_path):
    model, cluster = model_preset("gpt-1.5b"), cluster_preset("dgx1-v100")
    pred = predict(model, ParallelSpec(tp=1, pp=1, dp=2, global_batch_size=8, micro_batch_size=2), cluster)
    est = estimate(pred)
    write_chakra(pred, est, tmp_path)
    with pytest.raises(ValueError, match="already holds export output"):
        write_chakra(pred, est, tmp_path)


def test_export_out_is_checked_before_any_work(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    assert main(["export", "chakra", *_JOB, "--out", str(tmp_path / "file.txt" / "et")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("prefix", ["../escaped", "", ".hidden", "sub/name", "a..b", "..", "/abs"])
def test_a_prefix_that_is_not_a_file_name_is_refused(tmp_path, capsys, prefix):
    """--prefix ../escaped once wrote escaped.0.et beside --out, and --prefix '' hidden .0.et files in it."""
    out = tmp_path / "sub" / "et"
    assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "2", "--out", str(out),
                 "--prefix", prefix]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"prefix={prefix!r}: must be a plain file name stem" in err
    assert not any(tmp_path.rglob("*.et")) and not out.exists()
