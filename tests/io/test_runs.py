"""Reading a measured run from any records (issue 16 item 1) and defending against bad ones (issue 18 item 4).

The commscope logs are recorded once per module on real gloo ranks (4 ranks, 3 steps of one fp32 all-reduce of
the gradients after a setup broadcast); every test copies them and breaks the copy in one way.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared

from commscope.api import predict
from commscope.measure.capture.analysis import compare, summary
from commscope.cli.main import main
from commscope.io.runs import op_step, read_run
from commscope.spec.cluster import ClusterSpec, LinkTier
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

DATA = Path(__file__).parent / "data"
REAL_LOGS = SHARED / "data" / "real-logs"
DS_SUMMARY = "deepspeed_comms_summary_1_megatron-zero3.txt"
CLUSTER = ClusterSpec(name="cpu", intra_node=LinkTier(name="shm", bandwidth_bytes_per_s=1e9),
                      inter_node=LinkTier(name="tcp", bandwidth_bytes_per_s=1e8), peak_flops={"fp32": 1e11})
MODEL = ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=2, seq_len=16, vocab_size=100,
                  make_vocab_size_divisible_by=1, dtype="fp32")
PARALLEL = ParallelSpec(dp=4, global_batch_size=4)
JOB = ["--model", "gpt-1.5b", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
       "--seq-length", "16", "--vocab-size", "100", "--make-vocab-size-divisible-by", "1", "--dtype", "fp32",
       "--tp", "1", "--pp", "1", "--dp", "4", "--global-batch-size", "4", "--micro-batch-size", "1"]


def _dp_job(rank: int, world: int, logdir: str, numel: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    from commscope.measure.capture import pg as cpg
    from commscope.measure.capture.recorder import RankLog

    log = RankLog(Path(logdir), batch=16)
    cpg.set_sink(log)
    dist.broadcast(torch.zeros(numel), src=0)
    for i in range(steps):
        log.step = i
        dist.all_reduce(torch.randn(numel))
    log.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    from commscope.measure.capture import pg as cpg
    from commscope.measure.launch import spawn

    cpg.register()
    logdir = tmp_path_factory.mktemp("recorded")
    numel = MODEL.num_parameters(padded_vocab=True)
    spawn(_dp_job, 4, args=(str(logdir), numel, 3), backend="commscope", env={cpg.INNER_BACKEND_ENV: "gloo"},
          timeout_s=120)
    return logdir


@pytest.fixture
def logs(recorded: Path, tmp_path: Path) -> Path:
    out = tmp_path / "logs"
    shutil.copytree(recorded, out)
    return out


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_recorded_run_reads_clean(logs):
    run = read_run(logs)
    assert run.formats == ("jsonl",) and run.world_size == 4 and sorted(run.ops_by_rank) == [0, 1, 2, 3]
    assert run.problems == () and run.partial_steps == {} and run.matrix_omitted is None
    result = compare(predict(MODEL, PARALLEL, CLUSTER), run)
    assert result["max_rel_error"] == 0.0 and result["num_steps"] == 3


BAD_RECORDS = {
    "dtype": ('"dtype":"fp32"', '"dtype":"float33"', "dtype='float33': unknown"),
    "group": ('"group":[0,1,2,3]', '"group":null', "group=None: expected a list of ranks"),
    "size": (None, None, "size_bytes=inf: expected a whole number"),
    "size_inf": (None, None, "size_bytes=inf: expected a whole number"),
    "size_nan": (None, None, "size_bytes=nan: expected a whole number"),
    "step": ('"step":1', '"step":"one"', "step='one': expected a training step"),
    "time": ('"t_start_ns":', '"t_start_ns":-', "t_start_ns=-"),
}


@pytest.mark.parametrize("kind", sorted(BAD_RECORDS))
def test_one_bad_record_is_reported_with_file_and_line_and_skipped(logs, capsys, kind):
    old, new, message = BAD_RECORDS[kind]
    path = logs / "rank00002.jsonl"
    lines = _lines(path)
    k = next(i for i, line in enumerate(lines) if '"step":1' in line)
    if kind == "size":  # 1e400 as written in the file: JSON has no limit, Python reads it as infinity
        lines[k] = re.sub(r'"size_bytes":\d+', '"size_bytes":1e400', lines[k])
        assert "1e400" in lines[k]
    elif kind in ("size_inf", "size_nan"):
        obj = json.loads(lines[k])
        obj["size_bytes"] = float("inf") if kind == "size_inf" else float("nan")
        lines[k] = json.dumps(obj)
    else:
        assert old in lines[k]
        lines[k] = lines[k].replace(old, new, 1)
    path.write_text("\n".join(lines) + "\n")
    run = read_run(logs)
    where = f"rank00002.jsonl line {k + 1}: "
    found = [p for p in run.problems if p.startswith(where)]
    assert len(found) == 1 and message in found[0] and found[0].endswith("skipped"), run.problems
    assert len(run.ops_by_rank[2]) == len(run.ops_by_rank[1]) - 1
    # every command shows it, and none crashes
    code, _, err = _cli(capsys, "summarize", str(logs))
    assert code == 0 and where in err and "Traceback" not in err
    code, _, err = _cli(capsys, "compare", str(logs), *JOB)
    assert code == 0 and where in err, err
    report = logs.parent / "r.html"
    code, _, _ = _cli(capsys, "report", *JOB, "--measured", str(logs), "--out", str(report))
    assert code == 0 and where in report.read_text()


def test_partial_step_is_left_out_of_the_comparison_not_counted_as_less(logs, capsys):
    # rank 0 (the lowest of the group: the one whose records count) lost its all-reduce of step 2
    path = logs / "rank00000.jsonl"
    path.write_text("\n".join(line for line in _lines(path) if '"step":2' not in line) + "\n")
    run = read_run(logs)
    assert run.partial_steps == {2: (0,)}
    result = compare(predict(MODEL, PARALLEL, CLUSTER), run)
    assert result["num_steps"] == 2 and result["max_rel_error"] == 0.0  # not -33%
    assert any("partial steps left out of the comparison (step 2: rank(s) 0)" in p for p in result["problems"])
    code, _, err = _cli(capsys, "compare", str(logs), *JOB)
    assert code == 0 and "step 2: [0]" in err and "partial steps left out of the comparison" in err


def test_run_level_problems(logs, capsys):
    (logs / "rank00003.jsonl").unlink()  # a missing rank
    shutil.copy(logs / "rank00001.jsonl", logs / "rank00009.jsonl")  # a duplicate (header rank 1, name 9)
    (logs / "notes.txt").write_text("the run on Tuesday\n")  # a foreign file
    run = read_run(logs)
    text = "\n".join(run.problems)
    assert "rank00009.jsonl: the header says rank 1, the file name rank 9; using the header's" in text
    assert "rank00009.jsonl: rank 1 again (also in rank00001.jsonl)" in text
    assert "no log for rank(s) 3 of the 4 ranks" in text
    assert "notes.txt: not read: cannot tell the format" in text
    assert sorted(run.ops_by_rank) == [0, 1, 2]
    code, out, _ = _cli(capsys, "summarize", str(logs), "--json")
    assert code == 0 and "no log for rank(s) 3" in out


def test_mixed_runs_and_formats_in_one_directory(logs):
    path = logs / "rank00002.jsonl"
    lines = _lines(path)
    header = json.loads(lines[0])
    header["commscope_header"]["world_size"] = 8
    header["commscope_header"]["started_ns"] += 5 * 3600 * 10**9
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    shutil.copy(DATA / "kineto_pre21" / "sampled_rank-0.json.gz", logs / "trace.json.gz")
    run = read_run(logs)
    text = "\n".join(run.problems)
    assert "headers disagree on the world size" in text and "hours apart" in text
    assert "files of several formats (jsonl: 4, kineto: 1); read the 4 jsonl file(s), left out: trace.json.gz" in text


def test_nothing_importable_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("hello\n")
    code, _, err = _cli(capsys, "summarize", str(tmp_path))
    assert code == 2 and "nothing importable" in err and "a.txt" in err and "Traceback" not in err


def test_directory_of_old_kineto_traces_merges_ranks_and_omits_the_matrix_with_the_reason(capsys):
    run = read_run(DATA / "kineto_pre21")
    assert sorted(run.ops_by_rank) == [0, 1] and run.world_size == 128
    assert run.matrix_omitted and "name no process group" in run.matrix_omitted
    s = summary(run)
    assert s["traffic"] == {"omitted": run.matrix_omitted} and "group" in s["missing_fields"]
    code, out, _ = _cli(capsys, "summarize", str(DATA / "kineto_pre21"))
    assert code == 0 and "traffic matrix omitted:" in out and "0 B over" not in out


@requires_shared("data", "real-logs", DS_SUMMARY)
def test_deepspeed_records_take_the_world_as_group_only_when_unambiguous(capsys):
    path = REAL_LOGS / DS_SUMMARY
    run = read_run(path)  # the bandwidths say 16 ranks
    assert run.world_size == 16 and run.matrix_omitted is None
    assert all(op.group == tuple(range(16)) for op in run.unranked if op.op != "barrier")
    assert any("took the whole world of 16 ranks" in n for n in run.notes)
    assert summary(run)["traffic"]["logical"]["total_bytes"] > 0
    code, out, _ = _cli(capsys, "summarize", str(path), "--tp", "2", "--dp", "8", "--pp", "1")
    assert code == 0 and "traffic matrix omitted:" in out and "tp=2" in out


def _ddp_job(rank: int, world: int, logdir: str, store: str) -> None:
    """A user's DDP script, recorded with capture.record() and its steps marked with capture.step(i)."""
    import torch
    import torch.distributed as dist

    import commscope.measure.capture

    with commscope.measure.capture.record(logdir):
        dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # a bucket per parameter
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for i in range(3):
            commscope.measure.capture.step(i)
            opt.zero_grad()
            ddp(torch.randn(8, 16)).sum().backward()
            opt.step()
        dist.destroy_process_group()


def test_a_complete_ddp_run_has_no_partial_step(tmp_path, capsys):
    """DDP rebuilds its buckets during its second step, which then holds more ops than the others: the last of
    three steps held fewer than the median of the other two and was called partial on every rank."""
    pytest.importorskip("torch")
    import multiprocessing

    from commscope.io.runs import read_run_totals

    logs = tmp_path / "logs"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_ddp_job, args=(r, 2, str(logs), str(tmp_path / "store"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    run = read_run(logs)
    per_step = [sum(1 for op in run.ops_by_rank[0] if op_step(op) == i) for i in range(3)]
    assert per_step[1] > per_step[2], per_step  # the bucket rebuild: what misled the reader
    assert run.partial_steps == {} and read_run_totals(logs).partial_steps == {}
    assert main(["summarize", str(logs)]) == 0
    out, err = capsys.readouterr()
    assert "partial" not in out + err


def test_a_rank_stopped_in_its_last_step_is_still_found():
    from commscope.io.runs import _partial_steps_of

    ddp_like = {0: {0: 2, 1: 5, 2: 3}, 1: {0: 2, 1: 5, 2: 3}}
    assert _partial_steps_of(ddp_like) == {}  # 3 is no fewer than the fewest of the other steps
    killed = {0: {0: 4, 1: 4, 2: 4}, 1: {0: 4, 1: 4, 2: 1}}
    assert _partial_steps_of(killed) == {2: (1,)}
    assert _partial_steps_of(killed, finished={1}) == {}  # its log ended normally: the step is whole
    assert _partial_steps_of({0: {0: 4, 1: 4}, 1: {0: 4}}) == {1: (1,)}  # a step one rank lacks


def test_a_folder_of_nothing_readable_says_what_it_holds(tmp_path):
    """A rank log that is a link to a device (``ln -s /dev/zero rank00000.jsonl``) or a pipe is never read (the read
    would not end); the folder was then called 'an empty directory', which it is not."""
    import os

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank00000.jsonl").symlink_to("/dev/zero")
    os.mkfifo(logs / "rank00001.jsonl")
    with pytest.raises(ValueError, match=r"holds no regular file \(rank00000.jsonl, rank00001.jsonl: not a regular "
                                         r"file, a pipe, a device or a dangling link\)"):
        read_run(logs)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="an empty directory"):
        read_run(empty)
