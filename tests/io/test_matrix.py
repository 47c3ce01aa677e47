"""Traffic matrices on disk: triplet CSV and NPZ round trips, and clear errors for bad files."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import jobs

from commscope.io.matrix import read_npz, read_triplets_csv, write_npz, write_triplets_csv
from commscope.commop import AXES
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.traffic import TrafficMatrix, traffic_of
from commscope.pattern.workload.dense import build_workload


def _traffic(algorithm: str = "ring", **parallel) -> TrafficMatrix:
    model = ModelSpec(name="gpt-1.5b", num_layers=24, hidden_size=2304, num_heads=24, seq_len=1024)
    parallel = {"tp": 2, "pp": 4, "dp": 4, "global_batch_size": 512, "micro_batch_size": 4, **parallel}
    return traffic_of(build_workload(model, ParallelSpec(**parallel)), 8, algorithm=algorithm)


def assert_same(a: TrafficMatrix, b: TrafficMatrix) -> None:
    for name in ("src", "dst", "axis", "bytes"):
        x, y = getattr(a, name), getattr(b, name)
        assert y.dtype == np.int64, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert (a.world_size, a.gpus_per_node, a.algorithm, a.view) == (b.world_size, b.gpus_per_node, b.algorithm, b.view)


# ----------------------------------------------------------------------------------------------- CSV


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_triplets_round_trip(tmp_path, suffix):
    tm = _traffic()
    path = tmp_path / f"traffic{suffix}"
    assert write_triplets_csv(path, tm) == tm.src.size
    assert_same(tm, read_triplets_csv(path, world_size=32, gpus_per_node=8))


def test_triplets_file_layout(tmp_path):
    tm = _traffic()
    path = tmp_path / "traffic.csv"
    write_triplets_csv(path, tm)
    lines = path.read_text().splitlines()
    assert lines[0] == "src,dst,axis,bytes"
    assert lines[1:] == [f"{s},{d},{a},{b}" for s, d, a, b in tm.triplets()]
    assert len(lines) - 1 == len({(s, d, a) for s, d, a, _ in tm.triplets()})


def test_triplets_keep_algorithm_and_view_when_told(tmp_path):
    tm = _traffic(algorithm="tree")
    write_triplets_csv(tmp_path / "t.csv", tm)
    back = read_triplets_csv(tmp_path / "t.csv", world_size=32, algorithm="tree")
    assert_same(tm, back)


def test_triplets_world_size_is_inferred(tmp_path):
    tm = _traffic()
    write_triplets_csv(tmp_path / "t.csv", tm)
    assert read_triplets_csv(tmp_path / "t.csv").world_size == 32


def test_triplets_any_row_order_duplicates_summed_zeros_dropped(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text("axis,bytes,src,dst\npp,5,3,1\ntp,7,0,1\n\ntp,3,0,1\ndp,0,2,0\ntp,1,1,0\n")
    tm = read_triplets_csv(path, world_size=4, gpus_per_node=2)
    assert tm.triplets() == [(0, 1, "tp", 10), (1, 0, "tp", 1), (3, 1, "pp", 5)]
    assert tm.world_size == 4 and tm.gpus_per_node == 2


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0,1,xp,5", "t.csv line 3: axis='xp' is not one of tp, pp, dp, ep, cp, emb, other"),
        ("0,1,tp,5.5", "t.csv line 3: bytes='5.5' is not an integer"),
        ("zero,1,tp,5", "t.csv line 3: src='zero' is not an integer"),
        ("0,1,tp", "t.csv line 3: expected 4 fields src,dst,axis,bytes, got 3"),
        ("0,9,tp,5", r"t.csv line 3: rank out of range \(src=0, dst=9\), expected 0..7"),
        ("2,2,tp,5", "t.csv line 3: src = dst = 2"),
        ("0,1,tp,-5", "t.csv line 3: bytes=-5 is negative"),
    ],
)
def test_triplets_bad_rows_name_the_line(tmp_path, row, message):
    path = tmp_path / "t.csv"
    path.write_text(f"src,dst,axis,bytes\n1,0,tp,4\n{row}\n")
    with pytest.raises(ValueError, match=message):
        read_triplets_csv(path, world_size=8)


def test_triplets_bad_header_and_missing_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("from,to,bytes\n0,1,5\n")
    with pytest.raises(ValueError, match="t.csv line 1: expected the header src,dst,axis,bytes"):
        read_triplets_csv(path)
    with pytest.raises(ValueError, match="missing.csv: no such file"):
        read_triplets_csv(tmp_path / "missing.csv")


def test_triplets_header_only_is_an_empty_matrix(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("src,dst,axis,bytes\n")
    tm = read_triplets_csv(path, world_size=16)
    assert tm.world_size == 16 and tm.total_bytes == 0 and tm.src.size == 0


# ----------------------------------------------------------------------------------------------- NPZ


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_npz_round_trip(tmp_path, algorithm):
    tm = _traffic(algorithm=algorithm, cp=2)
    path = tmp_path / "traffic.npz"
    write_npz(path, tm)
    back = read_npz(path)
    assert_same(tm, back)
    assert back.bytes_by_axis() == tm.bytes_by_axis()
    np.testing.assert_array_equal(back.to_dense(), tm.to_dense())


def test_npz_layout_loads_without_pickle(tmp_path):
    tm = _traffic()
    path = tmp_path / "no_suffix"
    write_npz(path, tm)
    assert path.exists()  # no ".npz" appended behind the caller's back
    with np.load(path, allow_pickle=False) as data:
        assert {"src", "dst", "axis", "axes", "bytes", "world_size", "gpus_per_node", "algorithm", "view"} <= set(data.files)
        assert tuple(data["axes"].tolist()) == AXES
        assert int(data["world_size"]) == 32
        assert str(data["algorithm"]) == "ring"


def test_npz_axis_codes_are_mapped_by_name(tmp_path):
    """A file written with another axis order reads back with the right axes."""
    path = tmp_path / "other_order.npz"
    np.savez(path, src=np.array([0, 1]), dst=np.array([1, 0]), axis=np.array([0, 1]), axes=np.array(["dp", "tp"]),
             bytes=np.array([10, 20]), world_size=np.int64(2), gpus_per_node=np.int64(8),
             algorithm=np.array("ring"), view=np.array("wire"))
    tm = read_npz(path)
    assert tm.triplets() == [(0, 1, "dp", 10), (1, 0, "tp", 20)]
    assert tm.view == "wire"


def test_npz_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="gone.npz: no such file"):
        read_npz(tmp_path / "gone.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="junk.npz: cannot read as .npz"):
        read_npz(tmp_path / "junk.npz")
    np.savez(tmp_path / "partial.npz", src=np.array([0]))
    with pytest.raises(ValueError, match="partial.npz: not a commscope traffic matrix, missing array"):
        read_npz(tmp_path / "partial.npz")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=jobs(max_world=32, moe=None))
def test_round_trips_of_random_jobs(tmp_path, job):
    model, parallel = job
    tm = traffic_of(build_workload(model, parallel), 4)
    write_npz(tmp_path / "r.npz", tm)
    assert_same(tm, read_npz(tmp_path / "r.npz"))
    write_triplets_csv(tmp_path / "r.csv", tm)
    assert_same(tm, read_triplets_csv(tmp_path / "r.csv", world_size=tm.world_size, gpus_per_node=4))
