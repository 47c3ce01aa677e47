"""``commscope`` command: one sub-command per task; bad input exits 2 with one clear line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from commscope.cli.common import Parser, os_error_message
from commscope.errors import ConfigError, JobFailed

_COMMANDS = ("traffic", "estimate", "plan", "presets", "record", "summarize", "compare", "bench", "fit", "calibrate", "report",
             "shapes", "workload", "moe", "tune", "validate", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="commscope",
        description="How distributed training communicates and what it costs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        module = __import__(f"commscope.cli.{name}_cmd", fromlist=["add_parser"])
        module.add_parser(sub)
    return parser


def _version() -> str:
    from commscope import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.error(f"give a command: {', '.join(_COMMANDS)}")
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"commscope {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except JobFailed as exc:  # a rank of a job commscope started died: name it, no traceback of the launcher
        print(f"commscope {args.command}: error: {getattr(exc, 'summary', exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `commscope traffic --json | head`
        return 0
    except OSError as exc:  # a path the user gave: missing, a file, unwritable, a full disk
        print(f"commscope {args.command}: error: {os_error_message(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
