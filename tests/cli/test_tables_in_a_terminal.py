"""Every command that prints a table, run as a person at a terminal runs it: stdout on a real pty of 80 and of 120
columns. No line is wider than the screen (only a single word longer than the screen may run over), no cell is
cut (no "…"), and every word the command prints into a pipe, where tables are as wide as their rows, reaches the
terminal too: columns that do not fit move to a block of their own and prose wraps, nothing is lost."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import shared_or_skip
from terminal_run import run_on_terminal, visible

pytest.importorskip("torch")

WIDTHS = (80, 120)
CLI = [sys.executable, "-m", "commscope.cli.main"]


def _check_screen(text: str, columns: int) -> None:
    """Nothing on the screen is cut or runs over its width (a single word longer than the screen may)."""
    shown = visible(text)
    assert "…" not in shown, shown
    for line in shown.splitlines():
        assert len(line) <= columns or " " not in line.strip(), f"{len(line)} > {columns} columns: {line!r}\n{shown}"


def _words(text: str) -> Counter[str]:
    """The words of ``text``, the seconds a command took to run made one word (they change from run to run)."""
    return Counter(re.sub(r"\b\d+\.\d+ s\b", "T s", visible(text)).split())


def _check_nothing_lost(piped: str, screen: str) -> None:
    """Every word printed into a pipe is on the screen, as often (blocks repeat their key columns: more is fine)."""
    missing = _words(piped) - _words(screen)
    assert not missing, f"lost on the terminal: {dict(missing)}\n{visible(screen)}"


def _piped(argv: list[str], cwd: Path) -> str:
    import subprocess

    proc = subprocess.run([*CLI, *argv], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded 2-rank job (tp 2) and a routing trace: what summarize, compare and moe analyze read."""
    import subprocess

    root = tmp_path_factory.mktemp("terminal")
    for argv in (["workload", "gpt", "--tp", "2", "--dp", "1", "--steps", "2", "--record", "logs"],
                 ["moe", "simulate", "--model", "deepseek-moe-16b", "--ep", "8", "--iterations", "20", "--out", "moe",
                  "--no-plot"]):
        proc = subprocess.run([*CLI, *argv], cwd=root, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
    return root


#: Commands whose output depends only on their input: the pipe's words are the terminal's.
DETERMINISTIC = {
    "presets": ["presets"],
    "plan": ["plan", "--model", "llama3-70b", "--gpus", "512", "--cluster", "dgx-h100", "--global-batch-size", "1024"],
    "estimate": ["estimate", "--model", "llama3-70b", "--tp", "8", "--pp", "4", "--gpus", "512",
                 "--sequence-parallel", "--use-distributed-optimizer", "--global-batch-size", "1024",
                 "--micro-batch-size", "1", "--cluster", "dgx-h100"],
    "traffic": ["traffic", "--model", "llama3-70b", "--tp", "8", "--pp", "4", "--gpus", "512", "--sequence-parallel",
                "--global-batch-size", "1024", "--micro-batch-size", "1", "--cluster", "dgx-h100"],
    "compare": ["compare", "logs"],
    "compare --time": ["compare", "logs", "--time"],
    "summarize": ["summarize", "logs"],
    "shapes": ["shapes", "--model", "gpt-3b", "--cluster", "dgx-a100", "--tp", "2", "--micro-batch-size", "4"],
    "moe analyze": ["moe", "analyze", "moe/trace.npz"],
}


@pytest.mark.parametrize("name", sorted(DETERMINISTIC))
def test_tables_fit_80_and_120_columns_and_lose_nothing(name: str, work: Path) -> None:
    argv = DETERMINISTIC[name]
    piped = _piped(argv, work)
    for columns in WIDTHS:
        code, screen, err = run_on_terminal([*CLI, *argv], columns, cwd=work)
        assert code == 0, err
        _check_screen(screen, columns)
        _check_nothing_lost(piped, screen)


def test_validate_fits_80_and_120_columns() -> None:
    runs = shared_or_skip("data", "measured_iteration_times.csv")
    argv = ["validate", str(runs), "--attention-backend", "unfused", "--fp16", "--no-gradient-accumulation-fusion",
            "--inter-node-GBps", "12.5"]
    piped = _piped(argv, runs.parent)
    for columns in WIDTHS:
        code, screen, err = run_on_terminal([*CLI, *argv], columns)
        assert code == 0, err
        _check_screen(screen, columns)
        _check_nothing_lost(piped, screen)


@pytest.mark.parametrize("columns", WIDTHS)
def test_measuring_commands_fit(columns: int, tmp_path: Path) -> None:
    """bench, fit and tune measure (their numbers change run to run): each fits the screen and shows its columns."""
    sweep = ["-b", "1K", "-e", "16K", "-f", "4", "-n", "10", "-w", "1", "--nproc", "2"]
    code, screen, err = run_on_terminal([*CLI, "bench", "--ops", "all_reduce,all_gather", *sweep, "--out",
                                         "bench.json", "--no-plot"], columns, cwd=tmp_path)
    assert code == 0, err
    _check_screen(screen, columns)
    assert all(word in visible(screen) for word in ("size", "time", "algbw", "busbw", "#wrong", "cv"))
    code, screen, err = run_on_terminal([*CLI, "fit", "bench.json"], columns, cwd=tmp_path)
    assert code == 0, err
    _check_screen(screen, columns)
    assert "all_reduce" in screen and "busbw" in screen
    code, screen, err = run_on_terminal([*CLI, "tune", "--ops", "all_reduce", *sweep, "--out", "tuning.json"],
                                        columns, cwd=tmp_path)
    assert code == 0, err
    _check_screen(screen, columns)
    assert "all_reduce" in screen and "backend per size" in screen


def test_json_on_a_terminal_is_printed_whole() -> None:
    """Prose wraps on a terminal, JSON does not: a line cut in two would not parse when copied from the screen."""
    import json

    code, screen, err = run_on_terminal([*CLI, "estimate", "--json"], 80)
    assert code == 0, err
    assert json.loads(visible(screen))["notes"] and max(map(len, visible(screen).splitlines())) > 80
