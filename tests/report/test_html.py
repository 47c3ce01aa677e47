"""The HTML report: its data (every number from the library), its self-containment, its inputs, its CLI."""

from __future__ import annotations

import json
import re
import struct
import time

import numpy as np
import pytest

import commscope.report.html as report_html
from commscope.api import predict
from commscope.cli.main import main
from commscope.errors import ConfigError
from commscope.estimate.iteration import estimate
from commscope.io.oplog import write_ops_jsonl
from commscope.pattern.layout import Layout
from commscope.commop import AXES
from commscope.report.html import (build_report_data, compare_measured, heatmap_section, load_bench, load_measured,
                                   load_moe, moe_metrics, predicted_bytes_by_axis, render_html, size_histogram)
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.traffic import TrafficMatrix

PAR_32 = dict(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4)
JOB_32 = ["--model", "gpt-3b", "--tp", "2", "--pp", "4", "--dp", "4", "--global-batch-size", "512",
          "--micro-batch-size", "4", "--cluster", "dgx1-v100"]
SVG_NAMESPACE = "http://www.w3.org/2000/svg"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pred32():
    return predict("gpt-3b", ParallelSpec(**PAR_32), "dgx1-v100")


@pytest.fixture(scope="module")
def est32(pred32):
    return estimate(pred32)


def _embedded(html: str) -> dict:
    m = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', html, re.DOTALL)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def write_measured_logs(pred, directory, *, steps=(1, 2), scale=None, axis="other"):
    """Per-rank logs as a recorder writes them: every member of a collective logs it, a send on its sender and
    a recv on its receiver, records tagged with a step, a setup broadcast before the first step."""
    directory.mkdir(parents=True, exist_ok=True)
    world = pred.traffic.world_size
    per_rank = {r: [] for r in range(world)}
    for r in range(world):
        per_rank[r].append(next(pred.workload.ops("group")).with_(op="broadcast", axis=axis or "other", group=tuple(range(world)),
                                                                   rank=r, size_bytes=4096, count=1, phase=None))
    for step in steps:
        for op in pred.workload.ops("group"):
            size = int(op.size_bytes * (scale or {}).get(op.axis, 1.0))
            rec = op.with_(axis=axis if axis else op.axis, extra=(("step", step),), size_bytes=size)
            if op.rank is not None:  # send, recv, all_to_all (one per issuing rank)
                per_rank[op.rank].append(rec)
            else:
                for r in op.group:
                    per_rank[r].append(rec.with_(rank=r))
    for r, ops in per_rank.items():
        write_ops_jsonl(directory / f"rank{r:05d}.jsonl", ops, header={"kind": "measured", "rank": r, "world_size": world})
    return directory


def write_bench(path):
    rows = []
    for op, n, intra, bw in (("all_reduce", 8, True, 130e9), ("all_reduce", 16, False, 11e9), ("sendrecv", 2, False, 11e9)):
        for k in range(10, 27, 4):
            t = 20e-6 + 2**k / bw
            rows.append({"op": op, "group_size": n, "size_bytes": 2**k, "busbw_bytes_per_s": 2**k / t, "time_s": t,
                         "intra_node": intra, "noisy": k == 14, "backend_op": op})
    path.write_text(json.dumps({"meta": {"tool": "commscope bench", "world_size": 16, "hosts": ["a"] * 8 + ["b"] * 8},
                                "rows": rows}))
    return path


def write_moe(directory, *, iterations=40, ep=4):
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    for layer in (1, 3):
        routing = rng.integers(0, 500, size=(iterations, ep, ep))
        np.savez(directory / f"layer{layer}.npz", routing=routing)
    return directory


# ----------------------------------------------------------------------------------------------- data


def test_every_section_holds_the_librarys_numbers(pred32, est32):
    data = build_report_data(prediction=pred32, estimate=est32, command_line="commscope report ...")
    tm = pred32.traffic
    h = data["heatmap"]
    assert h["level"] == "gpu" and h["block"] == 1 and h["side"] == 32
    by_axis = tm.bytes_by_axis()
    for layer in h["layers"]:
        s, _d, b = tm.pairs(layer["axis"])
        assert layer["num_cells"] == s.size
        assert sum(layer["b"]) == by_axis[layer["axis"]] == layer["total_bytes"]
        assert max(layer["b"]) <= h["max_bytes"] and min(layer["b"]) >= h["min_bytes"]
    assert [layer["axis"] for layer in h["layers"]] == ["tp", "pp", "dp", "emb"]
    assert sum(h["all"]["b"]) == tm.total_bytes and h["all"]["num_cells"] == tm.num_pairs
    dense = tm.to_dense("tp")
    tp = h["layers"][0]
    assert all(dense[r, c] == b for r, c, b in zip(tp["r"], tp["c"], tp["b"]))

    rows = {r["axis"]: r for r in data["bytes"]["rows"]}
    assert rows["tp"]["bytes"] == by_axis["tp"] and rows["pp"]["inter_node_bytes"] == by_axis["pp"]
    assert sum(r["bytes"] for r in rows.values()) == tm.total_bytes
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)

    b = data["breakdown"]
    assert sum(t["seconds"] for t in b["terms"]) == pytest.approx(est32.iteration_time_s)
    assert {t["key"] for t in b["terms"]} == {"compute", "tp", "pp", "cp", "ep", "dp", "emb", "optimizer", "bubble"}

    sched = data["schedule"]
    first = sched["schedules"][0]
    assert first["name"] == "1f1b" and first["configured"]
    assert first["makespan_s"] + sum(t["seconds"] for t in sched["tail"]) == pytest.approx(est32.iteration_time_s)
    assert len(first["slots"]["stage"]) == 2 * 4 * pred32.parallel.num_micro_batches
    assert sched["schedules"][1]["name"] == "interleaved"  # the what-if beside it
    assert sched["schedules"][1]["idle_fraction"] < first["idle_fraction"]

    sizes = data["message_sizes"]["predicted"]
    sets = [s for s in pred32.workload.opsets if s.op != "recv"]
    assert sizes["total_ops"] == sum(s.num_ops for s in sets)
    assert sum(sum(se["bytes"]) for se in sizes["series"]) == sum(s.logical_bytes for s in sets)
    assert data["inputs"]["model"]["name"] == "gpt-3b" and data["inputs"]["parallel"]["tp"] == 2
    assert data["inputs"]["cluster"]["name"] == "dgx1-v100" and data["inputs"]["command_line"] == "commscope report ..."


def test_breakdown_shows_what_the_overlaps_hide_beside_what_they_leave():
    par = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=16, micro_batch_size=1, sequence_parallel=True,
                       distributed_optimizer=True, tp_comm_overlap=True, overlap_grad_reduce=True,
                       overlap_param_gather=True, virtual_pipeline_size=2)
    est = estimate(predict("gpt-1.5b", par, "dgx-h100"))
    terms = {t["key"]: t for t in report_html.breakdown_section(est, parallel=par)["terms"]}
    assert {k for k, t in terms.items() if t["hidden_seconds"] > 0} == set(est.hidden_s) >= {"tp", "dp"}
    for key, seconds in est.hidden_s.items():
        assert terms[key]["hidden_seconds"] == pytest.approx(seconds)
    assert terms["compute"]["hidden_seconds"] == terms["bubble"]["hidden_seconds"] == 0.0


def test_node_level_above_1024_gpus_and_pooling_keeps_the_largest_entry():
    # 2,048 GPUs, 8 per node: node level, 256 nodes, no pooling; forced GPU level pools 4x4 blocks
    rng = np.random.default_rng(0)
    src = rng.integers(0, 2048, 5000)
    dst = (src + rng.integers(1, 2047, 5000)) % 2048
    key = np.unique(src * 2048 + dst)
    src, dst = key // 2048, key % 2048
    nbytes = rng.integers(1, 10**9, src.size)
    tm = TrafficMatrix(world_size=2048, gpus_per_node=8, src=src, dst=dst, axis=np.full(src.size, AXES.index("dp")),
                       bytes=nbytes)
    node = heatmap_section(tm)
    assert node["level"] == "node" and node["side"] == 256 and node["block"] == 1
    dense = tm.node_matrix()
    assert sum(node["all"]["b"]) == dense.sum()
    assert all(dense[r, c] == b for r, c, b in zip(node["all"]["r"], node["all"]["c"], node["all"]["b"]))
    gpu = heatmap_section(tm, level="gpu")
    assert gpu["block"] == 4 and gpu["cells"] == 512
    full = tm.to_dense()
    pooled = full.reshape(512, 4, 512, 4).max(axis=(1, 3))
    r, c, b = (np.array(gpu["all"][k]) for k in ("r", "c", "b"))
    assert np.array_equal(pooled[r, c], b)
    assert (pooled > 0).sum() == r.size
    assert any("largest entry of a 4\u00d74 block" in n for n in gpu["notes"])


def test_size_histogram_bins_are_exact_powers_of_two():
    h = size_histogram(np.array([1024, 1023, 2047, 2048, 0, 3 * 2**30]), np.array([1, 2, 3, 4, 5, 6]),
                       ["tp", "tp", "dp", "dp", "pp", "ep"])
    edges = h["edges_bytes"]
    assert edges[0] == 512 and edges[-1] == 2**32
    tp = next(s for s in h["series"] if s["axis"] == "tp")
    dp = next(s for s in h["series"] if s["axis"] == "dp")
    assert tp["counts"][edges.index(512)] == 2 and tp["counts"][edges.index(1024)] == 1
    assert dp["counts"][edges.index(1024)] == 3 and dp["counts"][edges.index(2048)] == 4
    assert h["zero_size_ops"] == 5 and h["total_ops"] == 1 + 2 + 3 + 4 + 6


def test_json_is_embedded_verbatim_and_cannot_close_its_script(pred32, est32):
    hostile = '</script><script>alert(1)</script> & <!-- %JS% %DATA%'
    data = build_report_data(prediction=pred32, estimate=est32, command_line=hostile, title=hostile)
    html = render_html(data)
    assert html.count("</script>") == 3  # the error hook, the data, the page script, and nothing more
    assert "<script>alert(1)" not in html
    back = _embedded(html)
    assert back["inputs"]["command_line"] == hostile and back["title"] == hostile
    assert back["heatmap"]["all"]["b"] == data["heatmap"]["all"]["b"]
    assert "<title>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;!-- %JS% %DATA%</title>" in html


def test_page_is_self_contained(pred32, est32, tmp_path):
    data = build_report_data(prediction=pred32, estimate=est32, measured=load_measured(write_measured_logs(pred32, tmp_path / "logs")),
                             bench=load_bench(write_bench(tmp_path / "bench.json")), moe=load_moe(write_moe(tmp_path / "moe")))
    html = render_html(data)
    code = html.replace(json.dumps(SVG_NAMESPACE)[1:-1], "")  # a namespace name, never fetched
    code = code.replace(_embedded_text(html), "")
    for needle in ("http:", "https:", "//cdn", "<link", "<img", "<iframe", "@import", " src=", "fetch(",
                   "XMLHttpRequest", "WebSocket", "EventSource", "import(", "sendBeacon", "@font-face"):
        assert needle not in code, needle
    assert re.findall(r"url\((?!#)", code) == []  # only references to the page's own SVG patterns
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")


def _embedded_text(html: str) -> str:
    return re.search(r'<script id="report-data" type="application/json">(.*?)</script>', html, re.DOTALL).group(1)


def test_16384_gpus_is_node_level_and_small(capsys):
    layers = (7,) + (8,) * 14 + (7,)
    par = ParallelSpec(tp=8, pp=16, dp=128, global_batch_size=2048, micro_batch_size=1, pipeline_layers=layers)
    t0 = time.perf_counter()
    pred = predict("llama3-405b", par, "dgx-h100")
    data = build_report_data(prediction=pred, estimate=estimate(pred))
    html = render_html(data)
    elapsed = time.perf_counter() - t0
    assert data["heatmap"]["level"] == "node" and data["heatmap"]["side"] == 2048
    assert data["heatmap"]["cells"] <= report_html.HTML_MAX_CELLS
    assert len(html.encode()) < 2 * 2**20
    with capsys.disabled():
        print(f"\n16,384-GPU report: {len(html.encode()) / 2**10:.0f} KiB, predict + build + render {elapsed:.2f} s")


# ----------------------------------------------------------------------------------------------- measured


def test_predicted_ops_read_back_as_measured_match_exactly(pred32, tmp_path):
    path = tmp_path / "ops.jsonl"
    write_ops_jsonl(path, pred32.workload.ops("full"))
    cmp = compare_measured(load_measured(path), pred32)
    assert cmp["num_iterations"] == 1
    assert {r["axis"] for r in cmp["rows"]} == {"tp", "pp", "dp", "emb"}
    for r in cmp["rows"]:
        assert r["measured_bytes"] == r["predicted_bytes"] and r["ratio"] == 1.0
        assert r["measured_ops"] == r["predicted_ops"]
        assert type(r["measured_ops"]) is int and type(r["measured_bytes"]) is int  # counts, not 4.0


def test_per_rank_logs_with_steps_setup_and_no_axes(pred32, tmp_path):
    logs = write_measured_logs(pred32, tmp_path / "logs", steps=(5, 6, 7), scale={"dp": 1.25})
    measured = load_measured(logs)
    assert measured.num_iterations == 3 and measured.steps == (5, 6, 7) and len(measured.files) == 32
    cmp = compare_measured(measured, pred32)
    rows = {r["axis"]: r for r in cmp["rows"]}
    assert set(rows) == {"tp", "pp", "dp", "emb"}  # the setup broadcast is left out, axes come from the layout
    for axis in ("tp", "pp", "emb"):
        assert rows[axis]["ratio"] == pytest.approx(1.0)
    assert rows["dp"]["ratio"] == pytest.approx(1.25, rel=1e-6)
    assert any("setup records" in n for n in cmp["notes"])
    assert any("took the axis" in n for n in cmp["notes"])
    assert load_measured(logs, num_iterations=3).num_iterations == 3
    with pytest.raises(ConfigError, match="measured_iterations=1: the logs mark 3 complete training step"):
        load_measured(logs, num_iterations=1)  # would rescale every measured count by 3
    with pytest.raises(ConfigError, match="holds the logs of 32 ranks, but the job to compare them with has 8"):
        load_measured(logs, layout=Layout(ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=16)))


def test_all_to_all_counts_per_issuing_rank():
    from commscope.spec.model import ModelSpec

    model = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128,
                      num_experts=4, top_k=2)
    pred = predict(model, ParallelSpec(tp=1, pp=1, dp=4, ep=4, global_batch_size=8, micro_batch_size=1), "dgx-a100")
    pb = predicted_bytes_by_axis(pred.workload)
    ep_ops = [op for op in pred.workload.ops("full") if op.axis == "ep"]
    assert pb["ep"]["bytes"] == sum(op.size_bytes * op.count for op in ep_ops) > 0
    assert pb["ep"]["ops"] == sum(op.count for op in ep_ops)


def test_measured_only_report_and_measured_heatmap(pred32, tmp_path):
    logs = write_measured_logs(pred32, tmp_path / "logs", axis=None)
    data = build_report_data(measured=load_measured(logs))
    assert "heatmap" not in data and "breakdown" not in data
    assert all(r["predicted_bytes"] is None for r in data["measured"]["rows"])
    assert data["message_sizes"]["measured"]["total_ops"] > 0
    with_pred = build_report_data(prediction=pred32, measured=load_measured(logs))
    assert with_pred["measured_heatmap"]["total_bytes"] == pred32.traffic.total_bytes  # per iteration, of two steps


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "nothing-here", "no such file or directory"),
    (lambda d: d, "an empty directory"),
])
def test_measured_input_errors(tmp_path, make, match):
    with pytest.raises(ConfigError, match=match):
        load_measured(make(tmp_path))


# ----------------------------------------------------------------------------------------------- bench, moe


def test_bench_curves_with_the_model_beside_them(tmp_path, pred32):
    bench = load_bench(write_bench(tmp_path / "bench.json"))
    section = report_html.bench_section(bench, pred32.cluster)
    labels = [s["label"] for s in section["series"]]
    assert labels == ["all_reduce \u00d78 intra-node", "all_reduce \u00d716 inter-node", "sendrecv \u00d72 inter-node"]
    for s in section["series"]:
        assert s["size_bytes"] == sorted(s["size_bytes"])
        assert len(s["model_busbw_bytes_per_s"]) == len(s["size_bytes"])
        assert all(v > 0 for v in s["model_busbw_bytes_per_s"])
    assert section["meta"]["hosts"][-1].endswith("16 items in all")


@pytest.mark.parametrize("doc, match", [
    ('{"meta": {}, "rows": []}', "non-empty"),
    ('{"rows": [{"op": "all_reduce", "group_size": 8, "size_bytes": 1024}]}', "lacks busbw_bytes_per_s"),
    # a damaged row is skipped, as fit and --bandwidth skip it; a file of no usable row is refused
    ('{"rows": [{"op": "all_reduce", "group_size": "x", "size_bytes": 1, "busbw_bytes_per_s": 1}]}',
     r"has no usable row: bench.json rows\[1\].group_size='x': not a number"),
    ("not json", "is not valid JSON"),
])
def test_bench_errors_say_what_is_wrong(tmp_path, doc, match):
    path = tmp_path / "bench.json"
    path.write_text(doc)
    with pytest.raises(ConfigError, match=match):
        load_bench(path)


def test_moe_inputs_and_metrics(tmp_path):
    items = load_moe(write_moe(tmp_path / "moe", iterations=100))
    assert [i.name for i in items] == ["layer1", "layer3"]
    section = report_html.moe_section(items)
    first = section["items"][0]
    assert first["num_iterations"] == 100 and len(first["frames"]) == report_html.MAX_MOE_FRAMES
    assert first["frames"][0] == 0 and first["frames"][-1] == 99
    assert len(first["metrics"]["entropy"]) == 100
    assert np.array_equal(np.array(first["matrices"][-1]), items[0].routing[99])
    balanced = moe_metrics(np.full((2, 4, 4), 10))
    assert balanced["load_imbalance"] == [1.0, 1.0] and balanced["entropy"] == pytest.approx([1.0, 1.0])
    assert balanced["cross_rank_fraction"] == pytest.approx([0.75, 0.75])
    local = moe_metrics(np.eye(4)[None] * 5)
    assert local["cross_rank_fraction"] == [0.0] and local["load_imbalance"] == [1.0]
    one = moe_metrics(np.pad(np.ones((1, 1, 1)), ((0, 0), (0, 3), (0, 3))))
    assert one["load_imbalance"] == [4.0] and one["entropy"] == [0.0]
    np.savez(tmp_path / "single.npz", routing=np.ones((4, 4)))
    assert load_moe(tmp_path / "single.npz")[0].routing.shape == (1, 4, 4)


def test_moe_trace_shows_the_talks_dynamics(tmp_path):
    from commscope.moe.generators import generate
    from commscope.moe.metrics import routing_metrics
    from commscope.moe.trace import save_trace

    trace = generate("settle:20", iterations=60, ep=4, num_experts=8, top_k=2, tokens_per_rank=64, num_layers=2)
    save_trace(trace, tmp_path / "run.npz")
    (item,) = load_moe(tmp_path / "run.npz")
    section = report_html.moe_section([item])
    first = section["items"][0]
    expected = routing_metrics(trace)
    keys = [s["key"] for s in first["series"]]
    assert {"expert_entropy", "pairs_switching", "prediction_error_last", "balance_error"} <= set(keys)
    for key in keys:
        assert np.allclose(first["metrics"][key], getattr(expected, key), equal_nan=True), key
    assert len(first["phases"]) == 5 and first["phases"][0]["first_iteration"] == 0
    assert first["phases"][-1]["expert_entropy"] > first["phases"][0]["expert_entropy"]  # settle grows uniform
    assert any(n.startswith("run over training") for n in section["notes"])
    assert report_html.data_to_json({"moe": section})  # JSON-ready (NaN -> null)


@pytest.mark.parametrize("arrays, match", [
    ({"routing": np.ones((3, 4, 5))}, "expected \\(iterations, ep, ep\\)"),
    ({"routing": -np.ones((3, 4, 4))}, "token counts >= 0"),
    ({"tokens": np.ones((3, 4, 4))}, "has no 'routing' array"),
])
def test_moe_errors(tmp_path, arrays, match):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ConfigError, match=match):
        load_moe(tmp_path / "bad.npz")


# ----------------------------------------------------------------------------------------------- the command


def test_cli_writes_report_and_pngs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pred = predict("gpt-3b", ParallelSpec(**PAR_32), "dgx1-v100")
    logs = write_measured_logs(pred, tmp_path / "logs")
    out = tmp_path / "report.html"
    code = main(["report", *JOB_32, "--measured", str(logs), "--bench", str(write_bench(tmp_path / "bench.json")),
                 "--moe", str(write_moe(tmp_path / "moe")), "--plan-gpus", "32", "--plan-top", "3",
                 "--out", str(out), "--png", str(tmp_path / "png")])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert f"wrote {out}" in stdout
    data = _embedded(out.read_text())
    assert {"heatmap", "bytes", "message_sizes", "breakdown", "schedule", "measured", "measured_heatmap", "bench",
            "moe"} <= set(data)
    assert len(data["breakdown"]["plan"]["entries"]) == 3
    assert "--plan-gpus 32" in data["inputs"]["command_line"] and "--tp 2" in data["inputs"]["command_line"]
    names = {p.name for p in (tmp_path / "png").iterdir()}
    assert names == {"heatmap.png", "heatmap_by_axis.png", "bytes.png", "message_sizes.png", "breakdown.png", "plan.png",
                     "schedule.png", "measured_vs_predicted.png", "busbw.png", "moe.png"}
    for name in names:
        raw = (tmp_path / "png" / name).read_bytes()
        assert raw[:8] == PNG_MAGIC, name
        w, h = struct.unpack(">II", raw[16:24])
        assert 300 <= w <= 4000 and 150 <= h <= 4000, (name, w, h)


def test_cli_reproduces_from_the_recorded_command_line(tmp_path, capsys):
    first = tmp_path / "a.html"
    assert main(["report", *JOB_32, "--pipeline-layers", "6,6,6,6", "--no-sequence-parallel", "--out", str(first)]) == 0
    recorded = _embedded(first.read_text())["inputs"]["command_line"]
    argv = recorded.split()[1:]
    assert "--pipeline-layers" in argv and "--no-sequence-parallel" in argv
    argv[argv.index("--out") + 1] = str(tmp_path / "b.html")
    assert main(argv) == 0
    a, b = _embedded(first.read_text()), _embedded((tmp_path / "b.html").read_text())
    for key in ("heatmap", "bytes", "breakdown", "schedule", "summary"):
        assert a[key] == b[key], key
    capsys.readouterr()


def test_cli_measured_only(tmp_path, capsys):
    pred = predict("gpt-3b", ParallelSpec(**PAR_32), "dgx1-v100")
    logs = write_measured_logs(pred, tmp_path / "logs", axis=None)
    out = tmp_path / "m.html"
    assert main(["report", "--no-predicted", "--measured", str(logs), "--out", str(out)]) == 0
    data = _embedded(out.read_text())
    assert "heatmap" not in data and data["measured"]["rows"]
    capsys.readouterr()


@pytest.mark.parametrize("argv, match", [
    (["report"], "give --out FILE.html and/or --png DIR"),
    (["report", "--no-predicted", "--out", "x.html"], "at least one of --measured, --bench, --moe"),
    (["report", "--tp", "5", "--out", "x.html"], "tp=5"),
    (["report", "--bench", "missing.json", "--out", "x.html"], "bench='missing.json'"),
    (["report", "--plan-top", "0", "--plan-gpus", "8", "--out", "x.html"], "plan_top=0"),
])
def test_cli_errors_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, match):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
    assert not (tmp_path / "x.html").exists()


def test_public_names():
    assert set(report_html.__all__) <= set(dir(report_html))
    from commscope.report import png

    assert set(png.__all__) <= set(dir(png))


def test_html_and_png_modules_import_without_matplotlib():
    import subprocess
    import sys

    code = ("import sys, commscope.report.html, commscope.report.png, commscope.estimate.schedule, commscope.cli.report_cmd; "
            "assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_png_without_matplotlib_says_how_to_install(tmp_path, monkeypatch, pred32, est32):
    import sys

    from commscope.report.png import write_pngs

    data = build_report_data(prediction=pred32, estimate=est32)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install commscope\[plots\]"):
        write_pngs(data, tmp_path)


def test_the_page_counts_ops_once_and_says_how_the_estimate_timed_what_it_was_given(pred32, est32):
    """A new user read 16,016 ops per iteration in the summary and 14,480 in the message sizes; gpu_util 0.4 and
    0.596 both as inputs; and 'flash' attention on a V100 whose notes said unfused."""
    data = build_report_data(prediction=pred32, estimate=est32)
    ops = next(card for card in data["summary"] if card["label"] == "ops per iteration")
    assert ops["value"] == data["message_sizes"]["predicted"]["total_ops"] < pred32.num_ops
    assert f"{pred32.num_ops:,} records with the receives" in ops["detail"]
    gpus = next(card for card in data["summary"] if card["label"] == "GPUs")
    assert gpus["detail"] == "4 nodes \u00d7 8"
    inputs = data["inputs"]
    assert "gpu_util" not in inputs and inputs["cluster"]["gpu_util"] == 0.4  # the input once, the result said apart
    assert inputs["estimate_method"].startswith("refined: the GPU's compute model, ") and "of 125 TFLOP/s peak" in \
        inputs["estimate_method"]
    assert inputs["parallel"]["attention"] == "flash"
    assert inputs["attention_timed"] == "unfused: V100-SXM2-32GB has no fused (flash) attention kernels"
    one_node = predict("gpt-1.5b", ParallelSpec(tp=2, dp=4, global_batch_size=512, micro_batch_size=4), "dgx-a100")
    data = build_report_data(prediction=one_node, estimate=estimate(one_node))
    assert next(c for c in data["summary"] if c["label"] == "GPUs")["detail"] == "1 node \u00d7 8"
    assert "attention_timed" not in data["inputs"]  # an A100 runs flash attention as asked


def test_report_refuses_an_out_in_a_folder_that_does_not_exist(tmp_path, capsys):
    """`report --out /nonexistent/dir/r.html` made the whole tree, silently."""
    out = tmp_path / "no" / "such" / "r.html"
    assert main(["report", *JOB_32, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"its folder {out.parent} does not exist" in err and err.count("\n") == 1
    assert not (tmp_path / "no").exists()


def test_validation_plot_labels_log_ticks_as_plain_numbers():
    from commscope.report.validation_plot import _minor_label

    assert [_minor_label(v, None) for v in (2.0, 3.0, 4.0, 5.0, 20.0, 30.0, 0.5, 0.7)] == \
        ["2", "3", "", "5", "20", "30", "0.5", ""]


def test_bandwidth_pictures_go_log_where_their_values_span_orders_of_magnitude(tmp_path):
    """busbw.png drew gloo's MB/s flat on zero under a V100 preset's 100 GB/s, as the page did."""
    from commscope.report.png import spans_orders_of_magnitude

    assert spans_orders_of_magnitude([2e5, 1e9, 1.1e11, None, 0.0])
    assert not spans_orders_of_magnitude([1e9, 2e10, None]) and not spans_orders_of_magnitude([None])
