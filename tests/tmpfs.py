"""A real full filesystem for tests: a small tmpfs mounted in a user namespace (``unshare -rm``), where this machine
lets an unprivileged user make one; tests that need it are skipped, with the reason, where it does not."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def unshare_or_skip() -> str:
    """The ``unshare`` program, once it has shown that it can mount a tmpfs here; else the test is skipped."""
    path = shutil.which("unshare")
    if path is None:
        pytest.skip("needs unshare (util-linux) to mount a small tmpfs")
    probe = subprocess.run([path, "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"], check=False,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine does not let a user mount a tmpfs (unshare -rm: {probe.stderr.strip()})")
    return path


def on_tmpfs(mnt: Path, size: str, commands: Sequence[Sequence[str]], *, timeout_s: float = 120,
             ) -> subprocess.CompletedProcess[str]:
    """Mount a tmpfs of ``size`` (``64k``) on the folder ``mnt`` in a private mount namespace and run ``commands``
    (each a command line, run one after another whatever their exit status; each one's status is printed on
    stdout as ``rc=N``) with this checkout's sources first on PYTHONPATH."""
    unshare = unshare_or_skip()
    mnt.mkdir(parents=True, exist_ok=True)
    script = " ; ".join(f"{shlex.join(c)} ; echo rc=$?" for c in commands)
    mount = f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(mnt))}"
    return subprocess.run([unshare, "-rm", "sh", "-c", f"{mount} && {{ {script} ; }}"], check=False,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=timeout_s)
