"""Bus bandwidth against message size, one line per op and group size (the seed talk's figure).

Needs matplotlib (the ``plots`` extra), imported inside the function; callers check for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from commscope.bench.sweep import BenchRow
from commscope.units import GB


def _size_label(size_bytes: float) -> str:
    """Binary size as nccl-tests' -b/-e read it: 8, 1K, 64M, 1G."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g}{unit}"
    return f"{size_bytes:g}"


def plot_busbw(rows: Sequence[BenchRow], path: Path, *, title: str = "") -> Path:
    """Write the busbw-vs-size figure of ``rows`` to ``path`` (log2 x axis; noisy points hollow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    curves: dict[tuple[str, int], list[BenchRow]] = {}
    for r in rows:
        curves.setdefault((r.op, r.group_size), []).append(r)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    try:
        for (op, n), pts in curves.items():
            pts = sorted(pts, key=lambda r: r.size_bytes)
            x = [r.size_bytes for r in pts]
            y = [r.busbw_bytes_per_s / GB for r in pts]
            (line,) = ax.plot(x, y, marker="o", markersize=3, label=f"{op} (n={n})")
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
