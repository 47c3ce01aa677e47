"""Writing outputs so that a full disk, a kill or a planted link never costs a user a file.

Every file commscope writes goes through here:

    with atomic_path("out/ops.jsonl") as tmp:      # a new, empty file beside the target
        write_ops_jsonl(tmp, ops)                 # any writer that takes a path (numpy, matplotlib, pyarrow)
    # now flushed to disk (fsync) and renamed over out/ops.jsonl in one step (os.replace)

    write_text("out/summary.json", text)          # the same, for text in memory

- The data goes to a temporary file in the target's own folder (``.commscope-<pid>-<random>-<name>``: same
  filesystem, so the rename is atomic; the name keeps the target's suffixes, which writers read), is fsync'ed and
  renamed over the target. A full disk (ENOSPC), a quota, a Ctrl-C or an exception leaves the old file as it was,
  or no file, never a cut one: the temporary file is removed and the error names the target, not the temporary
  file (``No space left on device: out/ops.jsonl``). A kill (SIGKILL) leaves the temporary file, hidden by its
  dot; the next claim of the folder removes those of processes no longer running (:func:`sweep`).
- A target that is a symbolic link is refused (:func:`refuse_link`), dangling or not: commscope never writes
  through a link (``ln -s ~/.bashrc out/ops.jsonl`` must not replace ``~/.bashrc``), and a rename would silently
  replace the link itself. Temporary files are created with ``O_EXCL | O_NOFOLLOW``.
- :class:`OutputSet` stages the several files of one output (``traffic --out DIR``) and renames them into place
  only when every one of them was written: a failure half-way leaves the earlier run's files, not a mix.

A log that grows while a job runs (a recorder's rank log) is appended to instead (a rename cannot follow it): it
is opened with :func:`open_append`, never through a link, and a record cut by a kill or a full disk is
recognised and skipped by the readers with a warning naming the file and line.

Standard library only: the analytical core's writers use it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TextIO

from commscope.errors import ConfigError

__all__ = ["TMP_PREFIX", "OutputSet", "atomic_open", "atomic_path", "is_link", "named_error", "open_append",
           "refuse_link", "sweep", "write_bytes", "write_new_text", "write_text"]

#: Names of temporary files start so (hidden; the next claim of a folder removes those of dead processes).
TMP_PREFIX = ".commscope-"


def is_link(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` itself is a symbolic link (dangling or not)."""
    return os.path.islink(path)


def refuse_link(path: str | os.PathLike[str], field: str = "out") -> None:
    """ConfigError when ``path`` is a symbolic link: commscope never writes through one."""
    if is_link(path):
        try:
            to = f" (-> {os.readlink(path)})"
        except OSError:
            to = ""
        raise ConfigError(field, str(path), f"is a symbolic link{to}; commscope never writes through a link: "
                                            "remove the link or choose another name")


def named_error(exc: OSError, target: str | os.PathLike[str]) -> OSError:
    """``exc`` (met writing a temporary file) as an OSError naming ``target``, the file the user asked for."""
    code = exc.errno
    text = exc.strerror or str(exc)
    if code is None and "no space left" in text.lower():  # pyarrow and zipfile say it in words
        code = errno.ENOSPC
    return OSError(code or errno.EIO, exc.strerror or text.removesuffix(f": {exc.filename}"), os.fspath(target))


def _temp_name(target: Path) -> Path:
    return target.with_name(f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{target.name}")


def _create(target: Path) -> Path:
    """A new, empty temporary file beside ``target`` (its mode that of a fresh file, or of the file it replaces)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(16):
        tmp = _temp_name(target)
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise named_error(exc, target) from None
        try:
            with contextlib.suppress(OSError):
                old = os.stat(target, follow_symlinks=False)
                if stat.S_ISREG(old.st_mode):
                    os.fchmod(fd, stat.S_IMODE(old.st_mode))
        finally:
            os.close(fd)
        return tmp
    raise OSError(errno.EEXIST, "cannot create a temporary file", os.fspath(target))  # pragma: no cover


def _sync(path: Path, *, folder: bool = False) -> None:
    """A file's data on disk; with ``folder``, a folder's entries (a rename), where the filesystem can fsync one."""
    kind = getattr(os, "O_DIRECTORY", 0) if folder else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, os.O_RDONLY | kind | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not folder:
            raise


def _sync_dir(folder: Path) -> None:
    _sync(folder, folder=True)


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def _check_target(target: Path, field: str) -> None:
    refuse_link(target, field)
    if target.is_dir():
        raise ConfigError(field, str(target), "is a directory; give a file name")
    if target.exists() and not target.is_file():  # a rename would replace a device or a pipe with a file
        raise ConfigError(field, str(target), "is not a regular file (a device, a pipe or a socket); give a file name")


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, field: str = "out") -> Iterator[Path]:
    """A temporary path beside ``target`` to write to; renamed over ``target`` when the block ends without an error,
    removed when it raises (an OSError then names ``target``). Refuses a target that is a link or a directory."""
    target = Path(target)
    _check_target(target, field)
    tmp = _create(target)
    try:
        yield tmp
        _sync(tmp)
        refuse_link(target, field)  # planted while the data was written: the rename would replace the link
        os.replace(tmp, target)
    except OSError as exc:
        _discard(tmp)
        raise named_error(exc, target) from None
    except BaseException:
        _discard(tmp)
        raise
    _sync_dir(target.parent)


@contextlib.contextmanager
def atomic_open(target: str | os.PathLike[str], mode: str = "w", *, encoding: str | None = "utf-8",
                newline: str | None = None, field: str = "out") -> Iterator[IO[Any]]:
    """``open(target, mode)`` for writing (``"w"``, ``"wb"``), through :func:`atomic_path`."""
    if mode not in ("w", "wb", "wt"):
        raise ValueError(f"mode={mode!r}: atomic_open writes a new file ('w' or 'wb')")
    with atomic_path(target, field=field) as tmp:
        if "b" in mode:
            with open(tmp, "wb") as fh:  # closed before the rename
                yield fh
        else:
            with open(tmp, "w", encoding=encoding, newline=newline) as text:
                yield text


def write_text(target: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", field: str = "out") -> Path:
    """Write ``text`` to ``target`` atomically; returns the target."""
    with atomic_open(target, "w", encoding=encoding, newline="", field=field) as fh:
        fh.write(text)
    return Path(target)


def write_new_text(target: str | os.PathLike[str], text: str, *, field: str = "out") -> bool:
    """Write ``text`` to ``target`` unless a file (or link) is there already, atomically either way (a hard link of the
    complete temporary file, which fails when the name is taken); True when this call wrote it."""
    target = Path(target)
    _check_target(target, field)
    tmp = _create(target)
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        _sync(tmp)
        try:
            os.link(tmp, target, follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            return _write_exclusive(target, text)  # a filesystem without hard links
    except OSError as exc:
        raise named_error(exc, target) from None
    finally:
        _discard(tmp)
    _sync_dir(target.parent)
    return True


def _write_exclusive(target: Path, text: str) -> bool:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    return True


def write_bytes(target: str | os.PathLike[str], data: bytes, *, field: str = "out") -> Path:
    """Write ``data`` to ``target`` atomically; returns the target."""
    with atomic_open(target, "wb", field=field) as fh:
        fh.write(data)
    return Path(target)


def open_append(path: str | os.PathLike[str], *, create: bool) -> TextIO:
    """A log file opened for appending, never through a link. ``create``: a new file (refused when one is there:
    a log is never appended to another run's); else an existing one, reopened by the writer that made it."""
    flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    if create:
        flags |= os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP or is_link(path):
            raise ConfigError("log", os.fspath(path), "is a symbolic link; commscope never writes through a link")
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


class OutputSet:
    """The files of one output, written beside their targets and renamed into place together by :meth:`commit`
    (as the block of ``with OutputSet(folder) as out:`` ends without an error), or all removed.

        with OutputSet(folder) as out:
            write_ops_jsonl(out.path("ops.jsonl"), ops)
            out.write_text("summary.json", text)
        # out.written: the targets, in the order they were staged
    """

    def __init__(self, folder: str | os.PathLike[str], *, field: str = "out") -> None:
        self.folder = Path(folder)
        self.field = field
        self._staged: dict[Path, Path] = {}  # target -> temporary file
        self.written: list[Path] = []

    def path(self, name: str | os.PathLike[str]) -> Path:
        """A temporary path for the file ``name`` of the folder (a name given twice gets the same one)."""
        target = self.folder / name
        if target not in self._staged:
            _check_target(target, self.field)
            self._staged[target] = _create(target)
        return self._staged[target]

    def drop(self, name: str | os.PathLike[str]) -> None:
        """Leave the file ``name`` out after all (its writer gave up): its temporary file is removed."""
        tmp = self._staged.pop(self.folder / name, None)
        if tmp is not None:
            _discard(tmp)

    def write_text(self, name: str, text: str) -> Path:
        try:
            with open(self.path(name), "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
        except OSError as exc:  # a write's error names no file: name the one the user asked for
            raise named_error(exc, self.folder / name) from None
        return self.folder / name

    def commit(self) -> list[Path]:
        """Sync every staged file, then rename each over its target; returns the targets."""
        for target, tmp in self._staged.items():
            try:
                _sync(tmp)
            except OSError as exc:
                self.discard()
                raise named_error(exc, target) from None
        for target in self._staged:
            refuse_link(target, self.field)
        for target, tmp in self._staged.items():
            try:
                os.replace(tmp, target)
            except OSError as exc:
                self.discard()
                raise named_error(exc, target) from None
            self.written.append(target)
        self._staged.clear()
        _sync_dir(self.folder)
        return list(self.written)

    def discard(self) -> None:
        """Remove every staged file that was not renamed into place."""
        for tmp in self._staged.values():
            _discard(tmp)
        self._staged.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.commit()
            return
        self.discard()
        if isinstance(exc, OSError) and exc.filename is not None:
            tmp = Path(exc.filename)
            if tmp.name.startswith(TMP_PREFIX):  # name the file the user asked for, not the temporary one
                raise named_error(exc, self.folder / tmp.name.split("-", 3)[-1]) from None


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: str | os.PathLike[str], name: str | None = None) -> list[Path]:
    """Remove the temporary files a killed commscope left in ``folder`` (of the target ``name`` only, when given):
    those of processes no longer running. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(TMP_PREFIX) or entry.is_dir(follow_symlinks=False):
            continue
        parts = entry.name[len(TMP_PREFIX):].split("-", 2)
        if len(parts) != 3 or not parts[0].isdigit() or (name is not None and parts[2] != name):
            continue
        if _pid_alive(int(parts[0])):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed
