"""Traffic heatmaps: who sends how many bytes to whom, the seed talk's figure.

Orientation: row ``src`` (y axis, GPU 0 at the top) sends to column ``dst`` (x axis), so the picture is
``traffic_bytes[src, dst]`` as printed. Colour is log-scaled bytes per iteration; a pair that exchanges
nothing is white. TP and DP groups show as blocks on or near the diagonal, PP as off-diagonal lines between
adjacent stages, the tied-embedding sync as lines between the first and the last stage [seed-talk].

Above 1,024 GPUs the GPU-level picture has more cells than a figure has pixels, so ``level="auto"`` switches
to nodes (:meth:`~commscope.pattern.traffic.TrafficMatrix.node_matrix`: bytes node src sends to node dst, intra-node
traffic on the diagonal). Whenever a matrix still has more rows than the figure can show, each drawn cell is
the *largest* entry of the block of cells it covers (stated under the figure), so that a single busy pair
never disappears into white.

Only presentation lives here; matplotlib is imported inside the functions (extra ``plots``) and drawn with
the Agg canvas, without touching pyplot or the user's backend.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from commscope.commop import AXES, REPORT_AXES
from commscope.pattern.traffic import TrafficMatrix
from commscope.units import bytes_label

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.colors import LogNorm

Level = Literal["auto", "gpu", "node"]
LEVELS: tuple[str, ...] = ("auto", "gpu", "node")
#: ``level="auto"`` draws GPUs up to this world size, nodes above it.
AUTO_GPU_LEVEL_MAX = 1024
#: Most cells per side drawn in a single heatmap / in one panel of the small multiples.
MAX_CELLS = 1024
MAX_CELLS_PANEL = 512
#: Node boundaries are drawn at GPU level up to this many nodes.
MAX_NODE_LINES = 32
CMAP = "viridis"
_COLORBAR_LABEL = "bytes sent per iteration (src \u2192 dst)"


def _matplotlib() -> Any:
    """Import matplotlib's object API, or say how to install it."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "commscope's plots need matplotlib, which is not installed: pip install commscope[plots]"
        ) from exc
    return Figure, FigureCanvasAgg


# ----------------------------------------------------------------------------------------------- data


class _Grid:
    """What one heatmap panel shows: a (cells, cells) float array, 0 = no traffic."""

    def __init__(self, tm: TrafficMatrix, level: str, axis: str | None, max_cells: int) -> None:
        s, d, b = tm.pairs(axis)
        if level == "node":
            g = tm.gpus_per_node
            s, d = s // g, d // g
            side = tm.num_nodes
            if side <= max_cells:  # node sums straight into the picture
                self.values = np.zeros((side, side), dtype=np.float64)
                np.add.at(self.values, (s, d), b.astype(np.float64))
                self.block, self.side, self.level = 1, side, level
                return
            key = s * side + d  # sum per node pair first, then pool below
            uniq, inverse = np.unique(key, return_inverse=True)
            summed = np.zeros(uniq.size, dtype=np.int64)
            np.add.at(summed, inverse.reshape(-1), b)
            s, d, b = uniq // side, uniq % side, summed
        else:
            side = tm.world_size
        block = max(1, math.ceil(side / max_cells))
        cells = math.ceil(side / block)
        values = np.zeros((cells, cells), dtype=np.float64)
        if block == 1:
            values[s, d] = b  # pairs are unique
        else:
            np.maximum.at(values, (s // block, d // block), b.astype(np.float64))
        self.values, self.block, self.side, self.level = values, block, side, level

    @property
    def unit(self) -> str:
        return "GPU" if self.level == "gpu" else "node"

    @property
    def positive(self) -> np.ndarray:
        return self.values[self.values > 0]


def _resolve_level(tm: TrafficMatrix, level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: valid levels are {', '.join(LEVELS)}")
    if level == "auto":
        return "gpu" if tm.world_size <= AUTO_GPU_LEVEL_MAX else "node"
    return level


def _check_axis(axis: str | None) -> None:
    if axis is not None and axis not in AXES:
        raise ValueError(f"axis={axis!r}: valid axes are {', '.join(AXES)} (or None for all)")


def _output_path(path: str | Path) -> Path:
    path = Path(path)
    return path if path.suffix else path.with_suffix(".png")


# ----------------------------------------------------------------------------------------------- drawing


def _norm(values: list[np.ndarray]) -> LogNorm | None:
    from matplotlib.colors import LogNorm

    positive = [v for v in values if v.size]
    if not positive:
        return None
    vmin = float(min(v.min() for v in positive))
    vmax = float(max(v.max() for v in positive))
    if vmax <= vmin * 1.5:  # one value (or nearly): give the scale some room below it
        vmin = vmax / 10
    return LogNorm(vmin=vmin, vmax=vmax)


def _ticks(vmin: float, vmax: float) -> list[float]:
    """Colourbar ticks at powers of two, so that their binary labels are round (``256 MiB``, ``1 GiB``): every one
    when they are few, else every 2nd, 5th, 10th (``1 KiB``, ``1 MiB``, ``1 GiB``) ... (at most 8); quarter steps
    when the range holds fewer than two."""
    lo, hi = math.ceil(math.log2(vmin) - 1e-9), math.floor(math.log2(vmax) + 1e-9)
    exps = list(range(lo, hi + 1))
    ticks: list[float] = []
    for stride in (1, 2, 5, 10, 20, 30, 40, 50, 100):
        ticks = [2.0**e for e in exps if e % stride == 0]
        if len(ticks) <= 8:
            break
    if len(ticks) >= 2:
        return ticks
    # a narrow range (within one doubling): quarter steps, 1.25 GiB, 1.5 GiB, ...
    e = math.floor(math.log2(vmin))
    quarters = [m * 2.0**k for k in (e, e + 1) for m in (1.0, 1.25, 1.5, 1.75) if vmin <= m * 2.0**k <= vmax]
    return quarters if len(quarters) >= 2 else [vmin, vmax]


def _colorbar(fig: Any, image: Any, axes: Any, norm: LogNorm) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    bar = fig.colorbar(image, ax=axes, shrink=0.9, pad=0.02)
    bar.set_label(_COLORBAR_LABEL)
    assert norm.vmin is not None and norm.vmax is not None  # the heatmaps build their norm with both
    bar.ax.yaxis.set_major_locator(FixedLocator(_ticks(norm.vmin, norm.vmax)))
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _pos: bytes_label(x)))
    bar.ax.yaxis.set_minor_locator(NullLocator())


def _draw(ax: Axes, grid: _Grid, tm: TrafficMatrix, norm: LogNorm | None, *, fontsize: float) -> Any:
    """One heatmap into ``ax``; returns the image."""
    from matplotlib import colormaps
    from matplotlib.ticker import MultipleLocator

    cmap = colormaps[CMAP].with_extremes(bad="white", under="white")
    shown = np.ma.masked_less_equal(grid.values, 0)
    extent_max = grid.values.shape[0] * grid.block - 0.5
    image = ax.imshow(shown, cmap=cmap, norm=norm, interpolation="nearest", origin="upper",
                      extent=(-0.5, extent_max, extent_max, -0.5), aspect="equal")
    ax.set_xlim(-0.5, grid.side - 0.5)
    ax.set_ylim(grid.side - 0.5, -0.5)
    ax.set_facecolor("white")
    num_nodes = tm.num_nodes
    g = tm.gpus_per_node
    if grid.level == "gpu" and 1 < num_nodes <= MAX_NODE_LINES and grid.block == 1:
        bounds = np.arange(1, num_nodes) * g - 0.5
        style: dict[str, Any] = dict(colors="0.55", linewidths=0.6 if num_nodes <= 16 else 0.4, alpha=0.8, zorder=3)
        ax.hlines(bounds, -0.5, grid.side - 0.5, **style)
        ax.vlines(bounds, -0.5, grid.side - 0.5, **style)
    step = _tick_step(grid.side, g if grid.level == "gpu" else 1)
    for a in (ax.xaxis, ax.yaxis):
        a.set_major_locator(MultipleLocator(step))
        if grid.side <= 64 and step > 1:
            a.set_minor_locator(MultipleLocator(1))
    ax.tick_params(labelsize=fontsize, length=3)
    for spine in ax.spines.values():
        spine.set_linewidth(0.6)
        spine.set_color("0.4")
    return image


def _tick_step(side: int, gpus_per_node: int) -> int:
    """Rank ticks at a power of two giving about 8 labels (ranks and nodes come in powers of two), or at
    node starts when that is coarser and still gives at least 4."""
    step = 2 ** max(0, math.ceil(math.log2(max(side, 1) / 8)))
    if gpus_per_node > step and side / gpus_per_node >= 4:
        step = gpus_per_node
    return step


def _dpi_for(cells: int, axes_inches: float) -> int:
    """Enough dots that every cell gets at least one pixel, within 110..300 dpi."""
    return int(min(300, max(110, math.ceil(1.15 * cells / axes_inches))))


def _pooled_note(grid: _Grid) -> str | None:
    if grid.block == 1:
        return None
    return f"each cell: largest entry of a {grid.block}\u00d7{grid.block} block of {grid.unit}s"


def _level_note(tm: TrafficMatrix, grid: _Grid) -> str:
    if grid.level == "node":
        return f"{tm.num_nodes} nodes of {tm.gpus_per_node} GPUs; diagonal = intra-node traffic"
    return f"{tm.world_size} GPUs, {tm.num_nodes} node{'s' if tm.num_nodes != 1 else ''} of {tm.gpus_per_node}"


def _save(fig: Any, canvas_cls: Any, path: Path, dpi: int) -> Path:
    from commscope.io.atomic import atomic_path

    canvas_cls(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, facecolor="white")
    return path


def plot_heatmap(tm: TrafficMatrix, path: str | Path, *, level: Level = "auto", axis: str | None = None,
                 title: str | None = None) -> Path:
    """Draw ``tm`` (or one ``axis`` of it) as a src x dst heatmap and save it to ``path``; returns the path.

    ``level="auto"`` shows GPUs up to 1,024 GPUs and nodes above; ``"gpu"`` and ``"node"`` force one.
    The file format follows the suffix (``.png`` when there is none). Thin grey lines mark node boundaries
    at GPU level up to 32 nodes. Needs matplotlib (``pip install commscope[plots]``).
    """
    _check_axis(axis)
    resolved = _resolve_level(tm, level)
    Figure, FigureCanvasAgg = _matplotlib()
    grid = _Grid(tm, resolved, axis, MAX_CELLS)
    path = _output_path(path)
    norm = _norm([grid.positive])

    cells = grid.values.shape[0]
    fig = Figure(figsize=(7.4, 6.4), layout="constrained")
    ax = fig.add_subplot()
    image = _draw(ax, grid, tm, norm, fontsize=8)
    unit = grid.unit
    ax.set_xlabel(f"destination {unit} (dst, receives)")
    ax.set_ylabel(f"source {unit} (src, sends)")
    scope = f"{axis} traffic" if axis else "traffic"
    total = int(tm.bytes[tm.axis == AXES.index(axis)].sum()) if axis else tm.total_bytes
    pair = "GPU-to-GPU" if unit == "GPU" else "Node-to-node"
    fig.suptitle(title if title is not None else f"{pair} {scope} per iteration", fontsize=12)
    notes = [_level_note(tm, grid), f"total {bytes_label(total)}", f"{tm.algorithm} algorithm, {tm.view} view"]
    if pooled := _pooled_note(grid):
        notes.append(pooled)
    ax.set_title(" \u00b7 ".join(notes), fontsize=8, color="0.3")
    if norm is None:
        ax.text(0.5, 0.5, "no traffic", transform=ax.transAxes, ha="center", va="center", color="0.4")
    else:
        _colorbar(fig, image, ax, norm)
    return _save(fig, FigureCanvasAgg, path, _dpi_for(cells, 5.2))


def plot_heatmaps_by_axis(tm: TrafficMatrix, path: str | Path, *, level: Level = "auto",
                          title: str | None = None) -> Path:
    """Small multiples: one heatmap per parallelism axis present (tp, pp, dp, emb, cp, ep, then other), each
    titled with the axis and its total bytes, on one shared colour scale; returns the path.

    Needs matplotlib (``pip install commscope[plots]``).
    """
    resolved = _resolve_level(tm, level)
    Figure, FigureCanvasAgg = _matplotlib()
    path = _output_path(path)
    present = set(tm.axes_present())
    axes_drawn: list[str | None] = [a for a in (*REPORT_AXES, "other") if a in present] or [None]
    grids = [_Grid(tm, resolved, a, MAX_CELLS_PANEL) for a in axes_drawn]
    norm = _norm([g.positive for g in grids])
    totals = tm.bytes_by_axis()

    num = len(axes_drawn)
    ncols = min(3, num)
    nrows = math.ceil(num / ncols)
    panel = 3.3
    fig = Figure(figsize=(panel * ncols + 1.3, panel * nrows + 0.9), layout="constrained")
    subplots = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    image = None
    for k, (axis, grid) in enumerate(zip(axes_drawn, grids)):
        ax = subplots[k // ncols][k % ncols]
        image = _draw(ax, grid, tm, norm, fontsize=7)
        if axis is None:
            ax.set_title("no traffic", fontsize=10)
        else:
            ax.set_title(f"{axis}: {bytes_label(totals[axis])}", fontsize=10)
        if k // ncols == nrows - 1 or k + ncols >= num:
            ax.set_xlabel(f"dst {grid.unit}", fontsize=8)
            ax.tick_params(labelbottom=True)
        if k % ncols == 0:
            ax.set_ylabel(f"src {grid.unit}", fontsize=8)
    for k in range(num, nrows * ncols):
        subplots[k // ncols][k % ncols].set_visible(False)
    notes = [_level_note(tm, grids[0]), f"total {bytes_label(tm.total_bytes)}", f"{tm.algorithm} algorithm"]
    if pooled := _pooled_note(grids[0]):
        notes.append(pooled)
    heading = title if title is not None else "Traffic per iteration by parallelism axis"
    fig.suptitle(f"{heading}\n" + " \u00b7 ".join(notes), fontsize=10)
    if norm is not None and image is not None:
        _colorbar(fig, image, [ax for row in subplots for ax in row if ax.get_visible()], norm)
    return _save(fig, FigureCanvasAgg, path, _dpi_for(grids[0].values.shape[0], panel * 0.8))


__all__ = ["plot_heatmap", "plot_heatmaps_by_axis"]
