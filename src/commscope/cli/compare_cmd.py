"""``commscope compare logs/ --predicted <flags>``: measured vs predicted communication, per axis and op."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.cli.common import add_job_args, resolve_job
from commscope.units import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare recorded logs with the prediction for the same job",
                       description="Compare a recorded run with the prediction for the job described by the flags "
                                   "(the same flags as `commscope traffic`), per axis and op kind, per iteration. "
                                   "Mark steps in the job with commscope.capture.step(i) to separate setup ops.")
    p.add_argument("logdir", type=Path, metavar="PATH",
                   help="a directory of per-rank records or one file, of any format `commscope summarize` reads")
    p.add_argument("--predicted", action="store_true", help="(accepted for readability: the flags describe the prediction)")
    add_job_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.api import predict
    from commscope.capture.analysis import compare
    from commscope.cli.summarize_cmd import load_run, print_run_findings
    from commscope.errors import ConfigError

    model, parallel, cluster = resolve_job(args)
    pred = predict(model, parallel, cluster)
    run_log = load_run(args.logdir, layout=pred.workload.layout)
    try:
        result = compare(pred, run_log)
    except ValueError as exc:
        raise ConfigError("logdir", str(args.logdir), str(exc)) from None
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.logdir} vs prediction for {model.name} ({parallel.world_size} ranks), per iteration over "
          f"{result['num_steps']} step(s)")
    print_run_findings(result)
    print_comparison(result)
    return 0


def print_comparison(result: dict) -> None:
    """The per-axis, per-op table of a :func:`commscope.capture.analysis.compare` result, setup ops apart."""
    print(f"\n{'axis':<6}{'op':<16}{'pred count':>11}{'meas count':>11}{'pred bytes':>13}{'meas bytes':>13}{'diff':>13}")
    for r in result["by_op"]:
        print(f"{r['axis']:<6}{r['op']:<16}{r['predicted_count']:>11,.0f}{r['measured_count']:>11,.1f}"
              f"{format_bytes(r['predicted_bytes']):>13}{format_bytes(r['measured_bytes']):>13}"
              f"{format_bytes(r['diff_bytes']):>13}")
    if result["setup"]:
        print("\nsetup (before the first step): " + ", ".join(f"{s['axis']}/{s['op']} x{s['count']} "
                                                            f"{format_bytes(s['bytes'])}" for s in result["setup"]))
    exact = result["max_rel_error"] == 0 and all(r["predicted_count"] == r["measured_count"] for r in result["by_op"])
    print(f"\nlargest relative byte difference over axes: {result['max_rel_error']:.1%}"
          + (" (counts and bytes match exactly)" if exact else ""))
