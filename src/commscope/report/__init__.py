"""Pictures from results (extra ``plots``). Computes nothing itself; matplotlib is imported only when a
function draws, so ``import commscope.report`` works without it."""

from commscope.report.heatmap import plot_heatmap, plot_heatmaps_by_axis

__all__ = ["plot_heatmap", "plot_heatmaps_by_axis"]
