"""``commscope report``: one self-contained HTML report (and the same pictures as PNGs)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from commscope.cli.common import add_job_args, check_out_dir, check_out_file, estimate_job, out_path, resolve_job, warn
from commscope.cli.outputs import add_force_arg
from commscope.estimate.iteration import METHODS
from commscope.pattern.traffic import ALGORITHMS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="write one self-contained HTML report (heatmaps, bytes, sizes, time, schedule, measured)",
        description="Predict a job's communication and iteration time and write one HTML file that shows them: the "
                    "traffic heatmap with a toggle per axis, bytes by axis and link class, message sizes, the "
                    "iteration-time breakdown, the pipeline schedule, and when given measured op logs, a "
                    "benchmark and MoE routing, those beside the prediction. The file opens offline; nothing "
                    "in it makes a request. --png DIR writes the same pictures as PNG files.")
    add_job_args(p)
    g = p.add_argument_group("prediction and estimate")
    g.add_argument("--predicted", action=argparse.BooleanOptionalAction, default=True,
                   help="include the prediction of the job the flags describe (default; --no-predicted leaves it out)")
    g.add_argument("--algorithm", choices=ALGORITHMS, default="ring", help="collective algorithm for the matrix (default ring)")
    g.add_argument("--method", choices=METHODS, default="refined", help="estimate method (default refined)")
    g.add_argument("--gpu-util", type=float, default=None, help="achieved fraction of peak FLOP/s (default: the cluster's)")
    g.add_argument("--bandwidth", type=Path, default=None,
                   help="measured bandwidth table or nccl-tests output for the estimate (as `commscope estimate --bandwidth`)")
    g.add_argument("--heatmap-level", choices=("auto", "gpu", "node"), default="auto",
                   help="heatmap cells: GPUs, nodes, or auto (GPUs up to 1,024, nodes above; default)")
    g.add_argument("--plan-gpus", type=int, default=None, metavar="N",
                   help="also plan the model on N GPUs and show its top configurations beside this job")
    g.add_argument("--plan-top", type=int, default=5, help="configurations of the plan to show (default 5)")
    m = p.add_argument_group("measured and other inputs")
    m.add_argument("--measured", type=Path, default=None, metavar="PATH",
                   help="a directory of per-rank records or one file, of any format `commscope summarize` reads: "
                        "measured vs predicted bytes per axis")
    m.add_argument("--measured-iterations", type=int, default=None, metavar="N",
                   help="iterations logs without step marks cover (default: the complete steps the logs mark, else "
                        "the log header's num_iterations, else 1)")
    m.add_argument("--bench", type=Path, default=None, metavar="FILE",
                   help='benchmark JSON {"meta": {...}, "rows": [{op, group_size, size_bytes, busbw_bytes_per_s, ...}]}: busbw curves')
    m.add_argument("--moe", type=Path, default=None, metavar="PATH",
                   help="an .npz with a routing array (iterations, ep, ep), or a directory of them: MoE heatmaps over iterations")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=out_path, default=None, help="the HTML file to write (e.g. report.html)")
    o.add_argument("--png", type=out_path, default=None, metavar="DIR", help="also write the pictures as PNG files into DIR")
    o.add_argument("--title", default=None, help="report title (default: model, cluster and configuration)")
    add_force_arg(o, "report (and pictures) of an earlier run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from commscope.cli.outputs import claim_dir, claim_file
    from commscope.errors import ConfigError

    check_out_file(args.out)
    if args.out is not None and not args.out.parent.is_dir():  # a mistyped folder is said, not made
        raise ConfigError("out", str(args.out), f"its folder {args.out.parent} does not exist; create it first, or "
                                                "give a file in an existing folder")
    check_out_dir(args.png, "png")  # both before anything is written: never a report without its pictures
    if args.out is None and args.png is None:
        raise ConfigError("out", None, "give --out FILE.html and/or --png DIR")
    with ExitStack() as claims:  # one run writes each output, an earlier one's replaced only when asked
        from commscope.report.png import PNG_NAMES

        if args.out is not None:
            claims.enter_context(claim_file(args, args.out))
        png_claim = None if args.png is None else claims.enter_context(
            claim_dir(args, args.png, PNG_NAMES, field="png", what="the pictures", clear=False))
        return _run(args, [] if png_claim is None else png_claim.earlier)


def _run(args: argparse.Namespace, earlier_pngs: list[Path]) -> int:
    from commscope.errors import ConfigError
    from commscope.report import html as report_html

    if not args.predicted and args.measured is None and args.bench is None and args.moe is None:
        raise ConfigError("predicted", False, "with --no-predicted, give at least one of --measured, --bench, --moe")
    if args.plan_gpus is not None and not args.predicted:
        raise ConfigError("plan_gpus", args.plan_gpus, "needs the prediction (drop --no-predicted)")
    if args.plan_top < 1:
        raise ConfigError("plan_top", args.plan_top, "must be >= 1")
    t0 = time.perf_counter()
    prediction = est = plan_result = None
    job_files: list[str] = []
    if args.measured is not None and args.predicted:
        from commscope.cli.compare_cmd import resolve_logged_job

        args.logdir = args.measured
        job_files = resolve_logged_job(args)  # the job saved beside the logs, under the flags
    if args.predicted:
        from commscope.api import predict

        model, parallel, cluster = resolve_job(args)
        prediction = predict(model, parallel, cluster, algorithm=args.algorithm)
        est = estimate_job(prediction, args)
        est = _with_warnings(est, model, parallel, cluster, args)
        if args.plan_gpus is not None:
            from commscope.estimate.plan import plan

            plan_result = plan(model, cluster, args.plan_gpus, parallel.global_batch_size, top=args.plan_top,
                               gpu_util=args.gpu_util,
                               gradient_accumulation_fusion=parallel.gradient_accumulation_fusion,
                               attention=parallel.attention, fp8_format=parallel.fp8_format, stack=parallel.stack)
    measured = bench = moe = None
    files: dict[str, object] = {}
    time_result = None
    if args.measured is not None:
        measured = report_html.load_measured(args.measured, num_iterations=args.measured_iterations,
                                             layout=prediction.workload.layout if prediction is not None else None)
        for line in measured.problems:  # records skipped, ranks not read: said as summarize and compare say them
            warn(args, line)
        files["measured"] = str(args.measured)
        if job_files:
            files["job"] = job_files
        if prediction is not None and Path(args.measured).is_dir():
            time_result = _time_comparison(prediction, args)
    if args.bench is not None:
        bench = report_html.load_bench(args.bench)
        for line in bench.problems:  # damaged rows skipped, as fit and --bandwidth skip them
            warn(args, line)
        files["bench"] = str(args.bench)
    if args.moe is not None:
        moe = report_html.load_moe(args.moe)
        files["moe"] = str(args.moe)
    if args.bandwidth is not None:
        files["bandwidth"] = str(args.bandwidth)
    command_line = shlex.join(["commscope", *sys.argv[1:]]) if _invoked_as_cli() else None
    data = report_html.build_report_data(prediction=prediction, estimate=est, plan=plan_result, measured=measured,
                                         bench=bench, moe=moe, command_line=command_line or _reconstructed(args),
                                         files=files, title=args.title, heatmap_level=args.heatmap_level,
                                         time_comparison=time_result)
    paths: list[Path] = []
    if args.png is not None:  # the pictures complete before the page that shows them, all renamed into place at once
        from commscope.io.atomic import OutputSet
        from commscope.report.png import write_pngs

        try:
            with OutputSet(args.png, field="png") as pngs:
                paths = write_pngs(data, args.png, traffic=prediction.traffic if prediction is not None else None,
                                   place=pngs.path)
        except ImportError as exc:
            print(f"commscope report: error: {exc}", file=sys.stderr)
            return 2
        from commscope.cli.outputs import remove_files

        remove_files(p for p in earlier_pngs if p not in paths)  # --force: no picture of the earlier run is left
    if args.out is not None:
        path = report_html.write_html(data, args.out)
        print(f"wrote {path} ({path.stat().st_size / 1024:,.0f} KiB) in {time.perf_counter() - t0:.2f} s")
    for path in paths:
        print(f"wrote {path}")
    return 0


def _time_comparison(prediction, args: argparse.Namespace) -> dict | None:
    """Measured against predicted in time when the logs hold timed ops of the same world size (else None)."""
    from commscope.measure.capture.analysis import read_run
    from commscope.cli.compare_cmd import time_comparison

    try:
        run_log = read_run(args.measured)
    except ValueError:
        return None
    if run_log.world_size != prediction.parallel.world_size:
        return None
    return time_comparison(prediction, run_log, args.bandwidth)


def _invoked_as_cli() -> bool:
    """True when this process is the ``commscope`` command (so sys.argv is the user's command line)."""
    return Path(sys.argv[0]).name in ("commscope", "commscope.exe", "__main__.py", "main.py") and "report" in sys.argv[1:]


def _reconstructed(args: argparse.Namespace) -> str:
    """A command line with the same meaning, rebuilt from the parsed flags (when called in-process)."""
    out = ["commscope", "report"]
    for key, value in sorted(vars(args).items()):
        if key in ("func", "command", "logdir", "force") or value is None or (key == "predicted" and value):
            continue
        flag = "--" + key.split(".", 1)[-1].replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:  # a --no-... of a boolean flag
            out.append("--no-" + flag[2:])
        elif isinstance(value, tuple):
            out += [flag, ",".join(str(x) for x in value)]
        else:
            out += [flag, str(value)]
    return shlex.join(out)


def _with_warnings(est, model, parallel, cluster, args: argparse.Namespace):
    """The estimate with what `estimate` warns about (:func:`~commscope.cli.estimate_cmd.job_warnings`) added to its
    notes, which the report shows, and said on stderr too."""
    from dataclasses import replace

    from commscope.cli.common import warn
    from commscope.cli.estimate_cmd import job_warnings, memory_check

    warnings = job_warnings(memory_check(model, parallel, cluster), parallel, est)
    for message in warnings:
        warn(args, message)
    return replace(est, notes=[*est.notes, *(f"warning: {m}" for m in warnings)]) if warnings else est
