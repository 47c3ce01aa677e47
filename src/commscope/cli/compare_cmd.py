"""``commscope compare logs/``: measured vs predicted communication, per axis and op; ``--time``: in time too."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.cli.common import add_job_args, add_jobs_arg, job_from_logdir, resolve_job
from commscope.cli.terminal import print_table
from commscope.units import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare recorded logs with the prediction for the same job",
                       description="Compare a recorded run with the prediction for its job, per axis and op kind, per "
                                   "iteration. The job is the one saved beside the logs (model.toml, parallel.toml, "
                                   "cluster.toml: `commscope workload --record` writes them); flags (the same as "
                                   "`commscope traffic`) override it. --time compares durations, effective bandwidth, "
                                   "exposed communication and the step time with the bandwidth model and estimate. "
                                   "Mark steps in the job with commscope.measure.capture.step(i) to separate setup ops.")
    p.add_argument("logdir", type=Path, metavar="PATH",
                   help="a directory of per-rank records or one file, of any format `commscope summarize` reads")
    p.add_argument("--predicted", action="store_true", help="(accepted for readability: the flags describe the prediction)")
    add_job_args(p)
    p.add_argument("--time", action="store_true",
                   help="also compare in time: op durations and effective bandwidth per axis, op and size, exposed "
                        "communication per rank and step, predicted vs measured step")
    p.add_argument("--bandwidth", type=Path, default=None,
                   help="bandwidth model for --time: a cluster file from `commscope calibrate` (also the cluster, "
                        "unless --cluster is given), `commscope fit` output, bench JSON or nccl-tests output")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_jobs_arg(p)
    p.set_defaults(func=run)


def resolve_logged_job(args: argparse.Namespace) -> list[str]:
    """The job of ``args.logdir`` (files saved beside the logs, under the flags), and for ``--bandwidth`` a
    calibrated cluster file as the cluster when no --cluster is given; returns the files used."""
    used = job_from_logdir(args, args.logdir)
    bandwidth = getattr(args, "bandwidth", None)
    if args.cluster is None and bandwidth is not None and is_cluster_file(bandwidth):
        args.cluster = str(bandwidth)
        used.append(str(bandwidth))
    return used


def is_cluster_file(path: Path) -> bool:
    """Whether ``path`` is a TOML cluster file (``commscope calibrate`` output): it has link tiers."""
    import tomllib

    if Path(path).suffix.lower() != ".toml" or not Path(path).is_file():
        return False
    try:
        data = tomllib.loads(Path(path).read_text(errors="replace"))
    except tomllib.TOMLDecodeError:
        return False
    return isinstance(data.get("intra_node"), dict)


def time_comparison(prediction, run_log, bandwidth_path: Path | None) -> dict:
    """:func:`commscope.measure.capture.timing.compare_time` with the bandwidth model of ``bandwidth_path`` (the cluster's
    alpha-beta tiers for ops it lacks) and the refined estimate on the same model."""
    from commscope.estimate.bandwidth import AlphaBeta, BandwidthModel
    from commscope.measure.capture.timing import compare_time
    from commscope.estimate.iteration import estimate

    fallback = AlphaBeta(prediction.cluster)
    bw: BandwidthModel = fallback
    if bandwidth_path is not None:
        from commscope.io.bandwidth_file import read_bandwidth

        bw = read_bandwidth(bandwidth_path, fallback=fallback)
    est = estimate(prediction, bandwidth=bw)
    result = compare_time(prediction, run_log, bw, est)
    result["estimate"] = est.to_dict()
    result["bandwidth"] = str(bandwidth_path) if bandwidth_path is not None else f"cluster {prediction.cluster.name}"
    if bandwidth_path is not None or prediction.cluster.gpu.lower() == "cpu":
        return result
    backends = {dict(op.extra).get("backend") for ops in run_log.ops_by_rank.values() for op in ops[:50]}
    if "gloo" in backends:  # timed against GPU links: the factors then say how far a CPU is from NVLink, no more
        result["notes"].append(
            f"the job ran on gloo (CPU), and its times are compared with cluster {prediction.cluster.name}'s "
            f"{prediction.cluster.gpu} links and GPU; `commscope calibrate --nproc {prediction.parallel.world_size} "
            "--out local.toml` measures this machine, then --bandwidth local.toml compares with it")
    return result


def run(args: argparse.Namespace) -> int:
    from commscope.api import predict
    from commscope.measure.capture.analysis import compare
    from commscope.cli.summarize_cmd import load_run, print_run_findings
    from commscope.errors import ConfigError

    if args.bandwidth is not None and not args.time:
        raise ConfigError("bandwidth", str(args.bandwidth), "is used by --time; add --time")
    job_files = resolve_logged_job(args)
    model, parallel, cluster = resolve_job(args)
    pred = predict(model, parallel, cluster)
    # --time reads every record's times: the run in memory; otherwise its totals, read rank file by rank file
    run_log = load_run(args.logdir, layout=pred.workload.layout, jobs=None if args.time else args.jobs)
    try:
        result = compare(pred, run_log)
    except ValueError as exc:
        raise ConfigError("logdir", str(args.logdir), str(exc)) from None
    result["job_files"] = job_files
    if args.time:
        result["time"] = time_comparison(pred, run_log, args.bandwidth)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.logdir} vs prediction for {model.name} ({parallel.world_size} ranks), per iteration over "
          f"{result['num_steps']} step(s)" + (f"; job from {', '.join(job_files)}" if job_files else ""))
    print_run_findings(result, command="compare")
    print_comparison(result)
    if args.time:
        print_time(result["time"])
    return 0


def print_comparison(result: dict) -> None:
    """The per-axis, per-op table of a :func:`commscope.measure.capture.analysis.compare` result, setup ops apart."""
    print()
    print_table(("axis", "op", "pred count", "meas count", "pred bytes", "meas bytes", "diff"),
                [(r["axis"], r["op"], f"{r['predicted_count']:,.0f}", f"{r['measured_count']:,}",
                  format_bytes(r["predicted_bytes"]), format_bytes(r["measured_bytes"]), format_bytes(r["diff_bytes"]))
                 for r in result["by_op"]], left=("axis", "op"), keys=2)
    if result["setup"]:
        print("\nsetup (before the first step): " + ", ".join(f"{s['axis']}/{s['op']} x{s['count']} "
                                                            f"{format_bytes(s['bytes'])}" for s in result["setup"]))
    exact = result["max_rel_error"] == 0 and all(r["predicted_count"] == r["measured_count"] for r in result["by_op"])
    print(f"\nlargest relative byte difference over axes: {result['max_rel_error']:.1%}"
          + (" (counts and bytes match exactly)" if exact else ""))
    # bytes can agree by accident (a wrong --tp/--dp moves ops between axes): op counts that differ are said too
    off = [f"{r['axis']}/{r['op']} {r['predicted_count']:,.0f} predicted vs {r['measured_count']:,} measured"
           for r in result["by_op"] if r["predicted_count"] != r["measured_count"]]
    if off:
        silent = result.get("silent_ranks") or []
        why = (f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent[:16]))}"
               f"{' ...' if len(silent) > 16 else ''} logged no op, so {'their' if len(silent) > 1 else 'its'} ops are "
               "missing from the measured side" if silent else "is the job the one that was recorded?")
        print(f"op counts differ on {len(off)} of {len(result['by_op'])} rows ({'; '.join(off[:4])}"
              + (" ..." if len(off) > 4 else "") + f"): {why}")


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e6:,.0f}"


def _x(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def _factor(x: float | None) -> str:
    """A ratio with two significant digits however small (0.0031, not 0.00: gloo's small ops reach a few tenths
    of a percent of the benchmarked bandwidth)."""
    return "-" if x is None else f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.2f}"


def print_time(t: dict) -> None:
    """The tables of a :func:`time_comparison` result."""
    print(f"\nin time, bandwidth model: {t['bandwidth']} ({t['num_timed_records']:,} timed records)")
    print()
    print_table(("axis", "op", "size <=", "n", "count", "meas med us", "meas p95 us", "model us", "busbw GB/s",
                 "model GB/s", "factor"),
                [(r["axis"], r["op"], format_bytes(r["le_bytes"]), r["group_size"], r["count"],
                  _us(r["measured_median_s"]), _us(r["measured_p95_s"]), _us(r["predicted_median_s"]),
                  _x(r["achieved_busbw_bytes_per_s"], 1e-9, 3), _x(r["model_busbw_bytes_per_s"], 1e-9, 3),
                  _factor(r["factor"])) for r in t["durations"]["by_bin"]], left=("axis", "op"), keys=3)
    print("\neffective-bandwidth factor per op kind (model time / measured time; median, and total over total):")
    for r in t["durations"]["by_op"]:
        print(f"  {r['axis']}/{r['op']}: {_factor(r['factor'])} (time-weighted {_factor(r['time_weighted_factor'])}) over "
              f"{r['count']:,} records")
    s = t["step"]
    if s["num_steps"]:
        print(f"\nstep time: measured median {_ms(s['measured_median_s'])} ms (min {_ms(s['measured_min_s'])}, max "
              f"{_ms(s['measured_max_s'])}; {s['num_steps']} steps, slowest rank) vs predicted "
              f"{_ms(s['predicted_s'])} ms: measured / predicted = {s['ratio']:.2f}")
        print_table(("term", "predicted ms", "measured ms", "min", "max", "ratio"),
                    [(r["term"], _ms(r["predicted_s"]), _ms(r["measured_s"]), _ms(r["measured_min_s"]),
                      _ms(r["measured_max_s"]), _x(r["ratio"])) for r in t["terms"]], left=("term",))
        shares = [e["comm_share"] for e in t["exposed"] if e["comm_share"] is not None]
        if shares:
            print(f"exposed communication: {min(shares):.0%}-{max(shares):.0%} of the step over "
                  f"{len(shares)} rank-steps (union of op intervals)")
    for note in t["notes"] + t["bandwidth_notes"]:
        print(f"note: {note}")
