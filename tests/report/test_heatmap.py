"""Heatmaps: files are written, are PNGs of a sane size, and pick the right level."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest

from commscope.commop import AXES
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.traffic import TrafficMatrix, traffic_of
from commscope.pattern.workload.dense import build_workload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = ModelSpec(name="gpt-1.5b", num_layers=24, hidden_size=2304, num_heads=24, seq_len=1024)


def _traffic(tp=2, pp=4, dp=4, cp=1, global_batch_size=512) -> TrafficMatrix:
    parallel = ParallelSpec(tp=tp, pp=pp, dp=dp, cp=cp, global_batch_size=global_batch_size, micro_batch_size=4)
    return traffic_of(build_workload(MODEL, parallel), 8)


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


def _non_white_fraction(path) -> float:
    from matplotlib.image import imread

    image = imread(path)[..., :3]
    return float((image < 0.98).any(axis=-1).mean())


def test_import_does_not_need_matplotlib():
    code = "import sys, commscope.report, commscope.report.heatmap; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    from commscope.report import plot_heatmap

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install commscope\[plots\]"):
        plot_heatmap(_traffic(), tmp_path / "x.png")


def test_gpu_level_png(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import plot_heatmap

    path = plot_heatmap(_traffic(), tmp_path / "tp2_pp4_dp4.png")
    assert path == tmp_path / "tp2_pp4_dp4.png"
    width, height = _png_size(path)
    assert 400 <= width <= 3000 and 400 <= height <= 3000
    assert path.stat().st_size < 1_000_000
    assert 0.02 < _non_white_fraction(path) < 0.6  # cells, text and colourbar drawn; most of the 32x32 is empty


def test_one_axis_custom_title_and_no_suffix(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import plot_heatmap

    path = plot_heatmap(_traffic(cp=2), tmp_path / "cp_only", axis="cp", title="CP ring")
    assert path.name == "cp_only.png"
    _png_size(path)


def test_other_formats_follow_the_suffix(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import plot_heatmap

    path = plot_heatmap(_traffic(), tmp_path / "t.svg")
    assert path.read_text().lstrip().startswith("<?xml")


def test_node_level_above_1024_gpus(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from commscope.report import heatmap

    tm = _traffic(tp=8, pp=4, dp=64, global_batch_size=1024)
    assert tm.world_size == 2048
    seen = []
    real = heatmap._Grid

    def spy(*args, **kwargs):
        grid = real(*args, **kwargs)
        seen.append(grid)
        return grid

    monkeypatch.setattr(heatmap, "_Grid", spy)
    path = heatmap.plot_heatmap(tm, tmp_path / "big.png")
    assert [g.level for g in seen] == ["node"]
    assert seen[0].values.shape == (tm.num_nodes, tm.num_nodes)
    np.testing.assert_array_equal(seen[0].values, tm.node_matrix().astype(np.float64))
    width, height = _png_size(path)
    assert width <= 3000 and height <= 3000
    assert path.stat().st_size < 1_000_000


def test_forced_gpu_level_on_a_big_world_pools_blocks_by_their_largest_entry(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import heatmap

    tm = _traffic(tp=8, pp=4, dp=64, global_batch_size=1024)
    grid = heatmap._Grid(tm, "gpu", None, heatmap.MAX_CELLS)
    assert grid.block == 2 and grid.values.shape == (1024, 1024)
    dense = tm.to_dense()
    np.testing.assert_array_equal(grid.values, dense.reshape(1024, 2, 1024, 2).max(axis=(1, 3)))
    path = heatmap.plot_heatmap(tm, tmp_path / "forced.png", level="gpu")
    assert path.stat().st_size < 1_000_000


def test_small_multiples_by_axis(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import plot_heatmaps_by_axis

    tm = _traffic(cp=2)
    assert tm.axes_present() == ["tp", "pp", "dp", "cp", "emb"]
    path = plot_heatmaps_by_axis(tm, tmp_path / "axes.png")
    width, height = _png_size(path)
    assert width > height  # 3 x 2 panels
    assert path.stat().st_size < 1_000_000


def test_empty_matrix_still_draws(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import plot_heatmap, plot_heatmaps_by_axis

    empty = np.empty(0, dtype=np.int64)
    tm = TrafficMatrix(world_size=8, gpus_per_node=4, src=empty, dst=empty, axis=empty, bytes=empty)
    _png_size(plot_heatmap(tm, tmp_path / "empty.png"))
    _png_size(plot_heatmaps_by_axis(tm, tmp_path / "empty_axes.png"))


def test_single_value_matrix(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import plot_heatmap

    tm = TrafficMatrix(world_size=2, gpus_per_node=8, src=np.array([0, 1]), dst=np.array([1, 0]),
                       axis=np.array([AXES.index("tp")] * 2), bytes=np.array([1000, 1000]))
    _png_size(plot_heatmap(tm, tmp_path / "two.png"))


def test_bad_arguments(tmp_path):
    from commscope.report import plot_heatmap

    with pytest.raises(ValueError, match="level='rack': valid levels are auto, gpu, node"):
        plot_heatmap(_traffic(), tmp_path / "x.png", level="rack")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="axis='xp': valid axes are"):
        plot_heatmap(_traffic(), tmp_path / "x.png", axis="xp")


def test_sizes_are_binary_as_the_cli_writes_them():
    # the heatmaps once wrote "526 GB" under a CLI that said "489.49 GiB" of the same traffic
    from commscope.report.heatmap import _ticks
    from commscope.units import GiB, MiB, bytes_label, format_bytes

    assert bytes_label(0) == "0 B"
    assert bytes_label(999) == "999 B"
    assert bytes_label(1024) == "1 KiB"
    assert bytes_label(3 * MiB) == "3 MiB"
    assert bytes_label(1.5 * GiB) == "1.50 GiB"
    assert bytes_label(525_588_480_000) == "489 GiB" and format_bytes(525_588_480_000) == "489.49 GiB"
    assert [bytes_label(t) for t in _ticks(2.5e8, 2.6e9)] == ["256 MiB", "512 MiB", "1 GiB", "2 GiB"]
    assert [bytes_label(t) for t in _ticks(1e3, 1e12)] == ["1 KiB", "32 KiB", "1 MiB", "32 MiB", "1 GiB", "32 GiB"]
    assert [bytes_label(t) for t in _ticks(1.2e9, 1.9e9)] == ["1.25 GiB", "1.50 GiB", "1.75 GiB"]
    for lo, hi in ((1.0, 1.6), (7.0, 1e15), (3e9, 3.1e10)):
        ticks = _ticks(lo, hi)
        assert 2 <= len(ticks) <= 8 and all(lo <= t <= hi for t in ticks) and ticks == sorted(ticks)


def test_node_level_with_more_nodes_than_cells_sums_nodes_then_pools(tmp_path):
    pytest.importorskip("matplotlib")
    from commscope.report import heatmap

    rng = np.random.default_rng(0)
    world = 2100
    src = rng.integers(0, world, 5000)
    dst = (src + rng.integers(1, world, 5000)) % world
    key = np.unique(src * world + dst)
    src, dst = key // world, key % world
    nbytes = rng.integers(1, 10**9, src.size)
    tm = TrafficMatrix(world_size=world, gpus_per_node=1, src=src, dst=dst, axis=np.zeros_like(src), bytes=nbytes)
    grid = heatmap._Grid(tm, "node", None, heatmap.MAX_CELLS)
    assert grid.block == 3 and grid.values.shape == (700, 700)
    np.testing.assert_array_equal(grid.values, tm.node_matrix().reshape(700, 3, 700, 3).max(axis=(1, 3)))
    _png_size(heatmap.plot_heatmap(tm, tmp_path / "many_nodes.png", level="node"))
