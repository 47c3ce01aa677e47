"""Dynamics of MoE routing: per-iteration and whole-run metrics of a :class:`~commscope.moe.trace.RoutingTrace`.

The seed talk finds expert-parallel all-to-all traffic semi-predictable: an on-off regularity, low entropy,
and growing uniformity as training goes on [seed-talk]. These metrics put numbers on each claim. Notation:
``counts[it, mb, l, r, x]`` token-to-expert assignments (the trace), ``P_l[it][i, j]`` tokens EP rank i
dispatches to EP rank j in MoE layer l, summed over micro-batches (after capacity dropping).

Per iteration (arrays of length ``iterations``):

- ``expert_entropy``: H(expert load) / log E per layer, averaged over layers; 1 = uniform, 0 = one expert
  takes everything. Expert load = assignments per expert summed over micro-batches and source ranks.
- ``pair_entropy``: H of the (ep, ep) token matrix summed over layers / log(ep^2); 1 = every pair equal.
- ``expert_imbalance``: max / mean expert load per layer, averaged over layers; 1 = balanced, E = one hot
  expert (all tokens to one expert, top_k = 1).
- ``expert_gini``: Gini coefficient of the expert load per layer, averaged; 0 = balanced, 1 - 1/E = one hot
  expert. G = 2 sum_i i x_(i) / (n sum x) - (n + 1) / n, x sorted ascending, i = 1..n.
- ``rank_imbalance``: max / mean over EP ranks of tokens received (the experts' work per rank).
- ``cross_rank_fraction``: share of tokens whose expert is on another rank (they cross the network).
- ``balance_error``: how much longer the slowest rank's all-to-all takes than balanced routing predicts,
  bandwidth-bound: sum over (micro-batch, layer) of max_r max(tokens r sends to others, tokens r receives from
  others), over the same sum for the balanced split of the same assignments, A / ep x (ep - 1) / ep per rank.
  1.0 = balance is right; 1.5 = every all-to-all takes 50% longer than a balanced-routing tool says.
- ``prediction_error_last``: relative L1 error of predicting iteration k's per-layer matrices by k - 1's:
  sum_l |P_l[k] - P_l[k-1]|_1 / sum_l |P_l[k]|_1 (NaN at k = 0). 0 = perfectly predictable.
- ``prediction_error_moving_average``: the same with the mean of the previous ``window`` iterations.
- ``pairs_switching``: fraction of rank pairs (i != j, per layer) whose on-off state changed from k - 1 to k,
  a pair being "on" when its tokens exceed its own mean over the run (NaN at k = 0).
- ``dropped_fraction``: share of assignments dropped by the capacity factor (0 without one).

Over the run (:meth:`RoutingMetrics.summary`): means and extremes of those, plus

- ``on_off_switch_rate``: the mean of ``pairs_switching``: ~0.5 for independent noise, ~0 for pairs that stay
  on or off, towards 1 for pairs that alternate (the on-off regularity);
- ``pair_autocorrelation``: lag-1 autocorrelation of each pair's tokens about its mean, averaged over pairs
  that vary: > 0 persistent, ~0 random, < 0 alternating;
- ``uniformity_trend_per_iteration``: least-squares slope of ``expert_entropy`` over iterations
  (> 0: routing grows more uniform as training goes on).

Over training (:meth:`RoutingMetrics.phases`): the run cut into consecutive windows of iterations, each with
the mean of the talk's quantities (:data:`PHASE_COLUMNS`), so that a change in the course of training shows
as a change between rows rather than hiding in a run-wide mean.

Everything is vectorised over iterations, ranks and experts; layers are visited one at a time so that memory
stays at a few (iterations, ep, ep) arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from commscope.moe.routing import apply_capacity, rank_tokens
from commscope.moe.trace import RoutingTrace

#: Per-iteration columns of :meth:`RoutingMetrics.table`, in order.
PER_ITERATION = ("assignments", "dropped_assignments", "dropped_fraction", "expert_entropy", "pair_entropy",
                 "expert_imbalance", "expert_gini", "rank_imbalance", "cross_rank_fraction", "balance_error",
                 "prediction_error_last", "prediction_error_moving_average", "pairs_switching")


#: Per-iteration quantities averaged over each window of :meth:`RoutingMetrics.phases`: (column, label).
PHASE_COLUMNS = (("expert_entropy", "entropy"), ("expert_imbalance", "max/mean"),
                 ("balance_error", "slowest/bal."), ("prediction_error_last", "err. k-1"),
                 ("pairs_switching", "switching"), ("dropped_fraction", "dropped"))


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingMetrics:
    """Metrics of one routing trace (definitions in the module docstring); arrays have one entry per iteration."""

    source: str
    first_iteration: int
    """Training iteration of the first entry (a trace may be a cut of a longer run)."""
    top_k: int
    num_experts: int
    ep: int
    num_layers: int
    micro_batches: int
    window: int
    """Iterations in the moving average of ``prediction_error_moving_average``."""
    capacity_factor: float | None
    pair_tokens: np.ndarray
    """(iterations, ep, ep) tokens EP rank i (row) dispatches to EP rank j (column), summed over micro-batches
    and layers, after capacity dropping."""
    expert_tokens: np.ndarray
    """(iterations, layers, experts) assignments per expert, summed over micro-batches and source ranks."""
    assignments: np.ndarray
    dropped_assignments: np.ndarray
    dropped_fraction: np.ndarray
    expert_entropy: np.ndarray
    pair_entropy: np.ndarray
    expert_imbalance: np.ndarray
    expert_gini: np.ndarray
    rank_imbalance: np.ndarray
    cross_rank_fraction: np.ndarray
    balance_error: np.ndarray
    prediction_error_last: np.ndarray
    prediction_error_moving_average: np.ndarray
    pairs_switching: np.ndarray
    pair_autocorrelation: float
    uniformity_trend_per_iteration: float

    @property
    def iterations(self) -> int:
        return int(self.pair_tokens.shape[0])

    @property
    def on_off_switch_rate(self) -> float:
        return _nanmean(self.pairs_switching)

    def phases(self, count: int = 5) -> list[dict[str, Any]]:
        """The run in ``count`` consecutive windows of (nearly) equal length: ``first_iteration``,
        ``last_iteration`` (training iterations, inclusive) and the mean of each :data:`PHASE_COLUMNS` quantity
        (None where undefined, e.g. switching in a one-iteration window at the start)."""
        edges = np.linspace(0, self.iterations, min(max(count, 1), self.iterations) + 1).round().astype(int)
        out = []
        for lo, hi in pairwise(edges):
            row: dict[str, Any] = {"first_iteration": self.first_iteration + int(lo),
                                   "last_iteration": self.first_iteration + int(hi) - 1}
            for name, _ in PHASE_COLUMNS:
                value = _nanmean(getattr(self, name)[lo:hi])
                row[name] = value if math.isfinite(value) else None
            out.append(row)
        return out

    def table(self) -> dict[str, np.ndarray]:
        """Column name -> per-iteration values, ``iteration`` first (for a CSV)."""
        columns = {name: getattr(self, name) for name in PER_ITERATION}
        return {"iteration": self.first_iteration + np.arange(self.iterations), **columns}

    def summary(self) -> dict[str, Any]:
        """The run in a few numbers (JSON-ready; NaN where undefined becomes None)."""
        out: dict[str, Any] = {
            "source": self.source, "first_iteration": self.first_iteration, "iterations": self.iterations,
            "micro_batches": self.micro_batches, "layers": self.num_layers, "ep": self.ep, "experts": self.num_experts, "top_k": self.top_k,
            "capacity_factor": self.capacity_factor, "window": self.window,
            "assignments": int(self.assignments.sum()), "dropped_assignments": int(self.dropped_assignments.sum()),
            "expert_entropy_first": self.expert_entropy[0], "expert_entropy_last": self.expert_entropy[-1],
            "uniformity_trend_per_iteration": self.uniformity_trend_per_iteration,
            "on_off_switch_rate": self.on_off_switch_rate, "pair_autocorrelation": self.pair_autocorrelation,
        }
        for name in ("expert_entropy", "pair_entropy", "expert_imbalance", "expert_gini", "rank_imbalance",
                     "cross_rank_fraction", "balance_error", "prediction_error_last",
                     "prediction_error_moving_average", "dropped_fraction"):
            out[f"{name}_mean"] = _nanmean(getattr(self, name))
        for name in ("expert_imbalance", "rank_imbalance", "balance_error"):
            out[f"{name}_max"] = float(np.nanmax(getattr(self, name)))
        out = {k: (None if isinstance(v, float) and not math.isfinite(v) else
                   (float(v) if isinstance(v, (float, np.floating)) else v)) for k, v in out.items()}
        out["phases"] = self.phases()
        return out


def _nanmean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def normalized_entropy(load: np.ndarray) -> np.ndarray:
    """Entropy of the distribution ``load`` over its last axis / log(n): 1 uniform, 0 all in one entry.
    An all-zero row counts as uniform (1.0); n = 1 gives 1.0."""
    load = np.asarray(load, dtype=np.float64)
    n = load.shape[-1]
    total = load.sum(axis=-1, keepdims=True)
    p = np.divide(load, total, out=np.zeros_like(load), where=total > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=-1)
    out = h / math.log(n) if n > 1 else np.ones_like(h)
    return np.where(total[..., 0] > 0, out, 1.0)


def imbalance(load: np.ndarray) -> np.ndarray:
    """max / mean over the last axis (1 = balanced; an all-zero row gives 1)."""
    load = np.asarray(load, dtype=np.float64)
    mean = load.mean(axis=-1)
    return np.divide(load.max(axis=-1), mean, out=np.ones_like(mean), where=mean > 0)


def gini(load: np.ndarray) -> np.ndarray:
    """Gini coefficient over the last axis: 0 balanced, 1 - 1/n when one entry holds everything."""
    x = np.sort(np.asarray(load, dtype=np.float64), axis=-1)
    n = x.shape[-1]
    total = x.sum(axis=-1)
    weighted = (x * np.arange(1, n + 1)).sum(axis=-1)
    g = np.divide(2 * weighted, n * total, out=np.zeros_like(total), where=total > 0) - (n + 1) / n
    return np.where(total > 0, g, 0.0)


def routing_metrics(trace: RoutingTrace, *, window: int = 10, capacity_factor: float | None = None) -> RoutingMetrics:
    """Every metric of the module docstring for ``trace``; ``capacity_factor`` drops assignments first."""
    if window < 1:
        raise ValueError(f"window={window}: must be >= 1")
    counts = trace.counts  # (I, M, L, R, E)
    I, M, L, R, E = counts.shape
    kept, dropped = apply_capacity(counts, capacity_factor)
    assignments = counts.sum(axis=(1, 2, 3, 4))
    dropped_total = dropped.sum(axis=(1, 2, 3, 4))
    expert_tokens = counts.sum(axis=(1, 3))  # (I, L, E)

    pair_tokens = np.zeros((I, R, R), dtype=np.int64)
    slow = np.zeros(I)
    err_last_num = np.zeros(I)
    err_ma_num = np.zeros(I)
    err_den = np.zeros(I)
    switched = np.zeros(I)
    num_pairs = 0
    ac_sum, ac_pairs = 0.0, 0
    off = ~np.eye(R, dtype=bool) if R > 1 else np.ones((1, 1), dtype=bool)
    steps = np.arange(I)
    lo = np.maximum(0, steps - window)
    for layer in range(L):
        assert trace.placement is not None  # __post_init__ fills in the default
        per_mb = rank_tokens(kept[:, :, layer], trace.placement, R)  # (I, M, R, R)
        offdiag = per_mb * ~np.eye(R, dtype=bool)
        busiest = np.maximum(offdiag.sum(axis=-1), offdiag.sum(axis=-2)).max(axis=-1)  # (I, M)
        slow += busiest.sum(axis=1)
        P = per_mb.sum(axis=1)  # (I, R, R)
        pair_tokens += P
        Pf = P.astype(np.float64)
        err_den += Pf.sum(axis=(1, 2))
        err_last_num[1:] += np.abs(Pf[1:] - Pf[:-1]).sum(axis=(1, 2))
        cs = np.concatenate([np.zeros((1, R, R)), np.cumsum(Pf, axis=0)])
        moving = (cs[steps] - cs[lo]) / np.maximum(steps - lo, 1)[:, None, None]
        err_ma_num += np.abs(moving - Pf).sum(axis=(1, 2))
        pairs = Pf[:, off]  # (I, pairs)
        on = pairs > pairs.mean(axis=0)
        switched[1:] += (on[1:] != on[:-1]).sum(axis=1)
        num_pairs += pairs.shape[1]
        if I > 1:
            centred = pairs - pairs.mean(axis=0)
            var = (centred**2).sum(axis=0)
            varies = var > 0
            ac_sum += float(((centred[1:] * centred[:-1]).sum(axis=0)[varies] / var[varies]).sum())
            ac_pairs += int(varies.sum())

    # balanced split: each (micro-batch, layer) sends A / R x (R - 1) / R per rank; summed: A_total (R - 1) / R^2
    balanced = assignments * (R - 1) / R**2
    nan = np.full(I, np.nan)
    err_last = np.divide(err_last_num, err_den, out=nan.copy(), where=err_den > 0)
    err_last[0] = np.nan
    err_ma = np.divide(err_ma_num, err_den, out=nan.copy(), where=err_den > 0)
    err_ma[0] = np.nan
    switching = switched / max(num_pairs, 1)
    switching[0] = np.nan
    diag = np.trace(pair_tokens, axis1=1, axis2=2)
    total = pair_tokens.sum(axis=(1, 2))
    expert_entropy = normalized_entropy(expert_tokens).mean(axis=1)
    trend = float(np.polyfit(np.arange(I), expert_entropy, 1)[0]) if I > 1 else 0.0
    return RoutingMetrics(
        source=trace.source, first_iteration=trace.first_iteration, top_k=trace.top_k, num_experts=E, ep=R,
        num_layers=L, micro_batches=M, window=window,
        capacity_factor=capacity_factor, pair_tokens=pair_tokens, expert_tokens=expert_tokens,
        assignments=assignments, dropped_assignments=dropped_total,
        dropped_fraction=np.divide(dropped_total, assignments, out=np.zeros(I), where=assignments > 0),
        expert_entropy=expert_entropy, pair_entropy=normalized_entropy(pair_tokens.reshape(I, R * R)),
        expert_imbalance=imbalance(expert_tokens).mean(axis=1), expert_gini=gini(expert_tokens).mean(axis=1),
        rank_imbalance=imbalance(pair_tokens.sum(axis=1)),
        cross_rank_fraction=np.divide(total - diag, total, out=np.zeros(I), where=total > 0),
        balance_error=np.divide(slow, balanced, out=np.ones(I), where=balanced > 0),
        prediction_error_last=err_last, prediction_error_moving_average=err_ma, pairs_switching=switching,
        pair_autocorrelation=ac_sum / ac_pairs if ac_pairs else float("nan"),
        uniformity_trend_per_iteration=trend,
    )


__all__ = ["PER_ITERATION", "PHASE_COLUMNS", "RoutingMetrics", "gini", "imbalance", "normalized_entropy", "routing_metrics"]
