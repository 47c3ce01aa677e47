"""``commscope`` command: one sub-command per task; bad input exits 2 with one clear line."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from commscope.cli.parser import Parser, os_error_message

#: Every sub-command and its one-line help, in the order ``--help`` lists them. A command's module
#: (``commscope.cli.<name>_cmd``) is imported only when that command is run: ``commscope --help`` imports none
#: and ``commscope traffic --help`` only traffic's. tests/cli/test_main.py holds these lines equal to the modules'.
_COMMANDS: dict[str, str] = {
    "traffic": "predict every communication op of one iteration and the per-GPU-pair traffic matrix",
    "estimate": "estimate iteration time, communication and bubble ratios",
    "plan": "rank parallelism configurations by predicted iteration time",
    "presets": "list the built-in models, clusters, GPUs and software stacks",
    "record": "run a torch.distributed job and record every communication op",
    "summarize": "summarise recorded logs: ops by axis, message sizes, traffic matrix",
    "compare": "compare recorded logs with the prediction for the same job",
    "bench": "measure collective bandwidth (nccl-tests semantics, any torch backend)",
    "fit": "fit latency and bandwidth per op and group size from bench or nccl-tests output",
    "report": "write one self-contained HTML report (heatmaps, bytes, sizes, time, schedule, measured)",
    "shapes": "GEMM efficiency of a model's shapes on its GPU, broken shape rules, faster shapes",
    "workload": "run a reference training with PyTorch's parallelism (and record it)",
    "moe": "MoE expert-parallel routing over iterations: simulate or analyze a trace",
    "tune": "measure every backend per op and size; write the table for the mixed runtime",
    "validate": "compare predicted with measured iteration times of runs in a CSV file",
    "calibrate": "measure this machine: a GPU's kernels into a GPU file, its collectives into a cluster file",
    "export": "hand a prediction or a recording to other tools: Chakra traces (ASTRA-sim), Parquet (DuckDB, Dask, Spark)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``commscope`` parser. Sub-command ``command`` gets its full parser (its module imported); the others
    are listed by name and help line only. ``None``: every sub-command in full."""
    parser = Parser(
        prog="commscope",
        description="How distributed training communicates and what it costs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_line in _COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"commscope.cli.{name}_cmd").add_parser(sub)
        else:
            sub.add_parser(name, help=help_line)
    return parser


def _command_of(argv: Sequence[str]) -> str:
    """The sub-command ``argv`` names (its first word; the top level takes no option with a value), or ''."""
    first = next((a for a in argv if not a.startswith("-")), "")
    return first if first in _COMMANDS else ""


def _version() -> str:
    from commscope import __version__

    return __version__


#: The optional packages a command may need, by the top-level module it imports: (what it is for, how to install
#: it). Without a GPU, PyTorch's CPU build comes from its own index: plain ``pip install torch`` pulls a CUDA build of
#: several GB (https://pytorch.org/get-started/locally/).
OPTIONAL_MODULES = {
    "torch": ("PyTorch (torch.distributed starts and records the ranks)",
              ("pip install 'commscope[torch]' (without a GPU, the CPU build: pip install torch "
               "--index-url https://download.pytorch.org/whl/cpu)")),
    "matplotlib": ("matplotlib (the plots)", "pip install 'commscope[plots]'"),
    "yaml": ("PyYAML", "pip install 'commscope[yaml]'"),
    "pyarrow": ("pyarrow (Parquet)", "pip install 'commscope[parquet]'"),
    "pandas": ("pandas", "pip install 'commscope[pandas]'"),
    "polars": ("polars", "pip install 'commscope[polars]'"),
    "duckdb": ("DuckDB", "pip install 'commscope[duckdb]'"),
    "chakra": ("mlc-chakra (Chakra traces)", "pip install 'commscope[chakra]'"),
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one line that says which optional package a command needs and how to install it, where ``exc`` is that
    package missing; None for any other missing module (a bug, which keeps its traceback)."""
    top = (exc.name or "").split(".")[0]
    if top not in OPTIONAL_MODULES:
        return None
    what, how = OPTIONAL_MODULES[top]
    return f"this command needs {what}, which is not installed: {how}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown and getattr(args, "command", None):  # the sub-command's words: point at its own --help
        print(f"commscope {args.command}: error: unrecognized arguments: {' '.join(unknown)} "
              f"(see `commscope {args.command} --help`)", file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "command", None):
        parser.error(f"give a command: {', '.join(_COMMANDS)}")
    from commscope.cli.terminal import fitted_stdout
    from commscope.errors import ConfigError, JobFailed

    try:
        # on a terminal, prose wider than the screen wraps at a blank; JSON is printed as it is, to be copied whole
        with fitted_stdout(enabled=not getattr(args, "json", False)):
            return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"commscope {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except JobFailed as exc:  # a rank of a job commscope started died: name it, no traceback of the launcher
        print(f"commscope {args.command}: error: {getattr(exc, 'summary', exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `commscope traffic --json | head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for it; files already written are kept
        print(f"commscope {args.command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:  # an optional extra this command needs (torch, matplotlib, ...) is missing
        needs = missing_extra(exc)
        if needs is None:
            raise
        print(f"commscope {args.command}: error: {needs}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user gave: missing, a file, unwritable, a full disk
        print(f"commscope {args.command}: error: {os_error_message(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
