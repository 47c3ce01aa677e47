"""``commscope export``: the predicted iteration as Chakra execution traces for ASTRA-sim (``chakra``), or a
recorded run's records as Parquet tables, one per rank file, for DuckDB, Dask or Spark (``parquet``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from commscope.cli.common import add_job_args, check_out_dir, estimate_job, out_path, resolve_job
from commscope.estimate.iteration import METHODS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="hand a prediction or a recording to other tools: Chakra traces (ASTRA-sim), "
                                      "Parquet (DuckDB, Dask, Spark)",
                       description="Write the predicted iteration of a job in another tool's format. `chakra`: one "
                                   "Chakra execution trace per rank (<prefix>.<rank>.et) and comm_group.json for "
                                   "ASTRA-sim: every op of the op list (collective type, size, process group; sends and "
                                   "receives with matching tags) and every kernel group (time, FLOP, HBM bytes, kernel "
                                   "class), in the estimate's pipeline schedule, communication overlapping compute where "
                                   "the estimate overlaps it; --check replays them. Needs mlc-chakra. `parquet "
                                   "--run LOGS`: every rank file of a recorded run (any format `summarize` reads) as "
                                   "one Parquet op table, one file at a time; query the directory with DuckDB or Dask "
                                   "when the logs outgrow one machine's memory. Needs pyarrow.")
    p.add_argument("target", choices=("chakra", "parquet"), help="the format to write")
    p.add_argument("--run", type=Path, default=None,
                   help="parquet: the recorded run (directory of rank logs, or one file); the parallelism saved beside "
                        "the logs, or --tp/--pp/--dp..., attributes its ops to axes as `summarize` does")
    add_job_args(p)
    g = p.add_argument_group("export")
    g.add_argument("--out", type=out_path, required=True,
                   help="directory to write into: new, or holding no earlier export (.et, comm_group.json, .parquet)")
    g.add_argument("--prefix", default="commscope", help="chakra: file name stem, without '/', '..' or a leading '.' "
                                                           "(default commscope: commscope.0.et, ...)")
    g.add_argument("--method", choices=METHODS, default="refined", help="estimate method for compute durations")
    g.add_argument("--gpu-util", type=float, default=None, help="achieved fraction of peak FLOP/s (as `estimate`)")
    g.add_argument("--bandwidth", type=Path, default=None, help="measured bandwidth table (as `estimate`)")
    g.add_argument("--check", action="store_true",
                   help="chakra: replay the traces written (every rank; a node runs when its dependencies have, a receive "
                        "when its send has delivered, a collective when every member has issued it; one collective or "
                        "send at a time per GPU, as ASTRA-sim runs them; op times from the bandwidth model) and print the "
                        "simulated iteration time beside the estimate; exit 1 if they deadlock")
    g.add_argument("--comm-streams", type=int, choices=(1, 2), default=1,
                   help="chakra: 1 (default) orders each rank's collectives and sends in one chain, as ASTRA-sim runs them "
                        "one at a time; 2 puts DP/ZeRO traffic on a chain of its own, for simulators that run collectives "
                        "concurrently (ASTRA-sim may then deadlock where a stage's ranks finish collectives at different "
                        "times)")
    g.add_argument("--force", action="store_true", help="replace the export of an earlier run in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.api import predict
    from commscope.errors import ConfigError

    if args.target == "parquet":
        return _parquet(args)
    if args.run is not None:
        raise ConfigError("run", str(args.run), "is for `export parquet` (a recorded run); `export chakra` exports "
                                                "the job the flags describe")

    from commscope.cli.outputs import claim_dir, remove_files
    from commscope.io.chakra import GROUP_FILE, _require_chakra, check_prefix, export_chakra

    check_out_dir(args.out)
    check_prefix(args.prefix)
    try:
        _require_chakra()
    except ImportError as exc:
        raise ConfigError("target", "chakra", str(exc)) from None
    model, parallel, cluster = resolve_job(args)
    # one run writes the folder; an earlier export (traces of any prefix) never mixed with this one
    with claim_dir(args, args.out, ("*.et", GROUP_FILE), what="an export", clear=False) as claim:
        pred = predict(model, parallel, cluster)
        est = estimate_job(pred, args)
        export = export_chakra(pred, est, args.out, prefix=args.prefix, bandwidth=_bandwidth(args, pred),
                               comm_streams=args.comm_streams, replace=bool(claim.earlier))
        remove_files(p for p in claim.earlier if p not in export.paths)  # --force: none of the earlier export is left
    paths = export.paths
    print(f"wrote {len(paths) - 1} Chakra execution traces ({args.out / f'{args.prefix}.0.et'} ...; "
          f"{sum(export.num_nodes):,} nodes) and {paths[-1]}")
    for line in export.unplaced[:5]:
        print(f"note: no rule places {line}: it runs after the iteration's compute")
    if args.check:
        return _check(args, pred, est)
    return 0


def _bandwidth(args: argparse.Namespace, pred: Any) -> Any:
    """The bandwidth model the estimate used: --bandwidth's table (alpha-beta where it lacks an op), or None (the
    cluster's alpha-beta tiers)."""
    if args.bandwidth is None:
        return None
    from commscope.estimate.bandwidth import AlphaBeta
    from commscope.io.bandwidth_file import read_bandwidth

    return read_bandwidth(args.bandwidth, fallback=AlphaBeta(pred.cluster))


def _check(args: argparse.Namespace, pred: Any, est: Any) -> int:
    """Replay the traces just written and print the simulated time beside the estimate (1 if they deadlock)."""
    from commscope.io.chakra_replay import bandwidth_timer, replay

    res = replay(args.out, bandwidth_timer(pred.cluster, _bandwidth(args, pred)), prefix=args.prefix)
    for line in res.problems[:10]:
        print(f"problem: {line}")
    if not res.finished:
        print(f"replay: the traces deadlock: {len(res.blocked)} of {len(res.rank_time_s)} ranks never finish")
        for line in res.blocked[:8]:
            print(f"  {line}")
        return 1
    sim, target = res.iteration_time_s, est.iteration_time_s
    exposed = res.exposed_comm_s
    print(f"replay: every rank finished: simulated iteration {sim * 1e3:,.2f} ms, estimate {target * 1e3:,.2f} ms "
          f"({(sim / target - 1) if target else 0.0:+.1%}); per rank {min(res.compute_s) * 1e3:,.2f}-"
          f"{max(res.compute_s) * 1e3:,.2f} ms computing, {min(exposed) * 1e3:,.2f}-{max(exposed) * 1e3:,.2f} ms "
          "not (exposed communication and pipeline bubble)")
    return 1 if res.problems else 0


def _parquet(args: argparse.Namespace) -> int:
    from commscope.errors import ConfigError
    from commscope.io.runs import write_run_parquet

    if args.run is None:
        raise ConfigError("run", None, "export parquet needs --run LOGS: a recorded run's directory (or one log file)")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError("target", "parquet", "needs pyarrow: pip install pyarrow (or commscope[parquet])") from None
    from commscope.cli.summarize_cmd import run_layout

    from commscope.cli.outputs import claim_dir, remove_files

    check_out_dir(args.out)
    layout = run_layout(args, args.run)
    # one run writes the folder; an earlier run's tables are never read with this one's (out/*.parquet)
    with claim_dir(args, args.out, ("*.parquet",), what="an export", clear=False) as claim:
        try:
            files, rows, problems = write_run_parquet(args.run, args.out, layout=layout)
        except ValueError as exc:
            raise ConfigError("run", str(args.run), str(exc)) from None
        remove_files(p for p in claim.earlier if p not in files)  # --force: none of the earlier export is left
    for line in problems[:20]:
        print(f"commscope export: problem: {line}", file=sys.stderr)
    if len(problems) > 20:
        print(f"commscope export: problem: ... and {len(problems) - 20} more", file=sys.stderr)
    print(f"wrote {rows:,} records of {len(files)} rank file(s) to {args.out}/ ({files[0].name} ...): one row per "
          "record of every rank, so a collective appears once per member; the guide's DuckDB query (docs/guide.md) counts the "
          f"logical ops as summarize does, e.g. over '{args.out}/*.parquet'")
    return 0

