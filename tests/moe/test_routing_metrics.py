"""Expert counts -> rank tokens, capacity dropping, and the dynamics metrics on routings whose answer is known."""

import math

import numpy as np
import pytest

from commscope.moe import RoutingTrace, apply_capacity, expert_capacity, generate, rank_tokens, routing_metrics
from commscope.errors import ConfigError
from commscope.moe.metrics import gini, imbalance, normalized_entropy


def test_rank_tokens_against_a_loop():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, size=(3, 4, 12))
    for placement in (np.arange(12) // 3, rng.integers(0, 4, size=12)):
        fast = rank_tokens(counts, placement, 4)
        slow = np.zeros((3, 4, 4), dtype=np.int64)
        for x in range(12):
            slow[..., placement[x]] += counts[..., x]
        assert np.array_equal(fast, slow) and fast.dtype == np.int64


def test_capacity_worked_example():
    # T = 4096 tokens, top-2, 8 experts, capacity factor 1.0: C = ceil(8192 / 8) = 1024 per expert and source rank
    assert int(expert_capacity(4096 * 2, 8, 1.0)) == 1024
    assert int(expert_capacity(4096 * 2, 8, 1.25)) == 1280
    counts = np.array([1500, 1024, 900, 900, 1000, 968, 950, 950])
    kept, dropped = apply_capacity(counts, 1.0)
    assert kept.tolist() == [1024, 1024, 900, 900, 1000, 968, 950, 950] and dropped.sum() == 476
    assert np.array_equal(apply_capacity(counts, None)[0], counts) and not apply_capacity(counts, None)[1].any()


def test_entropy_imbalance_gini_primitives():
    assert normalized_entropy(np.ones(8)) == pytest.approx(1.0)
    assert normalized_entropy(np.eye(8)[3]) == pytest.approx(0.0)
    assert imbalance(np.ones(8)) == 1.0 and imbalance(np.eye(8)[0]) == 8.0
    assert gini(np.ones(8)) == pytest.approx(0.0) and gini(np.eye(8)[0]) == pytest.approx(1 - 1 / 8)
    assert gini(np.array([1.0, 3.0])) == pytest.approx(0.25)  # sum |xi - xj| / (2 n^2 mean) = 4 / 16


SHAPE = dict(iterations=5, ep=4, num_experts=16, tokens_per_rank=64, micro_batches=2, num_layers=3)


def test_balanced_routing_scores_uniform():
    m = routing_metrics(generate("balanced", top_k=2, **SHAPE))
    for name in ("expert_entropy", "pair_entropy", "expert_imbalance", "rank_imbalance", "balance_error"):
        assert getattr(m, name) == pytest.approx(np.ones(5)), name
    assert m.expert_gini == pytest.approx(np.zeros(5))
    assert m.cross_rank_fraction == pytest.approx(np.full(5, 3 / 4))
    assert np.isnan(m.prediction_error_last[0]) and m.prediction_error_last[1:] == pytest.approx(0)
    assert m.prediction_error_moving_average[1:] == pytest.approx(0)
    assert m.pairs_switching[1:] == pytest.approx(0) and m.uniformity_trend_per_iteration == pytest.approx(0)
    s = m.summary()
    assert s["expert_entropy_mean"] == pytest.approx(1.0) and s["pair_autocorrelation"] is None


def test_one_hot_expert_gives_the_known_maxima():
    E, R = SHAPE["num_experts"], SHAPE["ep"]
    m = routing_metrics(generate("hot:5:1", top_k=1, **SHAPE))  # every token picks expert 5
    assert m.expert_entropy == pytest.approx(np.zeros(5), abs=1e-12)
    assert m.expert_imbalance == pytest.approx(np.full(5, E))
    assert m.expert_gini == pytest.approx(np.full(5, 1 - 1 / E))
    # expert 5 lives on rank 1: every rank sends everything there
    assert m.rank_imbalance == pytest.approx(np.full(5, R))
    assert m.pair_entropy == pytest.approx(np.full(5, math.log(R) / math.log(R * R)))
    # rank 1 receives (R - 1) T from the others; balanced predicts (R - 1) T / R: R times longer
    assert m.balance_error == pytest.approx(np.full(5, R))


def test_uniform_sampling_is_near_uniform():
    m = routing_metrics(generate("uniform", top_k=2, **{**SHAPE, "tokens_per_rank": 20_000}))
    assert m.expert_entropy == pytest.approx(np.ones(5), abs=1e-3)
    assert m.expert_imbalance == pytest.approx(np.ones(5), abs=0.05)
    assert 0.2 < m.on_off_switch_rate < 0.8  # independent noise: pairs flip about half the time


def _trace(counts, **kw):
    return RoutingTrace(counts=np.asarray(counts), top_k=1, **kw)


def test_on_off_alternation_and_predictability():
    # two ranks, one expert each; rank 0 sends 10 or 30 tokens to rank 1, alternating every iteration
    counts = np.zeros((6, 1, 1, 2, 2), dtype=np.int64)
    counts[:, 0, 0, 0, 1] = [10, 30, 10, 30, 10, 30]
    counts[:, 0, 0, 1, 0] = 20
    m = routing_metrics(_trace(counts), window=2)
    assert m.pairs_switching[1:] == pytest.approx(np.full(5, 0.5))  # 1 of the 2 off-diagonal pairs flips
    assert m.pair_autocorrelation == pytest.approx(-1.0 * 5 / 6)  # lag-1 sum over 5 steps / variance over 6
    # previous iteration: |30 - 10| over 30 + 20 tokens; mean of the last two: |20 - 30| / 50
    assert m.prediction_error_last[1] == pytest.approx(20 / 50)
    assert m.prediction_error_moving_average[3] == pytest.approx(10 / 50)


def test_capacity_drops_are_counted_and_not_sent():
    counts = np.zeros((1, 1, 1, 2, 4), dtype=np.int64)
    counts[0, 0, 0, 0] = [40, 0, 0, 0]  # rank 0: 40 assignments, all to expert 0
    counts[0, 0, 0, 1] = [10, 10, 10, 10]
    m = routing_metrics(RoutingTrace(counts=counts, top_k=1), capacity_factor=1.0)  # C = ceil(40 / 4) = 10
    assert m.dropped_assignments.tolist() == [30] and m.dropped_fraction[0] == pytest.approx(30 / 80)
    assert m.pair_tokens[0].tolist() == [[10, 0], [20, 20]]


def test_metrics_table_and_summary_are_complete():
    m = routing_metrics(generate("zipf:1.2", top_k=2, **SHAPE))
    table = m.table()
    assert next(iter(table)) == "iteration" and all(len(v) == 5 for v in table.values())
    s = m.summary()
    assert {"expert_entropy_mean", "balance_error_max", "on_off_switch_rate", "uniformity_trend_per_iteration"} <= set(s)
    assert s["balance_error_mean"] > 1.0 and m.pair_tokens.shape == (5, 4, 4) and m.expert_tokens.shape == (5, 3, 16)
    assert m.pair_tokens.sum() == m.assignments.sum()


@pytest.mark.parametrize("factor", [8.0, 1e6, 1e300, 1.7e308])
def test_a_factor_of_experts_or_more_drops_nothing_and_never_overflows(factor):
    """1e300 once overflowed the cast to int64 (a numpy RuntimeWarning) and dropped every assignment."""
    counts = np.array([[40, 0, 0, 0, 0, 0, 0, 0], [5] * 8], dtype=np.int64)
    assert expert_capacity(counts.sum(axis=-1), 8, factor).tolist() == [40, 40]
    kept, dropped = apply_capacity(counts, factor)
    assert np.array_equal(kept, counts) and not dropped.any()


@pytest.mark.parametrize("factor", [float("inf"), float("nan"), 0.0, -1.0])
def test_a_capacity_factor_that_is_not_finite_and_positive_is_refused(factor):
    with pytest.raises(ConfigError, match="capacity_factor=.*: must be a finite number > 0"):
        apply_capacity(np.ones((2, 4), dtype=np.int64), factor)
