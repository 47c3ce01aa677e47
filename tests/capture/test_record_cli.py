"""`commscope record -- torchrun ...` then `commscope summarize`: the path a user takes with their own script."""

from __future__ import annotations

import json
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


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_record_torchrun_job_then_summarize(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "commscope.cli.main", "record", "--out", str(logs), "--",
                           "torchrun", "--nproc-per-node", "2", str(script)], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in logs.iterdir()) == ["rank00000.done", "rank00000.jsonl", "rank00001.done", "rank00001.jsonl"]
    out = subprocess.run([sys.executable, "-m", "commscope.cli.main", "summarize", str(logs), "--dp", "2", "--json"],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["world_size"] == 2 and s["unfinished_ranks"] == [] and not s["problems"]
    rows = {(r["axis"], r["op"]): r for r in s["ops"]}
    # three steps of DDP: one gradient all-reduce of 32*32+32 fp32 each
    assert rows[("dp", "all_reduce")]["count"] == 3
    assert rows[("dp", "all_reduce")]["bytes"] == 3 * (32 * 32 + 32) * 4
    assert s["traffic"]["logical"]["total_bytes"] > 0


def test_summarize_bad_input(tmp_path: Path):
    out = subprocess.run([sys.executable, "-m", "commscope.cli.main", "summarize", str(tmp_path)],
                         capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 2 and "no rank" in out.stderr and "Traceback" not in out.stderr
