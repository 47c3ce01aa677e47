"""Nothing a user runs twice, plants a link under, or runs out of disk on loses or mixes data (issue 36).

Every case is one line on stderr and exit status 2, and the files that were there before are as they were: a second
run writing the same output (a real ``commscope`` process holds it), a link planted where an output goes, a full
filesystem (a real tmpfs, mounted in a user namespace where the machine allows it; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commscope.cli.main import main
from commscope.io.claim import lock_path
from tmpfs import SRC, on_tmpfs

ENV = {**os.environ, "PYTHONPATH": SRC, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                                 os.environ.get("PATH", "")])}
BENCH_JSON = {"meta": {"backend": "gloo"}, "rows": [
    {"op": "all_reduce", "group_size": 2, "size_bytes": s, "time_s": 2e-5 + s / 1e9, "wrong": 0}
    for s in (1024, 65536, 1 << 20, 1 << 22)]}


def _one_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (code, err)
    return err


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _commscope(*argv: str) -> subprocess.Popen[str]:
    """A commscope run in a session of its own (so that it is stopped with the job it launched)."""
    return subprocess.Popen([sys.executable, "-m", "commscope.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)


def _wait_for_claim(lock: Path, proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    """Until ``proc`` (a commscope run) holds the claim whose lock file is ``lock``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if json.loads(lock.read_text() or "{}").get("pid") == proc.pid:
                return
        except (OSError, ValueError):
            pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{lock} was not claimed in {timeout_s} s")


def _finish(proc: subprocess.Popen[str], timeout_s: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out, err


@pytest.fixture
def holder(tmp_path):
    """A real commscope run holding the folder ``tmp_path/held`` (a recording whose job sleeps), stopped after."""
    held = tmp_path / "held"
    proc = _commscope("record", "--out", str(held), "--", sys.executable, "-c", "import time; time.sleep(120)")
    _wait_for_claim(lock_path(held, folder=True), proc)
    yield held, proc
    os.killpg(proc.pid, signal.SIGKILL)  # the run and the job it launched
    _finish(proc)


@pytest.mark.torch  # its commands start gloo ranks or check the backend with torch
def test_a_second_writer_is_refused_before_it_does_anything(holder, capsys, tmp_path):
    held, proc = holder
    before = _snapshot(held)
    marker = tmp_path / "ran"
    for argv in (["traffic", "--out", str(held), "--no-plot"],
                 ["workload", "gpt", "--tp", "2", "--pp", "1", "--dp", "1", "--record", str(held)],
                 ["workload", "gpt", "--tp", "2", "--pp", "1", "--dp", "1", "--record", str(held), "--force"],
                 ["summarize", str(tmp_path), "--out", str(held)],
                 ["record", "--out", str(held), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]):
        err = _one_line(capsys, main(argv))
        assert f"'{held}': is being written by another commscope run (pid {proc.pid}: " in err, err
        assert "wait for it to finish, or choose another directory" in err
        assert _snapshot(held) == before and not marker.exists()  # no rank started, no job ran, nothing touched
    assert not (held / "failure.json").exists()


@pytest.mark.torch  # its commands start gloo ranks or check the backend with torch
def test_two_workloads_into_one_folder(tmp_path):
    """The issue's case: the second of two `workload --record same` a second apart once started its ranks, was
    refused by them, and wrote failure.json into the first run's recording. Now it is refused before any rank starts
    (the first holds the folder; or, had it finished already, its recording is there) and the first is whole."""
    same = tmp_path / "same"
    argv = ("workload", "gpt", "--tp", "2", "--pp", "1", "--dp", "1", "--steps", "3", "--record", str(same))
    first = _commscope(*argv)
    _wait_for_claim(lock_path(same, folder=True), first)
    second = _commscope(*argv)
    code2, out2, err2 = _finish(second)
    code1, _, err1 = _finish(first)
    assert code1 == 0, err1[-2000:]
    assert code2 == 2 and out2 == "" and len(err2.strip().splitlines()) == 1, err2
    assert ("is being written by another commscope run" in err2
            or "already holds a recording of an earlier run" in err2), err2
    assert not (same / "failure.json").exists()
    summary = subprocess.run([sys.executable, "-m", "commscope.cli.main", "summarize", str(same), "--json"],
                             capture_output=True, text=True, check=False, env=ENV, timeout=120)
    s = json.loads(summary.stdout)
    assert s["unfinished_ranks"] == [] and not s.get("failure") and s["world_size"] == 2


@pytest.mark.torch  # its commands start gloo ranks or check the backend with torch
def test_two_benches_into_one_file(tmp_path):
    """Two `bench --out same.json` once both printed 'wrote same.json' and one measurement was lost."""
    out = tmp_path / "same.json"
    argv = ("bench", "--nproc", "2", "--ops", "all_reduce", "-b", "1K", "-e", "256K", "--time-budget", "0.1",
            "--no-plot", "--out", str(out))
    first = _commscope(*argv)
    _wait_for_claim(lock_path(out, folder=False), first)
    code2, _, err2 = _finish(_commscope(*argv))
    code1, _, err1 = _finish(first)
    assert code1 == 0, err1[-2000:]
    assert code2 == 2 and len(err2.strip().splitlines()) == 1, err2
    assert "is being written by another commscope run" in err2 or "already exists; give --force" in err2, err2
    assert "wrote" not in err2
    rows = json.loads(out.read_text())["rows"]
    assert rows and {r["op"] for r in rows} == {"all_reduce"}


def test_replacing_an_output_needs_force(capsys, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH_JSON))
    fit = tmp_path / "fit.toml"
    fit.write_text("# an earlier fit\n")
    err = _one_line(capsys, main(["fit", str(bench), "--out", str(fit)]))
    assert f"out='{fit}': {fit} already exists; give --force to replace" in err
    assert fit.read_text() == "# an earlier fit\n"
    assert main(["fit", str(bench), "--out", str(fit), "--force"]) == 0
    err = capsys.readouterr().err
    assert f"replaced {fit} of an earlier run (--force)" in err and "commscope-fitted-bandwidth" in fit.read_text()
    report = tmp_path / "r.html"
    report.write_text("an earlier report")
    err = _one_line(capsys, main(["report", "--out", str(report)]))
    assert "already exists; give --force" in err and report.read_text() == "an earlier report"
    # --force with bad input: the input's one line, and no line saying the report was replaced (it was not)
    err = _one_line(capsys, main(["report", "--out", str(report), "--force", "--no-predicted"]))
    assert "with --no-predicted, give at least one of" in err and report.read_text() == "an earlier report"
    err = _one_line(capsys, main(["fit", str(tmp_path / "missing.json"), "--out", str(fit), "--force"]))
    assert "no such file" in err and "commscope-fitted-bandwidth" in fit.read_text()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.torch  # its commands start gloo ranks or check the backend with torch
def test_outputs_are_never_written_through_a_planted_link(capsys, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    out = tmp_path / "out"
    out.mkdir()
    (out / "ops.jsonl").symlink_to(victim)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH_JSON))
    (tmp_path / "fit.toml").symlink_to(victim)
    (tmp_path / "b.json").symlink_to(victim)
    (tmp_path / "r.html").symlink_to(victim)
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "rank00000.jsonl").symlink_to(victim)
    for argv, where in ((["traffic", "--out", str(out)], out / "ops.jsonl"),
                        (["traffic", "--out", str(out), "--force"], out / "ops.jsonl"),
                        (["fit", str(bench), "--out", str(tmp_path / "fit.toml"), "--force"], tmp_path / "fit.toml"),
                        (["bench", "--nproc", "2", "--out", str(tmp_path / "b.json")], tmp_path / "b.json"),
                        (["report", "--out", str(tmp_path / "r.html"), "--force"], tmp_path / "r.html"),
                        (["workload", "gpt", "--record", str(rec), "--force"], rec / "rank00000.jsonl"),
                        (["record", "--out", str(rec), "--force", "--", "true"], rec / "rank00000.jsonl")):
        err = _one_line(capsys, main(argv))
        assert f"'{where}': is a symbolic link (-> {victim}); commscope never writes through a link" in err, err
    assert victim.read_text() == "the user's file"


def test_an_output_folder_that_is_a_link_keeps_the_earlier_run(capsys, tmp_path):
    """A link to a folder as --out (``ln -s /scratch/runs out``) is followed, as a user who made it means; but the
    earlier run's files were looked for only where no link led, so a second run replaced them without --force."""
    real = tmp_path / "scratch"
    real.mkdir()
    out = tmp_path / "out"
    out.symlink_to(real)
    argv = ["traffic", "--model", "gpt3-125m", "--tp", "1", "--no-plot", "--out", str(out)]
    assert main([*argv, "--dp", "2"]) == 0
    capsys.readouterr()
    before = _snapshot(real)
    assert "ops.jsonl" in before
    err = _one_line(capsys, main([*argv, "--dp", "4"]))  # another job, the same folder
    assert "already holds the files of an earlier run" in err and "give --force" in err, err
    assert _snapshot(real) == before
    assert main([*argv, "--dp", "4", "--force"]) == 0 and "replaced the files of an earlier run" in capsys.readouterr().err


def test_a_full_disk_leaves_the_earlier_files_or_none(tmp_path):
    """traffic --out, fit --out and report --out on a full tmpfs: one line naming the file, exit 2, and the earlier
    run's files as they were (or no file at all), never one cut short."""
    mnt = tmp_path / "mnt"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH_JSON))
    cs = [sys.executable, "-m", "commscope.cli.main"]
    probe = (f"import os,json; print(json.dumps({{n: os.path.getsize(os.path.join({str(mnt)!r}, d, n)) "
             f"for d in ('', 'out') if os.path.isdir(os.path.join({str(mnt)!r}, d)) "
             f"for n in os.listdir(os.path.join({str(mnt)!r}, d)) if not os.path.isdir(os.path.join({str(mnt)!r}, d, n))}}))")
    run = on_tmpfs(mnt, "1200k", [
        [*cs, "traffic", "--tp", "1", "--pp", "1", "--dp", "8", "--out", str(mnt / "out"), "--no-plot"],  # fits
        [*cs, "fit", str(bench), "--out", str(mnt / "fit.toml")],
        [sys.executable, "-c", probe],
        ["dd", "if=/dev/zero", f"of={mnt / 'filler'}", "bs=4k"],  # the rest of the disk
        [*cs, "traffic", "--tp", "1", "--pp", "1", "--dp", "8", "--out", str(mnt / "out"), "--no-plot", "--force"],
        [*cs, "fit", str(bench), "--out", str(mnt / "fit.toml"), "--force"],
        [*cs, "report", "--out", str(mnt / "r.html")],
        [sys.executable, "-c", probe]])
    lines = run.stdout.splitlines()
    codes = [int(line[3:]) for line in lines if line.startswith("rc=")]
    assert codes[:3] == [0, 0, 0] and codes[4:] == [2, 2, 2, 0], run.stdout + run.stderr
    before, after = (json.loads(line) for line in lines if line.startswith("{"))
    after.pop("filler")
    assert after == before and before["ops.jsonl"] > 0 and before["fit.toml"] > 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("commscope")]
    assert errors[0].startswith(f"commscope fit: wrote {mnt / 'fit.toml'}")  # the first, with room
    # (nothing was replaced: no line says it was, the error is each run's one line)
    assert errors[1:] == [
        f"commscope traffic: error: No space left on device (the disk is full): {mnt / 'out' / 'ops.jsonl'}",
        f"commscope fit: error: No space left on device (the disk is full): {mnt / 'fit.toml'}",
        f"commscope report: error: No space left on device (the disk is full): {mnt / 'r.html'}"], run.stderr
    assert "r.html" not in after and not [n for n in after if n.startswith(".")]


def test_a_parquet_export_on_a_full_disk_leaves_no_table_of_some_ranks(tmp_path):
    """export parquet wrote a rank's table at a time: a disk that filled at the third left the first two, which a
    query over out/*.parquet reads as the whole run. The tables are now renamed into place together or not at all."""
    pytest.importorskip("pyarrow")
    from commscope.measure.capture.synthetic import write_synthetic_rank

    logs = tmp_path / "logs"
    logs.mkdir()
    for rank in range(4):
        write_synthetic_rank(logs, rank, 4, 40, gz=False, steps=1)  # ~7 KB of Parquet each
    mnt = tmp_path / "mnt"
    run = on_tmpfs(mnt, "20k", [[sys.executable, "-m", "commscope.cli.main", "export", "parquet", "--run", str(logs),
                                 "--out", str(mnt / "pq")], ["ls", "-A", str(mnt / "pq")]])
    lines = run.stdout.strip().splitlines()
    assert lines == ["rc=2", "rc=0"], run.stdout  # refused, and the folder holds nothing (ls -A prints no name)
    err = run.stderr.strip().splitlines()
    assert len(err) == 1 and "No space left on device (the disk is full)" in err[0] and ".parquet" in err[0], err


def test_a_chakra_export_on_a_full_disk_leaves_no_traces_of_some_ranks(tmp_path):
    """export chakra wrote a rank's trace at a time: a disk that filled at the third rank left two traces and no
    comm_group.json, which a simulator reads as a job of two ranks. The files are renamed into place together."""
    pytest.importorskip("chakra")
    mnt = tmp_path / "mnt"
    run = on_tmpfs(mnt, "8m", [[sys.executable, "-m", "commscope.cli.main", "export", "chakra", "--model", "gpt3-125m",
                                "--num-layers", "2", "--tp", "2", "--pp", "1", "--dp", "2", "--cluster", "dgx-a100",
                                "--out", str(mnt / "et")], ["ls", "-A", str(mnt / "et")]])  # 3.5 MB a rank
    assert run.stdout.strip().splitlines() == ["rc=2", "rc=0"], run.stdout  # refused, and the folder holds nothing
    err = run.stderr.strip().splitlines()
    assert len(err) == 1 and "No space left on device (the disk is full)" in err[0] and ".et" in err[0], err


@pytest.mark.torch  # its commands start gloo ranks or check the backend with torch
def test_a_recording_on_a_full_disk_is_one_line(tmp_path):
    """The ranks' logs fill the disk: the training runs on, the launcher says in one line which log stopped, and
    nothing is compared with the incomplete recording (it once raised OSError in a rank, naming no file)."""
    mnt = tmp_path / "mnt"
    run = on_tmpfs(mnt, "24k", [[sys.executable, "-m", "commscope.cli.main", "workload", "gpt", "--tp", "2", "--pp",
                                 "1", "--dp", "1", "--steps", "3", "--record", str(mnt / "rec")]], timeout_s=300)
    assert run.stdout.strip().splitlines()[-1] == "rc=2", run.stdout + run.stderr
    err = run.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"commscope workload: error: record='{mnt / 'rec'}/rank0000"), err
    assert "the recording stopped: No space left on device (the disk is full)" in err[0]
    assert "nothing was compared" in err[0]


@pytest.mark.torch  # its commands start gloo ranks or check the backend with torch
def test_a_recorded_job_on_a_full_disk_is_one_line(tmp_path):
    """`commscope record -- python train.py` whose rank log fills the disk: the job runs on (its exit status 0), and
    record says in one line that the recording stopped and why, exit status 2 (it said 'N rank log(s) ... (exit
    status 0)' after a line per rank)."""
    script = tmp_path / "train.py"
    script.write_text("import torch, torch.distributed as dist\n"
                      f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
                      "t = torch.ones(4)\n"
                      "for _ in range(3000):\n"
                      "    dist.all_reduce(t)\n"
                      "dist.destroy_process_group()\n")
    mnt = tmp_path / "mnt"
    run = on_tmpfs(mnt, "16k", [[sys.executable, "-m", "commscope.cli.main", "record", "--out", str(mnt / "logs"), "--",
                                 sys.executable, str(script)]], timeout_s=300)
    assert run.stdout.strip().splitlines()[-1] == "rc=2", run.stdout + run.stderr
    err = run.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("commscope record: error: the recording of 1 of 1 rank(s) stopped before the job ended "
                             "(rank00000.jsonl has no completion marker; no space left on device: the disk is full)")


def test_a_file_a_folder_writer_writes_is_refused_to_another_command(capsys, tmp_path):
    """``fit --out d/traffic.csv`` while ``traffic --out d`` runs: the file's claim and the folder's were two locks,
    so both runs wrote traffic.csv. Now the second is refused in one line; a file of another name is not."""
    from commscope.cli.traffic_cmd import OUTPUT_NAMES
    from commscope.io.claim import claim_folder

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH_JSON))
    out = tmp_path / "d"
    with claim_folder(out, names=OUTPUT_NAMES):  # (this process, another open lock: as another run's)
        err = _one_line(capsys, main(["fit", str(bench), "--out", str(out / "traffic.csv")]))
        assert f"is among the files another commscope run writes in {out}" in err
        assert main(["fit", str(bench), "--out", str(out / "fit.toml")]) == 0
    assert not (out / "traffic.csv").exists() and (out / "fit.toml").is_file()
    capsys.readouterr()
