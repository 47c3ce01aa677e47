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
rank that :func:`commscope.measure.launch.spawn` forks draws from that rank (it pickles without its bar, for ``spawn``).

Tables go through :func:`format_table` / :func:`print_table`, so that every command's rows line up the same way
and fit the terminal they are printed on: no number, name or header is ever cut (rich's own tables cut ``dp=128``
to ``1…`` at 120 columns); columns a narrow terminal cannot hold move to a block of their own, prose columns wrap.
Prose lines wider than the terminal wrap at a blank (:func:`fitted_stdout`, which the command line wraps around
every command). Piped, a table is one row a line and nothing wraps.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Self, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress, TaskID

__all__ = ["Progress", "fitted_stdout", "format_table", "print_table", "terminal_width"]


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


#: Columns between two table columns; a table that does not fit tries a single blank before it moves columns.
_GAP = 2
#: The narrowest a prose column (``wrap``) is wrapped to inside its table; narrower, it moves under its row.
_MIN_PROSE = 24


def terminal_width(file: TextIO | None = None) -> int | None:
    """Columns of the terminal ``file`` (stdout) is, or None when it is none (a pipe, a file): then tables are as
    wide as their rows. ``COLUMNS`` wins over the terminal's own size, as in :func:`shutil.get_terminal_size`."""
    out = file if file is not None else sys.stdout
    try:
        if not out.isatty():
            return None
    except (AttributeError, ValueError):  # a closed or fake stream
        return None
    text = os.environ.get("COLUMNS", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    try:
        return os.get_terminal_size(out.fileno()).columns or None
    except (OSError, ValueError):
        return None


class _Layout:
    """Where every column of one table goes for a given width (see :func:`format_table`)."""

    def __init__(self, columns: Sequence[str], rows: Iterable[Sequence[Any] | str], left: Collection[str],
                 wrap: Collection[str], keys: int) -> None:
        from rich.cells import cell_len

        #: the body in order: a row's cells, or a section label (a str) printed on its own line in every block
        self.body: list[list[str] | str] = [row if isinstance(row, str) else [str(cell) for cell in row] for row in rows]
        cells = [row for row in self.body if not isinstance(row, str)]
        self.columns, self.keys = list(columns), keys
        self.right = [name not in left for name in columns]
        self.prose = [name in wrap for name in columns]
        self.natural = [max([cell_len(name), *(cell_len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
        self.floor = [min(n, max(cell_len(name), _MIN_PROSE)) for n, name in zip(self.natural, columns, strict=True)]

    def span(self, indices: Sequence[int], widths: Sequence[int], gap: int) -> int:
        return sum(widths[i] for i in indices) + gap * max(len(indices) - 1, 0)

    def fit_prose(self, indices: Sequence[int], width: int, gap: int) -> list[int] | None:
        """Widths of ``indices`` within ``width``, the prose columns among them narrowed (not below
        :data:`_MIN_PROSE` or their header) so that the rest fits; None when even that does not fit."""
        widths = list(self.natural)
        if self.span(indices, widths, gap) <= width:
            return widths
        prose = [i for i in indices if self.prose[i]]
        if not prose:
            return None
        room = width - self.span(indices, [0 if self.prose[i] else w for i, w in enumerate(widths)], gap)
        if room < sum(self.floor[i] for i in prose):
            return None
        want = sum(self.natural[i] for i in prose)  # the room shared in proportion to what each would take
        for i in prose:
            widths[i] = max(self.floor[i], min(self.natural[i], room * self.natural[i] // want))
        while sum(widths[i] for i in prose) > room:  # rounded up to the floors: take back from the widest
            widest = max(prose, key=lambda i: widths[i] - self.floor[i])
            widths[widest] -= 1
        return widths

    def blocks(self, indices: list[int], width: int, gap: int) -> list[list[int]]:
        """``indices`` packed in order into blocks no wider than ``width``, each led by the key columns."""
        keys = indices[:self.keys]
        out: list[list[int]] = []
        block = list(keys)
        for i in indices[len(keys):]:
            if len(block) > len(keys) and self.span([*block, i], self.natural, gap) > width:
                out.append(block)
                block = list(keys)
            block.append(i)
        out.append(block)
        return out


def _wrap_cell(text: str, width: int) -> list[str]:
    """``text`` wrapped at blanks to ``width``, a number kept on the line of its unit (``141 GB``)."""
    import textwrap

    glued = _NUMBER_UNIT.sub("\\1\xa0\\2", text)
    lines = textwrap.wrap(glued, width, break_long_words=False, break_on_hyphens=False) or [""]
    return [line.replace("\xa0", " ") for line in lines]


def _render(layout: _Layout, indices: Sequence[int], widths: Sequence[int], gap: int,
            under: Sequence[int] = (), width: int | None = None) -> list[tuple[str, bool]]:
    """Lines of one block, each with whether it is the header: ``indices`` as columns of ``widths`` (prose
    wrapped in its column), and the columns ``under`` as indented ``name: text`` lines beneath each row."""
    from rich.cells import cell_len

    def line(cells: Sequence[str]) -> str:
        parts = []
        for i, text in zip(indices, cells, strict=True):
            pad = " " * max(widths[i] - cell_len(text), 0)
            parts.append(pad + text if layout.right[i] else text + pad)
        return (" " * gap).join(parts).rstrip()

    out = [(line([layout.columns[i] for i in indices]), True)]
    for row in layout.body:
        if isinstance(row, str):  # a section's label, a blank line before all but the first
            out += ([("", False)] if len(out) > 1 else []) + [(row, False)]
            continue
        wrapped = [_wrap_cell(row[i], widths[i]) if layout.prose[i] else [row[i]] for i in indices]
        for k in range(max(len(w) for w in wrapped)):
            out.append((line([w[k] if k < len(w) else "" for w in wrapped]), False))
        for i in under:
            if row[i]:
                lead = f"    {layout.columns[i]}: "
                room = max((width or 10_000) - cell_len(lead), _MIN_PROSE)
                for k, text in enumerate(_wrap_cell(row[i], room)):
                    out.append(((lead if k == 0 else " " * cell_len(lead)) + text, False))
    return out


def _lines(columns: Sequence[str], rows: Iterable[Sequence[Any] | str], title: str | None, left: Collection[str],
           wrap: Collection[str], keys: int, width: int | None) -> list[tuple[str, bool]]:
    layout = _Layout(columns, rows, left, wrap, keys)
    every = list(range(len(columns)))
    out: list[tuple[str, bool]] = [(title, False)] if title else []
    if width is None:
        return out + _render(layout, every, layout.natural, _GAP)
    for gap in (_GAP, 1):  # the whole table in one block, one row a line
        if layout.span(every, layout.natural, gap) <= width:
            return out + _render(layout, every, layout.natural, gap)
    for gap in (_GAP, 1):  # the whole table in one block, prose wrapped in its column
        widths = layout.fit_prose(every, width, gap)
        if widths is not None:
            return out + _render(layout, every, widths, gap)
    # the columns in blocks one after the other, each led by the key columns; the prose last, in its own block
    # when it fits beside the keys, else under each row of the first block
    prose = [i for i in every if layout.prose[i]]
    rest = [i for i in every if not layout.prose[i]]
    leads = rest[:keys]
    gap = _GAP if layout.span(rest, layout.natural, _GAP) <= width else 1
    prose_widths = layout.fit_prose([*leads, *prose], width, gap) if prose else None
    under = prose if prose and prose_widths is None else []
    for k, block in enumerate(layout.blocks(rest, width, gap)):
        out += ([("", False)] if k else []) + _render(layout, block, layout.natural, gap, under if k == 0 else (), width)
    if prose_widths is not None:
        out += [("", False)] + _render(layout, [*leads, *prose], prose_widths, gap)
    return out


def format_table(columns: Sequence[str], rows: Iterable[Sequence[Any] | str], *, title: str | None = None,
                 left: Collection[str] = (), wrap: Collection[str] = (), keys: int = 1,
                 width: int | None = None) -> str:
    """Rows under a header as plain text, one row a line, columns aligned right (numbers) or left (the columns
    named in ``left``); no trailing blanks, no final newline.

    No cell is ever cut. As wide as the rows need when stdout is no terminal; on a terminal (or with ``width``)
    a table wider than the screen first tries one blank between columns, then wraps its prose columns (``wrap``)
    in their column, then puts the columns in blocks one after the other, each led by the first ``keys`` columns
    so that its rows can be told apart (the prose in a block of its own, or under each row: ``why: ...``).
    A row given as a str is a section's label, on a line of its own (in every block).
    """
    width = terminal_width() if width is None else width
    return "\n".join(text for text, _ in _lines(columns, rows, title, left, wrap, keys, width))


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any] | str], *, title: str | None = None,
                left: Collection[str] = (), wrap: Collection[str] = (), keys: int = 1,
                file: TextIO | None = None) -> None:
    """:func:`format_table` printed to ``file`` (stdout), fitted to its width and with bold headers on a terminal."""
    out = file if file is not None else sys.stdout
    width = terminal_width(out)
    lines = _lines(columns, rows, title, left, wrap, keys, width)
    if width is None:
        out.write("\n".join(text for text, _ in lines) + "\n")
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=out, highlight=False, soft_wrap=True)
    for text, header in lines:
        console.print(Text(text, style="bold" if header else ""))


class _FittedStdout(io.TextIOBase):
    """stdout on a terminal, whose prose lines wider than the screen wrap at a blank (tables fit themselves
    before they get here, and a line that looks like a table's row is left alone), each continuation indented as
    its line is (two more after ``note:`` and the like; a ``# `` comment, as nccl-tests' headers are, continues as
    one)."""

    def __init__(self, out: TextIO, width: int) -> None:
        self.out, self.width, self.pending = out, width, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.out.write(self._fit(line) + "\n")
        return len(text)

    def _fit(self, line: str) -> str:
        import textwrap

        from rich.cells import cell_len

        if "\x1b" in line or cell_len(line) <= self.width or _TABLE_ROW.search(line):
            return line  # a table's row is never wrapped as prose: tables fit themselves (format_table)
        lead = line[:len(line) - len(line.lstrip(" "))]
        hang = "#   " if line.startswith("# ") else lead + ("  " if _LABEL.match(line[len(lead):]) else "")
        glued = _NUMBER_UNIT.sub("\\1\xa0\\2", line)  # a number stays on the line of its unit (textwrap breaks at ASCII blanks)
        return "\n".join(textwrap.wrap(glued, self.width, subsequent_indent=hang, break_long_words=False,
                                       break_on_hyphens=False) or [glued]).replace("\xa0", " ")

    def flush(self) -> None:
        if self.pending:
            self.out.write(self.pending)
            self.pending = ""
        self.out.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.out.encoding


#: A line with two gaps of several blanks between words: a table's row, not prose.
_TABLE_ROW = re.compile(r"\S {2,}\S.* {2,}\S")
#: A number and the unit after it (``1.12 MiB``, ``3 ms``), kept together when a line wraps.
_NUMBER_UNIT = re.compile(r"(\d) ((?:[KMGT]i?)?B(?:/s)?|[munp]?s|[KMGPT]?FLOP(?:/s)?|%|GB/s|Gb/s|x)(?=\W|$)")
#: A line that starts with a label (``note: ``, ``warning: ``, ``#3: ``): its continuations hang under the text.
_LABEL = re.compile(r"[\w#][\w .'(),/-]{0,60}: ")


@contextlib.contextmanager
def fitted_stdout(*, enabled: bool = True) -> Iterator[None]:
    """While inside, lines printed to stdout wider than its terminal wrap at a blank (nothing changes in a pipe, or
    when not ``enabled``)."""
    width = terminal_width() if enabled else None
    if width is None:
        yield
        return
    saved = sys.stdout
    fitted = _FittedStdout(saved, width)
    sys.stdout = fitted
    try:
        yield
    finally:
        fitted.flush()
        if sys.stdout is fitted:
            sys.stdout = saved
