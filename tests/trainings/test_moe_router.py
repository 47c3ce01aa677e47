"""A router that learns: the reference MoE trained on real text with Megatron's router losses, on 4 real gloo
ranks. Its routing differs from random-token routing, the load-balancing loss moves expert load towards
uniform against the same run without it, and with token dropping the recorded all-to-alls still carry
exactly the predicted bytes."""

from __future__ import annotations

import numpy as np
import pytest

from commscope.errors import ConfigError
from commscope.moe.metrics import routing_metrics
from commscope.moe.routing import apply_capacity
from commscope.moe.trace import RoutingTrace, load_trace
from commscope.spec.parallel import ParallelSpec
from commscope.trainings.moe import (
    MoeRunConfig,
    check_moe_config,
    compare_run,
    reference_moe_model,
    run_moe,
)

torch = pytest.importorskip("torch")

STEPS = 24
RANDOM_STEPS = 5  # random tokens: only the first steps are compared
PARALLEL = ParallelSpec(dp=4, ep=4, micro_batch_size=2, global_batch_size=16)
CAPACITY = 1.5  # every run drops the same way, so that only the data or the aux loss differs


def _trace(results: list[dict]) -> RoutingTrace:
    """The EP group's routing from the ranks' results (ranks are EP ranks 0..3 here)."""
    counts = np.stack([r["routing"] for r in sorted(results, key=lambda r: r["ep_rank"])], axis=3)
    return RoutingTrace(counts=counts, top_k=2)


def _run(tmp_path, name: str, *, data: str, aux: float, record: bool = False,
         steps: int = STEPS) -> tuple[list[dict], RoutingTrace]:
    model = reference_moe_model(capacity_factor=CAPACITY)
    cfg = MoeRunConfig(model=model, parallel=PARALLEL, steps=steps, data=data, aux_loss_coeff=aux, seed=3,
                       record=str(tmp_path / name) if record else None,
                       record_routing=str(tmp_path / name / "routing") if record else None)
    results = run_moe(cfg, timeout_s=240)
    return results, _trace(results)


def test_trained_router_on_text_learns_and_the_aux_loss_balances_it(tmp_path):
    text_results, text = _run(tmp_path, "text", data="text", aux=0.0, record=True)
    _, balanced = _run(tmp_path, "aux", data="text", aux=0.05)
    _, noise = _run(tmp_path, "random", data="random", aux=0.0, steps=RANDOM_STEPS)
    plain, aux, rand = (routing_metrics(t, capacity_factor=CAPACITY) for t in (text, balanced, noise))

    # the model learns the text: the language-model loss falls well below its start
    loss = np.mean([r["losses"] for r in text_results], axis=0)
    assert loss[-5:].mean() < loss[:3].mean() - 2.0, loss
    # real text routes unevenly from the first steps (bytes are not uniform); random tokens do not
    start = slice(0, RANDOM_STEPS)
    assert plain.expert_entropy[start].mean() < rand.expert_entropy.mean() - 0.04, (plain.expert_entropy[start],
                                                                                  rand.expert_entropy)
    # same seed, same data: the load-balancing loss moves the expert load towards uniform
    late = slice(STEPS // 2, None)
    assert aux.expert_entropy[late].mean() > plain.expert_entropy[late].mean() + 0.1, (
        aux.expert_entropy[late].mean(), plain.expert_entropy[late].mean())
    assert aux.expert_imbalance[late].mean() < plain.expert_imbalance[late].mean()

    # dropping happened, and the recorded all-to-alls are the predicted ones to the byte, step by step
    recorded = load_trace(tmp_path / "text" / "routing")
    assert np.array_equal(recorded.counts, text.counts)
    assert apply_capacity(recorded.counts, CAPACITY)[1].sum() > 0
    result = compare_run(reference_moe_model(capacity_factor=CAPACITY), PARALLEL, tmp_path / "text",
                         tmp_path / "text" / "routing")
    assert result["max_rel_error"] == 0 and result["num_steps"] == STEPS
    assert all(r["predicted_bytes"] == r["measured_bytes"] for r in result["by_op"]), result["by_op"]


@pytest.mark.parametrize("change,field", [
    ({"data": "txt"}, "data"),
    ({"data": "text:/no/such/dir"}, "data"),
    ({"aux_loss_coeff": -0.01}, "aux_loss_coeff"),
    ({"z_loss_coeff": float("nan")}, "z_loss_coeff"),
    ({"model": reference_moe_model(vocab_size=128), "data": "text"}, "vocab_size"),
])
def test_bad_router_and_data_settings_are_refused(change, field):
    values = {"model": reference_moe_model(), "parallel": PARALLEL, **change}
    with pytest.raises(ConfigError) as err:
        check_moe_config(MoeRunConfig(**values))
    assert err.value.field == field


def test_cli_refuses_bad_data_in_one_line(capsys):
    from commscope.cli.main import main

    assert main(["workload", "moe", "--data", "text:/no/such/corpus", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "/no/such/corpus" in err and "\n" not in err and "Traceback" not in err
    assert main(["workload", "moe", "--moe-aux-loss-coeff", "-1", "--steps", "1"]) == 2
    assert "aux_loss_coeff" in capsys.readouterr().err
