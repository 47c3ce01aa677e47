"""The command line's own parser and one-line OS errors: kept apart from :mod:`commscope.cli.common` (which
imports the specs and numpy) so that ``commscope --help`` stays a light import."""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Any, NoReturn

__all__ = ["Parser", "os_error_message"]


class _Formatter(argparse.HelpFormatter):
    """Help whose placeholders are the field's name (``--tp TP``), not where the value is kept (``PARALLEL.TP``),
    wrapped between words only."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return action.dest.rsplit(".", 1)[-1].upper()

    def _split_lines(self, text: str, width: int) -> list[str]:
        """argparse's wrapping of a help text, which never breaks inside a word, a flag or a list (argparse's own
        cut ``all_reduce,all_gather,...`` mid-word and would cut ``--time-budget`` at its hyphen)."""
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_long_words=False,
                             break_on_hyphens=False)


class _StoreSaid(argparse._StoreAction):
    """argparse's ``store``, which says so when an option given twice changes its value: the last one given is
    kept (so a wrapper's defaults followed by the user's own still work), but not silently (``--tp 2 ... --tp 4``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        # per parse: its namespace (a parser parsed again starts afresh, see Parser.parse_known_args)
        given = parser.__dict__.setdefault("_commscope_given", {}).setdefault(id(namespace), {})
        if option_string is not None:
            first = given.get(self.dest, _UNSET)
            if first is not _UNSET and first[1] != values:
                sys.stderr.write(f"{parser.prog}: warning: {option_string} given twice ({first[0]} {first[1]}, then "
                                 f"{option_string} {values}): using {values}\n")
            given[self.dest] = (option_string, values)
        super().__call__(parser, namespace, values, option_string)


_UNSET = object()


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line with a pointer to ``--help`` (exit 2), not a usage dump, and which
    says when an option given twice changes its value (:class:`_StoreSaid`).

    Sub-commands inherit it: ``add_subparsers`` makes sub-parsers of the class of the parser it hangs from.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreSaid)
        self.register("action", "store", _StoreSaid)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.__dict__.pop("_commscope_given", None)  # what this parse was given, option by option
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        # argparse names the flag and the value of a mistyped number but not what it wanted
        for kind, wanted in _WANTED.items():
            if f"invalid {kind} value:" in message:
                message += f": {wanted}"
                break
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


#: What argparse's type conversions accept, said after its "invalid <type> value: 'x'".
_WANTED = {"int": "expected a whole number, e.g. 8", "float": "expected a number, e.g. 0.5 or 1e9"}


def os_error_message(exc: OSError) -> str:
    """One line for an OSError a command met reading or writing a user's path (full disk, not a directory, ...)."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason += " (the disk is full)"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        reason += " (choose a writable place)"
    elif exc.errno in (errno.EEXIST, errno.ENOTDIR):
        reason += " (a file is in the way of a directory)"
    where = exc.filename if exc.filename is not None else ""
    return f"{reason}: {where}" if where else reason
