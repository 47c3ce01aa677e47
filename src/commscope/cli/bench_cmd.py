"""``commscope bench``: nccl-tests-style bandwidth sweeps through torch.distributed.

    commscope bench --nproc 4 --backend gloo -b 8 -e 64M -f 2 --out bench.json     # starts its own ranks
    torchrun --nproc-per-node 8 -m commscope.measure.bench -b 8 -e 1G -f 2 --out bench.json  # inside a job (NCCL on GPUs)

Rank 0 prints the table as rows are measured; the JSON (``--out``) and the busbw plot beside it are written
at the end. A failed data check (``-c 1``, the default) still writes the rows, then exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from commscope.errors import ConfigError

#: Exit status when the data check found wrong results or a rank failed.
EXIT_FAILED = 1
#: Suffixes of pictures: an --out with one would be the JSON of the rows under a picture's name, and the plot
#: beside it (``.png``) would land on the same path and overwrite the measurements.
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".gif", ".webp")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure collective bandwidth (nccl-tests semantics, any torch backend)",
                       description="Sweep collectives over message sizes and group sizes through torch.distributed, "
                                   "with nccl-tests' flags, sizes, algbw/busbw and table; JSON rows for `commscope fit`.")
    add_bench_args(p)
    p.set_defaults(func=run)


def _size(text: str) -> int:
    from commscope.measure.bench.sweep import parse_sizes_arg

    try:
        return parse_sizes_arg(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.expected) from None


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 2,4,8; got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one group size")
    return values


def add_bench_args(p: argparse.ArgumentParser) -> None:
    from commscope.measure.bench.sweep import OPS, REDOPS

    g = p.add_argument_group("what to measure (nccl-tests' flags)")
    g.add_argument("--ops", default=",".join(OPS), help=f"comma-separated collectives (default: all of {', '.join(OPS)})")
    g.add_argument("-b", "--minbytes", type=_size, default=8, metavar="SIZE", help="smallest size, K/M/G suffixes (default 8)")
    g.add_argument("-e", "--maxbytes", type=_size, default=64 << 20, metavar="SIZE", help="largest size (default 64M)")
    g.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size multiplier (default 2; 1: add -i)")
    g.add_argument("-i", "--stepbytes", type=_size, default=1 << 20, metavar="SIZE", help="size increment when -f 1 (default 1M)")
    g.add_argument("-n", "--iters", type=int, default=None,
                   help="timed iterations per size (default: as many as fit in --time-budget, 10-1000)")
    g.add_argument("-w", "--warmup_iters", "--warmup-iters", dest="warmup_iters", type=int, default=5,
                   help="warm-up iterations per size (default 5)")
    g.add_argument("-c", "--check", type=int, choices=(0, 1), nargs="?", const=1, default=1,
                   help="check every result on every rank: -c, -c 1 (default) or -c 0 to skip")
    g.add_argument("-d", "--datatype", default="float", help="float, half, bfloat16, double, int8, uint8, int32, int64")
    g.add_argument("-o", "--op", default="sum", choices=REDOPS, help="reduction (default sum; avg needs NCCL)")
    g.add_argument("-r", "--root", type=int, default=0, help="root of broadcast/reduce, index in the group (default 0)")
    g.add_argument("-a", "--average", type=int, choices=(0, 1, 2, 3), default=3,
                   help="combine ranks' times: 0 rank 0, 1 average (nccl-tests' default), 2 min, 3 max (default)")
    g.add_argument("--groups", type=_int_list, default=None, metavar="N,N,...",
                   help="measure on subgroups of these sizes (communication scale), e.g. 2,4,8 (default: all ranks)")
    g.add_argument("--group-mode", choices=("concurrent", "sequential"), default="concurrent",
                   help="groups of one size run all at once (default, as in training) or one at a time")
    g.add_argument("--time-budget", type=float, default=0.2, metavar="S",
                   help="timed seconds per size when -n is not given (default 0.2)")
    g.add_argument("--noisy-cv", type=float, default=0.2, help="flag rows whose coefficient of variation exceeds this")
    g.add_argument("--inject-error-rank", type=int, default=None, help=argparse.SUPPRESS)  # test hook: corrupt a result
    r = p.add_argument_group("where it runs")
    r.add_argument("--nproc", type=int, default=None,
                   help="start this many local ranks (forked); without it, join the torchrun job of this process")
    r.add_argument("--backend", default=None, help="gloo or nccl (default: nccl when CUDA is available, else gloo)")
    r.add_argument("--oversubscribe", action="store_true",
                   help="start --nproc ranks even beyond 4 per core (default: refuse more)")
    r.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                   help="seconds before hung ranks are killed (default 1800)")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, default=None, help="write rows and metadata as JSON (and the plot beside it, .png)")
    o.add_argument("--no-plot", action="store_true", help="do not write the busbw plot")
    o.add_argument("--force", action="store_true", help="replace the JSON (and plot) of an earlier run at --out")
    o.add_argument("--json", action="store_true", help="print JSON instead of the table")
    o.add_argument("--wide", action="store_true",
                   help="nccl-tests' every column even on a terminal narrower than its lines (a pipe always gets them)")


def config_from_args(args: argparse.Namespace):
    from commscope.measure.bench.sweep import SweepConfig

    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    return SweepConfig(ops=ops, min_bytes=args.minbytes, max_bytes=args.maxbytes, step_factor=args.stepfactor,
                       step_bytes=args.stepbytes, iters=args.iters, warmup_iters=args.warmup_iters,
                       time_budget_s=args.time_budget, check=bool(args.check), dtype=args.datatype, redop=args.op,
                       root=args.root, average=args.average, group_sizes=args.groups, group_mode=args.group_mode,
                       noisy_cv=args.noisy_cv, inject_error_rank=args.inject_error_rank)


def _print_line(line: str) -> None:
    print(line, flush=True)


def short_table(args: argparse.Namespace) -> bool:
    """Whether the table goes out in its short form: on a terminal narrower than nccl-tests' lines, unless --wide."""
    from commscope.measure.bench.sweep import FULL_ROW_WIDTH
    from commscope.cli.terminal import terminal_width

    width = terminal_width()
    return not args.wide and width is not None and width < FULL_ROW_WIDTH


def _rank_main(rank: int, world_size: int, cfg, quiet: bool, command: str, short: bool = False):
    """One rank's sweep; returns (result on rank 0 else None, whether the data check failed)."""
    from commscope.measure.bench.sweep import WrongResultsError, run_sweep
    from commscope.cli.terminal import Progress

    try:
        with Progress("bench", quiet=quiet or rank != 0) as progress:
            result = run_sweep(cfg, emit=None if quiet else _print_line, command=command, progress=progress,
                               short=short)
        failed = False
    except WrongResultsError as exc:
        result, failed = exc.result, True
    return (result if rank == 0 else None), failed


def _default_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def plot_path(out: Path) -> Path:
    """Where the busbw plot of the rows written to ``out`` goes: beside it, as ``.png``."""
    return out.with_suffix(".png")


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any rank starts, an --out the rows could not be written to or whose plot would overwrite
    them (``--out bench.png``: the plot's own name)."""
    from commscope.cli.common import check_out_file

    if args.out is None:
        return
    out = Path(args.out)
    if out.suffix.lower() in IMAGE_SUFFIXES:
        raise ConfigError("out", str(out), f"is the JSON of the measured rows, not a picture; give a .json name such "
                                           f"as {out.with_suffix('.json')} (the busbw plot is written beside it, as "
                                           f"{plot_path(out.with_suffix('.json'))})")
    check_out_file(out, "out")
    plot = plot_path(out)
    if not args.no_plot and plot.is_dir():
        raise ConfigError("out", str(out), f"the busbw plot beside it, {plot}, is a directory; choose another --out "
                                           "or give --no-plot")


def claim_outputs(args: argparse.Namespace):
    """The claim on --out (and the plot beside it) for this run, or None without --out: another run writing them is
    refused, and so are the files of an earlier run unless --force (:func:`commscope.cli.outputs.claim_file`)."""
    from commscope.cli.outputs import claim_file

    if args.out is None:
        return None
    out = Path(args.out)
    return claim_file(args, out, beside=() if args.no_plot else (plot_path(out),))


def run(args: argparse.Namespace, command: str | None = None) -> int:
    from commscope.measure.bench.sweep import check_memory, check_world
    from commscope.measure.launch import LaunchError, ranks_from_env

    cfg = config_from_args(args)
    check_outputs(args)
    command = command or "commscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    quiet = bool(args.json)
    backend = args.backend or _default_backend()
    if args.nproc is not None:
        if args.nproc < 2:
            raise ConfigError("nproc", args.nproc, "a collective needs at least 2 ranks")
        group_sizes = check_world(cfg, args.nproc, backend)
        from commscope.measure.launch import check_backend, check_nproc

        check_nproc(args.nproc, oversubscribe=args.oversubscribe)
        check_backend(backend, args.nproc)
        check_memory(cfg, group_sizes, args.nproc, backend)
        from commscope.measure.launch import spawn

        claim = claim_outputs(args)  # before any rank starts
        try:
            try:
                outs = spawn(_rank_main, args.nproc, args=(cfg, quiet, command, short_table(args)), backend=backend,
                             timeout_s=args.timeout, oversubscribe=args.oversubscribe)
            except LaunchError as exc:
                print(f"commscope bench: error: {exc.summary}", file=sys.stderr)
                return EXIT_FAILED
            result, failed = outs[0]
            return _finish(args, result, failed)
        finally:
            if claim is not None:
                claim.release()
    env = ranks_from_env()
    if env is None:
        raise ConfigError("nproc", None, "give --nproc N to start N ranks on this machine, or run inside a torchrun job "
                                         "(RANK and WORLD_SIZE set): torchrun --nproc-per-node 8 -m commscope.measure.bench ...")
    import torch
    import torch.distributed as dist

    # rank 0 writes --out: it claims it before joining the job (refused, it exits, and torchrun stops the others)
    claim = claim_outputs(args) if env.rank == 0 else None
    created = False
    if not dist.is_initialized():
        check_memory(cfg, check_world(cfg, env.world_size, backend), env.local_world_size, backend)
        from commscope.measure.launch import check_backend

        check_backend(backend)
        device_id = None
        if "nccl" in backend:
            device_id = torch.device("cuda", env.local_rank)
            torch.cuda.set_device(device_id)
        from datetime import timedelta

        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout), device_id=device_id)
        created = True
    try:
        try:
            result, failed = _rank_main(env.rank, env.world_size, cfg, quiet, command, short_table(args))
        finally:
            if created:
                dist.destroy_process_group()
        if env.rank != 0:
            return EXIT_FAILED if failed else 0
        return _finish(args, result, failed)
    finally:
        if claim is not None:
            claim.release()


def _finish(args: argparse.Namespace, result, failed: bool) -> int:
    """Rank 0 / the launching parent: JSON, plot, and the exit status."""
    if not result.rows:  # check_world refuses sizes that hold no element; nothing else may pass as a result
        print("commscope bench: error: no row was measured (no size in -b..-e held an element of the op); "
              "nothing written", file=sys.stderr)
        return EXIT_FAILED
    data = result.to_dict()
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    if args.out is not None:
        from commscope.io.atomic import write_text

        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text(out, json.dumps(data, indent=2) + "\n")
        print(f"commscope bench: wrote {out}", file=sys.stderr)
        if not args.no_plot:
            _plot(result, plot_path(out))
    noisy = sum(r.noisy for r in result.rows)
    if noisy:
        print(f"commscope bench: {noisy} of {len(result.rows)} rows are noisy (cv > {result.meta.get('noisy_cv')}): "
              "more iterations (-n, --time-budget) or a quieter machine would make them stable", file=sys.stderr)
    if failed:
        print(f"commscope bench: error: DATA CHECK FAILED: {result.num_wrong} wrong elements "
              f"({sum(1 for r in result.rows if r.wrong)} rows); these numbers must not be trusted", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _plot(result, path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("commscope bench: matplotlib is not installed, so no plot (pip install 'commscope[plots]')", file=sys.stderr)
        return
    from commscope.measure.bench.plot import plot_busbw

    meta = result.meta
    title = f"{meta.get('backend')} on {meta.get('num_hosts', 1)} host(s), {meta.get('world_size')} ranks"
    plot_busbw(result.rows, path, title=title)
    print(f"commscope bench: wrote {path}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m commscope.measure.bench``: the same command, for ``torchrun -m``."""
    parser = argparse.ArgumentParser(prog="python -m commscope.measure.bench",
                                     description="nccl-tests-style sweeps through torch.distributed (see `commscope bench -h`)")
    add_bench_args(parser)
    args = parser.parse_args(argv)
    try:
        return run(args, command="python -m commscope.measure.bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])))
    except ConfigError as exc:
        print(f"commscope bench: error: {exc}", file=sys.stderr)
        return 2
