"""Predicted against measured iteration time as a PNG (extra ``plots``): the picture of ``commscope validate``.

Draws a :class:`~commscope.estimate.validate.Validation`; computes nothing. matplotlib is imported only when the
function draws, through its object API and the Agg canvas (no pyplot, the user's backend untouched).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["check_matplotlib", "plot_validation"]

_DPI = 150
#: Points are labelled with their case id up to this many runs.
MAX_LABELS = 30
#: The band drawn around y = x: a prediction within +-10% of the measurement.
BAND = 0.10


def check_matplotlib() -> tuple[Any, Any]:
    """matplotlib's Figure and Agg canvas; ImportError saying how to install it when it is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("commscope's plots need matplotlib, which is not installed: "
                          "pip install commscope[plots]") from exc
    return Figure, FigureCanvasAgg


def _minor_label(value: float, _: Any) -> str:
    """A log axis's minor tick labelled where it is 2, 3 or 5 times a power of ten (else unlabelled)."""
    import math

    if value <= 0:
        return ""
    lead = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if any(abs(lead - d) < 1e-6 for d in (2, 3, 5)) else ""


def plot_validation(validation: Any, path: str | Path, *, title: str | None = None) -> Path:
    """Scatter each run's predicted (y) against measured (x) seconds per iteration on log axes, with the line
    y = x and the +-10% band around it; one colour per cluster. Returns the path written (``.png`` added
    when ``path`` has no suffix)."""
    figure_cls, canvas_cls = check_matplotlib()
    rows = validation.rows
    measured = [r.measured_s for r in rows]
    predicted = [r.predicted_s for r in rows]
    low = min(measured + predicted) / 1.3
    high = max(measured + predicted) * 1.3
    fig = figure_cls(figsize=(6.4, 5.6))
    canvas_cls(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.fill_between([low, high], [low * (1 - BAND), high * (1 - BAND)], [low * (1 + BAND), high * (1 + BAND)],
                    color="0.88", label=f"\u00b1{BAND:.0%}", zorder=0)
    ax.plot([low, high], [low, high], color="0.35", linewidth=1, label="predicted = measured", zorder=1)
    for cluster in dict.fromkeys(r.cluster for r in rows):
        mine = [r for r in rows if r.cluster == cluster]
        ax.scatter([r.measured_s for r in mine], [r.predicted_s for r in mine], s=28, zorder=3, label=cluster)
    if len(rows) <= MAX_LABELS:
        for r in rows:
            ax.annotate(r.case_id, (r.measured_s, r.predicted_s), textcoords="offset points", xytext=(4, -9),
                        fontsize=6, color="0.25")
    from matplotlib.ticker import FuncFormatter

    for axis in (ax.xaxis, ax.yaxis):  # plain numbers (3, 5, 10, 20), never matplotlib's 3x10^0 on the minor ticks
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(_minor_label))
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_aspect("equal")
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted iteration time (s)")
    summary = (f"{len(rows)} runs: mean |error| {validation.mean_abs_error:.1%}, "
               f"worst {validation.worst_abs_error:.1%} ({validation.worst_case})")
    ax.set_title(f"{title}\n{summary}" if title else summary, fontsize=9)
    ax.grid(True, which="both", linewidth=0.3, color="0.8")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    if not out.suffix:
        out = out.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    from commscope.io.atomic import atomic_path

    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=_DPI, facecolor="white")
    return out
