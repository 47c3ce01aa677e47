"""``commscope validate RUNS.csv``: predicted against measured iteration time of a user's own runs.

    commscope validate runs.csv --dtype fp16 --attention-backend unfused --inter-node-GBps 12.5 --png runs.png
    commscope validate runs.csv --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap --json
    commscope validate runs.csv --fit --out mycluster.toml   # your cluster's compute/network efficiency, fitted
    commscope estimate ... --cluster mycluster.toml          # every command then estimates with them

Reads the runs (:func:`commscope.estimate.validate.read_runs`; the columns are listed there), predicts each one, and
prints a table of measured and predicted seconds with the error and the main terms, the mean and worst
absolute error, and the assumptions the rows needed. The flags give the values of cells a file leaves blank
and of columns it lacks; a cell's value wins over a flag.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.cli.common import GRADIENT_ACCUMULATION_FUSION_HELP, STACK_HELP, out_path, spelled_flag, warn
from typing import Any

from commscope.cli.parser import _Formatter

#: flag dest -> the column it gives the default of
_DEFAULT_FLAGS = ("cluster", "gpus_per_node", "intra_node_GBps", "inter_node_GBps", "dtype", "recompute", "attention",
                  "micro_batch_size", "sequence_parallel", "distributed_optimizer", "overlap_grad_reduce",
                  "overlap_param_gather", "tp_comm_overlap", "gradient_accumulation_fusion", "fp8_format",
                  "position_embedding", "tied_embeddings", "gated_mlp", "normalization", "vocab_size", "seq_len",
                  "stack", "grad_reduce_dtype")


def _columns_help() -> str:
    """The file's columns and their spellings, as commscope.estimate.validate documents them (one place for both), in plain
    text."""
    import re

    from commscope.estimate import validate

    doc = validate.__doc__ or ""
    table = doc[doc.find("The file, one run per row"):doc.find("Other columns")].replace("::", ":")
    table = re.sub(r":(?:func|attr|class):`~?([^`]+)`", r"\1", table).replace("``", "")
    return (table.strip() + "\n\nOther columns (source, notes, status, ...) are kept as text. A blank cell takes the "
            "flag above, else the\ndefault; every assumption a row needed is printed. A bad cell stops with one line "
            "naming the row,\nthe column, the value and what would be valid.")


class _HelpWithColumns(_Formatter, argparse.RawDescriptionHelpFormatter):
    """Help whose description and column table keep their line breaks."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="compare predicted with measured iteration times of runs in a CSV file",
                       formatter_class=_HelpWithColumns, epilog=_columns_help(),
                       description="Predict each measured run of a CSV file (model shape, t/p/d/cp/ep, batch sizes,\n"
                                   "recompute, SP, GPU, measured iteration time or TFLOP/s per GPU) and print predicted\n"
                                   "against measured seconds per iteration, the error, the main terms, and the mean and\n"
                                   "worst absolute error. The file's columns are listed below the options.")
    p.add_argument("runs", type=Path, metavar="RUNS.csv", help="one measured run per row, a header line first")
    d = p.add_argument_group("defaults for blank cells and absent columns (a cell's value wins over these)")
    d.add_argument("--cluster", default=None,
                   help="cluster preset or file for rows with no cluster (default: matched from the gpu column)")
    d.add_argument("--gpus-per-node", dest="gpus_per_node", type=int, default=None, help="GPUs per node")
    d.add_argument("--intra-node-GBps", dest="intra_node_GBps", type=float, default=None, metavar="GBPS",
                   help="intra-node link bandwidth, GB/s per GPU (default: the cluster's)")
    d.add_argument("--inter-node-GBps", dest="inter_node_GBps", type=float, default=None, metavar="GBPS",
                   help="inter-node link bandwidth, GB/s per GPU (a node's NIC rate over its GPUs; default: the "
                        "cluster's)")
    d.add_argument("--dtype", default=None, help="parameter/activation dtype: bf16 (default), fp16")
    d.add_argument("--bf16", dest="dtype", action="store_const", const="bf16", help="same as --dtype bf16")
    d.add_argument("--fp16", dest="dtype", action="store_const", const="fp16", help="same as --dtype fp16")
    d.add_argument("--vocab-size", dest="vocab_size", type=int, default=None,
                   help="vocabulary before padding (default 50257)")
    d.add_argument("--seq-length", "--seq-len", dest="seq_len", type=int, default=None,
                   help="sequence length (default 2048)")
    d.add_argument("--position-embedding-type", dest="position_embedding", default=None,
                   help="learned (default), rope or none")
    d.add_argument("--untie-embeddings-and-output-weights", dest="tied_embeddings", action="store_const", const=False,
                   default=None, help="the output layer has its own weights (default: tied to the input embedding)")
    d.add_argument("--swiglu", dest="gated_mlp", action="store_const", const=True, default=None,
                   help="gated MLP with two up projections (default: plain 2-matrix MLP)")
    d.add_argument("--normalization", dest="normalization", default=None,
                   help="LayerNorm (default) or RMSNorm")
    d.add_argument("--recompute", "--recompute-granularity", dest="recompute", default=None,
                   help="activation recomputation: none (default), selective, full")
    d.add_argument("--attention-backend", dest="attention", default=None, metavar="{auto,flash,fused,unfused,local}",
                   help="attention kernels: flash/fused/auto = one fused kernel (default), unfused/local = GEMMs + "
                        "softmax")
    d.add_argument("--micro-batch-size", dest="micro_batch_size", type=int, default=None,
                   help="sequences per micro-batch (default 1)")
    for flags, dest, text in ((("--sequence-parallel",), "sequence_parallel", "Megatron sequence parallelism"),
                              (("--use-distributed-optimizer", "--distributed-optimizer"), "distributed_optimizer",
                               "Megatron's distributed optimizer"),
                              (("--overlap-grad-reduce",), "overlap_grad_reduce",
                               "DP gradient buckets reduce during the last backward pass"),
                              (("--overlap-param-gather",), "overlap_param_gather",
                               "parameter all-gathers run under the next forward pass (needs dist. optimizer)"),
                              (("--tp-comm-overlap",), "tp_comm_overlap",
                               "TP communication overlapped with the GEMMs (needs --sequence-parallel where tp > 1)")):
        d.add_argument(*flags, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                       help=f"{text} (default no)")
    d.add_argument("--gradient-accumulation-fusion", dest="gradient_accumulation_fusion",
                   action=argparse.BooleanOptionalAction, default=None,
                   help=GRADIENT_ACCUMULATION_FUSION_HELP)
    d.add_argument("--fp8-format", dest="fp8_format", default=None,
                   help="hybrid or e4m3: linear layers in FP8 (default none)")
    d.add_argument("--stack", default=None, help=STACK_HELP)
    d.add_argument("--grad-reduce-dtype", dest="grad_reduce_dtype", default=None,
                   help="dtype gradients are reduced in: fp32 (Megatron's default for bf16), bf16, fp16, fp8")
    f = p.add_argument_group("calibrate to these runs")
    f.add_argument("--fit", action="store_true",
                   help="fit this cluster's compute and network efficiency to the runs (bounded; leave-one-run-out "
                        "error printed) and, with --out, write a cluster file that every command takes as --cluster")
    f.add_argument("--fit-parameters", default="compute_efficiency,network_efficiency", metavar="NAMES",
                   help="which factors --fit fits: compute_efficiency, network_efficiency (default both)")
    f.add_argument("--out", type=out_path, default=None, metavar="CLUSTER.toml",
                   help="with --fit: the fitted cluster file to write (.toml, .json or .yaml)")
    g = p.add_argument_group("estimate and output")
    g.add_argument("--bandwidth", type=Path, default=None,
                   help="measured bandwidth (nccl-tests output or a table, as for `commscope estimate`); ops it lacks "
                        "fall back to each run's cluster")
    g.add_argument("--png", type=out_path, default=None, metavar="OUT.png",
                   help="write predicted against measured, with y = x and a +-10%% band (needs matplotlib)")
    g.add_argument("--json", action="store_true", help="print the validation as JSON")
    g.add_argument("--force", action="store_true", help="replace the plot (and fitted cluster file) of an earlier run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.png is not None:
        try:
            from commscope.report.validation_plot import check_matplotlib

            check_matplotlib()
        except ImportError as exc:
            print(f"commscope validate: error: {exc}", file=sys.stderr)
            return 2
    from commscope.errors import ConfigError

    if args.out is not None and not args.fit:
        raise ConfigError("out", str(args.out), "is the fitted cluster file: give --fit too")
    if args.fit and args.out is not None:
        from commscope.cli.common import check_out_file

        check_out_file(args.out, "out")
    from contextlib import ExitStack

    from commscope.cli.outputs import claim_file

    with ExitStack() as claims:  # one run writes each output, an earlier one's replaced only when asked
        if args.png is not None:
            claims.enter_context(claim_file(args, args.png if args.png.suffix else args.png.with_suffix(".png"),
                                            field="png"))
        if args.out is not None:
            claims.enter_context(claim_file(args, args.out))
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from commscope.estimate.validate import read_runs, validate

    fit_names = [n.strip() for n in args.fit_parameters.split(",") if n.strip()]
    defaults = {name: getattr(args, name) for name in _DEFAULT_FLAGS if getattr(args, name) is not None}
    runs = read_runs(args.runs, defaults)
    used = frozenset().union(*(run.defaults_used for run in runs))
    for name, value in defaults.items():
        if name not in used:
            warn(args, f"{spelled_flag(name, value)} changes nothing here: every row of {args.runs} gives its own {name}")
    unread = sorted({header for run in runs for header in run.extra})
    if unread:
        warn(args, f"columns of {args.runs} the estimate does not read (kept as text): {', '.join(unread)}")
    result = validate(runs, bandwidth=args.bandwidth)
    fit = None
    if args.fit:
        from commscope.estimate.validate_fit import fit_runs

        print(f"fitting {', '.join(fit_names)} to {len(runs)} runs (each refitted without one run: "
              f"{len(runs) + 1} fits)", file=sys.stderr)
        fit = fit_runs(runs, parameters=fit_names, bandwidth=args.bandwidth)
        if args.out is not None:
            _write_fitted_cluster(args.out, runs, fit, args.runs)
    if args.json:
        doc = result.to_dict()
        if fit is not None:
            doc["fit"] = fit.to_dict()
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_validation(result))
        if fit is not None:
            print("\n" + format_fit(fit))
    if fit is not None and args.out is not None:
        print(f"wrote {args.out}", file=sys.stderr if args.json else sys.stdout)
    if args.png is not None:
        from commscope.report.validation_plot import plot_validation

        path = plot_validation(result, args.png, title=str(args.runs))
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def format_fit(fit: Any) -> str:
    """The fitted factors and the errors before, after and left out."""
    params = ", ".join(f"{k} {v:.3g}" for k, v in fit.parameters.items()) or "nothing to fit"
    loo = fit.loo_mean_abs_error
    lines = [f"fit to these runs: {params}",
             f"mean absolute error {fit.default_mean_abs_error:.1%} as given, {fit.mean_abs_error:.1%} fitted"
             + (f", {loo:.1%} with each run predicted by the factors fitted without it" if loo is not None else "")]
    lines += [f"note: {n}" for n in fit.notes]
    return "\n".join(lines)


def _write_fitted_cluster(path: Path, runs: Any, fit: Any, source: Path) -> None:
    """The runs' cluster with the fitted factors, as a cluster file (one cluster only)."""
    from commscope.errors import ConfigError
    from commscope.spec.files import cluster_to_mapping, write_mapping
    from commscope.estimate.validate_fit import fitted_cluster

    clusters = {json.dumps(cluster_to_mapping(r.cluster), sort_keys=True): r.cluster for r in runs}
    if len(clusters) > 1:
        names = sorted({r.cluster.name for r in runs})
        raise ConfigError("out", str(path), f"the runs are on {len(clusters)} different clusters ({', '.join(names)}, or "
                                            "link overrides per row): a cluster file holds one; fit the rows of one "
                                            "cluster at a time")
    cluster = fitted_cluster(next(iter(clusters.values())), fit.parameters)
    mapping = cluster_to_mapping(cluster)
    loo = fit.loo_mean_abs_error
    mapping["source"] = (f"{cluster.source} | fitted by `commscope validate {source} --fit` to {len(runs)} runs: "
                         + ", ".join(f"{k} {v:g}" for k, v in fit.parameters.items())
                         + f"; mean absolute error {fit.default_mean_abs_error:.1%} before, {fit.mean_abs_error:.1%} after"
                         + (f", {loo:.1%} leave-one-run-out" if loo is not None else ""))
    write_mapping(path, mapping)


def format_validation(result: Any) -> str:
    """The table: one line per run, the error summary, then the notes (each once, with the runs it applies to)."""
    from commscope.cli.terminal import format_table
    from commscope.estimate.validate import TERMS

    rows = result.rows
    terms = [(f, label) for f, label in TERMS if f == "compute_s" or any(getattr(r, f) for r in rows)]
    axes = [a for a in ("cp", "ep") if any(getattr(r, a) > 1 for r in rows)]
    hidden = any(sum(r.hidden_s.values()) for r in rows)
    columns = ["case", "model", "t", "p", "d", *axes, "measured s", "predicted s", "error", *(label for _, label in terms)]
    columns += ["hidden"] if hidden else []
    table = [[r.case_id, r.model, r.tp, r.pp, r.dp, *(getattr(r, a) for a in axes), f"{r.measured_s:.3f}",
              f"{r.predicted_s:.3f}", f"{r.error:+.1%}", *(f"{getattr(r, f):.3f}" for f, _ in terms)]
             + ([f"{sum(r.hidden_s.values()):.3f}"] if hidden else []) for r in rows]
    lines = [format_table(columns, table, left=("case", "model"))]
    summary = (f"mean absolute error {result.mean_abs_error:.1%}, worst {result.worst_abs_error:.1%} "
               f"({result.worst_case}); mean error {result.mean_error:+.1%} over {len(rows)} runs")
    legend = ("terms: exposed seconds per iteration of the predicted time"
              + (" (hidden: communication under compute, not in the time)" if hidden else "")
              + "; error = predicted / measured - 1")
    lines += ["", legend, summary]
    notes: dict[str, list[str]] = {}
    for r in rows:
        for note in r.notes:
            notes.setdefault(note, []).append(r.case_id)
    if notes:
        lines.append("")
    everywhere = [note for note, cases in notes.items() if len(cases) == len(rows)]
    lines += [f"note ({'all runs' if len(rows) > 1 else rows[0].case_id}): {note}" for note in everywhere]
    lines += [f"note ({', '.join(cases)}): {note}" for note, cases in notes.items() if len(cases) < len(rows)]
    return "\n".join(lines)
