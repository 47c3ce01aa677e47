"""Progress bars go to stderr, and only when stderr is a terminal (a real pty here) and the command prints no JSON;
tables line up the same way in every command."""

from __future__ import annotations

import io
import re
import os
import pty
import select
import subprocess
import sys
import textwrap

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
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    if not stderr_tty:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
        return proc.returncode, proc.stdout, proc.stderr
    master, slave = pty.openpty()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env) as p:
        os.close(slave)
        chunks: list[bytes] = []
        while True:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the pty's last writer is gone
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
        out = p.stdout.read().decode() if p.stdout else ""
        code = p.wait(timeout=120)
    os.close(master)
    return code, out, b"".join(chunks).decode(errors="replace")


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
