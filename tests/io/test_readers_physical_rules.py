"""Every reader applies the same physical rules with the same outcome (issue 36): a damaged row is skipped with a
warning naming the file and the row or line, a file with no usable row is refused in one line, a document of
another format or a newer version is refused naming the file, and output whose first lines are a launcher's
warnings is read. Real logs from other people's clusters (``../shared/data/real-logs``), damaged as files get
damaged."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from commscope.cli.main import main
from commscope.io.deepspeed import import_deepspeed_comms
from commscope.io.runs import read_run
from conftest import requires_shared, shared_or_skip

A100 = "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
MI300X = "rccl-tests_allreduce_mi300x8_single-node_rccl-version-block.txt"
KINETO = "kineto_trace_a100x2_nccl-allreduce-broadcast_rank0.json.gz"
DS_SUMMARY = "deepspeed_comms_summary_1_megatron-zero3.txt"
DS_VERBOSE = "deepspeed_comms_verbose_1_megatron-zero3.txt"
JOB = ["--tp", "2", "--pp", "1", "--dp", "4"]


def _real(name: str) -> Path:
    return shared_or_skip("data", "real-logs", name)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


def _bench(path: Path, times: list[float]) -> Path:
    rows = [{"op": "all_reduce", "group_size": 8, "size_bytes": 1024 * 16**i, "time_s": t,
             "busbw_bytes_per_s": 5e10, "wrong": 0} for i, t in enumerate(times)]
    path.write_text(json.dumps({"meta": {"backend": "nccl"}, "rows": rows}))
    return path


@pytest.mark.parametrize("bad", [-1e-3, 0.0, float("nan")], ids=["negative", "zero", "nan"])
def test_a_bench_file_of_no_real_time_is_refused_alike_everywhere(capsys, tmp_path, bad):
    """estimate --bandwidth once used a bench JSON whose times were all negative (or NaN, or zero), where fit
    refused it: both refuse it now, and report --bench too, each naming the rows."""
    bench = _bench(tmp_path / "b.json", [bad] * 3)
    verdicts = []
    for argv in (["fit", str(bench)], ["estimate", *JOB, "--bandwidth", str(bench)],
                 ["report", "--no-predicted", "--bench", str(bench), "--out", str(tmp_path / "r.html")]):
        code, _, err = _run(capsys, *argv)
        assert code == 2 and len(err) == 1, err
        assert "b.json rows[1].time_s=" in err[0] and "row skipped" in err[0] and "no usable row" in err[0], err[0]
        verdicts.append(err[0].split("rows[1].", 1)[1].split(":")[1])
    assert len(set(verdicts)) == 1, verdicts  # the same words for the same row
    assert not (tmp_path / "r.html").exists()


def _bench_warnings(capsys: pytest.CaptureFixture[str], bench: Path, tmp_path: Path) -> list[list[str]]:
    """The warnings about ``bench`` of fit, estimate --bandwidth and report --bench, each of which must succeed."""
    warnings = []
    for argv in (["fit", str(bench), "--json"], ["estimate", *JOB, "--bandwidth", str(bench)],
                 ["report", "--bench", str(bench), "--out", str(tmp_path / "r.html"), *JOB]):
        code, _, err = _run(capsys, *argv)
        assert code == 0, err
        warnings.append([line.split("warning: ", 1)[1] for line in err if f"warning: {bench.name}" in line])
    return warnings


def test_a_damaged_bench_row_is_skipped_alike_everywhere(capsys, tmp_path):
    bench = _bench(tmp_path / "b.json", [2e-5, 3e-5, -4e-5, 9e-5])
    assert _bench_warnings(capsys, bench, tmp_path) == [
        ["b.json rows[3].time_s=-4e-05: not a measured time (must be > 0): row skipped"]] * 3


def test_a_group_larger_than_any_cluster_is_skipped_alike_everywhere(capsys, tmp_path):
    """A bench row of group_size 1e308 was used by estimate --bandwidth and report --bench without a word, and fit
    refused the whole file printing a 309-digit number."""
    bench = _bench(tmp_path / "b.json", [2e-5, 3e-5, 5e-5, 9e-5])
    doc = json.loads(bench.read_text())
    doc["rows"] += [{**doc["rows"][1], "group_size": 1e308}]
    bench.write_text(json.dumps(doc))
    said = "b.json rows[5].group_size=1e+308: more ranks than any cluster (at most 1,048,576): row skipped"
    assert _bench_warnings(capsys, bench, tmp_path) == [[said]] * 3


@requires_shared("data", "real-logs", A100)
def test_a_zero_time_line_of_nccl_tests_is_skipped_alike(capsys, tmp_path):
    """estimate --bandwidth once used the busbw of a line whose time was 0.00 (no measurement) silently."""
    text = _real(A100).read_text().splitlines()
    n = next(i for i, line in enumerate(text) if line.split()[:1] == ["131072"])
    fields = text[n].split()
    text[n] = text[n].replace(f" {fields[5]} ", " 0.00 ", 1)
    log = tmp_path / "zero.txt"
    log.write_text("\n".join(text) + "\n")
    said = f"zero.txt:{n + 1}: all_reduce 131072 B out-of-place time=0.00 us is no measurement (must be > 0): row skipped"
    for argv in (["fit", str(log)], ["estimate", *JOB, "--bandwidth", str(log)]):
        code, _, err = _run(capsys, *argv)
        assert code == 0 and [line for line in err if "warning:" in line] == [f"commscope {argv[0]}: warning: {said}"]


@requires_shared("data", "real-logs", MI300X)
def test_output_below_a_launchers_warning_is_read_by_fit_too(capsys, tmp_path):
    """fit once took rccl-tests output whose first line is a UCX warning ('[1732812345.1] ...') for JSON: 'is not
    valid JSON'; summarize and estimate read it."""
    log = tmp_path / "ucx.txt"
    log.write_text("[1732812345.123456] [mi300x:12345:0]     ucp_context.c:1104 UCX  WARN  network device 'mlx5_0:1' "
                   "is not available, please use one or more of: 'eth0'(tcp), 'lo'(tcp)\n" + _real(MI300X).read_text())
    code, out, err = _run(capsys, "fit", str(log), "--json")
    assert code == 0, err
    assert {(c["op"], c["group_size"]) for c in json.loads(out)["curves"]} == {("all_reduce", 8)}
    for argv in (["summarize", str(log)], ["estimate", *JOB, "--bandwidth", str(log)]):
        assert _run(capsys, *argv)[0] == 0
    bad = tmp_path / "bad.json"  # a .json that is no JSON is still said to be so
    bad.write_text("[1732812345.1] not json\n")
    code, _, err = _run(capsys, "fit", str(bad))
    assert code == 2 and "input='bad.json': is not valid JSON" in err[0]


@requires_shared("data", "real-logs", KINETO)
def test_a_kineto_op_larger_than_any_message_is_skipped(capsys, tmp_path):
    """A Kineto trace with a 4e29-byte op once ended summarize with 'OverflowError: Python int too large to convert
    to C long'."""
    trace = json.loads(gzip.decompress(_real(KINETO).read_bytes()))
    event = next(i for i, e in enumerate(trace["traceEvents"]) if "In msg nelems" in e.get("args", {}))
    trace["traceEvents"][event]["args"].update({"In msg nelems": 10**29, "Out msg nelems": 10**29})
    path = tmp_path / "k.json"
    path.write_text(json.dumps(trace))
    for argv in (["summarize", str(path)], ["report", "--no-predicted", "--measured", str(path), "--out",
                                            str(tmp_path / "r.html")], ["summarize", str(path), "--jobs", "2"]):
        code, _out, err = _run(capsys, *argv)
        assert code == 0 and "Traceback" not in "".join(err), err
    assert (f"k.json event {event}: allreduce: size_bytes=400000000000000000000000000000: larger than any real "
            "message (> 1 TiB)") in "\n".join(err)  # a reader's problems go to stderr


def _rank_logs(tmp_path: Path) -> Path:
    from commscope.measure.capture.synthetic import write_synthetic_rank

    logs = tmp_path / "logs"
    logs.mkdir()
    for r in range(4):
        write_synthetic_rank(logs, r, 4, 40, gz=False, steps=1)
    return logs


@pytest.mark.parametrize(("change", "said"), [
    ({"format": "othertool-ops", "format_version": 99}, "format='othertool-ops': not a format this reader knows"),
    ({"format_version": 99}, "format_version=99: written by a newer commscope (this one reads up to version 1)"),
])
def test_a_log_of_another_format_or_a_newer_version_is_refused_naming_it(capsys, tmp_path, change, said):
    """A rank log whose header names another format at format_version 99 was once read without a word."""
    logs = _rank_logs(tmp_path)
    log = logs / "rank00002.jsonl"
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    header["commscope_header"].update(change)
    log.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    code, _, err = _run(capsys, "summarize", str(log))
    assert code == 2 and len(err) == 1 and f"rank00002.jsonl line 1: commscope_header {said}" in err[0]
    for jobs in ([], ["--jobs", "2"]):
        code, out, err_lines = _run(capsys, "summarize", str(logs), *jobs)
        said_all = out + "\n".join(err_lines)  # the results on stdout, the problems on stderr
        assert code == 0 and f"problem: rank00002.jsonl: not read: commscope_header {said}" in "\n".join(err_lines)
        assert "no log for rank(s) 2 of the 4 ranks" in said_all


def test_report_says_what_it_skipped_of_a_recording_as_summarize_does(capsys, tmp_path):
    """report --measured put a skipped record and an unread rank log into the page only, and said nothing on the
    terminal, where summarize and compare name them: the same recording, the same lines on stderr."""
    logs = _rank_logs(tmp_path)
    log = logs / "rank00002.jsonl"
    lines = log.read_text().splitlines()
    header = json.loads(lines[0])
    header["commscope_header"]["format_version"] = 99
    log.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    damaged = logs / "rank00001.jsonl"
    lines = damaged.read_text().splitlines()
    damaged.write_text("\n".join([*lines[:3], lines[3].replace('"size_bytes":', '"size_bytes":-', 1), *lines[4:]]) + "\n")
    code, _, said = _run(capsys, "summarize", str(logs))
    assert code == 0
    problems = [line.split("problem: ", 1)[1] for line in said if "problem: " in line]
    assert any("rank00001.jsonl line 4: size_bytes=-" in p for p in problems), problems
    assert any("rank00002.jsonl: not read" in p for p in problems), problems
    code, _, said = _run(capsys, "report", "--no-predicted", "--measured", str(logs), "--out", str(tmp_path / "r.html"))
    assert code == 0 and (tmp_path / "r.html").exists()
    warned = "\n".join(said)
    assert all(p in warned for p in problems), (problems, said)


def test_a_deepspeed_log_of_rank_0_is_no_world_of_one(capsys, tmp_path):
    """DeepSpeed's verbose lines come from rank 0 alone: a 32-rank log whose bandwidths do not pin the world was
    once read as world size 1."""
    log = tmp_path / "ds32.txt"
    log.write_text(
        "[2024-03-01 10:00:00,100] [INFO] [logging.py:96:log_dist] [Rank 0] comm op: broadcast | time (ms): 0.50 | "
        "msg size: 2.0 MB | algbw (Gbps): 33.55 | busbw (Gbps): 33.55\n"
        "[2024-03-01 10:00:00,200] [INFO] [logging.py:96:log_dist] [Rank 0] comm op: all_gather_into_tensor | time "
        "(ms): 0.90 | msg size: 2.0 KB | algbw (Gbps): 0.58 | busbw (Gbps): 0.56\n")
    assert read_run(log).world_size == 0
    code, out, _ = _run(capsys, "summarize", str(log))
    assert code == 0 and "1 rank(s), world size unknown" in out
    pinned = tmp_path / "ds32b.txt"  # a row whose bandwidths say 32
    pinned.write_text(log.read_text() + "[2024-03-01 10:00:00,300] [INFO] [logging.py:96:log_dist] [Rank 0] comm op: "
                      "all_gather_into_tensor | time (ms): 2.00 | msg size: 8.0 MB | algbw (Gbps): 1073.74 | busbw "
                      "(Gbps): 1040.18\n")
    assert read_run(pinned).world_size == 32


@requires_shared("data", "real-logs", DS_SUMMARY)
def test_a_damaged_deepspeed_row_does_not_change_the_world_size(tmp_path):
    """A digit changed in one row of the tutorial's table once made its rows agree on no world size (the log then read
    as a world of 1 or unknown): the n most rows say is kept, and the odd row named."""
    text = _real(DS_SUMMARY).read_text().splitlines()
    n = next(i for i, line in enumerate(text) if line.split()[:2] == ["128.0", "KB"])
    fields = text[n].split()  # size (2 tokens), count, total, avg, tput, busbw
    text[n] = text[n].replace(fields[-1], "1.94")
    damaged = tmp_path / "ds.txt"
    damaged.write_text("\n".join(text) + "\n")
    result = import_deepspeed_comms(damaged)
    assert result.meta["world_size"] == 16
    assert any("say otherwise (damaged?)" in p and f"line(s) {n + 1}" in p for p in result.problems), result.problems
    assert import_deepspeed_comms(_real(DS_SUMMARY)).meta["world_size"] == 16
    assert import_deepspeed_comms(_real(DS_VERBOSE)).meta["world_size"] == 16


def test_tune_show_of_what_is_no_tuning_table_is_one_line(capsys, tmp_path):
    """tune --show of a binary file or a JSON list once ended in UnicodeDecodeError / AttributeError tracebacks."""
    binary = tmp_path / "t.json"
    binary.write_bytes(bytes(range(256)))
    listed = tmp_path / "l.json"
    listed.write_text("[1, 2, 3]\n")
    for path, said in ((binary, "is not a text file (byte 128 is no UTF-8: a binary file?)"),
                       (listed, "holds a JSON list, not a tuning table")):
        code, _, err = _run(capsys, "tune", "--show", str(path))
        assert code == 2 and err == [f"commscope tune: error: tuning table='{path}': {said}" + err[0].split(said)[1]]
