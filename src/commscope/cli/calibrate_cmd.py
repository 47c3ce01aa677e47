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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from commscope.bench.calibrate import calibrate, cluster_toml, default_sweep
    from commscope.bench.fit import _points_from_bench, fit, format_fit
    from commscope.bench.sweep import parse_sizes_arg
    from commscope.launch import LaunchError

    if args.nproc < 2:
        raise ConfigError("nproc", args.nproc, "a collective needs at least 2 ranks")
    if args.out.suffix.lower() != ".toml":
        raise ConfigError("out", str(args.out), "must be a .toml file")
    from commscope.cli.common import check_out_file

    check_out_file(args.out, "out")  # before any rank starts
    if args.time_budget <= 0:
        raise ConfigError("time-budget", args.time_budget, "must be > 0")
    backend = args.backend or _default_backend(args.nproc)
    sweep = dataclasses.replace(default_sweep(args.nproc), max_bytes=parse_sizes_arg(args.maxbytes),
                                time_budget_s=args.time_budget)
    from commscope.cli.terminal import Progress

    try:
        with Progress("calibrate", quiet=args.json) as progress:
            cal = calibrate(args.nproc, backend=backend, sweep=sweep, timeout_s=args.timeout, progress=progress)
    except LaunchError as exc:
        print(f"commscope calibrate: error: {exc}", file=sys.stderr)
        return 1
    command = shlex.join(["commscope", "calibrate", *sys.argv[2:]]) if "calibrate" in sys.argv[1:2] else None
    points, info = _points_from_bench(cal.sweep.to_dict(), "calibration sweep")
    fitted = fit(points, source="calibration sweep", time_kind=info["time_kind"], backend=backend)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(cluster_toml(cal, fitted, name=args.name or args.out.stem, command=command))
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


def _default_backend(nproc: int) -> str:
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"
