"""`commscope record -- torchrun ...` then `commscope summarize`: the path a user takes with their own script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
for _ in range(3):
    model(torch.randn(4, 32)).sum().backward()
dist.destroy_process_group()
"""


# torchrun: on PATH, or beside this interpreter (a virtual environment that is not activated)
_BIN = str(Path(sys.executable).parent)
TORCHRUN = shutil.which("torchrun") or shutil.which("torchrun", path=_BIN)
ENV = {**os.environ, "PATH": os.pathsep.join([_BIN, os.environ.get("PATH", "")])}
needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun is neither on PATH nor beside the interpreter")


def _commscope(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commscope.cli.main", *argv], capture_output=True, text=True,
                          check=False, timeout=timeout, env=ENV)


@needs_torchrun
def test_record_torchrun_job_then_summarize(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "commscope.cli.main", "record", "--out", str(logs), "--",
                           "torchrun", "--nproc-per-node", "2", str(script)], capture_output=True, text=True, check=False,
                          timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in logs.iterdir()) == ["rank00000.done", "rank00000.jsonl", "rank00001.done", "rank00001.jsonl"]
    out = subprocess.run([sys.executable, "-m", "commscope.cli.main", "summarize", str(logs), "--dp", "2", "--json"],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["world_size"] == 2 and s["unfinished_ranks"] == [] and not s["problems"] and not s.get("failure")
    headers = [json.loads((logs / f"rank{r:05d}.jsonl").read_text().splitlines()[0])["commscope_header"] for r in (0, 1)]
    # the script destroyed its process group before the logs were first written: the world size is still known,
    # and both ranks name the same run
    assert [h["world_size"] for h in headers] == [2, 2] and headers[0]["run_id"] == headers[1]["run_id"]
    rows = {(r["axis"], r["op"]): r for r in s["ops"]}
    # three steps of DDP: one gradient all-reduce of 32*32+32 fp32 each
    assert rows[("dp", "all_reduce")]["count"] == 3
    assert rows[("dp", "all_reduce")]["bytes"] == 3 * (32 * 32 + 32) * 4
    assert s["traffic"]["logical"]["total_bytes"] > 0


def test_summarize_bad_input(tmp_path: Path):
    out = subprocess.run([sys.executable, "-m", "commscope.cli.main", "summarize", str(tmp_path)],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 2 and "no rank" in out.stderr and "Traceback" not in out.stderr


CRASH = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(8)
for step in range(3):
    dist.all_reduce(t)
    if step == 1 and dist.get_rank() == 1:
        raise ValueError("bad batch at step 1")
dist.destroy_process_group()
"""


@needs_torchrun
def test_a_rank_that_raises_is_named_beside_the_logs(tmp_path: Path):
    """Each rank still closes its log (its completion marker says the log is whole); failure.json says the job was
    not, and which rank failed first and how; summarize prints it."""
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    logs = tmp_path / "logs"
    proc = _commscope("record", "--out", str(logs), "--", "torchrun", "--nproc-per-node", "2", str(script))
    assert proc.returncode != 0 and "the job failed, see failure.json" in proc.stderr, proc.stderr[-2000:]
    failure = json.loads((logs / "failure.json").read_text())
    assert failure["rank"] == 1 and failure["how"] == "raised ValueError: bad batch at step 1"
    out = _commscope("summarize", str(logs))
    assert out.returncode == 0 and "failed: rank 1 raised ValueError: bad batch at step 1 first" in out.stderr


def test_a_command_that_records_nothing_says_so(tmp_path: Path):
    logs = tmp_path / "logs"
    proc = _commscope("record", "--out", str(logs), "--", sys.executable, "-c", "pass")
    assert proc.returncode == 1 and "no op was recorded" in proc.stderr


@pytest.mark.parametrize("argv, needle", [
    (["--", "no-such-command-xyz"], "command='no-such-command-xyz': not found on PATH"),
    (["--model", "ref-gpt", "--tp", "3", "--", sys.executable, "-c", "pass"], "tp=3: must divide num_heads=4"),
])
def test_a_job_refused_before_it_starts_leaves_no_log_folder(tmp_path: Path, argv, needle):
    logs = tmp_path / "logs"
    proc = _commscope("record", "--out", str(logs), *argv)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not logs.exists()
