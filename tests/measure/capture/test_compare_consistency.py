"""A perfect recording of a predicted iteration compares as exact: the join of predicted and measured is sound."""

from __future__ import annotations

from collections import defaultdict

import pytest

from commscope.api import predict
import numpy as np

from commscope.measure.capture.analysis import RunLog, compare, logical_ops, measured_traffic
from commscope.spec.cluster import ClusterSpec, LinkTier
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

CLUSTER = ClusterSpec(name="c", intra_node=LinkTier(name="a", bandwidth_bytes_per_s=1e11),
                      inter_node=LinkTier(name="b", bandwidth_bytes_per_s=1e10), peak_flops={"bf16": 1e14})


def _as_recorded(workload) -> RunLog:
    """Every predicted op as the ranks would log it: collectives on each member, p2p on each side, step 0."""
    by_rank = defaultdict(list)
    for op in workload.ops("group"):
        tagged = op.with_(extra=(("step", 0),))
        if op.rank is not None:
            by_rank[op.rank].append(tagged)
        else:
            for r in op.group:
                by_rank[r].append(tagged.with_(rank=r))
    return RunLog(ops_by_rank=dict(by_rank), world_size=workload.world_size)


@pytest.mark.parametrize("parallel", [
    ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=8, micro_batch_size=2),
    ParallelSpec(pp=2, dp=4, ep=4, global_batch_size=8),          # EP groups hold the same ranks as DP groups
    ParallelSpec(tp=2, dp=2, cp=2, ep=2, global_batch_size=4, sequence_parallel=True),
])
def test_perfect_recording_compares_exactly(parallel):
    model = ModelSpec(name="moe", num_layers=4, hidden_size=64, num_heads=4, seq_len=32, vocab_size=256,
                      num_experts=4, top_k=2)
    pred = predict(model, parallel, CLUSTER)
    result = compare(pred, _as_recorded(pred.workload))
    assert result["max_rel_error"] == 0.0, result["by_axis"]
    for row in result["by_op"]:
        assert row["measured_count"] == row["predicted_count"], row
        assert row["measured_bytes"] == row["predicted_bytes"], row
    if parallel.ep > 1:
        assert result["by_axis"]["ep"]["measured_bytes"] > 0
    # and the measured matrix, built with the prediction's decomposition, is the predicted matrix
    tm = measured_traffic(logical_ops(_as_recorded(pred.workload)), pred.traffic.world_size, 8)
    assert tm.bytes_by_axis() == pred.traffic.bytes_by_axis()
    assert np.array_equal(tm.to_dense(), pred.traffic.to_dense())
