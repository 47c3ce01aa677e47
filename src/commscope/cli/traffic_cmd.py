"""``commscope traffic``: the predicted ops and traffic matrix of one iteration."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal

from commscope.cli.common import add_job_args, add_routing_args, check_out_dir, out_path, resolve_job, v_label
from commscope.cli.outputs import add_force_arg, claim_dir, remove_files
from commscope.cli.terminal import format_table
from commscope.commop import REPORT_AXES
from commscope.pattern.traffic import ALGORITHMS
from commscope.units import format_bytes

#: Every file `traffic --out` may write (an earlier run's that this run does not rewrite are pointed out).
OUTPUT_NAMES = ("ops.jsonl", "ops.csv", "traffic.csv", "traffic.npz", "inputs.json", "summary.json", "heatmap.png",
                "heatmap_by_axis.png", "ops.parquet", "traffic.parquet")

#: Above this many CommOp records, --out writes one aggregated record per group instead (with a note).
MAX_FULL_OPS = 2_000_000


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "traffic",
        help="predict every communication op of one iteration and the per-GPU-pair traffic matrix",
        description="Predict every communication op of one training iteration and its per-GPU-pair traffic matrix. "
                    "With no flags: the seed talk's 1.5B GPT with tp=2 pp=4 dp=4 on DGX-1 V100 nodes.",
    )
    add_job_args(p)
    add_routing_args(p)
    g = p.add_argument_group("output")
    g.add_argument("--algorithm", choices=ALGORITHMS, default="ring", help="collective algorithm for the matrix (default ring)")
    g.add_argument("--out", type=out_path, default=None, help="directory for ops.jsonl, ops.csv, traffic.csv, traffic.npz, heatmap.png, summary.json")
    g.add_argument("--op-detail", choices=("full", "group"), default=None,
                   help="op list detail: one record per layer and micro-batch (full), or per group with a count "
                        f"(default: full up to {MAX_FULL_OPS:,} records)")
    add_force_arg(g, "files of an earlier run in --out")
    g.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    g.add_argument("--no-plot", action="store_true", help="do not draw the heatmap")
    g.add_argument("--format", choices=("default", "parquet"), default="default",
                   help="parquet: with --out, also write ops.parquet and traffic.parquet (needs pyarrow: "
                        "pip install 'commscope[parquet]')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.api import predict
    from commscope.cli.moe_cmd import job_routing
    from commscope.errors import ConfigError

    model, parallel, cluster = resolve_job(args)
    check_out_dir(args.out)
    if args.format == "parquet":
        if args.out is None:
            raise ConfigError("format", "parquet", "writes files: give --out DIR")
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ConfigError("format", "parquet", "needs pyarrow: pip install 'commscope[parquet]'") from None
    written: list[Path] = []
    if args.out is None:
        pred = predict(model, parallel, cluster, algorithm=args.algorithm, routing=job_routing(args, model, parallel))
        summary = pred.summary()
    else:  # one run writes a folder; an earlier run's files are replaced only when asked
        with claim_dir(args, args.out, OUTPUT_NAMES, clear=False) as claim:
            pred = predict(model, parallel, cluster, algorithm=args.algorithm,
                           routing=job_routing(args, model, parallel))
            summary = pred.summary()
            written = write_outputs(pred, args.out, detail=args.op_detail, plot=not args.no_plot, summary=summary,
                                    parquet=args.format == "parquet")
            remove_files(p for p in claim.earlier if p not in written)  # --force: none of the earlier run is left
    if args.json:
        if written:
            summary["files"] = [str(p) for p in written]
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_summary(summary))
        for path in written:
            print(f"wrote {path}")
    return 0


def op_detail(wl: Any, detail: str | None) -> Literal["full", "group"]:
    """The op-list detail written: the one asked for, else full up to MAX_FULL_OPS records, else group."""
    if detail in ("full", "group"):
        return "full" if detail == "full" else "group"
    return "full" if wl.num_ops("full") <= MAX_FULL_OPS else "group"


def write_outputs(pred, out: Path, *, detail: str | None, plot: bool, summary: dict[str, Any],
                  parquet: bool = False) -> list[Path]:
    """Write the op list, the matrix, the heatmap, the summary and the inputs into ``out`` (and the Parquet tables
    when ``parquet``): each file beside its target first, all renamed into place once every one is complete
    (:class:`~commscope.io.atomic.OutputSet`), so a full disk or a kill leaves the earlier files, never a mix."""
    from commscope.io.atomic import OutputSet

    out.mkdir(parents=True, exist_ok=True)
    with OutputSet(out) as files:
        _write_files(pred, files, detail=detail, plot=plot, summary=summary, parquet=parquet)
    return files.written


def _write_files(pred, files: Any, *, detail: str | None, plot: bool, summary: dict[str, Any], parquet: bool) -> None:
    from commscope.io.matrix import write_npz, write_triplets_csv
    from commscope.io.oplog import write_ops_csv, write_ops_jsonl
    from commscope.spec.files import cluster_to_mapping, model_to_mapping, parallel_to_mapping

    wl = pred.workload
    if detail is None and op_detail(wl, None) == "group":
        print(f"note: {wl.num_ops('full'):,} ops; writing one record per group with a count (--op-detail full to force)",
              file=sys.stderr)
    detail = op_detail(wl, detail)
    inputs = {"model": model_to_mapping(pred.model), "parallel": parallel_to_mapping(pred.parallel),
              "cluster": cluster_to_mapping(pred.cluster), "algorithm": pred.traffic.algorithm, "op_detail": detail}
    header = {"kind": "predicted", "world_size": pred.traffic.world_size, **inputs}
    write_ops_jsonl(files.path("ops.jsonl"), wl.ops(detail), header=header)
    write_ops_csv(files.path("ops.csv"), wl.ops(detail))
    write_triplets_csv(files.path("traffic.csv"), pred.traffic)
    write_npz(files.path("traffic.npz"), pred.traffic)
    files.write_text("inputs.json", json.dumps(inputs, indent=2) + "\n")
    files.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
    if parquet:
        from commscope.io.tables import write_matrix_parquet, write_ops_parquet

        write_ops_parquet(files.path("ops.parquet"), wl.ops(detail))
        write_matrix_parquet(files.path("traffic.parquet"), pred.traffic)
    if plot:
        try:
            from commscope.report.heatmap import plot_heatmap, plot_heatmaps_by_axis
        except ImportError as exc:  # pragma: no cover - depends on extras
            print(f"note: no heatmap: {exc}", file=sys.stderr)
        else:
            try:
                plot_heatmap(pred.traffic, files.path("heatmap.png"), title=f"{pred.model.name}: {_config_label(summary)}")
                plot_heatmaps_by_axis(pred.traffic, files.path("heatmap_by_axis.png"))
            except ImportError as exc:
                files.drop("heatmap.png")
                files.drop("heatmap_by_axis.png")
                print(f"note: no heatmap: {exc}", file=sys.stderr)


def _config_label(s: dict[str, Any]) -> str:
    p = s["parallel"]
    parts = [f"{k}={p[k]}" + (v_label(p.get("virtual_pipeline_size", 1)) if k == "pp" else "")
             for k in ("tp", "pp", "dp", "cp", "ep") if p[k] > 1 or k in ("tp", "pp", "dp")]
    return " ".join(parts) + f", {s['world_size']} GPUs"


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable table of `commscope traffic`."""
    p = s["parallel"]
    lines = [
        (f"{s['model']} on {s['cluster']}: {s['world_size']} GPUs ({s['num_nodes']} node{'s' if s['num_nodes'] != 1 else ''} x {s['gpus_per_node']}), "
        f"{_config_label(s).split(',')[0]}, {p['num_micro_batches']} micro-batches, order {p['order']}, {s['algorithm']} algorithm"),
        "",
    ]
    total = s["total_bytes"] or 1
    rows = []
    for axis in REPORT_AXES:
        b = s["bytes_by_axis"][axis]
        links = s["bytes_by_axis_and_link"].get(axis, {"intra_node": 0, "inter_node": 0})
        rows.append((axis, format_bytes(b), f"{b / total:.1%}", format_bytes(links["intra_node"]),
                     format_bytes(links["inter_node"]), format_bytes(s["logical_bytes_by_axis"][axis])))
    lk = s["bytes_by_link"]
    rows.append(("total", format_bytes(s["total_bytes"]), "", format_bytes(lk["intra_node"]),
                 format_bytes(lk["inter_node"]), ""))
    lines.append(format_table(("axis", "bytes sent", "share", "intra-node", "inter-node", "op bytes"), rows,
                              left=("axis",)))
    lines += [
        "",
        (f"ops per iteration: {s['num_ops']:,}   GPU pairs that talk: {s['num_pairs']:,}   "
        f"busiest pair: {format_bytes(s['max_pair_bytes'])}"),
        "bytes sent = what GPUs put on links per iteration (the traffic matrix); op bytes = sum of message sizes.",
    ]
    lines += [f"note: {n}" for n in s.get("notes", [])]
    return "\n".join(lines)
