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
from collections.abc import Callable, Sequence
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


def _flock_soon(fd: int, kind: int, tries: int = 5) -> None:
    """flock ``fd`` without waiting on a run that holds it, but over a few milliseconds: another run's look at
    whether a claim is held (:func:`_held`) holds a shared lock for an instant, which is no claim to refuse on."""
    import fcntl

    for i in range(tries):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if i == tries - 1:
                raise
            time.sleep(0.002 * (i + 1))


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
            _flock_soon(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
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



def _claim(target: Path, lock: Path, field: str, what: str, names: Sequence[str] = ()) -> Claim:
    from commscope.io.atomic import sweep

    fd = _lock(lock, True, field, target, what)
    token = secrets.token_hex(8)
    info = {"pid": os.getpid(), "command": _command(), "started": time.time(), "token": token, "names": list(names)}
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    claim = Claim(target, lock, fd, token)
    try:
        _refuse_other_kind(target, field, what, names)
    except BaseException:
        claim.release()
        raise
    sweep(lock.parent, None if what == "directory" else target.name)  # what killed runs left half-written
    return claim


def _refuse_other_kind(target: Path, field: str, what: str, names: Sequence[str]) -> None:
    """Refuse a claim whose output another run writes under the other kind of claim: a file a folder writer's names
    match (``report --out d/ops.jsonl`` beside ``traffic --out d``), or a folder holding such a file being written.
    Each side takes its own lock first and then looks for the other's, so two that start together may both be
    refused, never both let through."""
    if what == "directory":
        for entry in _entries(target):
            name = entry.name.removeprefix(".").removesuffix(".commscope.lock")
            if (entry.name.startswith(".") and entry.name.endswith(".commscope.lock") and entry.name != FOLDER_LOCK
                    and _matches(name, names)):
                holder = _held(Path(entry.path))
                if holder is not None:
                    raise ConfigError(field, str(target), f"its file {name} is being written by another commscope run"
                                                          f"{_describe(holder)}; wait for it to finish, or choose "
                                                          "another directory")
        return
    holder = _held(lock_path(target.parent, folder=True))
    if holder is not None and _matches(target.name, holder.get("names") or ()):
        raise ConfigError(field, str(target), f"is among the files another commscope run writes in "
                                              f"{target.parent}{_describe(holder)}; wait for it to finish, or choose "
                                              "another name")


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        return []


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` (a file directly in the folder) is one of ``patterns`` (a folder claim's output names)."""
    import fnmatch

    return any(isinstance(p, str) and "/" not in p and fnmatch.fnmatchcase(name, p) for p in patterns)


def _held(lock: Path) -> dict[str, Any] | None:
    """The holder of the exclusive claim ``lock`` (its pid, command, names), or None where no run holds it."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        # (a shared lock is refused only while an exclusive one is held; taken for an instant and given back)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:  # a filesystem without flock: no claims to see
        return None
    finally:
        os.close(fd)
    return None


def claim_folder(folder: Path, *, field: str = "out", names: Sequence[str] = ()) -> Claim:
    """Claim the folder ``folder`` (made when missing) for this run; ConfigError when another run holds it, or holds
    one of its files that ``names`` (the patterns of the files this run writes there) match."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return _claim(folder, lock_path(folder, folder=True), field, "directory", names)


def claim_file(target: Path, *, field: str = "out") -> Claim:
    """Claim the output file ``target`` (its folder made when missing); ConfigError when another run holds it, or
    holds its folder and writes a file of that name there."""
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
