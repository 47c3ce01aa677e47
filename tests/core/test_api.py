"""predict(): what it refuses it refuses at once; the op list and the traffic matrix are built when first read."""

import numpy as np
import pytest

from commscope.api import predict
from commscope.errors import ConfigError
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.traffic import traffic_of
from commscope.pattern.workload.dense import build_workload

MODEL = ModelSpec(name="m", num_layers=4, hidden_size=256, num_heads=8, seq_len=128, vocab_size=1000)
MOE = ModelSpec(name="moe", num_layers=4, hidden_size=256, num_heads=8, seq_len=128, vocab_size=1000, num_experts=4,
                top_k=2)


def test_the_op_list_and_the_matrix_are_built_when_read_and_kept():
    par = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=8)
    pred = predict(MODEL, par, "dgx-a100", algorithm="direct")
    assert pred._workload is None and pred._traffic is None
    tm = pred.traffic
    assert pred.traffic is tm and pred.workload is pred.workload
    want = traffic_of(build_workload(MODEL, par), 8, algorithm="direct")
    assert tm.triplets() == want.triplets() and tm.algorithm == "direct"
    assert pred.summary()["total_bytes"] == want.total_bytes


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(model=MODEL, parallel=ParallelSpec(tp=3, dp=2, global_batch_size=2)), ConfigError, "tp"),
    (dict(model=MODEL, parallel=ParallelSpec(tp=2, global_batch_size=2), algorithm="spiral"), ValueError, "spiral"),
    (dict(model=MOE, parallel=ParallelSpec(dp=4, ep=4, global_batch_size=4), routing=np.ones((2, 2))), ConfigError,
     "routing"),
    (dict(model=MODEL, parallel=ParallelSpec(tp=3, dp=2, global_batch_size=2, framework="torch-ddp")), ConfigError,
     "tp"),
])
def test_what_predict_refuses_it_refuses_at_once(kwargs, error, match):
    """Building the op list later must not be where a bad job first fails: predict checks Megatron's rules, the
    algorithm, the routing and the other frameworks' rules before it returns."""
    with pytest.raises(error, match=match):
        predict(cluster="dgx-a100", **kwargs)
