"""Pictures of MoE routing (extra ``plots``): the seed talk's row of traffic heatmaps over iterations, and the
dynamics metrics over iterations. Nothing is computed here beyond choosing frames; matplotlib is imported
only when a function draws (object API and the Agg canvas, as :mod:`commscope.report.png` does).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from commscope.moe.metrics import RoutingMetrics


def frame_iterations(iterations: int, frames: int) -> list[int]:
    """Up to ``frames`` iterations evenly spread over 0 .. iterations - 1, first and last included."""
    return sorted({int(x) for x in np.linspace(0, iterations - 1, max(1, min(frames, iterations))).round()})


def _count_formatter():
    """Colour-bar ticks as counts people read: 400k, 1.2M."""
    from matplotlib.ticker import FuncFormatter

    def label(value: float, _: object) -> str:
        for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= scale:
                return f"{value / scale:g}{unit}"
        return f"{value:g}"

    return FuncFormatter(label)


def plot_traffic_frames(pair_tokens: np.ndarray, path: str | Path, *, frames: int = 6,
                        iterations: list[int] | None = None, title: str | None = None) -> Path:
    """A row of (ep, ep) heatmaps, ``pair_tokens[it, i, j]`` tokens EP rank i (row) sends to EP rank j (column),
    at ``iterations`` (default: ``frames`` evenly spread), all on one colour scale."""
    from commscope.report.png import _mpl, _save

    Figure, _ = _mpl()
    pair_tokens = np.asarray(pair_tokens)
    picks = iterations if iterations is not None else frame_iterations(pair_tokens.shape[0], frames)
    shown = pair_tokens[picks]
    vmax = float(shown.max()) or 1.0
    fig = Figure(figsize=(2.1 * len(picks) + 1.2, 2.7), layout="constrained")
    axes = fig.subplots(1, len(picks), squeeze=False)[0]
    image = None
    for ax, it, mat in zip(axes, picks, shown):
        image = ax.imshow(mat, cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"iteration {it}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].set_ylabel("sending EP rank", fontsize=8)
    for ax in axes:
        ax.set_xlabel("receiving EP rank", fontsize=8)
    # a short label, its ticks in k/M: the long one ran off the figure's 2.7 inches
    bar = fig.colorbar(image, ax=list(axes), shrink=0.85, format=_count_formatter())
    bar.set_label("tokens (all layers)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    fig.suptitle(title or "EP all-to-all traffic over iterations (one colour scale)", fontsize=10)
    return _save(fig, path)


def plot_routing_metrics(metrics: RoutingMetrics, path: str | Path, *, title: str | None = None) -> Path:
    """Four panels over iterations: entropy and Gini with the uniformity trend; imbalance and the
    balance-assumption error; predictability; on-off switching (and dropped tokens when any)."""
    from commscope.report.png import _mpl, _save

    Figure, _ = _mpl()
    m = metrics
    it = np.arange(m.iterations)
    fig = Figure(figsize=(10, 6), layout="constrained")
    (a, b), (c, d) = fig.subplots(2, 2, sharex=True)
    a.plot(it, m.expert_entropy, color="#59a14f", label="expert entropy")
    a.plot(it, m.pair_entropy, color="#4e79a7", label="rank-pair entropy")
    a.plot(it, m.expert_gini, color="#e15759", label="expert Gini")
    a.plot(it, m.expert_entropy[0] + m.uniformity_trend_per_iteration * it, color="#59a14f", ls="--", lw=0.8,
           label=f"trend {m.uniformity_trend_per_iteration * 100:+.3f} / 100 it")
    a.set_ylim(-0.02, 1.05)
    a.set_title("uniformity (1 = uniform)", fontsize=9)
    b.plot(it, m.expert_imbalance, color="#e15759", label="expert max/mean")
    b.plot(it, m.rank_imbalance, color="#f28e2b", label="rank received max/mean")
    b.plot(it, m.balance_error, color="#76b7b2", label="slowest rank vs balanced")
    b.axhline(1.0, color="#999999", lw=0.6)
    b.set_title("imbalance (1 = balanced)", fontsize=9)
    c.plot(it, m.prediction_error_last, color="#4e79a7", label="from previous iteration")
    c.plot(it, m.prediction_error_moving_average, color="#b07aa1", label=f"from mean of last {m.window}")
    c.set_title("prediction error (relative L1 of the pair matrices)", fontsize=9)
    d.plot(it, m.pairs_switching, color="#edc948", label="pairs switching on/off")
    if m.dropped_fraction.any():
        d.plot(it, m.dropped_fraction, color="#e15759", label="dropped by capacity")
    d.set_ylim(-0.02, 1.02)
    d.set_title("on-off regularity", fontsize=9)
    for ax in (a, b, c, d):
        ax.legend(fontsize=7, frameon=False)
        ax.tick_params(labelsize=7)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    for ax in (c, d):
        ax.set_xlabel("iteration", fontsize=8)
    fig.suptitle(title or f"MoE routing dynamics: {m.source}", fontsize=10)
    return _save(fig, path)


__all__ = ["frame_iterations", "plot_routing_metrics", "plot_traffic_frames"]
