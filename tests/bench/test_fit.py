"""commscope fit: alpha-beta per op and group size, piecewise where needed, per-row errors, clear refusals."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
from conftest import SHARED, requires_shared

from commscope.bandwidth import AlphaBeta, GroupSpan
from commscope.bench.fit import FitPoint, fit, fit_curve, format_fit, load_points, to_toml
from commscope.bench.fitted import Curve, FittedModel, Segment, canonical_op, read_fitted
from commscope.cli.main import main
from commscope.errors import ConfigError
from commscope.io.bandwidth_file import read_bandwidth
from commscope.spec.files import load_cluster
from commscope.units import GB, US

LOGS = ("data", "real-logs")
A100_NAME = "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
FAILED_NAME = "nccl-tests_allreduce_rtx3090x2_2node_wrong-nonzero_FAILED.txt"
A100 = SHARED.joinpath(*LOGS, A100_NAME)
FAILED = SHARED.joinpath(*LOGS, FAILED_NAME)


def _points(op, n, alpha_s, busbw, sizes, f):
    return [FitPoint(op=op, group_size=n, size_bytes=s, time_s=alpha_s + s * f / busbw) for s in sizes]


def test_an_exact_line_is_recovered():
    sizes = [2 ** k for k in range(3, 27, 2)]
    pts = _points("all_reduce", 4, 20 * US, 50 * GB, sizes, 1.5) + _points("all_gather", 8, 5 * US, 80 * GB, sizes, 7 / 8)
    res = fit(pts, source="synthetic")
    by = {(c.op, c.group_size): c for c in res.curves}
    (seg,) = by["all_reduce", 4].segments
    assert seg.alpha_s == pytest.approx(20 * US, rel=1e-9) and seg.busbw_bytes_per_s == pytest.approx(50 * GB, rel=1e-9)
    (seg,) = by["all_gather", 8].segments
    assert seg.alpha_s == pytest.approx(5 * US, rel=1e-9) and seg.busbw_bytes_per_s == pytest.approx(80 * GB, rel=1e-9)
    assert max(abs(r.rel_error) for r in res.residuals) < 1e-9
    assert len(res.residuals) == 2 * len(sizes)


def test_two_regimes_are_split_at_the_right_breakpoint():
    small = [2 ** k for k in range(3, 15)]
    large = [2 ** k for k in range(15, 27)]
    pts = _points("all_reduce", 8, 30 * US, 5 * GB, small, 1.75) + _points("all_reduce", 8, 200 * US, 150 * GB, large, 1.75)
    (curve,) = fit(pts).curves
    assert [(s.size_min_bytes, s.size_max_bytes) for s in curve.segments] == [(8, 2 ** 14), (2 ** 15, 2 ** 26)]
    assert curve.segments[1].busbw_bytes_per_s == pytest.approx(150 * GB, rel=1e-6)
    one = fit(pts, max_pieces=1)
    assert max(abs(r.rel_error) for r in one.residuals) > 0.1  # one line does not fit these


def test_fit_curve_respects_nonnegativity():
    # times falling with size: the best non-negative line is a constant (busbw infinite), never negative beta
    pieces = fit_curve([8, 16, 32, 64], [10e-6, 9e-6, 8e-6, 7e-6], max_pieces=1)
    ((_, _, alpha, beta),) = pieces
    assert beta == 0 and alpha > 0


@requires_shared(*LOGS, A100_NAME)
def test_a100_nccl_tests_log_fits_in_three_pieces_within_tolerance():
    points, info = load_points(A100)
    assert info["time_kind"] == "mean" and len(points) == 25  # out-of-place rows only
    res = fit(points, source=A100.name, time_kind=info["time_kind"])
    (curve,) = res.curves
    assert curve.op == "all_reduce" and curve.group_size == 8 and curve.intra_node is True
    assert len(curve.segments) == 3 and res.max_rel_error("all_reduce", 8) < 0.1
    top = curve.segments[-1]
    assert top.busbw_bytes_per_s / GB == pytest.approx(210.9, abs=0.5)  # the module docstring's worked number
    assert top.alpha_s / US == pytest.approx(144.8, abs=0.5)
    text = format_fit(res)
    assert "134217728" in text and "rel err" in text


@requires_shared(*LOGS, A100_NAME)
def test_toml_round_trip_reproduces_the_fit(tmp_path):
    points, info = load_points(A100)
    res = fit(points, source=A100.name, time_kind=info["time_kind"])
    path = tmp_path / "a100.toml"
    path.write_text(to_toml(res))
    data = tomllib.loads(path.read_text())
    assert data["model"]["kind"] == "commscope-fitted-bandwidth" and data["model"]["time"] == "mean"
    assert data["fit"]["columns"][-1] == "rel_error" and len(data["fit"]["rows"]) == 25
    model = read_bandwidth(path)
    assert isinstance(model, FittedModel)
    span = GroupSpan(n=8, num_nodes=1, per_node=8)
    for r in res.residuals:
        assert model.op_time_s("all_reduce", r.size_bytes, span) == pytest.approx(r.fitted_time_s, rel=1e-5)
    assert not model.notes


def _model(**kw):
    seg = Segment(size_min_bytes=1024, size_max_bytes=1 << 20, alpha_s=10 * US, busbw_bytes_per_s=100 * GB)
    curves = [Curve(op="all_reduce", group_size=4, segments=(seg,), intra_node=True),
              Curve(op="sendrecv", group_size=2, segments=(seg,))]
    return FittedModel(curves=curves, source="m.toml", **kw)


def test_fitted_model_protocol():
    m = _model()
    inside4 = GroupSpan(n=4, num_nodes=1, per_node=4)
    t = m.op_time_s("all_reduce", 1 << 20, inside4)
    assert t == pytest.approx(10 * US + (1 << 20) * 1.5 / (100 * GB))
    assert m.busbw_bytes_per_s("all_reduce", 1 << 20, inside4) == pytest.approx((1 << 20) * 1.5 / t)
    assert m.op_time_s("all_reduce", 0, inside4) == 0.0
    assert m.op_time_s("send", 1 << 20, GroupSpan(n=2, num_nodes=2, per_node=1)) == pytest.approx(
        10 * US + (1 << 20) / (100 * GB))
    # another group size: busbw as fitted, latency scaled by steps 2(n-1): 14/6
    t8 = m.op_time_s("all_reduce", 1 << 20, GroupSpan(n=8, num_nodes=1, per_node=8))
    assert t8 == pytest.approx(10 * US * 14 / 6 + (1 << 20) * 1.75 / (100 * GB))
    assert any("used the 4-rank fit" in n for n in m.notes)
    m.op_time_s("all_reduce", 1 << 30, inside4)
    assert any("outside the fitted" in n for n in m.notes)
    # inter-node groups are not covered by an intra-node fit; ops it lacks neither
    with pytest.raises(ConfigError, match="lacks all_reduce"):
        m.op_time_s("all_reduce", 1 << 20, GroupSpan(n=16, num_nodes=2, per_node=8))
    with pytest.raises(ConfigError, match="lacks all_to_all.*it has: all_reduce, sendrecv"):
        m.op_time_s("all_to_all", 1 << 20, inside4)
    fb = _model(fallback=AlphaBeta(load_cluster("dgx-a100")))
    assert fb.op_time_s("all_to_all", 1 << 20, inside4) > 0
    assert any("cluster preset" in n for n in fb.notes)


def test_op_names():
    assert canonical_op("all_reduce_perf") == "all_reduce" and canonical_op("AllGather") == "all_gather"
    assert canonical_op("send") == canonical_op("recv") == canonical_op("sendrecv") == "sendrecv"
    assert canonical_op("alltoall") == "all_to_all"


def _write(path, rows, meta=None):
    path.write_text(json.dumps({"meta": meta or {"backend": "gloo"}, "rows": rows}))
    return path


def _row(op="all_reduce", n=2, size=1024, t=1e-4, **kw):
    return {"op": op, "group_size": n, "size_bytes": size, "time_s": t, "wrong": 0, **kw}


def test_refusals_are_clear(tmp_path, capsys):
    with pytest.raises(ConfigError, match="all_reduce over 2 ranks.*at least 2 message sizes"):
        fit(load_points(_write(tmp_path / "one.json", [_row(), _row(op="sendrecv", size=8)]))[0])
    with pytest.raises(ConfigError, match="lacks time_s"):
        load_points(_write(tmp_path / "notime.json", [{"op": "all_reduce", "group_size": 2, "size_bytes": 8}]))
    with pytest.raises(ConfigError, match="wrong results"):
        load_points(_write(tmp_path / "wrong.json", [_row(), _row(size=2048, wrong=3)]))
    with pytest.raises(ConfigError, match="finite time_s > 0"):
        load_points(_write(tmp_path / "neg.json", [_row(t=-1.0), _row(size=2048)]))
    with pytest.raises(ConfigError, match="no rows"):
        load_points(_write(tmp_path / "empty.json", []))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_points(tmp_path / "broken.json")
    with pytest.raises(ConfigError, match="no such file"):
        load_points(tmp_path / "missing.json")
    # through the command: exit 2, one line
    assert main(["fit", str(tmp_path / "one.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("commscope fit: error:")


@requires_shared(*LOGS, FAILED_NAME)
def test_a_failed_nccl_tests_log_is_refused():
    with pytest.raises(ConfigError, match="failed nccl-tests' data check"):
        load_points(FAILED)


@requires_shared(*LOGS, A100_NAME)
def test_fit_command_on_nccl_tests_output(tmp_path, capsys):
    out = tmp_path / "a100.toml"
    assert main(["fit", str(A100), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "alpha (us)" in text and "+3.5%" in text  # 8 B: 34.84 us measured, 36.06 us fitted
    assert read_fitted(out).curves[0].group_size == 8
    assert main(["fit", str(A100), "--json", "--max-pieces", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["curves"][0]["segments"]) == 1 and math.isclose(
        max(abs(r["rel_error"]) for r in data["rows"]), data["curves"][0]["max_rel_error"])


def _fitted_file(tmp_path, segments: str):
    path = tmp_path / "fit.toml"
    path.write_text('[model]\nkind = "commscope-fitted-bandwidth"\nversion = 1\n'
                    '[[curves]]\nop = "all_reduce"\ngroup_size = 2\nsegments = [{ size_min_bytes = 8, '
                    'size_max_bytes = 1024, alpha_us = 5.0, busbw_GBps = inf }]\n'
                    f'[[curves]]\nop = "all_gather"\ngroup_size = 2\nsegments = [{segments}]\n')
    return path


@pytest.mark.parametrize("busbw", ["1e-6", "50000", "inf"])
def test_a_fitted_curve_no_real_link_could_have_is_left_out(tmp_path, busbw):
    """A hand-edited or degenerate fit whose bandwidth-bound segment (>= 1 MiB) is outside any real link's range
    is unreliable: left out with a note (the estimate falls back to the cluster for it), never used."""
    seg = (f"{{ size_min_bytes = 8, size_max_bytes = 65536, alpha_us = 5.0, busbw_GBps = 2.0 }}, "
           f"{{ size_min_bytes = 65536, size_max_bytes = 67108864, alpha_us = 9.0, busbw_GBps = {busbw} }}")
    model = read_fitted(_fitted_file(tmp_path, seg))
    # the latency-bound all_reduce curve (flat, busbw = inf below 1 MiB) is plausible and kept
    assert [(c.op, c.group_size) for c in model.curves] == [("all_reduce", 2)]
    assert any("all_gather over 2 ranks left out: unreliable fit" in n and "outside any real link" in n
               for n in model.notes)


def test_a_plausible_fitted_curve_is_kept(tmp_path):
    seg = ("{ size_min_bytes = 8, size_max_bytes = 65536, alpha_us = 5.0, busbw_GBps = 0.00004 }, "
           "{ size_min_bytes = 65536, size_max_bytes = 67108864, alpha_us = 9.0, busbw_GBps = 40.0 }")
    model = read_fitted(_fitted_file(tmp_path, seg))
    assert sorted(c.op for c in model.curves) == ["all_gather", "all_reduce"] and not model.notes
