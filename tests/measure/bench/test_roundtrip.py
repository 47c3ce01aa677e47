"""bench -> fit -> estimate: the estimate uses the fitted numbers, and moves when they do."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch")

from commscope.api import predict
from commscope.estimate.fitted import FittedModel, read_fitted
from commscope.cli.main import main
from commscope.estimate.iteration import estimate
from commscope.spec.parallel import ParallelSpec

# tp=2, pp=2, dp=2 on one 8-GPU DGX-1 node: TP and DP all-reduces over 2 ranks and the PP sends stay inside
# the node, where the gloo fit (measured on one host) applies
JOB = ["--model", "gpt-1.5b", "--cluster", "dgx1-v100", "--tp", "2", "--pp", "2", "--dp", "2",
       "--global-batch-size", "64", "--micro-batch-size", "4"]


def _estimate(capsys, *extra):
    assert main(["estimate", *JOB, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _every_curve(text: str) -> str:
    """The fitted file with every curve read, as this test wants it: on a busy 2-core machine a noisy curve can
    fit a flat largest segment (busbw = inf), which fit marks unreliable and writes as a comment under an empty
    ``segments = []``; here the comment becomes the curve again, with a finite bandwidth where it was flat."""
    text = re.sub(r"\nunreliable = .*", "", text)
    text = re.sub(r"\nsegments = \[\]\n# what the rows fitted, not a link's bandwidth:", "", text)
    text = re.sub(r"(?m)^# (segments = \[|  \{ size_min_bytes|\])", r"\1", text)
    return re.sub(r"busbw_GBps = inf", "busbw_GBps = 1.0", text)


def test_every_curve_reads_an_unreliable_curve_back_as_a_curve():
    text = ('[[curves]]\nop = "sendrecv"\ngroup_size = 2\nunreliable = "flat"\nsegments = []\n'
            "# what the rows fitted, not a link's bandwidth:\n# segments = [\n"
            "#   { size_min_bytes = 1024, size_max_bytes = 4096, alpha_us = 5.0, busbw_GBps = inf },\n# ]\n")
    assert _every_curve(text) == ('[[curves]]\nop = "sendrecv"\ngroup_size = 2\nsegments = [\n'
                                  "  { size_min_bytes = 1024, size_max_bytes = 4096, alpha_us = 5.0, busbw_GBps = 1.0 },\n]\n")


def test_bench_fit_estimate_round_trip(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    model = tmp_path / "fitted.toml"
    assert main(["bench", "--nproc", "2", "--ops", "all_reduce,sendrecv", "-b", "1K", "-e", "4M", "-f", "4", "-n", "5",
                 "-w", "1", "--out", str(bench), "--no-plot", "--json"]) == 0
    capsys.readouterr()
    assert main(["fit", str(bench), "--out", str(model)]) == 0
    capsys.readouterr()
    # this test is about the round trip, so it reads every curve, the ones a noisy machine made unreliable too
    model.write_text(_every_curve(model.read_text()))
    fitted = read_fitted(model)
    assert {(c.op, c.group_size, c.intra_node) for c in fitted.curves} == {("all_reduce", 2, True), ("sendrecv", 2, True)}

    preset = _estimate(capsys)
    measured = _estimate(capsys, "--bandwidth", str(model))
    # the CLI's numbers are the fitted model's numbers
    pred = predict("gpt-1.5b", ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=64, micro_batch_size=4), "dgx1-v100")
    direct = estimate(pred, bandwidth=FittedModel(curves=fitted.curves, source=model.name)).to_dict()
    for key in ("tp_s", "pp_s", "dp_s", "iteration_time_s"):
        assert measured[key] == pytest.approx(direct[key], rel=1e-12)
        assert measured[key] != pytest.approx(preset[key], rel=1e-3)  # gloo on 2 cores is no NVLink
    assert not any("cluster preset" in n for n in measured["notes"])  # every op came from the fit

    # ten times the bus bandwidth in the file: every communication term shrinks, compute does not move.
    # (On a busy 2-core machine a noisy curve can fit a flat segment, busbw = inf, which no scaling moves;
    # such segments get a finite busbw first, so the comparison is about the mechanism, not the noise.)
    text = re.sub(r"busbw_GBps = inf", "busbw_GBps = 1.0", model.read_text())
    base_model, fast_model = tmp_path / "fitted_x1.toml", tmp_path / "fitted_x10.toml"
    base_model.write_text(text)
    fast_model.write_text(re.sub(r"busbw_GBps = ([0-9.e+-]+)", lambda m: f"busbw_GBps = {float(m.group(1)) * 10!r}", text))
    base = _estimate(capsys, "--bandwidth", str(base_model))
    fast = _estimate(capsys, "--bandwidth", str(fast_model))
    for key in ("tp_s", "dp_s", "pp_s"):
        assert 0 < fast[key] < base[key]
    assert fast["compute_s"] == base["compute_s"]
    assert fast["effective_bandwidth_bytes_per_s"]["dp"] > base["effective_bandwidth_bytes_per_s"]["dp"]

    # the bench JSON itself is a measured table for the estimate too
    table = _estimate(capsys, "--bandwidth", str(bench))
    assert table["dp_s"] != pytest.approx(preset["dp_s"], rel=1e-3)
