"""Parquet round trips and DataFrames of op lists and traffic matrices (issue 16 item 4).

Skipped cleanly without pyarrow / pandas / polars; the test extra installs pyarrow and pandas.
"""

from __future__ import annotations

import numpy as np
import pytest

from commscope.api import predict
from commscope.cli.main import main
from commscope.io.oplog import OpLog
from commscope.presets import cluster_preset, model_preset
from commscope.commop import CommOp
from commscope.spec.parallel import ParallelSpec

pytest.importorskip("pyarrow")
from commscope.io.tables import (
    read_matrix_parquet,
    read_ops_parquet,
    write_matrix_parquet,
    write_ops_parquet,
)


@pytest.fixture(scope="module")
def pred():
    parallel = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=16, micro_batch_size=2)
    return predict(model_preset("gpt-1.5b"), parallel, cluster_preset("dgx1-v100"))


def _odd_ops() -> list[CommOp]:
    """Every field used, None where allowed, extra with nested values, sizes beyond 2**53."""
    return [
        CommOp(op="all_to_all", axis="ep", group=(0, 1, 2), size_bytes=2**60 + 7, dtype="bf16", rank=1,
               splits=(2**59, 2**59 + 3, 4), phase="fwd", micro_batch=3, layer=11, count=2, name="dispatch",
               t_start_ns=1_700_000_000_123_456_789, t_end_ns=1_700_000_000_123_456_999, backend_op="all_reduce",
               extra=(("seq", 4), ("step", 2), ("tags", {"a": [1, 2]}))),
        CommOp(op="send", axis="pp", group=(0, 8), size_bytes=0, rank=0, peer=8),
        CommOp(op="barrier", axis="other", group=(), size_bytes=0, dtype="unknown"),
    ]


def test_ops_round_trip_exactly(tmp_path, pred):
    ops = _odd_ops() + list(pred.workload.ops("full"))
    path = tmp_path / "ops.parquet"
    assert write_ops_parquet(path, ops) == len(ops)
    assert read_ops_parquet(path) == ops


def test_matrix_round_trip_exactly(tmp_path, pred):
    path = tmp_path / "traffic.parquet"
    tm = pred.traffic
    write_matrix_parquet(path, tm)
    back = read_matrix_parquet(path)
    assert (back.world_size, back.gpus_per_node, back.algorithm, back.view) == \
        (tm.world_size, tm.gpus_per_node, tm.algorithm, tm.view)
    assert back.triplets() == tm.triplets()
    assert np.array_equal(back.to_dense(), tm.to_dense())


def test_bad_parquet_inputs_name_the_file(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ValueError, match=r"x\.parquet: not a Parquet file"):
        read_ops_parquet(bad)
    ops_path = tmp_path / "ops.parquet"
    write_ops_parquet(ops_path, _odd_ops())
    with pytest.raises(ValueError, match="not a commscope traffic matrix, missing world_size"):
        read_matrix_parquet(ops_path)


def test_traffic_cli_writes_parquet(tmp_path, capsys, pred):
    out = tmp_path / "run"
    code = main(["traffic", "--model", "gpt-1.5b", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch-size", "16",
                 "--micro-batch-size", "2", "--cluster", "dgx1-v100", "--out", str(out), "--no-plot",
                 "--format", "parquet"])
    assert code == 0 and "traffic.parquet" in capsys.readouterr().out
    assert read_matrix_parquet(out / "traffic.parquet").triplets() == pred.traffic.triplets()
    assert read_ops_parquet(out / "ops.parquet") == list(pred.workload.ops("full"))
    code = main(["traffic", "--format", "parquet"])
    assert code == 2 and "give --out DIR" in capsys.readouterr().err


def test_pandas_frames(pred):
    pd = pytest.importorskip("pandas")
    frame = pred.traffic.to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["src", "dst", "axis", "bytes", "intra_node"]
    assert int(frame["bytes"].sum()) == pred.traffic.total_bytes
    assert frame.groupby("axis")["bytes"].sum().to_dict() == {k: v for k, v in pred.traffic.bytes_by_axis().items() if v}
    ops = _odd_ops()
    of = OpLog(ops=ops).to_pandas()
    assert len(of) == 3 and of["size_bytes"].iloc[0] == 2**60 + 7 and pd.isna(of["rank"].iloc[2])


def test_polars_frames(pred):
    pl = pytest.importorskip("polars", reason="needs the polars extra: pip install -e \".[polars]\"")
    frame = pred.traffic.to_polars()
    assert isinstance(frame, pl.DataFrame) and frame["bytes"].sum() == pred.traffic.total_bytes
    assert OpLog(ops=_odd_ops()).to_polars().height == 3
