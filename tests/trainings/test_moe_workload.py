"""The reference MoE trained with expert parallelism on real gloo ranks: the recorded routing sizes the
prediction, and the recorded all-to-all bytes match it exactly, step by step."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from commscope.measure.capture.analysis import op_step, read_run  # noqa: E402
from commscope.cli.main import main  # noqa: E402
from commscope.errors import ConfigError  # noqa: E402
from commscope.moe.routing import rank_tokens  # noqa: E402
from commscope.moe.trace import load_trace  # noqa: E402
from commscope.spec.parallel import ParallelSpec  # noqa: E402
from commscope.trainings.moe import (MoeRunConfig, check_moe_config, compare_run, reference_moe_model,  # noqa: E402
                                     run_moe)


def test_recorded_all_to_alls_carry_exactly_the_recorded_routing(tmp_path):
    model = reference_moe_model()
    parallel = ParallelSpec(dp=4, ep=4, micro_batch_size=2, global_batch_size=16)
    logs, routing = tmp_path / "logs", tmp_path / "routing"
    results = run_moe(MoeRunConfig(model=model, parallel=parallel, steps=2, record=str(logs),
                                   record_routing=str(routing)), timeout_s=240)
    trace = load_trace(routing)
    assert trace.counts.shape == (2, 2, 2, 4, 8)  # steps, micro-batches, MoE layers, EP ranks, experts
    assert (trace.counts.sum(axis=-1) == 2 * 32 * 2).all()  # every token to top-2 experts, nothing dropped
    run = read_run(logs)
    token_bytes = model.hidden_size * 4
    for rank in range(4):
        # forward dispatches of rank r, in order: (step, micro-batch, layer); their splits are the routing
        sends = [o for o in run.ops_by_rank[rank] if o.op == "all_to_all" and op_step(o) is not None]
        # per layer and micro-batch: dispatch, combine forward; combine_grad, dispatch_grad backward
        assert len(sends) == 2 * 2 * 2 * 4
        dispatch = sends[0]
        expected = rank_tokens(trace.counts[0, 0, 0], trace.placement, 4)[rank] * token_bytes
        assert list(dispatch.splits) == list(expected)
    result = compare_run(model, parallel, logs, routing)
    assert result["max_rel_error"] == 0
    assert all(r["predicted_bytes"] == r["measured_bytes"] and r["predicted_count"] == r["measured_count"]
               for r in result["by_op"]), result["by_op"]
    assert {r["axis"] for r in result["by_op"]} == {"ep", "dp"}
    assert all(np.isfinite(r["losses"]).all() for r in results)


def test_cli_with_expert_data_parallel_replicas(tmp_path, capsys):
    """ep 2 inside dp 4: two EP groups, each with its own routing; expert gradients reduced over expert-dp."""
    code = main(["workload", "moe", "--ep", "2", "--dp", "4", "--steps", "1", "--record", str(tmp_path), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["comparison"]["max_rel_error"] == 0
    assert all(r["predicted_bytes"] == r["measured_bytes"] for r in out["comparison"]["by_op"])
    assert len(out["routing_metrics"]) == 2 and (tmp_path / "routing" / "group001").is_dir()
    # the recorded routing is a trace the MoE analysis reads
    assert main(["moe", "analyze", str(tmp_path / "routing" / "group000"), "--out", str(tmp_path / "moe"),
                 "--no-plot"]) == 0


@pytest.mark.parametrize("dp", [1, 2])
def test_an_ep_group_of_one_moves_nothing_as_predicted(tmp_path, capsys, dp):
    """`workload moe --ep 1` all-gathered and all-to-all'ed over EP groups of one rank (and all-reduced the dense
    gradients over a world of one): ops that move nothing, which the prediction rightly leaves out, so the comparison
    said 100% off and asked whether the job was the one recorded. Megatron-core hands a group of one its input back."""
    rec = tmp_path / "rec"
    code = main(["workload", "moe", "--ep", "1", "--dp", str(dp), "--steps", "1", "--record", str(rec), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["comparison"]["max_rel_error"] == 0
    assert all(r["predicted_count"] == r["measured_count"] and r["predicted_bytes"] == r["measured_bytes"]
               for r in out["comparison"]["by_op"]), out["comparison"]["by_op"]
    ops = read_run(rec).all_ops
    assert all(len(o.group) > 1 for o in ops) and (dp > 1 or not ops)
    assert (rec / "routing").is_dir()  # the routing is still recorded
    if dp == 1:
        main(["workload", "moe", "--ep", "1", "--steps", "1", "--record", str(tmp_path / "again")])
        assert "no communication, as predicted (one rank talks to no one)" in capsys.readouterr().out


def test_ep_that_does_not_divide_dp_is_explained(capsys):
    assert main(["workload", "moe", "--ep", "4", "--dp", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "ep=4" in err and "--ep 4 --dp 8" in err


@pytest.mark.parametrize("change,field", [
    (dict(tp=2), "tp"),
    (dict(ep=3, dp=3, global_batch_size=6), "ep"),
    (dict(framework="torch-ddp"), "framework"),
])
def test_bad_moe_runs_are_refused(change, field):
    values = {**dict(dp=4, ep=4, global_batch_size=8, micro_batch_size=2), **change}
    with pytest.raises(ConfigError) as err:
        check_moe_config(MoeRunConfig(model=reference_moe_model(), parallel=ParallelSpec(**values)))
    assert err.value.field == field
