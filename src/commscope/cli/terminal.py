"""The terminal: progress bars on stderr and tables on stdout, through rich, the one place commscope uses it.

A command whose work can last more than a few seconds reports its progress with one object:

    with Progress("estimating", total=len(configs), quiet=args.json) as progress:
        for config in configs:
            ...
            progress.advance()

or hands it to a library function as the ``progress(done, total)`` callback those take (``plan``, ``run_sweep``,
the reference trainings). The bar shows done/total, the elapsed and the remaining time, on stderr, and only when
stderr is a terminal and the command does not print JSON (``quiet``); otherwise nothing is drawn. It appears
after ``delay_s`` (short work shows none) and starts in the process that first reports: a callback handed to a
rank that :func:`commscope.launch.spawn` forks draws from that rank (it pickles without its bar, for ``spawn``).

Tables go through :func:`format_table` / :func:`print_table`, so that every command's rows line up the same way.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Self, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress, TaskID
    from rich.table import Table

__all__ = ["Progress", "format_table", "print_table"]


class Progress:
    """A progress bar on stderr for work of ``total`` steps (see the module docstring)."""

    def __init__(self, label: str, total: int | None = None, *, quiet: bool = False, delay_s: float = 0.25) -> None:
        self.label, self.total, self.delay_s = label, total, delay_s
        self.enabled = not quiet and sys.stderr.isatty()
        self.done = 0
        self._t0 = time.monotonic()
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("label", "total", "delay_s", "enabled", "done", "_t0")},
                "_bar": None, "_task": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` of ``total`` steps are finished (``total`` as given before when None)."""
        self.done = done
        if total is not None:
            self.total = total
        if not self.enabled:
            return
        finished = self.total is not None and done >= self.total
        if self._bar is None:
            if finished or time.monotonic() - self._t0 < self.delay_s:
                return  # short work draws nothing
            self._start()
        assert self._bar is not None and self._task is not None
        self._bar.update(self._task, completed=done, total=self.total)
        if finished:
            self.close()

    __call__ = update

    def advance(self, steps: int = 1) -> None:
        self.update(self.done + steps)

    def close(self) -> None:
        """Draw the final state and leave the bar's line (idempotent)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        # printed lines of a command that also writes to stdout go above the bar when both share the terminal
        self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                                 console=Console(file=sys.stderr), redirect_stdout=sys.stdout.isatty(),
                                 redirect_stderr=False)
        self._bar.start()
        self._task = self._bar.add_task(self.label, total=self.total, completed=self.done)
        self._bar.tasks[0].start_time = self._bar.get_time() - (time.monotonic() - self._t0)  # elapsed since created


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None, left: Collection[str]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    for name in columns:
        table.add_column(name, justify="left" if name in left else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    return table


def format_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None,
                 left: Collection[str] = ()) -> str:
    """Rows under a header as plain text, one row a line, columns aligned right (numbers) or left (the columns
    named in ``left``); as wide as the rows need, never wrapped, no trailing blanks, no final newline."""
    from rich.console import Console

    text = io.StringIO()
    Console(file=text, width=10_000, highlight=False, color_system=None).print(_table(columns, rows, title, left))
    return "\n".join(line.rstrip() for line in text.getvalue().splitlines())


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None,
                left: Collection[str] = (), file: TextIO | None = None) -> None:
    """:func:`format_table` printed to ``file`` (stdout), with a bold header on a terminal."""
    from rich.console import Console

    out = file if file is not None else sys.stdout
    if out.isatty():
        Console(file=out, highlight=False).print(_table(columns, rows, title, left))
    else:
        out.write(format_table(columns, rows, title=title, left=left) + "\n")
