"""The routing generator fitted to a recorded trace: it recovers a known router, replays a trace's dynamics,
and scales a small run to a large EP job."""

from __future__ import annotations

import numpy as np
import pytest

from commscope.cli.main import main
from commscope.errors import ConfigError
from commscope.moe.fit import FittedRouting, carried_popularity, fit_routing
from commscope.moe.generators import (
    generate,
    generate_fitted,
    parse_routing,
    routing_for_job,
)
from commscope.moe.metrics import routing_metrics
from commscope.moe.trace import save_trace
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec


def _known(persistence: float = 0.8, innovation: float = 0.3, rank_spread: float = 0.2) -> FittedRouting:
    """A router with Zipf-like popularity (two layers, mirrored), AR(1) switching and per-rank spread."""
    pop = -np.log(np.arange(1, 9.0))
    pop -= pop.mean()
    return FittedRouting(source="known", top_k=2, iterations=1, knot_iterations=np.array([0.0]),
                         knot_log_popularity=np.stack([pop, pop[::-1]])[None],
                         persistence=np.full(2, persistence), innovation=np.full(2, innovation),
                         rank_spread=np.full(2, rank_spread))


def _sample(fitted: FittedRouting, **kw):
    args = {"iterations": 300, "ep": 4, "num_experts": 8, "top_k": 2, "tokens_per_rank": 2048, "num_layers": 2,
            "seed": 1, **kw}
    return generate_fitted(fitted, **args)


def test_fit_recovers_a_known_router():
    fitted = fit_routing(_sample(_known()))
    # windows of the slow course absorb some slow wander: persistence comes back a little low, not 0 or 1
    assert np.all(np.abs(fitted.persistence - 0.8) < 0.15), fitted.persistence
    assert np.all(np.abs(fitted.innovation - 0.3) < 0.06), fitted.innovation
    assert np.all(np.abs(fitted.rank_spread - 0.2) < 0.08), fitted.rank_spread
    spread = fitted.knot_log_popularity.std(axis=-1).mean()  # the windows wander with the router
    assert abs(spread - _known().knot_log_popularity.std()) < 0.1, spread
    # popularity is kept per expert: layer 0's expert 0 is the most popular, layer 1's expert 7
    assert fitted.knot_log_popularity[:, 0].mean(axis=0).argmax() == 0
    assert fitted.knot_log_popularity[:, 1].mean(axis=0).argmax() == 7
    # independent noise has no persistence; a steady router no innovation beyond sampling
    assert fit_routing(_sample(_known(persistence=0.0, innovation=0.5))).persistence.max() < 0.15
    assert fit_routing(_sample(_known(innovation=0.0, rank_spread=0.0))).innovation.max() < 0.05


def test_replay_keeps_the_dynamics_of_the_trace_it_was_fitted_to():
    recorded = generate("settle:60:1.4", iterations=240, ep=4, num_experts=8, top_k=2, tokens_per_rank=256,
                        num_layers=2, seed=3)
    replay = generate_fitted(fit_routing(recorded), iterations=240, ep=4, num_experts=8, top_k=2,
                             tokens_per_rank=256, num_layers=2, seed=9)
    a, b = routing_metrics(recorded), routing_metrics(replay)
    for early, late in ((slice(0, 40), slice(200, 240)),):
        for m in (a, b):
            assert m.expert_entropy[late].mean() > m.expert_entropy[early].mean() + 0.05  # the trend survives
        assert abs(a.expert_entropy[early].mean() - b.expert_entropy[early].mean()) < 0.04
        assert abs(a.expert_entropy[late].mean() - b.expert_entropy[late].mean()) < 0.03
    assert abs(a.on_off_switch_rate - b.on_off_switch_rate) < 0.1
    assert abs(np.nanmean(a.prediction_error_last) - np.nanmean(b.prediction_error_last)) < 0.05


def test_a_small_run_scales_to_a_large_ep_job(tmp_path):
    small = _sample(_known(), iterations=60, tokens_per_rank=128)
    save_trace(small, tmp_path / "small.npz")
    model = ModelSpec(name="big-moe", num_layers=4, hidden_size=256, num_heads=4, seq_len=1024, vocab_size=1024,
                      num_experts=64, top_k=4)
    parallel = ParallelSpec(dp=32, ep=32, micro_batch_size=2, global_batch_size=64)
    big = routing_for_job(f"fit:{tmp_path / 'small.npz'}", model, parallel, iterations=20, seed=4)
    assert big.counts.shape == (20, 1, 4, 32, 64)
    assert (big.counts.sum(axis=-1) == 2048 * 4).all() and big.counts.max() <= 2048
    assert big.source.startswith("fit:")
    # the popularity profile travels by quantile: the log-share spread of the experts stays about the same
    share = big.counts.sum(axis=(1, 3)) + 0.5
    log = np.log(share / share.sum(axis=-1, keepdims=True))
    assert abs(log.std(axis=-1).mean() - _known().knot_log_popularity.std()) < 0.25
    # and an iteration is the same alone as inside the run
    alone = routing_for_job(f"fit:{tmp_path / 'small.npz'}", model, parallel, iterations=1, first_iteration=7, seed=4)
    assert np.array_equal(alone.counts[0], big.counts[7])


def test_carried_popularity_keeps_experts_or_quantiles():
    profile = np.array([2.0, 0.0, -1.0, -1.0])
    assert np.array_equal(carried_popularity(profile, 4, None), profile)
    out = carried_popularity(profile, 8, np.arange(8))
    assert out.shape == (8,) and np.all(np.diff(out) <= 0) and abs(out.mean()) < 1e-12


def test_cli_simulates_a_fitted_routing_and_refuses_bad_input(tmp_path, capsys):
    save_trace(_sample(_known(), iterations=30, tokens_per_rank=64), tmp_path / "t.npz")
    assert main(["moe", "simulate", "--model", "mixtral-8x7b", "--ep", "8", "--iterations", "12", "--routing",
                 f"fit:{tmp_path / 't.npz'}", "--json", "--no-plot"]) == 0
    assert '"iterations": 12' in capsys.readouterr().out
    assert main(["moe", "simulate", "--model", "mixtral-8x7b", "--ep", "8", "--routing", "fit:/no/such.npz"]) == 2
    assert "/no/such.npz" in capsys.readouterr().err
    save_trace(_sample(_known(), iterations=2), tmp_path / "short.npz")
    assert main(["moe", "simulate", "--model", "mixtral-8x7b", "--ep", "8", "--routing",
                 f"fit:{tmp_path / 'short.npz'}"]) == 2
    assert ">= 3" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="job"):
        parse_routing(f"fit:{tmp_path / 't.npz'}")
