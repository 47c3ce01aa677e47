"""commscope fit: alpha-beta per op and group size, piecewise where needed, per-row errors, clear refusals."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
from conftest import SHARED, requires_shared

from commscope.estimate.bandwidth import AlphaBeta, GroupSpan
from commscope.measure.bench.fit import FitPoint, fit, fit_curve, load_points, to_toml
from commscope.cli.fit_cmd import format_fit
from commscope.estimate.fitted import Curve, FittedModel, Segment, canonical_op, read_fitted
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
    assert "33,554,432-134,217,728" in text and "rel err" not in text  # the lines; the rows on request
    assert "25 rows fitted; --rows prints each" in text
    text = format_fit(res, rows=True)
    assert "rel err" in text and len(text.splitlines()) > 25


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
    points, info = load_points(_write(tmp_path / "neg.json", [_row(t=-1.0), _row(size=2048)]))  # skipped, named
    assert info["problems"] == ["neg.json rows[1].time_s=-1.0: not a measured time (must be > 0): row skipped"]
    assert [p.size_bytes for p in points] == [2048]
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
    assert main(["fit", str(A100), "--out", str(out), "--rows"]) == 0
    text = capsys.readouterr().out
    assert "alpha us" in text and "+3.5%" in text  # 8 B: 34.84 us measured, 36.06 us fitted
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


# --- what the input says is not overridden, damaged rows are named the same way in both formats -------------------

def _nccl_log(*, ranks: int | None = 8, test: str | None = "all_reduce_perf", times_us=None, sizes=None) -> str:
    """A small nccl-tests all_reduce log as all_reduce_perf prints it: 1 KiB x 4^i, out-of-place and in-place."""
    sizes = sizes or [1024 * 4**i for i in range(6)]
    times_us = times_us or [20 + s / 2e3 for s in sizes]
    n = ranks or 8
    lines = ["# nccl-tests version 2.19.4 nccl-headers=21903 nccl-library=21903"]
    if test:
        lines.append(f"# Collective test starting: {test}")
    lines.append(f"# nThread 1 nGpus {n} minBytes {sizes[0]} maxBytes {sizes[-1]} step: 4(factor) warmup iters: 1 "
                 "iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0")
    if ranks:
        lines += ["#", "# Using devices"] + [f"#  Rank {r:2d} Group  0 Pid 584419 on        dkh device {r:2d} "
                                             f"[0000:14:00] NVIDIA A100-SXM4-80GB" for r in range(ranks)]
    lines += ["#", ("#                                                              out-of-place                       "
              "in-place          "),
              ("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw "
              "  busbw  #wrong "),
              ("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  "
              "(GB/s)         ")]
    for size, t in zip(sizes, times_us):
        alg = size / 1e3 / t if t > 0 else 0.0
        half = f"{t:8.2f} {alg:7.2f} {alg * 2 * (n - 1) / n:7.2f}       0"
        ip = f"{20 + size / 2e3:8.2f} {size / 1e3 / (20 + size / 2e3):7.2f} {size / 1e3 / (20 + size / 2e3) * 1.75:7.2f}       0"
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1 {half} {ip}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0 ", "#"]
    return "\n".join(lines) + "\n"


def _fit_cli(capsys, *argv):
    code = main(["fit", *map(str, argv), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err.strip().splitlines()


def test_a_group_size_or_op_the_nccl_tests_log_contradicts_is_refused(tmp_path, capsys):
    """`fit ar.log --group-size 4` on a log listing 8 ranks fitted n=4; a named test was overridden by --op."""
    log = tmp_path / "ar.log"
    log.write_text(_nccl_log())
    with pytest.raises(ConfigError, match=r"group_size=4: ar.log says its rows ran on 8 ranks .*leave --group-size out"):
        load_points(log, group_size=4)
    with pytest.raises(ConfigError, match=r"op='broadcast': ar.log line 2 names the test all_reduce; leave --op out"):
        load_points(log, op="broadcast")
    points, _ = load_points(log, group_size=8, op="allreduce")  # agreeing with the file is fine
    assert {(p.op, p.group_size) for p in points} == {("all_reduce", 8)}
    code, _, err = _fit_cli(capsys, log, "--group-size", "4")
    assert code == 2 and len(err) == 1 and err[0].startswith("commscope fit: error: group_size=4: ar.log says")
    # where the log does not say, the flags say it
    bare = tmp_path / "bare.log"
    bare.write_text(_nccl_log(ranks=None, test=None))
    points, _ = load_points(bare, group_size=4, op="all_reduce")
    assert {(p.op, p.group_size) for p in points} == {("all_reduce", 4)}


def test_a_group_size_or_op_the_bench_json_contradicts_is_refused(tmp_path, capsys):
    """`fit b2.json --op broadcast --group-size 64` relabelled a 2-rank sweep as 64 ranks and ignored --op."""
    path = _write(tmp_path / "b2.json", [_row(size=1024 * 4**i, t=1e-4 + 4**i * 1e-7) for i in range(4)])
    code, _, err = _fit_cli(capsys, path, "--op", "broadcast", "--group-size", "64")
    assert code == 2 and len(err) == 1 and "group_size=64: b2.json rows[1] ran on 2 ranks" in err[0]
    code, _, err = _fit_cli(capsys, path, "--op", "broadcast")
    assert code == 2 and len(err) == 1 and "op='broadcast': b2.json rows[1] measures all_reduce" in err[0]
    code, data, err = _fit_cli(capsys, path, "--op", "all_reduce", "--group-size", "2")
    assert code == 0 and err == [] and [(c["op"], c["group_size"]) for c in data["curves"]] == [("all_reduce", 2)]


def test_an_unknown_op_is_named(tmp_path, capsys):
    """'foo' gave "foo over 2 ranks ... need at least 2 message sizes", and two foo rows a ValueError traceback."""
    code, _, err = _fit_cli(capsys, tmp_path / "any.json", "--op", "foo")
    assert code == 2 and len(err) == 1 and "op='foo': expected one of all_reduce, all_gather" in err[0]
    good = [_row(size=1024 * 4**i, t=1e-4 + 4**i * 1e-7) for i in range(4)]
    path = _write(tmp_path / "foo.json", [_row(op="foo"), _row(op="foo", size=4096)])
    code, _, err = _fit_cli(capsys, path)
    assert code == 2 and len(err) == 1
    assert "input='foo.json': has no usable rows: foo.json rows[1].op='foo': not a collective fit knows" in err[0]
    path = _write(tmp_path / "mixed.json", [*good, _row(op="foo"), _row(op="foo", size=4096)])
    code, data, err = _fit_cli(capsys, path)
    assert code == 0 and [(c["op"], c["group_size"]) for c in data["curves"]] == [("all_reduce", 2)]
    assert err == [("commscope fit: warning: mixed.json rows[5].op='foo': not a collective fit knows (all_reduce, "
                   "all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, sendrecv): row skipped"),
                   ("commscope fit: warning: mixed.json rows[6].op='foo': not a collective fit knows (all_reduce, "
                   "all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, sendrecv): row skipped")]


def test_damaged_rows_are_named_and_skipped_alike_in_both_formats(tmp_path, capsys):
    """A negative out-of-place time was dropped silently from nccl-tests output (bench JSON refused it), a zero one
    silently replaced by the in-place time, and a 1e15-byte bench row fitted."""
    sizes = [1024 * 4**i for i in range(6)]
    times = [20 + s / 2e3 for s in sizes]
    log = tmp_path / "ar.log"
    log.write_text(_nccl_log(times_us=[-30.0 if i == 1 else 0.0 if i == 3 else t for i, t in enumerate(times)]))
    line = {s: n for n, text in enumerate(log.read_text().splitlines(), start=1) for s in sizes
            if text.lstrip().startswith(f"{s} ")}
    code, data, err = _fit_cli(capsys, log)
    assert code == 0, err
    assert err == [(f"commscope fit: warning: ar.log:{line[4096]}: cannot read data row '4096 1024 float sum -1 -30.00 "
                   "0.00 0.00 0 22.05 0.19 0.33 0': time/algbw/busbw '-30.00 0.00 0.00' must be finite and >= 0: row "
                   "skipped"),
                   (f"commscope fit: warning: ar.log:{line[65536]}: all_reduce 65536 B out-of-place time=0.00 us is no "
                   "measurement (must be > 0): row skipped")]
    assert sorted(r["size_bytes"] for r in data["rows"]) == [s for s in sizes if s not in (4096, 65536)]
    bench = _write(tmp_path / "b.json", [_row(size=s, t=t * US) for s, t in zip(sizes, times)]
                   + [_row(size=10**15, t=1.0), _row(size=2048, t=-30e-6), _row(size=8192, t=0.0)])
    code, data, err = _fit_cli(capsys, bench)
    assert code == 0, err
    assert err == [("commscope fit: warning: b.json rows[7].size_bytes=1000000000000000: larger than any real message "
                   "(> 1 TiB): row skipped"),
                   "commscope fit: warning: b.json rows[8].time_s=-3e-05: not a measured time (must be > 0): row skipped",
                   "commscope fit: warning: b.json rows[9].time_s=0.0: not a measured time (must be > 0): row skipped"]
    assert sorted(r["size_bytes"] for r in data["rows"]) == sizes
    big = tmp_path / "big.log"
    big.write_text(_nccl_log(sizes=[*sizes, 2**41], times_us=[*times, 1e7]))
    code, data, err = _fit_cli(capsys, big)
    assert code == 0 and len(err) == 1 and "size 2199023255552 B is larger than any real message (> 1 TiB): row skipped" in err[0]
    assert sorted(r["size_bytes"] for r in data["rows"]) == sizes


def _toml_segments(text: str) -> list[dict]:
    return [seg for curve in tomllib.loads(text)["curves"] for seg in curve["segments"]]


def _physical(seg: dict) -> bool:
    """A segment a link could have: a bus bandwidth in the cluster files' range, or flat (latency only)."""
    return math.isinf(seg["busbw_GBps"]) or 0.01 <= seg["busbw_GBps"] <= 10_000


def test_a_size_range_whose_line_no_link_has_is_merged_and_its_rows_named(tmp_path, capsys):
    # two ranks sharing cores: the smallest messages' times climb by tens of microseconds over a hundred bytes
    # (noise), a line through them alone is a bus bandwidth of MB/s; then a real slope (2 GB/s) from 64 KiB on
    small = {8: 100e-6, 32: 140e-6, 128: 180e-6, 512: 300e-6, 2048: 302e-6, 8192: 301e-6}
    large = {s: 310e-6 + s / (2 * GB) for s in (1 << 16, 1 << 18, 1 << 20, 1 << 22)}
    pts = [FitPoint(op="all_reduce", group_size=2, size_bytes=s, time_s=t) for s, t in {**small, **large}.items()]
    res = fit(pts, source="noisy.json")
    (curve,) = res.curves
    assert all(s.busbw_bytes_per_s == math.inf or 0.01 * GB <= s.busbw_bytes_per_s <= 10_000 * GB
               for s in curve.segments), curve.segments
    assert res.merged and res.merged[0].startswith("all_reduce over 2 ranks: the rows of 8, 32, 128 B alone give a "
                                                   "line whose bus bandwidth")
    assert "outside any real link's range" in res.merged[0] and res.merged[0].endswith("fitted within 8-8,192 B instead")
    assert curve.segments[-1].busbw_bytes_per_s == pytest.approx(2 * GB, rel=1e-6)  # the large messages' own line kept
    assert all(_physical(seg) for seg in _toml_segments(to_toml(res)))
    _write(tmp_path / "noisy.json", [_row(size=s, t=t) for s, t in {**small, **large}.items()])
    assert main(["fit", str(tmp_path / "noisy.json"), "--out", str(tmp_path / "fit.toml")]) == 0
    err = capsys.readouterr().err
    assert "commscope fit: note: all_reduce over 2 ranks: the rows of 8, 32, 128 B alone give" in err
    assert all(_physical(seg) for seg in _toml_segments((tmp_path / "fit.toml").read_text()))


def test_an_unreliable_curve_keeps_its_lines_as_a_comment_only(tmp_path):
    sizes = [2 ** k for k in range(3, 12)]
    pts = [FitPoint(op="all_reduce", group_size=2, size_bytes=s, time_s=100e-6) for s in sizes]  # flat: infinite busbw
    res = fit(pts, source="flat")
    assert res.why_unreliable(res.curves[0]) is not None
    text = to_toml(res)
    assert _toml_segments(text) == [] and "# what the rows fitted, not a link's bandwidth:" in text
    (tmp_path / "flat.toml").write_text(text)
    with pytest.raises(ConfigError, match="every fitted curve is unreliable"):
        read_fitted(tmp_path / "flat.toml")


def test_fit_of_a_real_sweep_writes_only_lines_a_link_could_have(tmp_path, capsys):
    """A real 2-rank gloo sweep of small messages (the noisiest there is on 2 shared cores), fitted."""
    pytest.importorskip("torch")
    bench = tmp_path / "bench.json"
    assert main(["bench", "--nproc", "2", "--ops", "all_reduce,all_gather", "-b", "8", "-e", "64K", "-f", "4",
                 "-n", "20", "-w", "2", "--out", str(bench), "--no-plot"]) == 0
    capsys.readouterr()
    assert main(["fit", str(bench), "--out", str(tmp_path / "fit.toml")]) == 0
    out, _ = capsys.readouterr()
    assert all(_physical(seg) for seg in _toml_segments((tmp_path / "fit.toml").read_text()))
    assert "rows fitted; --rows prints each beside its fitted time" in out and "measured us" not in out
    assert main(["fit", str(bench), "--rows"]) == 0
    assert "measured us" in capsys.readouterr().out


def test_a_curve_of_thousands_of_sizes_is_fitted_on_a_grid():
    """A sweep with -f 1 (or a million rows of random sizes) gives thousands of distinct sizes: every split of them
    cost k^2 lines and k^3 splits (a thousand sizes took minutes; issue 36). Beyond EXHAUSTIVE_SIZES the pieces break
    at that many evenly spread sizes, each line from prefix sums: the three regimes of the A100 all_reduce are found
    again, and the lines from sums are those of the direct least squares."""
    import numpy as np

    from commscope.measure.bench.piecewise import EXHAUSTIVE_SIZES, _line, _line_from_sums, fit_curve

    x = np.unique(np.round(np.logspace(3, 27, 2000, base=2)))
    truth = np.where(x < 2**19, 36e-6 + x / 46e9, np.where(x < 2**24, 53e-6 + x / 135e9, 145e-6 + x / 211e9))
    y = truth * (1 + np.random.default_rng(0).uniform(-0.01, 0.01, len(x)))
    assert len(x) > EXHAUSTIVE_SIZES
    segs = fit_curve(x, y, tolerance=0.05)
    assert len(segs) == 3 and segs[0][0] == 0 and segs[-1][1] == len(x) - 1
    assert [round(1 / b / 1e9) for *_, b in segs] == pytest.approx([46, 135, 211], rel=0.05)
    assert all(abs((a + b * x[s:e + 1]) / y[s:e + 1] - 1).max() <= 0.05 for s, e, a, b in segs)
    inv = 1 / y[:40]
    sums = [float(np.sum(v)) for v in (inv * inv, x[:40] * inv * inv, (x[:40] * inv) ** 2, inv, x[:40] * inv)]
    assert _line_from_sums(*sums, 40) == pytest.approx(_line(x[:40], y[:40]), rel=1e-6, abs=1e-12)


V100_NAME = "nccl-tests_allgather-allreduce-broadcast-reduce-reducescatter_v100x12_dgx2_old-format_errors.txt"


@requires_shared(*LOGS, A100_NAME)
@requires_shared(*LOGS, V100_NAME)
@pytest.mark.parametrize("name, extra", [(A100_NAME, []), (V100_NAME, ["--op", "all_reduce"])])
def test_fit_and_estimate_read_the_nccl_tests_file_once(tmp_path, monkeypatch, capsys, name, extra):
    """What is fitted is what was read: the file is read once (a log still being written, or replaced between two
    reads, would otherwise have its kind decided on one content and its rows taken from another)."""
    import pathlib

    src = tmp_path / name
    src.write_bytes(SHARED.joinpath(*LOGS, name).read_bytes())
    reads: list[str] = []
    for method in ("read_bytes", "read_text"):
        original = getattr(pathlib.Path, method)

        def counted(self, *args, _original=original, _method=method, **kwargs):
            if self.name == name:
                reads.append(_method)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, method, counted)
    out = tmp_path / "fit.toml"
    assert main(["fit", str(src), "--out", str(out), *extra]) == 0
    assert reads == ["read_bytes"], reads
    if extra:  # (estimate --bandwidth refuses a log with a failed data check, as the V100 log's all_gather is)
        return
    reads.clear()
    assert main(["estimate", "--model", "gpt3-1.3b", "--tp", "2", "--dp", "4", "--bandwidth", str(src)]) == 0
    assert reads == ["read_bytes"], reads
    capsys.readouterr()
