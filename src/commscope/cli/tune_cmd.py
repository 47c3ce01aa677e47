"""``commscope tune``: measure every backend per op, size and group size; write the table the mixed runtime uses.

    commscope tune --nproc 4 --ops all_reduce,all_gather,reduce_scatter,all_to_all -b 1K -e 64M --out tuning.json
    torchrun --nproc-per-node 8 -m commscope.measure.tune -b 1K -e 64M --out tuning.json     # inside a job (the real network)
    commscope tune --show tuning.json [--force]                                      # a table's selection, checked

The sizes, iterations and check flags are ``commscope bench``'s (nccl-tests'); ``--backend`` takes a list
here. The table is written by the launching process (or rank 0) and its selection printed: per op and group
size, the winner per size range and the crossover sizes. A failed data check still writes the table (rows
that failed never win) and exits 1.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from commscope.errors import ConfigError
from commscope.units import format_bytes

#: Exit status when a data check found wrong results or a rank failed.
EXIT_FAILED = 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="measure every backend per op and size; write the table for the mixed runtime",
                       description="Time each collective on every available torch.distributed backend (gloo; NCCL "
                                   "with a GPU per rank) and on commscope's point-to-point algorithms, over message "
                                   "sizes and group sizes, with the bench harness; write the measurements and the "
                                   "winner per size range (crossovers) as a tuning table for `commscope.measure.tune.init`.")
    add_tune_args(p)
    p.set_defaults(func=run)


def add_tune_args(p: argparse.ArgumentParser) -> None:
    """``commscope bench``'s flags (sizes, iterations, check, groups, ranks), tune's defaults, and the rule's."""
    from commscope.cli.bench_cmd import add_bench_args
    from commscope.measure.tune.table import TUNABLE_OPS

    add_bench_args(p)
    p.set_defaults(ops=",".join(TUNABLE_OPS[:4]), out=Path("tuning.json"))
    _help(p, "ops", f"comma-separated collectives among {', '.join(TUNABLE_OPS)} "
                    f"(default {','.join(TUNABLE_OPS[:4])})")
    _help(p, "backend", "comma-separated backends to measure: gloo, nccl, and the algorithms ring, "
                        "recursive_doubling, recursive_halving, pairwise, bruck, binomial (default: all that can run)")
    _help(p, "groups", "group sizes to measure, e.g. 2,4,8 (default: 2 and --nproc, those dividing it)")
    _help(p, "out", "write the tuning table here (default tuning.json)")
    _help(p, "no_plot", argparse.SUPPRESS)
    _help(p, "json", "print the table as JSON instead of the selection")
    t = p.add_argument_group("selection")
    t.add_argument("--tie-tolerance", type=float, default=0.05, metavar="F",
                   help="candidates within this fraction of the fastest count as tied; a tie goes to the native "
                        "backend, and another must also beat it by more than the rows' measured spread (default 0.05)")
    t.add_argument("--show", type=Path, default=None, metavar="TABLE",
                   help="measure nothing: print the selection of this tuning table, after checking that it was "
                        "measured on a machine like this one")
    _help(p, "force", "replace the tuning table of an earlier run at --out; with --show: print it even if it was "
                      "measured on another machine")


def _help(p: argparse.ArgumentParser, dest: str, text: str) -> None:
    """Reword a flag ``add_bench_args`` defined, where tune gives it another default or meaning."""
    for action in p._actions:
        if action.dest == dest:
            action.help = text


def config_from_args(args: argparse.Namespace):
    from commscope.cli.bench_cmd import config_from_args as sweep_config
    from commscope.measure.tune.suite import TuneConfig

    only = tuple(b.strip() for b in args.backend.split(",") if b.strip()) if args.backend else None
    return TuneConfig(sweep=sweep_config(args), candidates=only, tie_tolerance=args.tie_tolerance)


def run(args: argparse.Namespace, command: str | None = None) -> int:
    from commscope.cli.bench_cmd import short_table
    from commscope.cli.terminal import Progress
    from commscope.measure.launch import LaunchError, ranks_from_env
    from commscope.measure.tune.suite import run_tuning

    if args.show is not None:
        return _show(args)
    cfg = config_from_args(args)
    from commscope.cli.common import check_out_file

    check_out_file(args.out, "out")  # before any rank starts: a sweep is never lost to an unwritable path
    command = command or "commscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    from commscope.cli.outputs import claim_file

    if args.nproc is not None:
        with claim_file(args, Path(args.out)):  # before any rank starts: one run writes the table
            try:
                with Progress("tune", quiet=bool(args.json)) as progress:
                    table = run_tuning(cfg, args.nproc, timeout_s=args.timeout, quiet=bool(args.json),
                                       command=command, progress=progress, oversubscribe=args.oversubscribe,
                                       short=short_table(args))
            except LaunchError as exc:
                print(f"commscope tune: error: {exc.summary}", file=sys.stderr)
                return EXIT_FAILED
            return _finish(args, table)
    env = ranks_from_env()
    if env is None:
        raise ConfigError("nproc", None, "give --nproc N to start N ranks on this machine, or run inside a torchrun "
                                         "job: torchrun --nproc-per-node 8 -m commscope.measure.tune ...")
    if env.rank != 0:
        _in_job(cfg, env, args, command)
        return 0
    with claim_file(args, Path(args.out)):  # rank 0 writes the table: it claims it before joining the job
        return _finish(args, _in_job(cfg, env, args, command))


def _in_job(cfg, env, args: argparse.Namespace, command: str):
    """Every rank of a torchrun job measures; rank 0 gets the table."""
    from datetime import timedelta

    import torch.distributed as dist

    from commscope.measure.bench.sweep import check_memory, check_world
    from commscope.cli.bench_cmd import short_table
    from commscope.cli.terminal import Progress
    from commscope.measure.tune.suite import default_group_sizes, measure, num_gpus, plan_candidates, table_from_rows
    from commscope.measure.tune.table import machine_here

    group_sizes = cfg.sweep.group_sizes or default_group_sizes(env.world_size)
    cfg = replace(cfg, sweep=replace(cfg.sweep, group_sizes=tuple(group_sizes)))
    check_world(cfg.sweep, env.world_size, "gloo")
    check_memory(cfg.sweep, group_sizes, env.local_world_size, "gloo")
    machine = machine_here()
    gpus = num_gpus() if "nccl" in machine.backends else 0
    candidates, skipped = plan_candidates(cfg.sweep.ops, env.local_world_size, machine, only=cfg.candidates,
                                          num_gpus=gpus)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    try:
        with Progress("tune", quiet=bool(args.json) or env.rank != 0) as progress:
            rows, hosts = measure(cfg, candidates, emit=None if args.json else print, command=command, progress=progress,
                                  short=short_table(args))
    finally:
        dist.destroy_process_group()
    return table_from_rows(rows, machine=machine, hosts=hosts, world_size=env.world_size, group_sizes=group_sizes,
                           candidates=candidates, skipped=skipped, cfg=cfg, command=command)


def format_selection(table) -> list[str]:
    """The selection as lines: per op and group size, each backend and the largest size it gets."""
    from commscope.cli.terminal import format_table
    from commscope.measure.tune.select import selection_notes, selection_summary

    lines = [(f"# selection ({table.machine.device}, torch {table.machine.torch_version}, "
             f"{table.world_size} ranks on {table.num_hosts} host(s); another backend than the native one only where "
             f"it is faster by more than {table.tie_tolerance:.0%} and than the measured spread)")]
    rows = []
    for entry in selection_summary(table):
        parts = [f"{seg['backend']} up to {format_bytes(seg['max_size_bytes'])}" if seg["max_size_bytes"] is not None
                 else f"{seg['backend']} {'beyond' if len(entry['segments']) > 1 else 'at every size'}"
                 for seg in entry["segments"]]
        rows.append((entry["op"], f"n={entry['group_size']}", entry["device"], ", ".join(parts)))
    columns = ("op", "group", "device", "backend per size")
    lines += format_table(columns, rows, left=columns, wrap=("backend per size",)).split("\n")
    for name, why in table.skipped.items():
        lines.append(f"# not measured: {name} ({why})")
    lines += [f"note: {note}" for note in selection_notes(table)]
    return lines


def _show(args: argparse.Namespace) -> int:
    from commscope.measure.tune.files import read_table, table_document
    from commscope.measure.tune.table import ensure_compatible, machine_here

    if args.show.is_dir() or not args.show.exists():  # a pipe or an unreadable file: read_table says which
        raise ConfigError("show", str(args.show), "is a directory; give a tuning table file" if args.show.is_dir()
                          else "no such file; give a tuning table that `commscope tune --out` wrote")
    table = read_table(args.show)
    for diff in ensure_compatible(table, machine_here(), allow_mismatch=args.force, source=str(args.show)):
        print(f"commscope tune: warning: {args.show} was measured on another machine: {diff}", file=sys.stderr)
    if args.json:
        json.dump(table_document(table), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print("\n".join(format_selection(table)))
    return 0


def _finish(args: argparse.Namespace, table) -> int:
    from commscope.measure.tune.files import table_document, write_table

    if args.json:
        json.dump(table_document(table), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print("\n".join(format_selection(table)))
    out = write_table(table, args.out)
    print(f"commscope tune: wrote {out}", file=sys.stderr)
    wrong = [m for m in table.measurements if m.wrong]
    if wrong:
        names = sorted({f"{m.backend} {m.op}" for m in wrong})
        print(f"commscope tune: error: DATA CHECK FAILED for {', '.join(names)}: those rows never win, but the "
              "backend is broken here", file=sys.stderr)
        return EXIT_FAILED
    return 0


def main(argv=None) -> int:
    """``python -m commscope.measure.tune``: the same command, for ``torchrun -m``."""
    parser = argparse.ArgumentParser(prog="python -m commscope.measure.tune", description="see `commscope tune -h`")
    add_tune_args(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    try:
        return run(args, command="python -m commscope.measure.tune " + " ".join(shlex.quote(a) for a in argv))
    except ConfigError as exc:
        print(f"commscope tune: error: {exc}", file=sys.stderr)
        return 2
