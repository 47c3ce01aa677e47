"""Progress bars go to stderr, and only when stderr is a terminal (a real pty here) and the command prints no JSON;
tables line up the same way in every command."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap

from terminal_run import run_on_terminal

from commscope.cli.terminal import print_table

_WORK = textwrap.dedent("""
    import sys, time
    from commscope.cli.terminal import Progress
    with Progress("crunching", 4, quiet=QUIET, delay_s=0) as progress:
        for _ in range(4):
            time.sleep(0.05)
            print("row", flush=True)
            progress.advance()
""")


def _run(argv: list[str], *, stderr_tty: bool) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a command whose stdout is a pipe and whose stderr is a pty or a pipe."""
    if not stderr_tty:
        env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
        return proc.returncode, proc.stdout, proc.stderr
    return run_on_terminal(argv, 120, timeout_s=120, terminal="stderr")


def test_progress_draws_on_a_terminal_stderr_only() -> None:
    code, out, err = _run([sys.executable, "-c", _WORK.replace("QUIET", "False")], stderr_tty=True)
    assert code == 0
    assert out == "row\n" * 4  # the data stays on stdout, untouched by the bar
    assert "crunching" in err and "4/4" in err and "elapsed" in err and "left" in err


def test_progress_is_silent_in_a_pipe_and_when_quiet() -> None:
    code, out, err = _run([sys.executable, "-c", _WORK.replace("QUIET", "False")], stderr_tty=False)
    assert (code, out, err) == (0, "row\n" * 4, "")
    code, out, err = _run([sys.executable, "-c", _WORK.replace("QUIET", "True")], stderr_tty=True)
    assert (code, out) == (0, "row\n" * 4) and "crunching" not in err


def test_plan_shows_its_progress_on_a_terminal_but_not_with_json() -> None:
    # a plan long enough to draw (~5,000 configurations that fit, ranked op by op: about a second)
    argv = [sys.executable, "-m", "commscope.cli.main", "plan", "--model", "llama3-70b", "--cluster", "dgx-h100",
            "--gpus", "8192", "--global-batch-size", "4096", "--cp-sizes", "1,2,4,8", "--micro-batch-sizes",
            "1,2,4,8,16", "--top", "2"]
    code, out, err = _run(argv, stderr_tty=True)
    assert code == 0 and "iter s" in out and "estimating" not in out
    assert "estimating" in err and re.search(r"(?<!\d)(\d+)/\1(?!\d)", err)  # drawn up to done/total
    code, out, err = _run([*argv, "--json"], stderr_tty=True)
    assert code == 0 and out.startswith("{") and "estimating" not in err


def test_tables_align_columns_without_trailing_blanks() -> None:
    buf = io.StringIO()
    print_table(("name", "bytes", "note"), [("tp", 1024, "ring"), ("dp", 8, "")], left=("name", "note"), file=buf)
    assert buf.getvalue() == "name  bytes  note\ntp     1024  ring\ndp        8\n"


def test_a_table_wider_than_the_screen_moves_columns_to_blocks_led_by_its_keys() -> None:
    from commscope.cli.terminal import format_table

    columns = ("axis", "op", *(f"column {k}" for k in range(8)))
    rows = [("tp", "all_reduce", *(f"{k * 1000 + r:,}" for k in range(8))) for r in range(3)]
    wide = format_table(columns, rows, left=("axis", "op"))  # stdout is no terminal here: as wide as the rows
    assert len(wide.splitlines()) == 4 and max(map(len, wide.splitlines())) > 80
    narrow = format_table(columns, rows, left=("axis", "op"), keys=2, width=60)
    lines = narrow.splitlines()
    assert max(map(len, lines)) <= 60 and "…" not in narrow
    headers = [line for line in lines if line.startswith("axis")]
    assert len(headers) >= 2 and all(h.split()[:2] == ["axis", "op"] for h in headers)  # every block led by its keys
    from collections import Counter

    assert not Counter(wide.split()) - Counter(narrow.split())  # every cell is there, whole


def test_prose_wraps_in_its_column_or_moves_under_its_row() -> None:
    from commscope.cli.terminal import format_table

    why = "largest cost compute (91%); comm 9%, bubble 0% and a few more words to wrap"
    rows = [(1, "4", "16.833", why), (2, "8", "17.191", why)]
    text = format_table(("#", "tp", "iter s", "why"), rows, left=("why",), wrap=("why",), width=50)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 50 and len(lines) > 3  # wrapped inside its column
    assert lines[1].startswith("1   4  16.833  largest cost") and lines[2].startswith(" " * 15 + "9%, bubble")
    under = format_table(("#", "tp", "iter s", "why"), rows, left=("why",), wrap=("why",), width=30)
    assert max(map(len, under.splitlines())) <= 30 and "    why: largest cost" not in under  # a block of its own
    assert " ".join(under.split()).count("largest cost compute (91%)") == 2


def test_section_labels_stand_on_their_own_line_in_every_block() -> None:
    from commscope.cli.terminal import format_table

    rows = ["-- dense layer", ("qkv", "fwd", "4096", "4608"), "-- output layer", ("logits", "fwd", "4096", "25216")]
    text = format_table(("gemm", "pass", "M", "N"), rows, left=("gemm", "pass"), keys=2, width=18)
    assert text.count("-- dense layer") == 2 and text.count("-- output layer") == 2  # two blocks
    assert "\n\n-- output layer" in text
