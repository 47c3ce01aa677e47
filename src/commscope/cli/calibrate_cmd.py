"""``commscope calibrate --nproc 2 --out local.toml``: this machine as a cluster file (extra: torch).

    commscope calibrate --nproc 2 --out local.toml       # ~10-30 s on 2 cores
    commscope compare logs/ --bandwidth local.toml --time
    commscope estimate --model ref-gpt ... --cluster local.toml --bandwidth local.toml
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from commscope.errors import ConfigError

#: Smallest -e calibrate accepts: the link bandwidth it writes is the busbw of the sweep's two largest all_reduce
#: sizes, and below 1 MiB those time the latency, not the bandwidth (gloo on CPUs: ~50 us of alpha, 4 KiB gave
#: 0.009 GB/s, under any real link). nccl-tests' PERFORMANCE.md reads busbw at large messages for the same reason.
MIN_MAXBYTES = 1 << 20
#: calibrate's own options, named where a value of one of them is refused (calibrate has no -b, -f, -n: the sweep's
#: other sizes and iterations are fixed, see :func:`commscope.bench.calibrate.default_sweep`).
OPTIONS = "--nproc, --out, --name, --backend, -e/--maxbytes, --time-budget, --timeout, --json"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure this machine (matmul rate, memory, collectives) into a cluster file",
                       description="Fork N ranks; on all of them at once time an fp32 matrix multiply and a memory copy "
                                   "(CUDA when there is a GPU per rank, else the CPU), then run a short `bench` sweep "
                                   "and fit it as `fit` does. Writes a cluster file (--cluster) whose [collectives] "
                                   "table is the fitted bandwidth model (--bandwidth), every measurement in [meta].")
    p.add_argument("--nproc", type=int, default=2, help="ranks to start, as many as the jobs you will compare (default 2)")
    p.add_argument("--out", type=Path, required=True, help="the cluster file to write (TOML)")
    p.add_argument("--name", default=None, help="cluster name in the file (default: the file's stem)")
    p.add_argument("--backend", default=None, choices=("gloo", "nccl"),
                   help="collective backend (default: nccl when there is a GPU per rank, else gloo)")
    p.add_argument("-e", "--maxbytes", default="4M", metavar="SIZE", help="largest message of the sweep (default 4M)")
    p.add_argument("--time-budget", type=float, default=0.03, metavar="S",
                   help="timed seconds per message size of the sweep (default 0.03)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="wall-clock limit (default 600)")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    p.add_argument("--force", action="store_true", help="replace the cluster file of an earlier run at --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from commscope.bench.calibrate import default_sweep

    if args.nproc < 2:
        raise ConfigError("nproc", args.nproc, "a collective needs at least 2 ranks")
    if args.out.suffix.lower() != ".toml":
        raise ConfigError("out", str(args.out), "must be a .toml file")
    from commscope.cli.common import check_out_file

    check_out_file(args.out, "out")  # before any rank starts
    if args.name is not None and not args.name.strip():
        raise ConfigError("name", args.name, "must not be empty; leave --name out to name the cluster after the file "
                                             f"({args.out.stem!r})")
    if not args.time_budget > 0:
        raise ConfigError("time-budget", args.time_budget, "must be > 0")
    if not args.timeout > 0:
        raise ConfigError("timeout", args.timeout, "must be > 0 seconds")
    max_bytes = _maxbytes(args.maxbytes)
    backend = args.backend or _default_backend(args.nproc)
    sweep = dataclasses.replace(default_sweep(args.nproc), max_bytes=max_bytes, time_budget_s=args.time_budget)
    from commscope.bench.sweep import check_memory, check_world
    from commscope.launch import check_nproc

    check_nproc(args.nproc)
    check_memory(sweep, check_world(sweep, args.nproc, backend), args.nproc, backend)
    from commscope.cli.outputs import claim_file

    with claim_file(args, args.out):  # before any rank starts: one run writes the cluster file
        return _calibrate(args, backend, sweep, max_bytes)


def _calibrate(args: argparse.Namespace, backend: str, sweep, max_bytes: int) -> int:
    import dataclasses
    import json

    from commscope.bench.calibrate import calibrate, cluster_toml
    from commscope.bench.fit import _points_from_bench, fit, format_fit
    from commscope.cli.terminal import Progress
    from commscope.launch import LaunchError

    try:
        with Progress("calibrate", quiet=args.json) as progress:
            cal = calibrate(args.nproc, backend=backend, sweep=sweep, timeout_s=args.timeout, progress=progress)
    except LaunchError as exc:
        print(f"commscope calibrate: error: {exc}", file=sys.stderr)
        return 1
    command = shlex.join(["commscope", "calibrate", *sys.argv[2:]]) if "calibrate" in sys.argv[1:2] else None
    points, info = _points_from_bench(cal.sweep.to_dict(), "calibration sweep")
    fitted = fit(points, source="calibration sweep", time_kind=info["time_kind"], backend=backend)
    text = cluster_toml(cal, fitted, name=args.name if args.name is not None else args.out.stem, command=command)
    why = _write_checked(text, args.out)
    if why is not None:
        print(f"commscope calibrate: error: the calibration measured {why}; nothing written to {args.out} (a cluster "
              "file `estimate --cluster` refuses would be of no use: run it again on a quieter machine, or with larger "
              f"messages, -e {max(4 * max_bytes, 4 << 20) >> 20}M)", file=sys.stderr)
        return 1
    if args.json:
        json.dump({"out": str(args.out), "wall_s": cal.wall_s, "probes": [dataclasses.asdict(p) for p in cal.probes],
                   "rows": [r.to_dict() for r in cal.sweep.rows]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.nproc} {backend} ranks on {cal.probes[0].device}, {cal.wall_s:.1f} s")
    print(f"matmul (fp32, n={cal.probes[0].matmul_n}) per rank: {cal.matmul_flops_per_s / 1e9:.2f} GFLOP/s; "
          f"copy {cal.memory_bandwidth_bytes_per_s / 1e9:.2f} GB/s; small op {cal.op_overhead_s * 1e6:.1f} us")
    print(format_fit(fitted))
    print(f"wrote {args.out} (use: --cluster {args.out} --bandwidth {args.out})")
    return 0


def _maxbytes(text: str) -> int:
    """-e as bytes, at least :data:`MIN_MAXBYTES`; ConfigError naming -e and calibrate's own options."""
    from commscope.bench.sweep import parse_sizes_arg

    try:
        value = parse_sizes_arg(text)
    except ConfigError as exc:
        raise ConfigError("maxbytes", text, f"-e {exc.expected} (calibrate's options: {OPTIONS})") from None
    if value < MIN_MAXBYTES:
        raise ConfigError("maxbytes", text, "-e must be at least 1M: the link bandwidth calibrate writes is the bus "
                                            "bandwidth of its largest all_reduce messages, and below 1 MiB they time "
                                            "the latency, not the bandwidth (the sweep runs from 1 KiB to -e by 4x; "
                                            f"calibrate's options: {OPTIONS}); the default is 4M")
    return value


def _write_checked(text: str, out: Path) -> str | None:
    """Write the cluster file ``text`` to ``out`` only if it reads back as a cluster (``--cluster``) and as a
    bandwidth model (``--bandwidth``), as the file says to use it; else leave ``out`` as it was and return why
    (the refused field, its measured value and the valid range)."""
    from commscope.io.atomic import atomic_path
    from commscope.io.bandwidth_file import read_bandwidth
    from commscope.spec.files import load_cluster

    class Refused(Exception):
        pass

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(out) as tmp:  # renamed over out only when it reads back
            tmp.write_text(text)
            try:
                load_cluster(tmp)
                read_bandwidth(tmp, fallback=None)
            except ConfigError as exc:
                raise Refused(f"{exc.field}={exc.value!r}: {exc.expected}") from None
    except Refused as why:
        return str(why)
    return None


def _default_backend(nproc: int) -> str:
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"
