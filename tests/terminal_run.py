"""Run a command with its stdout (or its stderr) on a real pseudo-terminal of a chosen width, as a person at a
terminal sees it; the other stream goes to a pipe."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal


def run_on_terminal(argv: Sequence[str], columns: int = 120, *, cwd: Path | None = None, timeout_s: float = 300,
                    env: Mapping[str, str] | None = None,
                    terminal: Literal["stdout", "stderr"] = "stdout") -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``argv`` run with one stream (``terminal``) on a pty of ``columns`` columns
    (its window size set, and ``COLUMNS``) and the other on a pipe. Stdout on the terminal, stderr in a pipe: no
    progress bar draws, tables fit the width; the other way round: the bar draws, the data is piped."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {**os.environ, **(env or {}), "COLUMNS": str(columns), "TERM": "xterm-256color"}
    environ.pop("NO_COLOR", None)
    on_pty: list[bytes] = []
    piped: list[bytes] = []
    streams = ({"stdout": slave, "stderr": subprocess.PIPE} if terminal == "stdout" else
               {"stdout": subprocess.PIPE, "stderr": slave})
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, cwd=cwd, env=environ, **streams) as proc:
        os.close(slave)
        pipe = proc.stderr if terminal == "stdout" else proc.stdout
        assert pipe is not None
        reader = threading.Thread(target=lambda: piped.append(pipe.read()), daemon=True)
        reader.start()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # the pty's last writer is gone
                    break
                if not data:
                    break
                on_pty.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
        code = proc.wait(timeout=60)
        reader.join(timeout=60)
    os.close(master)
    shown = b"".join(on_pty).decode(errors="replace").replace("\r\n", "\n")
    other = b"".join(piped).decode(errors="replace")
    return (code, shown, other) if terminal == "stdout" else (code, other, shown)


#: A terminal's control sequences (colour, bold): not columns on the screen.
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def visible(text: str) -> str:
    """``text`` as the screen shows it: without control sequences."""
    return _ESCAPES.sub("", text)
