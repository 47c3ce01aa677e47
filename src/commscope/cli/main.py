"""``commscope`` command: one sub-command per task; bad input exits 2 with one clear line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from commscope.errors import ConfigError

_COMMANDS = ("traffic", "estimate", "plan", "presets", "record", "summarize", "compare", "bench", "fit", "calibrate", "report",
             "shapes", "workload", "moe", "tune", "validate", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"commscope {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"commscope {args.command}: error: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `commscope traffic --json | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
