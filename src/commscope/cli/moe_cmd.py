"""``commscope moe``: MoE routing over iterations, simulated for a job or read from a recorded trace.

    commscope moe simulate --model deepseek-moe-16b --ep 8 --iterations 200 --routing drift --out moe/
    commscope moe analyze routing/ --out moe/

Both write ``metrics.csv`` (one row per iteration), ``metrics.json`` (the run's summary), ``traffic_frames.png``
(the EP rank x rank heatmaps at several iterations, one colour scale) and ``metrics.png``; ``simulate`` also
writes the routing it made as ``trace.npz`` (readable by ``analyze``, ``traffic --routing`` and
``report --moe``). An ``--out`` that already holds one of these files is refused unless ``--force``, as
``record`` refuses a folder holding a recording; with it, all of them are replaced when the new ones are complete
and the others removed: a second run never leaves some of the first's (the pictures of a run drawn before a
``--no-plot`` one) beside its own.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from commscope.cli.common import add_job_args, add_routing_args, out_path, resolve_job


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("moe", help="MoE expert-parallel routing over iterations: simulate or analyze a trace",
                       description="Expert-parallel all-to-all traffic follows the router and changes every iteration. "
                                   "Simulate a routing for a job, or analyze one recorded from a real run: entropy, "
                                   "imbalance, predictability, on-off regularity, the trend towards uniformity and the "
                                   "error of assuming balanced routing.")
    actions = p.add_subparsers(dest="moe_command", metavar="ACTION", required=True)
    sim = actions.add_parser("simulate", help="generate a synthetic routing for a job and analyze it",
                             description="Generate a seeded synthetic routing for the job's MoE layers and EP group, "
                                         "write it as trace.npz, and analyze it. Here --tp and --pp default to 1 and --dp "
                                         "to --ep.")
    add_job_args(sim)
    add_routing_args(sim, iteration=False, default="uniform")
    g = sim.add_argument_group("simulation")
    g.add_argument("--iterations", type=int, default=100, help="training iterations to simulate (default 100)")
    g.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batches recorded per iteration (default 1; the job's count: --micro-batches 0)")
    _add_output_args(sim)
    sim.set_defaults(func=run_simulate)

    ana = actions.add_parser("analyze", help="analyze a routing trace recorded from a run (or simulated)",
                             description="Analyze a routing trace: one .npz (commscope's format, or a 'routing' array "
                                         "(iterations, ep, ep)) or a directory of routing-rank*.npz files.")
    ana.add_argument("trace", type=Path, help="a trace .npz or a directory of routing-rank*.npz")
    ana.add_argument("--capacity-factor", type=float, default=None,
                     help="drop assignments beyond each expert's capacity first (default: none dropped)")
    _add_output_args(ana)
    ana.set_defaults(func=run_analyze)


def _add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("analysis and output")
    g.add_argument("--window", type=int, default=10, help="iterations in the moving-average predictor (default 10)")
    g.add_argument("--frames", type=int, default=6, help="heatmaps in the row of traffic frames (default 6)")
    g.add_argument("--out", type=out_path, default=None, help="directory for metrics.csv, metrics.json and the PNGs: new, "
                                                          "or holding none of the outputs of an earlier run")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")
    g.add_argument("--no-plot", action="store_true", help="do not draw the PNGs")
    g.add_argument("--force", action="store_true", help="replace the outputs of an earlier run in --out")


#: The files ``simulate`` writes into --out (``analyze`` all but the trace, which may be its own input).
SIMULATE_FILES = ("trace.npz", "metrics.csv", "metrics.json", "traffic_frames.png", "metrics.png")
ANALYZE_FILES = SIMULATE_FILES[1:]


def check_output_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, a bad --window or --frames and an --out that cannot be made."""
    from commscope.cli.common import check_out_dir
    from commscope.errors import ConfigError

    if args.window < 1:
        raise ConfigError("window", args.window, "must be >= 1")
    if args.frames < 1:
        raise ConfigError("frames", args.frames, "must be >= 1")
    check_out_dir(args.out, "out")


def _claim(args: argparse.Namespace, names: tuple[str, ...]):
    """The claim on --out (None without one): another run writing it is refused, and so are the outputs of an
    earlier run there (``names``) unless --force; with it, all of them are replaced or removed once the new ones
    are complete (:func:`_analyze`): one run's files are never left beside another's."""
    from contextlib import nullcontext

    from commscope.cli.outputs import claim_dir

    return nullcontext() if args.out is None else claim_dir(args, args.out, names, clear=False)


def job_routing(args: argparse.Namespace, model, parallel):
    """The routing of ``--routing``/``--routing-seed``/``--routing-iteration`` for a job (one iteration), or None."""
    if args.routing is None:
        return None
    from commscope.moe.generators import routing_for_job

    return routing_for_job(args.routing, model, parallel, first_iteration=args.routing_iteration, seed=args.routing_seed)


def run_simulate(args: argparse.Namespace) -> int:
    from commscope.errors import ConfigError
    from commscope.moe.generators import routing_for_job
    from commscope.moe.routing import check_capacity_factor
    from commscope.moe.trace import save_trace

    check_output_args(args)
    given = vars(args)
    check_capacity_factor(given.get("model.capacity_factor"))  # the flag; a --model file's value is checked below
    if args.parallel is None:  # only the EP group matters here: --ep 8 alone makes a valid job
        for key, value in (("tp", 1), ("pp", 1), ("dp", given.get("parallel.ep") if args.gpus is None else None)):
            if given.get(f"parallel.{key}") is None and value:
                given[f"parallel.{key}"] = value
    model, parallel, _ = resolve_job(args)
    check_capacity_factor(model.capacity_factor)
    if args.iterations < 1:
        raise ConfigError("iterations", args.iterations, "must be >= 1")
    if args.micro_batches < 0:
        raise ConfigError("micro_batches", args.micro_batches, "must be >= 1 (or 0: the job's micro-batches)")
    with _claim(args, SIMULATE_FILES):
        trace = routing_for_job(args.routing, model, parallel, iterations=args.iterations,
                                micro_batches=args.micro_batches or None, seed=args.routing_seed)
        return _analyze(trace, args, capacity_factor=model.capacity_factor, save=save_trace,
                        title=f"{model.name}, ep={parallel.ep}: {trace.source}")


def run_analyze(args: argparse.Namespace) -> int:
    from commscope.moe.routing import check_capacity_factor
    from commscope.moe.trace import load_trace

    check_capacity_factor(args.capacity_factor)
    check_output_args(args)
    with _claim(args, ANALYZE_FILES):
        trace = load_trace(args.trace)
        return _analyze(trace, args, capacity_factor=args.capacity_factor, title=trace.source)


def _analyze(trace, args: argparse.Namespace, *, capacity_factor: float | None, title: str, save: Any = None) -> int:
    """Metrics of ``trace``, printed, and with --out written (``save(trace, path)``: the trace too): every file
    staged beside its target and renamed into place when all are complete; an earlier run's others removed then."""
    from commscope.io.atomic import OutputSet
    from commscope.moe.metrics import routing_metrics

    metrics = routing_metrics(trace, window=args.window, capacity_factor=capacity_factor)
    summary = metrics.summary()
    written: list[Path] = []
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with OutputSet(args.out) as files:
            if save is not None:
                save(trace, files.path("trace.npz"))
            write_metrics(metrics, files, summary=summary)
            if not args.no_plot:
                _plots(metrics, files, frames=args.frames, title=title)
        written = files.written
        from commscope.cli.outputs import earlier_files, remove_files

        names = SIMULATE_FILES if save is not None else ANALYZE_FILES
        remove_files(p for p in earlier_files(args.out, names) if p not in written)  # --force: no mix
    if args.json:
        json.dump({**summary, "files": [str(p) for p in written]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_metrics(summary, metrics))
        for path in written:
            print(f"wrote {path}")
    return 0


def write_metrics(metrics, files, *, summary: dict[str, Any]) -> None:
    """``metrics.csv`` (one row per iteration) and ``metrics.json`` (the summary) into ``files``
    (an :class:`~commscope.io.atomic.OutputSet`)."""
    table = metrics.table()
    with open(files.path("metrics.csv"), "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(table)
        columns = [table[name].tolist() for name in table]
        for row in zip(*columns):
            writer.writerow("" if isinstance(v, float) and math.isnan(v) else (f"{v:.6g}" if isinstance(v, float) else v)
                            for v in row)
    files.write_text("metrics.json", json.dumps(summary, indent=2) + "\n")


def _plots(metrics, files, *, frames: int, title: str) -> None:
    try:
        from commscope.moe.plots import plot_routing_metrics, plot_traffic_frames
    except ImportError as exc:  # pragma: no cover - depends on extras
        print(f"note: no pictures: {exc}", file=sys.stderr)
        return
    try:
        plot_traffic_frames(metrics.pair_tokens, files.path("traffic_frames.png"), frames=frames,
                            title=f"EP all-to-all tokens over iterations: {title}")
        plot_routing_metrics(metrics, files.path("metrics.png"), title=f"MoE routing dynamics: {title}")
    except ImportError as exc:  # pragma: no cover - matplotlib missing
        files.drop("traffic_frames.png")
        files.drop("metrics.png")
        print(f"note: no pictures: {exc}", file=sys.stderr)


def format_metrics(s: dict[str, Any], metrics) -> str:
    """The human-readable table of `commscope moe`."""
    from commscope.cli.terminal import format_table

    def num(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows = [("expert entropy (1 = uniform)", "expert_entropy"), ("rank-pair entropy", "pair_entropy"),
            ("expert max/mean", "expert_imbalance"), ("expert Gini", "expert_gini"),
            ("rank received max/mean", "rank_imbalance"), ("cross-rank share", "cross_rank_fraction"),
            ("slowest rank vs balanced", "balance_error"), ("error from previous it.", "prediction_error_last"),
            (f"error from mean of last {s['window']}", "prediction_error_moving_average"),
            ("pairs switching on/off", "pairs_switching"), ("dropped by capacity", "dropped_fraction")]
    lines = [f"{s['source']}: {s['iterations']} iterations x {s['micro_batches']} micro-batch(es) x {s['layers']} MoE "
             f"layer(s), ep={s['ep']}, {s['experts']} experts, top-{s['top_k']}"
             + (f", capacity factor {s['capacity_factor']:g}" if s["capacity_factor"] is not None else ""),
             ""]
    cells = []
    for label, name in rows:
        values = getattr(metrics, name)
        finite = values[~np.isnan(values)]
        first, last, top = (finite[0], finite[-1], finite.max()) if finite.size else (None, None, None)
        cells.append((label, num(s.get(f"{name}_mean", float(finite.mean()) if finite.size else None)), num(first),
                      num(last), num(top)))
    lines.append(format_table(("metric", "mean", "first", "last", "max"), cells, left=("metric",)))
    from commscope.moe.metrics import PHASE_COLUMNS

    lines += ["", ("over training (means per window): expert entropy, expert max/mean, slowest rank vs balanced, "
                   "error predicting k from k-1, pairs switching on/off, dropped"),
              format_table(("iterations", *(label for _, label in PHASE_COLUMNS)),
                           [(f"{row['first_iteration']}-{row['last_iteration']}", *(num(row[name]) for name, _ in PHASE_COLUMNS))
                            for row in s["phases"]], left=("iterations",))]
    trend = s["uniformity_trend_per_iteration"] or 0.0
    lines += ["",
              f"trend towards uniformity: {trend * 100:+.4f} expert entropy per 100 iterations",
              (f"on-off regularity: {num(s['on_off_switch_rate'])} of pairs switch per iteration "
              f"(~0.5 random, ~0 steady); lag-1 autocorrelation {num(s['pair_autocorrelation'])}"),
              (f"the slowest rank's all-to-all takes {num(s['balance_error_mean'])}x what balanced routing predicts "
              f"on average, {num(s['balance_error_max'])}x at worst")]
    return "\n".join(lines)
