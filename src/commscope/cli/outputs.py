"""What a command does before it writes an output: claim it, and replace an earlier run's files only when asked.

Every command that writes takes ``--force`` and calls one of these before any work (before a rank starts):

- :func:`claim_dir` for a folder (``traffic --out DIR``, ``workload --record DIR``): another run writing it is
  refused (:mod:`commscope.io.claim`); files of this command's own names already there are an earlier run's,
  refused unless ``--force``, and with it replaced (the ones this run will not write again removed, so that nothing
  of the earlier run is left beside the new one as if it were of it), and said when the run has replaced them: a run
  that fails first (bad input, a full disk) leaves them as they were and does not say it replaced them.
- :func:`claim_file` for a file (``bench --out b.json``, ``fit --out m.toml``, ``report --out r.html``): the same
  for the file and the files written beside it (bench's plot).

The files themselves are then written with :mod:`commscope.io.atomic`.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from commscope.errors import ConfigError
from commscope.io.atomic import is_link, refuse_link
from commscope.io.claim import Claim, claim_file as _claim_file, claim_folder

__all__ = ["add_force_arg", "claim_dir", "claim_file", "earlier_files", "remove_files"]


def add_force_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str = "output") -> None:
    """``--force``: replace the files of an earlier run."""
    parser.add_argument("--force", action="store_true",
                        help=f"replace the {what} of an earlier run (default: refuse, naming its files)")


def _say(args: argparse.Namespace, message: str) -> None:
    command = getattr(args, "command", None)
    print(f"commscope{' ' + command if command else ''}: {message}", file=sys.stderr)


def earlier_files(folder: Path, patterns: Iterable[str]) -> list[Path]:
    """Files (or links) in ``folder`` whose names match one of ``patterns``, sorted. A pattern may go down into
    subfolders (``routing/group*/routing-rank*.npz``), never through a link to one. ``folder`` itself may be a link
    (``ln -s /scratch/runs out``): the outputs are written where it leads, and so are looked for there."""
    found: set[Path] = set()
    for pattern in patterns:
        *subs, name = pattern.split("/")
        wheres = [folder]
        for sub in subs:
            wheres = [Path(e.path) for w in wheres for e in _entries(w, top=w == folder)
                      if fnmatch.fnmatchcase(e.name, sub) and e.is_dir(follow_symlinks=False)]
        found.update(Path(e.path) for w in wheres for e in _entries(w, top=w == folder)
                     if fnmatch.fnmatchcase(e.name, name) and (e.is_symlink() or e.is_file()))
    return sorted(found)


def _entries(folder: Path, *, top: bool = False) -> list[os.DirEntry[str]]:
    if is_link(folder) and not top:
        return []
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:  # missing, or not a folder
        return []


def _names(paths: Sequence[Path], folder: Path, limit: int = 6) -> str:
    shown = [os.path.relpath(p, folder) for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(shown) + more


def remove_files(paths: Iterable[Path]) -> None:
    """Remove files of an earlier run (links themselves, never what they point to)."""
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def claim_dir(args: argparse.Namespace, folder: Path, patterns: Sequence[str], *, field: str = "out",
              what: str = "the files", clear: bool = True) -> Claim:
    """Claim ``folder`` for this run and make way for its outputs (``patterns``: the names this command writes).
    An earlier run's files there are refused unless ``args.force``; with it they are said and removed now when
    ``clear`` (a recording, written file by file as the job runs: nothing of the earlier run may be left beside it),
    else left to the caller (``claim.earlier``: replaced when the new files are complete, the others removed then,
    inside the ``with`` block) and said when the block ends well. A
    link among them is refused either way (never followed, never silently replaced). Returns the claim (release it
    when the outputs are written)."""
    claim = claim_folder(folder, field=field, names=patterns)
    try:
        old = earlier_files(folder, patterns)
        for p in old:
            refuse_link(p, field)
        if old:
            if not getattr(args, "force", False):
                raise ConfigError(field, str(folder), f"already holds {what} of an earlier run ({_names(old, folder)}); "
                                                      "give --force to replace it, or choose another directory")
            if clear:  # (removed now: said now)
                _say(args, f"replacing {what} of an earlier run in {folder} (--force): {_names(old, folder)}")
                remove_files(old)
            else:
                claim.earlier = old
                _say_replaced(args, claim, old, lambda done: f"replaced {what} of an earlier run in {folder} "
                                                             f"(--force): {_names(done, folder)}")
    except BaseException:
        claim.release()
        raise
    return claim


def claim_file(args: argparse.Namespace, target: Path, *, field: str = "out", beside: Sequence[Path] = ()) -> Claim:
    """Claim the output file ``target`` (and the files ``beside`` it that the same run writes) for this run. An
    existing one is refused unless ``args.force`` (then it is replaced when the new one is complete, and said when the
    run ends having replaced it); a link is refused either way. Returns the claim."""
    claim = _claim_file(target, field=field)
    try:
        old = []
        for p in (target, *beside):
            refuse_link(p, field)
            if p.exists():
                old.append(p)
        if old:
            if not getattr(args, "force", False):
                names = " and ".join(str(p) for p in old)
                raise ConfigError(field, str(target), f"{names} already exist{'s' if len(old) == 1 else ''}; give "
                                                      "--force to replace, or choose another name")
            _say_replaced(args, claim, old, lambda done: f"replaced {' and '.join(map(str, done))} of an earlier "
                                                         "run (--force)")
    except BaseException:
        claim.release()
        raise
    return claim


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, modification time) of ``path`` itself, None where it is gone."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _say_replaced(args: argparse.Namespace, claim: Claim, old: Sequence[Path],
                  message: Callable[[list[Path]], str]) -> None:
    """When the run ends well, say which of the earlier run's files ``old`` it replaced or removed (``message`` of
    them); a run that fails first (bad input, a full disk) replaced none of them and says nothing of it."""
    before = {p: _identity(p) for p in old}

    def said(done: bool) -> None:
        replaced = [p for p, was in before.items() if _identity(p) != was]
        if done and replaced:
            _say(args, message(replaced))

    claim.at_exit(said)
