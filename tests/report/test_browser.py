"""The report in a real headless browser (Debian's chromium): it loads without errors and without a single
request, the heatmap and the breakdown draw, and the axis toggle really re-draws the heatmap.

The page records what it drew in data attributes (``<body data-ready data-errors data-heatmap-cells>``,
``<canvas id="heatmap-canvas" data-cells data-axes>``); ``--dump-dom`` gives them back. The URL fragment
``#axes=tp,dp`` selects axes on load, as a click on the toggles would. Network access is cut off
(unresolvable hosts, a dead proxy) and the page's capture-phase error hook reports any request it makes.

A screenshot is saved under the test's tmp_path (its path is printed) and, when the environment variable
``COMMSCOPE_TEST_ARTIFACTS`` names a directory, copied there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from commscope.api import predict
from commscope.estimate.iteration import estimate
from commscope.io.oplog import write_ops_jsonl
from commscope.report.html import build_report_data, load_bench, load_measured, load_moe, write_html
from commscope.spec.parallel import ParallelSpec

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium", shutil.which("chromium-browser")) if p and Path(p).exists()), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium; "
                                                          ".ci/run installs it when it runs as root)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]
TIMEOUT_S = 90


def _chromium(tmp_path: Path, url: str, *extra: str) -> tuple[str, str]:
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, url]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish in {TIMEOUT_S} s: {' '.join(cmd)}")
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return done.stdout, done.stderr


def _dom(tmp_path: Path, html: Path, fragment: str = "") -> tuple[str, str]:
    out, err = _chromium(tmp_path, html.as_uri() + fragment, "--dump-dom")
    assert "<body" in out, f"no DOM from chromium; stderr:\n{err[-3000:]}"
    return out, err


def _attr(dom: str, element: str, name: str) -> str | None:
    """The attribute ``name`` of the first ``<element ...>`` start tag (element may be ``canvas id="x"``)."""
    tag = element.split()[0]
    for m in re.finditer(rf"<{tag}\b[^>]*>", dom):
        if all(part in m.group(0) for part in element.split()[1:]):
            a = re.search(rf'\s{re.escape(name)}="([^"]*)"', m.group(0))
            return a.group(1) if a else None
    return None


def _console_lines(stderr: str) -> list[str]:
    """Console messages chromium logged (the page writes none of its own; an uncaught exception is one)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _errors_listed(dom: str) -> list[str]:
    box = re.search(r'<div id="errors"[^>]*>(.*?)</div>', dom, re.DOTALL)
    return re.findall(r"<li>(.*?)</li>", box.group(1)) if box else []


def _assert_clean(dom: str, stderr: str) -> None:
    assert _attr(dom, "body", "data-ready") == "1", f"the page script did not finish; {_errors_listed(dom)}"
    assert _attr(dom, "body", "data-errors") == "0", _errors_listed(dom)
    assert re.search(r'<div id="errors" hidden=""', dom), _errors_listed(dom)
    assert _console_lines(stderr) == []


@pytest.fixture(scope="module", autouse=True)
def runs_headless(tmp_path_factory):
    """Skip (with chromium's own words) where the installed chromium cannot start headless at all."""
    tmp = tmp_path_factory.mktemp("probe")
    page = tmp / "probe.html"
    page.write_text("<!DOCTYPE html><html><body>ok</body></html>")
    out, err = _chromium(tmp, page.as_uri(), "--dump-dom")
    if "<body>ok" not in out:
        pytest.skip(f"{CHROMIUM} does not run headless here: {err.strip()[-500:]}")


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    """A 32-GPU report with every section: prediction, estimate, plan, measured logs, a benchmark, MoE routing."""
    from commscope.estimate.plan import plan

    tmp = tmp_path_factory.mktemp("browser-report")
    par = ParallelSpec(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4)
    pred = predict("gpt-3b", par, "dgx1-v100")
    logs = tmp / "logs"
    logs.mkdir()
    for r in range(8):  # ranks 0..7 log their ops of two steps, as a recorder does (axes left to the layout)
        ops = []
        for step in (1, 2):
            for op in pred.workload.ops("group"):
                if (op.rank is None and r in op.group) or op.rank == r:
                    ops.append(op.with_(rank=r, axis="other", extra=(("step", step),)))
        write_ops_jsonl(logs / f"rank{r:05d}.jsonl", ops)
    rows = [{"op": op, "group_size": n, "size_bytes": 2**k, "busbw_bytes_per_s": 2**k / (2e-5 + 2**k / bw), "time_s": 2e-5 + 2**k / bw}
            for op, n, bw in (("all_reduce", 8, 130e9), ("all_gather", 8, 120e9), ("sendrecv", 2, 11e9)) for k in range(8, 31, 2)]
    (tmp / "bench.json").write_text(json.dumps({"meta": {"tool": "test", "backend": "nccl"}, "rows": rows}))
    rng = np.random.default_rng(1)
    (tmp / "moe").mkdir()
    np.savez(tmp / "moe" / "layer0.npz", routing=rng.integers(0, 900, size=(120, 8, 8)))
    from commscope.moe.generators import generate
    from commscope.moe.trace import save_trace

    save_trace(generate("settle:30", iterations=90, ep=4, num_experts=8, top_k=2, tokens_per_rank=64), tmp / "moe" / "trace.npz")
    data = build_report_data(prediction=pred, estimate=estimate(pred), plan=plan(pred.model, pred.cluster, 32, 512, top=4),
                             measured=load_measured(logs), bench=load_bench(tmp / "bench.json"), moe=load_moe(tmp / "moe"),
                             command_line="commscope report --model gpt-3b --tp 2 --pp 4 --dp 4 ... --out report.html")
    return write_html(data, tmp / "report.html"), data


def test_loads_without_errors_and_draws_every_section(tmp_path, full_report):
    html, data = full_report
    dom, err = _dom(tmp_path, html)
    _assert_clean(dom, err)
    for section in ("heatmap", "bytes", "breakdown", "schedule", "sizes", "measured", "measured-heatmap", "bench", "moe", "inputs"):
        assert f'<section class="card" id="{section}"' in dom, section
    moe = dom[dom.index('id="moe"'):]
    assert "pairs switching on/off" in moe and "trace over training" in moe  # a trace's dynamics are drawn
    cells = int(_attr(dom, 'canvas id="heatmap-canvas"', "data-cells"))
    assert cells == data["heatmap"]["all"]["num_cells"] > 0
    assert _attr(dom, 'canvas id="heatmap-canvas"', "data-axes") == "tp,pp,dp,emb"
    breakdown = dom[dom.index('id="breakdown"'):dom.index('id="schedule"')]
    drawn = [t for t in data["breakdown"]["terms"] if t["seconds"] > 0]
    assert breakdown.count("<rect") >= len(drawn) and "<svg" in breakdown
    assert int(_attr(dom, 'canvas id="schedule-canvas"', "data-slots")) == len(data["schedule"]["schedules"][0]["slots"]["stage"])
    assert dom.count("<circle") >= sum(len(s["size_bytes"]) for s in data["bench"]["series"])
    assert "commscope report --model gpt-3b" in dom


@pytest.mark.parametrize("axes", [["tp"], ["pp"], ["dp", "emb"], ["tp", "dp"], []])
def test_axis_toggle_redraws_the_heatmap(tmp_path, full_report, axes):
    html, data = full_report
    dom, err = _dom(tmp_path, html, "#axes=" + ",".join(axes))
    _assert_clean(dom, err)
    layers = {layer["axis"]: layer for layer in data["heatmap"]["layers"]}
    expected = {(r, c) for a in axes for r, c in zip(layers[a]["r"], layers[a]["c"])}
    assert _attr(dom, 'canvas id="heatmap-canvas"', "data-axes") == ",".join(axes)
    assert int(_attr(dom, 'canvas id="heatmap-canvas"', "data-cells")) == len(expected)
    assert int(_attr(dom, "body", "data-heatmap-cells")) == len(expected)
    for axis in layers:
        pressed = _attr(dom, f'button data-axis="{axis}"', "aria-pressed")
        assert pressed == ("true" if axis in axes else "false")


def test_a_request_from_the_page_would_be_caught(tmp_path, full_report):
    html, _ = full_report
    leaky = tmp_path / "leaky.html"
    leaky.write_text(html.read_text().replace("</main>", '<img src="http://example.invalid/x.png"></main>', 1))
    dom, _ = _dom(tmp_path, leaky)
    assert int(_attr(dom, "body", "data-errors")) >= 1
    assert any("request from the page" in e for e in _errors_listed(dom))


def test_16384_gpu_report_draws_at_node_level(tmp_path):
    layers = (7,) + (8,) * 14 + (7,)
    par = ParallelSpec(tp=8, pp=16, dp=128, global_batch_size=2048, micro_batch_size=1, pipeline_layers=layers)
    pred = predict("llama3-405b", par, "dgx-h100")
    data = build_report_data(prediction=pred, estimate=estimate(pred))
    html = write_html(data, tmp_path / "big.html")
    dom, err = _dom(tmp_path, html)
    _assert_clean(dom, err)
    assert int(_attr(dom, 'canvas id="heatmap-canvas"', "data-cells")) == data["heatmap"]["all"]["num_cells"]
    dom, err = _dom(tmp_path, html, "#axes=dp")
    _assert_clean(dom, err)
    assert int(_attr(dom, 'canvas id="heatmap-canvas"', "data-cells")) == data["heatmap"]["layers"][2]["num_cells"]


def test_screenshot(tmp_path, full_report, capsys):
    html, _ = full_report
    shot = tmp_path / "report.png"
    _, err = _chromium(tmp_path, html.as_uri(), "--window-size=1280,7000", f"--screenshot={shot}")
    assert shot.exists(), err[-3000:]
    raw = shot.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    mpl_image = pytest.importorskip("matplotlib.image")
    pixels = mpl_image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (7000, 1280)
    assert float((pixels < 0.9).any(axis=-1).mean()) > 0.05  # drawn, not a blank page
    artifacts = os.environ.get("COMMSCOPE_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / "report-screenshot.png")
        shutil.copy(html, Path(artifacts) / "report.html")
    with capsys.disabled():
        print(f"\nreport screenshot: {shot}")


@pytest.fixture(scope="module")
def measured_reports(tmp_path_factory):
    """A real recorded job (tp 2 on 2 gloo ranks, 3 steps) and a real gloo sweep, put in reports as a user does:
    with the prediction of the job saved beside the logs (its preset V100 links dwarf gloo's), and without."""
    pytest.importorskip("torch")
    from commscope.cli.main import main

    tmp = tmp_path_factory.mktemp("measured-report")
    logs, bench = tmp / "logs", tmp / "bench.json"
    assert main(["workload", "gpt", "--tp", "2", "--dp", "1", "--steps", "3", "--record", str(logs), "--json"]) == 0
    assert main(["bench", "--nproc", "2", "--ops", "all_reduce,all_gather", "-b", "1K", "-e", "1M", "-f", "8",
                 "-n", "5", "-w", "1", "--out", str(bench), "--no-plot", "--json"]) == 0
    full, measured_only = tmp / "full.html", tmp / "measured.html"
    assert main(["report", "--measured", str(logs), "--bench", str(bench), "--out", str(full)]) == 0
    assert main(["report", "--no-predicted", "--measured", str(logs), "--out", str(measured_only)]) == 0
    return full, measured_only


def _svg(dom: str, svg_id: str) -> str:
    start = dom.index(f'id="{svg_id}"')
    return dom[dom.rindex("<svg", 0, start):dom.index("</svg>", start)]


def test_time_chart_draws_the_models_curves_and_keeps_its_whiskers_inside(tmp_path, measured_reports):
    """The time chart drew no dashed model curve (one size bin per op: a line of one point), its p95 whiskers ran
    off the plot, and its log axis had one tick."""
    dom, err = _dom(tmp_path, measured_reports[0])
    _assert_clean(dom, err)
    svg = _svg(dom, "time-chart")
    series = int(_attr(svg, 'svg id="time-chart"', "data-model-curves"))
    curves = re.findall(r'<polyline[^>]*class="model-curve"[^>]*>', svg)
    assert series >= 2 and len(curves) == series
    assert all(len(re.search(r'points="([^"]*)"', c).group(1).split()) >= 4 for c in curves)  # a curve, not a dot
    top, bottom = float(_attr(svg, 'svg id="time-chart"', "data-plot-top")), float(_attr(svg, 'svg id="time-chart"', "data-plot-bottom"))
    whiskers = re.findall(r'<line[^>]*class="whisker"[^>]*>', svg)
    assert whiskers
    for w in whiskers:
        y1, y2 = (float(re.search(rf'{k}="([^"]*)"', w).group(1)) for k in ("y1", "y2"))
        assert top <= min(y1, y2) and max(y1, y2) <= bottom, (w, top, bottom)
    assert len(re.findall(r'class="y-tick"', svg)) >= 3


def test_bandwidth_chart_goes_log_where_measured_and_preset_differ_by_orders_of_magnitude(tmp_path, measured_reports):
    """Measured gloo curves lay flat at 0 on a linear axis scaled to the preset's NVLink."""
    dom, err = _dom(tmp_path, measured_reports[0])
    _assert_clean(dom, err)
    svg = _svg(dom, "bench-chart")
    assert _attr(svg, 'svg id="bench-chart"', "data-scale") == "log"
    assert len(re.findall(r'class="measured-curve"', svg)) == 2 and re.search(r'class="model-curve"', svg)
    ticks = re.findall(r'class="y-tick"[^>]*>([^<]*)<', svg)
    assert len(ticks) >= 3 and "0" not in ticks  # small values keep their digits: 0.001, not 0


def test_a_report_without_prediction_shows_no_predicted_columns(tmp_path, measured_reports):
    dom, err = _dom(tmp_path, measured_reports[1])
    _assert_clean(dom, err)
    card = dom[dom.index('<section class="card" id="measured"'):]
    card = card[:card.index("</section>")]
    table = card[card.index("<table"):card.index("</table>")]  # the notes below it may name ranges (steps 0-2)
    assert "<h2>Measured bytes by axis</h2>" in card
    assert "predicted" not in table and "\u2013" not in table  # no column of dashes
