"""The report's MoE section: routing matrices over iterations and the metrics of their (im)balance.

:func:`moe_section` samples each routing record's (ep, ep) matrices for the page and computes
:func:`moe_metrics` for every iteration; for a routing trace with expert counts it adds the seed talk's
dynamics (:func:`commscope.moe.metrics.routing_metrics`: entropy, on-off switching, predictability, the slowest
rank), as series over iterations and a line per window of training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from commscope.report.loaders import MoeRouting

__all__ = ["MAX_MOE_FRAMES", "MOE_DYNAMICS_NOTES", "MOE_DYNAMICS_SERIES", "moe_metrics", "moe_section"]

#: Most MoE iterations whose routing matrix is embedded per file (evenly sampled; metrics cover all).
MAX_MOE_FRAMES = 64


def moe_metrics(routing: np.ndarray) -> dict[str, list[float]]:
    """Per-iteration metrics of (iterations, ep, ep) token counts:

    - ``load_imbalance``: max over EP ranks of tokens received / mean (1 = balanced);
    - ``cross_rank_fraction``: tokens sent to another EP rank / all tokens;
    - ``entropy``: entropy of the (src, dst) distribution over log(ep^2) (1 = uniform, 0 = one pair).
    """
    r = np.asarray(routing, dtype=np.float64)
    ep = r.shape[1]
    total = r.sum(axis=(1, 2))
    received = r.sum(axis=1)  # (it, ep)
    mean = received.mean(axis=1)
    imbalance = np.divide(received.max(axis=1), mean, out=np.ones_like(mean), where=mean > 0)
    diag = np.trace(r, axis1=1, axis2=2)
    cross = np.divide(total - diag, total, out=np.zeros_like(total), where=total > 0)
    prob = np.divide(r, total[:, None, None], out=np.zeros_like(r), where=total[:, None, None] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(prob > 0, prob * np.log(prob), 0.0).sum(axis=(1, 2))
    norm = math.log(ep * ep) if ep > 1 else 1.0
    return {"load_imbalance": imbalance.tolist(), "cross_rank_fraction": cross.tolist(), "entropy": (ent / norm).tolist()}


def moe_section(routings: Sequence[MoeRouting], *, max_frames: int = MAX_MOE_FRAMES) -> dict[str, Any]:
    """MoE routing over iterations: up to ``max_frames`` evenly sampled (ep, ep) matrices per file and the
    metrics of :func:`moe_metrics` for every iteration."""
    items = []
    for item in routings:
        r = item.routing
        its = r.shape[0]
        frames = np.unique(np.linspace(0, its - 1, min(its, max_frames)).round().astype(np.int64))
        sampled = r[frames]
        items.append({"name": item.name, "source": item.source, "num_iterations": its, "ep": int(r.shape[1]),
                      "frames": frames.tolist(),
                      "matrices": [[[float(x) if not float(x).is_integer() else int(x) for x in row] for row in mat]
                                   for mat in sampled],
                      "max_tokens": float(sampled.max()) if sampled.size else 0.0,
                      **_moe_dynamics(item.trace, moe_metrics(r))})
    notes = ["routing[i, j]: tokens EP rank i (row) sends to EP rank j (column)"]
    for it in items:
        if "phases" in it:
            notes.append(_phases_note(it["name"], it["summary"], it["phases"]))
    if any(item.trace is not None for item in routings):
        notes += list(MOE_DYNAMICS_NOTES)
    return {"items": items, "notes": notes}


#: The seed talk's MoE quantities drawn over iterations for a trace with expert counts: (metric, label, colour).
MOE_DYNAMICS_SERIES = (("expert_entropy", "expert entropy (1 = uniform)", "#59a14f"),
                       ("expert_imbalance", "expert max / mean", "#e15759"),
                       ("balance_error", "slowest rank vs balanced", "#76b7b2"),
                       ("prediction_error_last", "error predicting k from k-1", "#4e79a7"),
                       ("pairs_switching", "pairs switching on/off", "#edc948"))
MOE_DYNAMICS_NOTES = (
    ("expert entropy: of the load over experts per layer / log E, 1 = uniform (the talk: low entropy); its "
     "least-squares slope is the trend towards uniformity"),
    ("pairs switching on/off: share of rank pairs above or below their own mean that flip from one iteration to "
     "the next (~0.5 independent noise, ~0 steady: the talk's on-off regularity)"),
    ("error predicting k from k-1: relative L1 error of each layer's rank-to-rank matrix predicted by the previous "
     "iteration's (0 = perfectly predictable)"),
    ("slowest rank vs balanced: the busiest rank's all-to-all bytes over what balanced routing (every peer tool's "
     "assumption) gives it"),
)


def _moe_dynamics(trace, metrics: dict[str, list[float]]) -> dict[str, Any]:
    """``metrics``, and for a routing trace the talk's quantities per iteration (added to ``metrics`` and drawn as
    ``series``), their means per window of training (``phases``) and the run's ``summary``."""
    if trace is None:
        return {"metrics": metrics}
    from commscope.moe.metrics import routing_metrics

    dyn = routing_metrics(trace)
    summary = dyn.summary()
    return {"metrics": {**metrics, **{key: getattr(dyn, key) for key, _, _ in MOE_DYNAMICS_SERIES}},
            "series": [{"key": key, "label": label, "color": color} for key, label, color in MOE_DYNAMICS_SERIES],
            "phases": summary.pop("phases"),
            "summary": {k: summary[k] for k in ("expert_entropy_first", "expert_entropy_last",
                                                "uniformity_trend_per_iteration", "on_off_switch_rate",
                                                "pair_autocorrelation", "prediction_error_last_mean",
                                                "balance_error_mean", "balance_error_max")}}


def _phases_note(name: str, summary: dict[str, Any], phases: list[dict[str, Any]]) -> str:
    """One line: the run's dynamics per window of training, as `commscope moe analyze` prints them."""
    def num(v: Any, fmt: str = ".2f") -> str:
        return "\u2013" if v is None else format(v, fmt)

    windows = "; ".join(f"it {p['first_iteration']}-{p['last_iteration']}: entropy {num(p['expert_entropy'])}, "
                        f"switching {num(p['pairs_switching'])}, error from k-1 {num(p['prediction_error_last'])}, "
                        f"slowest rank {num(p['balance_error'])}x balanced" for p in phases)
    trend = (summary["uniformity_trend_per_iteration"] or 0.0) * 100
    return (f"{name} over training \u2014 {windows}. Expert entropy {num(summary['expert_entropy_first'], '.3f')} "
            f"\u2192 {num(summary['expert_entropy_last'], '.3f')}, trend {trend:+.3f} per 100 iterations; on-off "
            f"switching {num(summary['on_off_switch_rate'])}, lag-1 autocorrelation "
            f"{num(summary['pair_autocorrelation'])}")
