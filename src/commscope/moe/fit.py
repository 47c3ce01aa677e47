"""A routing model fitted to a recorded trace, so that a small recorded run can stand for a large EP job.

:func:`fit_routing` reads from a :class:`~commscope.moe.trace.RoutingTrace` what the router did, apart from
what the sampling of a few tokens added, per MoE layer l:

- popularity: the centred log share of every expert, ``c[t, x] = log s[t, x] - mean_x log s[t, x]`` with
  ``s`` the expert's share of the layer's assignments at iteration t (summed over micro-batches and ranks, half
  a token added to every count so that an idle expert has a finite log), followed slowly over training: the
  mean of ``c`` over each of K consecutive windows of iterations (K = min(8, I / 25)), linear between the
  windows' centres and constant before the first and after the last (the trend towards or away from
  uniformity, and an early collapse that recovers, which a straight line would miss);
- switching: the deviations ``d`` of ``c`` from that slow course as a first-order autoregression (AR(1)), pooled over the
  experts: ``d[t] = phi d[t-1] + sigma e[t]``. Sampling noise inflates the deviations' variance but not their
  lag-1 covariance, so the multinomial part ``(1 - s) / (N s)`` (N assignments) is removed from the variance
  before ``phi = cov_1 / var`` and ``sigma^2 = var (1 - phi^2)``: persistence near 1 means experts stay hot or
  cold (few switches), near 0 that popularity is redrawn every iteration;
- rank spread: how far a source rank's own log share is from the layer's at the same iteration, beyond its
  sampling noise ``(1 - s) / (T k s)``: different data on different ranks (``tau``, log units).

:func:`commscope.moe.generators.generate_fitted` replays the model for any job: another EP size, more tokens
per rank, more or fewer experts (the popularity profile is carried over by quantile, a popular expert staying
as popular relative to the others), any number of layers (recorded layers cycled) and iterations (the slow
course held at its end beyond the recorded ones). Only numpy and the standard library are imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.moe.trace import RoutingTrace

#: Largest AR(1) persistence fitted (1 would never forget, and the stationary variance would not exist).
MAX_PERSISTENCE = 0.999


@dataclass(frozen=True, slots=True, kw_only=True)
class FittedRouting:
    """Router statistics of a recorded trace (see the module docstring); arrays have one row per recorded layer."""

    source: str
    top_k: int
    iterations: int
    """Recorded iterations."""
    knot_iterations: np.ndarray
    """(K,) the iteration (offset from the trace's first) at the centre of each window of the slow course."""
    knot_log_popularity: np.ndarray
    """(K, layers, experts) centred log share of each expert, averaged over each window."""
    persistence: np.ndarray
    """(layers,) AR(1) coefficient phi of the deviations, in [0, MAX_PERSISTENCE]."""
    innovation: np.ndarray
    """(layers,) AR(1) innovation standard deviation sigma (log share)."""
    rank_spread: np.ndarray
    """(layers,) standard deviation tau of a source rank's log share about the layer's (log share)."""

    @property
    def num_layers(self) -> int:
        return int(self.knot_log_popularity.shape[1])

    @property
    def num_experts(self) -> int:
        return int(self.knot_log_popularity.shape[2])

    def log_popularity(self, iteration: float) -> np.ndarray:
        """(layers, experts) the slow course at ``iteration`` (linear between knots, constant outside)."""
        knots = self.knot_iterations
        j = int(np.clip(np.searchsorted(knots, iteration), 1, max(len(knots) - 1, 1)))
        if len(knots) == 1:
            return self.knot_log_popularity[0]
        w = float(np.clip((iteration - knots[j - 1]) / (knots[j] - knots[j - 1]), 0.0, 1.0))
        return (1 - w) * self.knot_log_popularity[j - 1] + w * self.knot_log_popularity[j]

    def summary(self) -> dict[str, Any]:
        """JSON-ready statistics per layer (for a report or a test)."""
        return {"source": self.source, "top_k": self.top_k, "iterations": self.iterations,
                "experts": self.num_experts, "persistence": self.persistence.tolist(),
                "innovation": self.innovation.tolist(), "rank_spread": self.rank_spread.tolist(),
                "log_popularity_spread_start": self.knot_log_popularity[0].std(axis=-1).tolist(),
                "log_popularity_spread_end": self.knot_log_popularity[-1].std(axis=-1).tolist()}


def _centred_log_share(load: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centred log share, share, assignments) over the last axis, half a token added to every count."""
    load = np.asarray(load, dtype=np.float64) + 0.5
    total = load.sum(axis=-1, keepdims=True)
    share = load / total
    log = np.log(share)
    return log - log.mean(axis=-1, keepdims=True), share, total


def fit_routing(trace: RoutingTrace) -> FittedRouting:
    """Fit the routing model of the module docstring to ``trace`` (at least 3 iterations)."""
    counts = trace.counts  # (I, M, L, R, E)
    iterations, _, layers, _, experts = counts.shape
    if iterations < 3:
        raise ConfigError("routing", trace.source, f"has {iterations} iteration(s); fitting its switching needs >= 3")
    if experts < 2:
        raise ConfigError("routing", trace.source, "has one expert: there is no popularity to fit")
    c, share, total = _centred_log_share(counts.sum(axis=(1, 3)))  # (I, L, E)
    edges = np.linspace(0, iterations, min(12, max(iterations // 10, 1)) + 1).round().astype(int)
    knots = np.array([(lo + hi - 1) / 2 for lo, hi in pairwise(edges)])
    knot_c = np.stack([c[lo:hi].mean(axis=0) for lo, hi in pairwise(edges)])  # (K, L, E)
    fitted = FittedRouting(source=f"fit:{trace.source}", top_k=trace.top_k, iterations=iterations,
                           knot_iterations=knots, knot_log_popularity=knot_c, persistence=np.zeros(layers),
                           innovation=np.zeros(layers), rank_spread=np.zeros(layers))
    d = c - np.stack([fitted.log_popularity(t) for t in range(iterations)])  # (I, L, E) fast deviations
    noise = ((1 - share) / (total * share)).mean(axis=(0, 2))  # (L,) multinomial variance of a log share
    var = np.maximum((d**2).mean(axis=(0, 2)) - noise, 0.0)
    cov1 = (d[1:] * d[:-1]).mean(axis=(0, 2))
    phi = np.clip(np.divide(cov1, var, out=np.zeros(layers), where=var > 0), 0.0, MAX_PERSISTENCE)
    sigma = np.sqrt(var * (1 - phi**2))
    # a source rank's share about the layer's at the same iteration and micro-batch
    rank_c, rank_share, rank_total = _centred_log_share(counts)  # (I, M, L, R, E)
    layer_c, _, _ = _centred_log_share(counts.sum(axis=3, keepdims=True))
    rank_noise = ((1 - rank_share) / (rank_total * rank_share)).mean(axis=(0, 1, 3, 4))
    tau2 = np.maximum(((rank_c - layer_c) ** 2).mean(axis=(0, 1, 3, 4)) - rank_noise, 0.0)
    return replace(fitted, persistence=phi, innovation=sigma, rank_spread=np.sqrt(tau2))


def carried_popularity(profile: np.ndarray, num_experts: int, order: np.ndarray | None) -> np.ndarray:
    """(..., E) centred log popularity -> (..., num_experts): the same experts when ``num_experts`` is E;
    otherwise the profile sorted by popularity, interpolated at ``num_experts`` evenly spread quantiles and
    given to the experts in ``order`` (``order[j]``: the popularity rank of expert j, 0 the most popular)."""
    profile = np.asarray(profile, dtype=np.float64)
    experts = profile.shape[-1]
    if num_experts == experts:
        return profile
    assert order is not None and order.shape == (num_experts,)
    ranked = -np.sort(-profile, axis=-1)  # most popular first
    q_old = (np.arange(experts) + 0.5) / experts
    q_new = (order + 0.5) / num_experts
    flat = ranked.reshape(-1, experts)
    out = np.stack([np.interp(q_new, q_old, row) for row in flat]).reshape(*profile.shape[:-1], num_experts)
    return out - out.mean(axis=-1, keepdims=True)


__all__ = ["MAX_PERSISTENCE", "FittedRouting", "carried_popularity", "fit_routing"]
