"""A command that needs an optional package the user has not installed says so in one line (exit 2) with the
command that installs it, instead of a ModuleNotFoundError traceback: bench, tune, workload, calibrate and record
start torch.distributed ranks, and the README's first command installs commscope without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from commscope.cli.main import missing_extra

# A fresh interpreter in which torch cannot be imported (as where it is not installed), then the CLI
BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
from commscope.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

COMMANDS = {
    "bench": ["bench", "--nproc", "2", "--out", "b.json"],
    "tune": ["tune", "--nproc", "2", "--out", "t.toml"],
    "workload": ["workload", "gpt", "--tp", "2", "--pp", "1", "--dp", "1", "--steps", "1", "--record", "rec"],
    "calibrate": ["calibrate", "--out", "gpu.toml"],
    "record": ["record", "--out", "rec2", "--", sys.executable, "-c", "pass"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_without_torch_says_so_in_one_line(name: str, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", BLOCK_TORCH, *COMMANDS[name]], check=False, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith(f"commscope {name}: error: this command needs PyTorch")
    assert "pip install 'commscope[torch]'" in lines[0] and "download.pytorch.org/whl/cpu" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing written, no folder claimed


def test_only_optional_packages_are_turned_into_a_line() -> None:
    assert "matplotlib" in (missing_extra(ModuleNotFoundError("x", name="matplotlib.pyplot")) or "")
    assert "commscope[parquet]" in (missing_extra(ModuleNotFoundError("x", name="pyarrow")) or "")
    # any other missing module is a bug in commscope or its install: it keeps its traceback
    assert missing_extra(ModuleNotFoundError("x", name="commscope.nowhere")) is None
    assert missing_extra(ModuleNotFoundError("x", name=None)) is None
