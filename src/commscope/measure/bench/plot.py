"""Bus bandwidth against message size, one line per op and group size (the seed talk's figure).

Needs matplotlib (the ``plots`` extra), imported inside the function; callers check for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from commscope.measure.bench.sweep import BenchRow
from commscope.units import GB


def _size_label(size_bytes: float) -> str:
    """Binary size as nccl-tests' -b/-e read it: 8, 1K, 64M, 1G."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g}{unit}"
    return f"{size_bytes:g}"


#: A line style and marker per group size (the colour is the op's).
_GROUP_STYLES: tuple[tuple[object, str], ...] = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"),
                                               ((0, (1, 3)), "P"))


def curve_styles(curves: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[object, object, str]]:
    """(colour, line style, marker) of each (op, group size) curve: a colour per op, a line style and marker per
    group size, so that no two curves look alike (matplotlib's cycle of 10 colours repeated two of 12 curves)."""
    import matplotlib

    ops = list(dict.fromkeys(op for op, _ in curves))
    sizes = sorted({n for _, n in curves})
    cmap = matplotlib.colormaps["tab10" if len(ops) <= 10 else "tab20"]
    colours = [cmap(i) for i in range(cmap.N)]
    return {(op, n): (colours[ops.index(op) % len(colours)], *_GROUP_STYLES[sizes.index(n) % len(_GROUP_STYLES)])
            for op, n in curves}


def plot_busbw(rows: Sequence[BenchRow], path: Path, *, title: str = "") -> Path:
    """Write the busbw-vs-size figure of ``rows`` to ``path`` (log2 x axis; noisy points hollow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    curves: dict[tuple[str, int], list[BenchRow]] = {}
    for r in rows:
        curves.setdefault((r.op, r.group_size), []).append(r)
    looks = curve_styles(list(curves))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    try:
        for (op, n), pts in curves.items():
            pts = sorted(pts, key=lambda r: r.size_bytes)
            x = [r.size_bytes for r in pts]
            y = [r.busbw_bytes_per_s / GB for r in pts]
            colour, linestyle, marker = looks[op, n]
            (line,) = ax.plot(x, y, marker=marker, markersize=3, linestyle=linestyle, label=f"{op} (n={n})",
                              color=colour)
            noisy = [(r.size_bytes, r.busbw_bytes_per_s / GB) for r in pts if r.noisy]
            if noisy:
                ax.scatter([x for x, _ in noisy], [y for _, y in noisy], s=30, facecolors="none", edgecolors=line.get_color())
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _size_label(v)))
        ax.set_xlabel("message size (bytes, nccl-tests' convention)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(title or "bus bandwidth vs message size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, title="hollow: noisy (high cv)", title_fontsize=7)
        fig.tight_layout()
        path = Path(path)
        from commscope.io.atomic import atomic_path

        with atomic_path(path) as tmp:
            fig.savefig(tmp)
    finally:
        plt.close(fig)
    return path
