"""One writer per output: a lock held for the life of the run that writes a folder or a file.

    with claim_folder(Path("logs"), field="record"):      # before any rank starts
        ...                                               # ranks forked from here share the claim

A second ``commscope`` run that asks for the same output is refused at once, before it starts a rank or touches a
file there, and the message names the run that holds it (its pid and command line)::

    record='logs': is being written by another commscope run (pid 4242: commscope workload gpt --record logs,
    since 12:03:07); wait for it to finish, or choose another directory

The lock is ``fcntl.flock`` on ``FOLDER/.commscope.lock`` (a folder output) or ``.NAME.commscope.lock`` beside a
file output. The kernel releases it when the process ends, however it ends (a kill, a crash): a lock file left
behind is no claim. Forked ranks inherit the open file, and so the claim; the ranks of a job started by
``commscope record -- torchrun`` are other programs: they find the claim's token in :data:`CLAIM_ENV` and check it
against the lock file (:func:`claimed_for_me`). Ranks that record through :func:`commscope.measure.capture.record`
without commscope's launcher share a folder among themselves with shared locks (:func:`share_folder`), which an
exclusive claim waits for no more than they wait for it.

Releasing removes the lock file; an acquirer checks that the file it locked is still the one at the path (a
release in between leaves it locking a removed file), so two claims never both hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from commscope.errors import ConfigError

__all__ = ["CLAIM_ENV", "Claim", "claim_file", "claim_folder", "claimed_for_me", "lock_path", "share_folder"]

#: ``<lock file>\n<token>`` of the claim a run's launcher holds, for the job's ranks (other programs) to check.
CLAIM_ENV = "COMMSCOPE_CLAIM"
#: The lock file of a folder output.
FOLDER_LOCK = ".commscope.lock"


def lock_path(target: Path, *, folder: bool) -> Path:
    """The lock file of an output: inside a folder, beside a file."""
    return target / FOLDER_LOCK if folder else target.with_name(f".{target.name}.commscope.lock")


def _holder(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0)
        info = json.loads(data.decode("utf-8", errors="replace") or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _describe(info: dict[str, Any]) -> str:
    parts = []
    if isinstance(info.get("pid"), int):
        parts.append(f"pid {info['pid']}")
    if isinstance(info.get("command"), str) and info["command"]:
        command = info["command"]
        parts.append(command if len(command) <= 120 else command[:117] + "...")
    text = ": ".join(parts)
    if isinstance(info.get("started"), (int, float)):
        when = time.strftime("%H:%M:%S", time.localtime(info["started"]))
        text += f"{', ' if text else ''}since {when}"
    return f" ({text})" if text else ""


def _command() -> str:
    argv = [os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
    if argv[0] in ("__main__.py", "main.py", "-c", "-m"):
        argv[0] = "commscope"
    return " ".join(argv)


def _lock(path: Path, exclusive: bool, field: str, target: Path, what: str) -> int:
    """An open descriptor of ``path`` holding flock (exclusive or shared); ConfigError when another run holds it."""
    import fcntl

    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as exc:
            if os.path.islink(path):
                raise ConfigError(field, str(target), f"its lock file {path.name} is a symbolic link; commscope never "
                                                      "writes through a link: remove it") from None
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_holder(fd))
            os.close(fd)
            raise ConfigError(field, str(target), f"is being written by another commscope run{holder}; wait for it "
                                                  f"to finish, or choose another {what}") from None
        except OSError:  # a filesystem without flock (some network mounts): no claim, as before
            return fd
        try:
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # released and removed while this opened it: lock the file now at the path


class Claim:
    """A held claim on an output (:func:`claim_folder`, :func:`claim_file`); :meth:`release` (or the end of a
    ``with`` block) gives it back. A process that ends without releasing loses it too."""

    def __init__(self, target: Path, lock: Path, fd: int, token: str) -> None:
        self.target = target
        self.lock = lock
        self.token = token
        self._fd: int | None = fd
        self._pid = os.getpid()
        self.earlier: list[Path] = []
        """Files of an earlier run the output held when claimed (set by the command that claimed it)."""
        self._at_exit: list[Callable[[bool], None]] = []

    def at_exit(self, fn: Callable[[bool], None]) -> None:
        """Call ``fn(done)`` when the ``with`` block ends, before the claim is released: ``done`` is whether the block
        finished without an exception (what a command says it replaced is said only when it did)."""
        self._at_exit.append(fn)

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that let the ranks of a job started by this run share its claim."""
        lock = Path(os.path.realpath(self.lock.parent)) / self.lock.name
        return {CLAIM_ENV: f"{lock}\n{self.token}"}

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None or os.getpid() != self._pid:  # a forked child never releases its parent's claim
            return
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(self.lock, follow_symlinks=False).st_ino:
                os.unlink(self.lock)
        os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            for fn in self._at_exit:
                fn(exc_type is None)
        finally:
            self.release()



def _claim(target: Path, lock: Path, field: str, what: str) -> Claim:
    from commscope.io.atomic import sweep

    fd = _lock(lock, True, field, target, what)
    token = secrets.token_hex(8)
    info = {"pid": os.getpid(), "command": _command(), "started": time.time(), "token": token}
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    claim = Claim(target, lock, fd, token)
    sweep(lock.parent, None if what == "directory" else target.name)  # what killed runs left half-written
    return claim


def claim_folder(folder: Path, *, field: str = "out") -> Claim:
    """Claim the folder ``folder`` (made when missing) for this run; ConfigError when another run holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return _claim(folder, lock_path(folder, folder=True), field, "directory")


def claim_file(target: Path, *, field: str = "out") -> Claim:
    """Claim the output file ``target`` (its folder made when missing); ConfigError when another run holds it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return _claim(target, lock_path(target, folder=False), field, "file")


def claimed_for_me(folder: Path) -> bool:
    """Whether the launcher of this process holds the claim on ``folder`` and handed it down (:data:`CLAIM_ENV`)."""
    given = os.environ.get(CLAIM_ENV, "")
    lock, _, token = given.partition("\n")
    if not token or Path(lock) != lock_path(Path(os.path.realpath(folder)), folder=True):
        return False
    try:
        fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        return _holder(fd).get("token") == token
    finally:
        os.close(fd)


_SHARED: dict[Path, int] = {}


def share_folder(folder: Path, *, field: str = "logdir") -> None:
    """Hold a shared lock on ``folder`` for the life of this process (the ranks of one job recording into it share
    it; a commscope run's exclusive claim and this refuse each other)."""
    folder = Path(folder)
    key = folder.resolve()
    if key in _SHARED:
        return
    folder.mkdir(parents=True, exist_ok=True)
    _SHARED[key] = _lock(lock_path(folder, folder=True), False, field, folder, "directory")
