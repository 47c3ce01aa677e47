"""The report's pictures as PNG files, for papers and slides (extra ``plots``).

Each function draws one section of the report data (:func:`commscope.report.html.build_report_data`), so the
PNGs and the HTML page show the same numbers; nothing is computed here. The traffic heatmaps come from
:mod:`commscope.report.heatmap`. matplotlib is imported only when a function draws, through its object API
and the Agg canvas (no pyplot, the user's backend untouched).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from commscope.units import GB, bytes_label

_DPI = 150


def _mpl() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("commscope's plots need matplotlib, which is not installed: pip install commscope[plots]") from exc
    return Figure, FigureCanvasAgg


def _save(fig: Any, path: str | Path) -> Path:
    _, canvas = _mpl()
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas(fig)
    from commscope.io.atomic import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=_DPI, facecolor="white")
    return path


def _binary_unit(largest: float) -> tuple[float, str]:
    """The binary unit that shows ``largest`` as a number from 1 to 1023: ``(2**30, 'GiB')`` for 5e10."""
    scale, name = 1.0, "B"
    for k, unit in enumerate(("KiB", "MiB", "GiB", "TiB", "PiB"), start=1):
        if largest >= 1024**k:
            scale, name = float(1024**k), unit
    return scale, name


def _seconds_label(value: float) -> str:
    a = abs(value)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{value * 1e6:.3g} \u00b5s"
    if a < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def _style(ax: Any) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8)


def plot_bytes(section: dict[str, Any], path: str | Path) -> Path:
    """Bytes per axis per iteration, intra-node solid and inter-node hatched."""
    Figure, _ = _mpl()
    rows = [r for r in section["rows"] if r["bytes"]] or section["rows"]
    fig = Figure(figsize=(7.5, 0.45 * len(rows) + 1.3), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    scale, unit = _binary_unit(max([r["bytes"] for r in rows] + [1]))
    intra = np.array([r["intra_node_bytes"] for r in rows], dtype=float) / scale
    inter = np.array([r["inter_node_bytes"] for r in rows], dtype=float) / scale
    colors = [r["color"] for r in rows]
    ax.barh(y, intra, color=colors)
    ax.barh(y, inter, left=intra, color="white", edgecolor=colors, hatch="////", linewidth=0.8)
    for yi, r in zip(y, rows):
        ax.text(r["bytes"] / scale, yi, f"  {bytes_label(r['bytes'])} ({r['share']:.1%})", va="center", fontsize=8)
    ax.set_yticks(y, [r["label"] for r in rows])
    ax.set_xlim(0, max([r["bytes"] for r in rows] + [1]) / scale * 1.35)
    ax.set_xlabel(f"bytes sent per iteration ({unit})")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="0.45", label="intra-node"),
                       Patch(facecolor="white", edgecolor="0.45", hatch="////", label="inter-node")],
              fontsize=8, frameon=False, loc="lower right")
    _style(ax)
    fig.suptitle(f"Bytes by axis and link: {bytes_label(section['total_bytes'])}, "
                 f"{section['inter_node_share']:.1%} inter-node", fontsize=10)
    return _save(fig, path)


def _formatter(fn: Any) -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: fn(x))


def plot_message_sizes(section: dict[str, Any], path: str | Path) -> Path:
    """Histogram of message sizes, stacked by axis: ops per bin (top) and bytes per bin (bottom), for the
    predicted ops and, beside them, the measured ones."""
    Figure, _ = _mpl()
    sources = [(k, section[k]) for k in ("predicted", "measured") if section.get(k) and section[k]["series"]]
    fig = Figure(figsize=(6.2 * max(1, len(sources)), 5.2), layout="constrained")
    axes = fig.subplots(2, max(1, len(sources)), squeeze=False)
    for col, (name, h) in enumerate(sources):
        edges = np.array(h["edges_bytes"], dtype=float)
        centers = np.arange(len(edges) - 1)
        for row, key in enumerate(("counts", "bytes")):
            ax = axes[row][col]
            bottom = np.zeros(len(centers))
            scale, unit = (1.0, "") if key == "counts" else \
                _binary_unit(max(sum(se[key][i] for se in h["series"]) for i in range(len(centers))))
            for se in h["series"]:
                vals = np.array(se[key], dtype=float) / scale
                ax.bar(centers, vals, bottom=bottom, color=se["color"], label=se["label"], width=0.85)
                bottom += vals
            step = max(1, math.ceil(len(edges) / 10))
            ax.set_xticks(np.arange(0, len(edges), step) - 0.5, [bytes_label(e) for e in edges[::step]], rotation=35,
                          ha="right")
            ax.set_ylabel("ops per iteration" if key == "counts" else f"{unit} per iteration", fontsize=8)
            _style(ax)
        axes[0][col].set_title(f"{name}: {h['total_ops']:,.0f} ops per iteration", fontsize=9)
        axes[0][col].legend(fontsize=7, frameon=False)
    fig.suptitle("Message sizes (power-of-two bins)", fontsize=10)
    return _save(fig, path)


def plot_breakdown(section: dict[str, Any], path: str | Path) -> Path:
    """The iteration time as one stacked bar, term by term, labelled with seconds and shares."""
    Figure, _ = _mpl()
    fig = Figure(figsize=(9, 2.4), layout="constrained")
    ax = fig.add_subplot()
    left = 0.0
    total = section["iteration_time_s"] or 1.0
    for t in section["terms"]:
        if t["seconds"] <= 0:
            continue
        ax.barh(0, t["seconds"], left=left, color=t["color"], edgecolor="white", label=f"{t['label']} {_seconds_label(t['seconds'])}")
        if t["seconds"] / total > 0.07:
            ax.text(left + t["seconds"] / 2, 0, f"{t['label']}\n{t['share']:.0%}", ha="center", va="center", fontsize=8,
                    color="black" if t["key"] == "bubble" else "white")
        left += t["seconds"]
    ax.set_yticks([])
    ax.set_xlim(0, total)
    ax.xaxis.set_major_formatter(_formatter(_seconds_label))
    ax.legend(fontsize=7, frameon=False, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    _style(ax)
    fig.suptitle(f"{section['label']}: {_seconds_label(section['iteration_time_s'])} per iteration "
                 f"(communication {section['comm_ratio']:.1%}, bubble {section['bubble_ratio']:.1%})", fontsize=10)
    return _save(fig, path)


def plot_plan(section: dict[str, Any], path: str | Path) -> Path:
    """This job beside the plan's top configurations, as stacked columns of the iteration-time terms."""
    Figure, _ = _mpl()
    plan = section["plan"]
    cols = [("this job", section["label"], section["terms"], section["iteration_time_s"])] + [
        (f"#{e['rank']}", e["label"], e["terms"], e["iteration_time_s"]) for e in plan["entries"]]
    fig = Figure(figsize=(max(6.0, 1.2 * len(cols) + 1.5), 4.6), layout="constrained")
    ax = fig.add_subplot()
    for i, (_, _, terms, total) in enumerate(cols):
        bottom = 0.0
        for t in terms:
            if t["seconds"] > 0:
                ax.bar(i, t["seconds"], bottom=bottom, color=t["color"], width=0.6, label=t["label"] if i == 0 else None)
                bottom += t["seconds"]
        ax.text(i, total, _seconds_label(total), ha="center", va="bottom", fontsize=7)
    labels = [name + "\n" + "\n".join([sub.split(" \u00b7 ")[0], *sub.split(" \u00b7 ")[1].split()]) for name, sub, _, _ in cols]
    ax.set_xticks(range(len(cols)), labels, fontsize=7)
    ax.yaxis.set_major_formatter(_formatter(_seconds_label))
    ax.set_ylabel("seconds per iteration", fontsize=8)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _style(ax)
    fig.suptitle(f"Top configurations on {plan['num_gpus']:,} GPUs (global batch {plan['global_batch_size']})", fontsize=10)
    return _save(fig, path)


def plot_schedule(section: dict[str, Any], path: str | Path, *, index: int = 0) -> Path:
    """One timed pipeline schedule: a row per stage, forward light, backward dark, bubbles hatched, then the
    DP and embedding reduction."""
    Figure, _ = _mpl()
    sched = section["schedules"][index]
    p = sched["pp"]
    fig = Figure(figsize=(11, 0.32 * p + 1.6), layout="constrained")
    ax = fig.add_subplot()
    span = sched["makespan_s"]
    for stage in range(p):
        ax.broken_barh([(0, span)], (stage - 0.42, 0.84), facecolors="#fbe9e6", edgecolor="#e9b3aa", hatch="///", linewidth=0)
    sl = sched["slots"]
    v = max(1, sched["virtual_pipeline_size"])
    for kind, base, dark in (("fwd", (0.62, 0.77, 0.91), (0.47, 0.67, 0.86)), ("bwd", (0.23, 0.47, 0.71), (0.09, 0.28, 0.51))):
        idx = [i for i, k in enumerate(sl["kind"]) if k == kind]
        for i in idx:
            t = sl["chunk"][i] / max(1, v - 1) if v > 1 else 0.0
            color = tuple(b + (d - b) * t for b, d in zip(base, dark))
            ax.broken_barh([(sl["t_start_s"][i], sl["t_end_s"][i] - sl["t_start_s"][i])], (sl["stage"][i] - 0.42, 0.84),
                           facecolors=[color], edgecolor="white", linewidth=0.3)
    t0 = span
    for tail in section["tail"]:
        ax.broken_barh([(t0, tail["seconds"])], (-0.42, p - 0.16), facecolors=tail["color"], label=tail["label"])
        t0 += tail["seconds"]
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)], fontsize=7 if p <= 16 else 5)
    ax.set_xlim(0, t0)
    ax.xaxis.set_major_formatter(_formatter(_seconds_label))
    _style(ax)
    from matplotlib.patches import Patch

    handles = [Patch(color=(0.62, 0.77, 0.91), label="forward"), Patch(color=(0.23, 0.47, 0.71), label="backward"),
               Patch(facecolor="#fbe9e6", edgecolor="#e9b3aa", hatch="///", label="bubble (idle)")]
    handles += [Patch(color=t["color"], label=t["label"]) for t in section["tail"]]
    ax.legend(handles=handles, fontsize=7, frameon=False, ncols=len(handles), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.suptitle(f"{sched['label']}: p={p}, m={sched['num_micro_batches']}"
                 + (f", v={sched['virtual_pipeline_size']}" if sched["virtual_pipeline_size"] > 1 else "")
                 + f"; pipeline {_seconds_label(span)}, idle {sched['idle_fraction']:.1%} of stage time", fontsize=10)
    return _save(fig, path)


def plot_measured(section: dict[str, Any], path: str | Path) -> Path:
    """Measured vs predicted bytes per axis per iteration, with their ratio."""
    Figure, _ = _mpl()
    rows = section["rows"]
    fig = Figure(figsize=(7.5, 0.55 * len(rows) + 1.4), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1].astype(float)
    has_pred = any(r["predicted_bytes"] is not None for r in rows)
    h = 0.38 if has_pred else 0.7
    top = max([max(r["measured_bytes"], r["predicted_bytes"] or 0) for r in rows] + [1])
    scale, unit = _binary_unit(top)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="white", edgecolor="0.45", hatch="////", label="measured")]
    if has_pred:
        ax.barh(y + h / 2, [(r["predicted_bytes"] or 0) / scale for r in rows], height=h, color=[r["color"] for r in rows])
        handles.insert(0, Patch(color="0.45", label="predicted"))
    ax.barh(y - (h / 2 if has_pred else 0), [r["measured_bytes"] / scale for r in rows], height=h, color="white",
            edgecolor=[r["color"] for r in rows], hatch="////")
    for yi, r in zip(y, rows):
        text = f"  \u00d7{r['ratio']:.3f}" if r["ratio"] is not None else "  not predicted" if has_pred else ""
        ax.text(max(r["measured_bytes"], r["predicted_bytes"] or 0) / scale, yi, text, va="center", fontsize=8)
    ax.set_yticks(y, [r["label"] for r in rows])
    ax.set_xlim(0, top / scale * 1.3)
    ax.set_xlabel(f"{unit} per iteration (sum of message sizes)")
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="lower right")
    _style(ax)
    what = "Measured vs predicted" if has_pred else "Measured bytes by axis"  # --no-predicted: no empty half
    fig.suptitle(f"{what} ({section['num_iterations']} measured iteration(s))", fontsize=10)
    return _save(fig, path)


#: Bus bandwidths that span more than this ratio are drawn on a log axis (the page's report.js does the same): on a
#: linear one scaled to the largest, the smaller curves lie flat on zero.
LOG_AXIS_RATIO = 30


def spans_orders_of_magnitude(values: Any) -> bool:
    """Whether the positive ``values`` (None and zero left out) span more than :data:`LOG_AXIS_RATIO`."""
    positive = [v for v in values if v is not None and v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_AXIS_RATIO


def plot_bench(section: dict[str, Any], path: str | Path) -> Path:
    """Bus bandwidth against message size per series, measured solid and the cluster model dashed."""
    Figure, _ = _mpl()
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    for i, s in enumerate(section["series"]):
        color = f"C{i % 10}"
        x = np.array(s["size_bytes"], dtype=float)
        ax.plot(x, np.array(s["busbw_bytes_per_s"], dtype=float) / GB, "-o", color=color, markersize=3, label=s["label"])
        if s.get("model_busbw_bytes_per_s"):
            m = np.array([np.nan if v is None else v for v in s["model_busbw_bytes_per_s"]], dtype=float) / GB
            ax.plot(x, m, "--", color=color, alpha=0.7, linewidth=1)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_formatter(bytes_label))
    ax.set_xlabel("message size")
    values = [v for s in section["series"] for v in [*s["busbw_bytes_per_s"], *(s.get("model_busbw_bytes_per_s") or [])]]
    if spans_orders_of_magnitude(values):  # gloo's MB/s beside a preset's 100 GB/s
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_formatter(lambda v: f"{v:g}"))
        ax.set_ylabel("bus bandwidth (GB/s, log scale)")
    else:
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _style(ax)
    fig.suptitle("Bus bandwidth" + (" (dashed: cluster model)" if any(s.get("model_busbw_bytes_per_s") for s in section["series"])
                                    else ""), fontsize=10)
    return _save(fig, path)


def plot_moe(section: dict[str, Any], path: str | Path, *, frames: int = 6) -> Path:
    """Per routing file: ``frames`` routing matrices over the iterations on one colour scale, and the
    imbalance metrics of every iteration."""
    Figure, _ = _mpl()
    items = section["items"]
    fig = Figure(figsize=(2.0 * frames + 3.6, 2.3 * len(items) + 0.6), layout="constrained")
    grid = fig.add_gridspec(len(items), frames + 2)
    for row, it in enumerate(items):
        n = len(it["frames"])
        picks = sorted({round(k * (n - 1) / max(1, frames - 1)) for k in range(min(frames, n))})
        image = None
        for col, f in enumerate(picks):
            ax = fig.add_subplot(grid[row, col])
            image = ax.imshow(np.array(it["matrices"][f], dtype=float), cmap="viridis", vmin=0, vmax=it["max_tokens"] or 1)
            ax.set_title(f"{it['name']}, it {it['frames'][f]}" if col == 0 else f"it {it['frames'][f]}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        if image is not None:
            fig.colorbar(image, ax=ax, shrink=0.8, label="tokens")
        ax = fig.add_subplot(grid[row, frames:])
        m = it["metrics"]
        ax.plot(m["load_imbalance"], color="#e15759", label="load imbalance")
        ax.plot(m["cross_rank_fraction"], color="#4e79a7", label="cross-rank fraction")
        ax.plot(m["entropy"], color="#59a14f", label="entropy")
        ax.set_xlabel("iteration", fontsize=8)
        ax.legend(fontsize=7, frameon=False)
        _style(ax)
    fig.suptitle("MoE routing over iterations (row: sending EP rank, column: receiving)", fontsize=10)
    return _save(fig, path)


#: Every file :func:`write_pngs` may write.
PNG_NAMES = ("heatmap.png", "heatmap_by_axis.png", "bytes.png", "message_sizes.png", "breakdown.png", "plan.png",
             "schedule.png", "measured_vs_predicted.png", "busbw.png", "moe.png")


def write_pngs(data: dict[str, Any], out_dir: str | Path, *, traffic: Any = None,
               place: Callable[[str], Path] | None = None) -> list[Path]:
    """Every picture of the report data into ``out_dir``; the traffic heatmaps too when ``traffic`` (the
    prediction's TrafficMatrix) is given. ``place(name)``: where to draw the file ``name`` instead (a staged
    temporary file, :meth:`commscope.io.atomic.OutputSet.path`). Returns the files of ``out_dir`` written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    where = place or (lambda name: out / name)
    names: list[str] = []
    if traffic is not None:
        from commscope.report.heatmap import plot_heatmap, plot_heatmaps_by_axis

        plot_heatmap(traffic, where("heatmap.png"), title=data.get("title"))
        plot_heatmaps_by_axis(traffic, where("heatmap_by_axis.png"))
        names += ["heatmap.png", "heatmap_by_axis.png"]
    sizes = data.get("message_sizes") or {}
    drawers: list[tuple[bool, str, Callable[[Any, Path], Path], Any]] = [
        (bool(data.get("bytes")), "bytes.png", plot_bytes, data.get("bytes")),
        (any(sizes.get(k) and sizes[k]["series"] for k in ("predicted", "measured")), "message_sizes.png",
         plot_message_sizes, sizes),
        (bool(data.get("breakdown")), "breakdown.png", plot_breakdown, data.get("breakdown")),
        (bool(data.get("breakdown") and data["breakdown"].get("plan")), "plan.png", plot_plan, data.get("breakdown")),
        (bool(data.get("schedule") and data["schedule"]["schedules"]), "schedule.png", plot_schedule,
         data.get("schedule")),
        (bool(data.get("measured") and data["measured"]["rows"]), "measured_vs_predicted.png", plot_measured,
         data.get("measured")),
        (bool(data.get("bench") and data["bench"]["series"]), "busbw.png", plot_bench, data.get("bench")),
        (bool(data.get("moe") and data["moe"]["items"]), "moe.png", plot_moe, data.get("moe")),
    ]
    for wanted, name, draw, value in drawers:
        if wanted:
            draw(value, where(name))
            names.append(name)
    return [out / name for name in names]


__all__ = [
    "LOG_AXIS_RATIO",
    "plot_bench",
    "plot_breakdown",
    "plot_bytes",
    "plot_measured",
    "plot_message_sizes",
    "plot_moe",
    "plot_plan",
    "plot_schedule",
    "spans_orders_of_magnitude",
    "write_pngs",
]
