"""``commscope summarize logs/``: what a recorded run communicated."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.cli.common import add_jobs_arg, add_parallel_args, out_path
from commscope.cli.terminal import print_table
from commscope.units import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summarize", help="summarise recorded logs: ops by axis, message sizes, traffic matrix",
                       description="Summarise a measured run. The parallelism saved beside the logs (parallel.toml), "
                                   "or flags (--tp, --pp, --dp, ...), attribute ops to axes; without them ops are grouped "
                                   "by process group size.")
    p.add_argument("logdir", type=Path, metavar="PATH",
                   help="a directory of per-rank records or one file: commscope's rank#####.jsonl logs, Kineto traces "
                        "(.json/.json.gz), DeepSpeed comms logs, nccl-tests output, Flight Recorder dumps, "
                        "NCCL_DEBUG=INFO logs (the format is told from the content)")
    add_parallel_args(p)
    p.add_argument("--gpus-per-node", type=int, default=8, help="for link classes (default 8)")
    p.add_argument("--out", type=out_path, default=None, help="write summary.json and the measured matrices (logical and wire)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--force", action="store_true", help="replace the summary of an earlier run in --out")
    add_jobs_arg(p)
    p.set_defaults(func=run)


#: The files ``summarize --out`` writes.
OUTPUT_NAMES = ("summary.json", "measured_logical.npz", "measured_logical.csv", "measured_wire.npz",
                "measured_wire.csv")


def run_layout(args: argparse.Namespace, logdir: Path):
    """The layout that attributes a recording's ops to axes: the parallelism saved beside the logs, under the
    parallel flags given; None when neither says anything."""
    from commscope.cli.common import _given, job_from_logdir, parallel_file_values
    from commscope.spec.parallel import ParallelSpec

    job_from_logdir(args, logdir, ("parallel",))  # the parallelism saved beside the logs, under the flags
    given = _given(args, "parallel")
    if not (args.parallel or given):
        return None
    from commscope.pattern.layout import Layout

    # (a file that names nothing is refused, not read as one rank of defaults)
    values = {**parallel_file_values(args.parallel), **given} if args.parallel else dict(given)
    if "global_batch_size" not in given:  # the layout does not depend on it: a saved batch must not refuse new sizes
        values["global_batch_size"] = values.get("dp", 1) * values.get("micro_batch_size", 1)
    return Layout(ParallelSpec(**values))


def run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from commscope.cli.common import check_out_dir
    from commscope.cli.outputs import claim_dir
    from commscope.errors import ConfigError

    if args.gpus_per_node < 1:
        raise ConfigError("gpus_per_node", args.gpus_per_node, "must be a positive integer")
    check_out_dir(args.out)
    # one run writes --out (before the logs are read); an earlier summary's files replaced only when asked
    with nullcontext() if args.out is None else claim_dir(args, args.out, OUTPUT_NAMES, clear=False):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from commscope.measure.capture.analysis import measured_traffic, summary
    from commscope.cli.common import _given
    from commscope.errors import ConfigError

    layout = run_layout(args, args.logdir)
    run_log = load_run(args.logdir, layout=layout, jobs=args.jobs)
    if layout is not None and run_log.world_size and layout.world_size != run_log.world_size:
        source = ""
        if args.parallel:
            source = f" (read from {args.parallel}{', under the flags given' if _given(args, 'parallel') else ''})"
        raise ConfigError("tp x pp x dp x cp", layout.world_size,
                          f"must equal the {run_log.world_size} ranks in the logs{source}")
    s = summary(run_log, layout=layout, gpus_per_node=args.gpus_per_node)
    if args.out is not None:
        from commscope.cli.outputs import earlier_files, remove_files
        from commscope.io.atomic import OutputSet
        from commscope.io.matrix import write_npz, write_triplets_csv

        args.out.mkdir(parents=True, exist_ok=True)
        ops = list(run_log.logical)
        if layout is not None:
            from commscope.measure.capture.analysis import attribute_axes

            ops = attribute_axes(ops, layout)
        with OutputSet(args.out) as files:  # renamed into place together when every file is complete
            for view in (("logical", "wire") if run_log.matrix_omitted is None else ()):
                tm = measured_traffic(ops, run_log.world_size, args.gpus_per_node, view=view)
                write_npz(files.path(f"measured_{view}.npz"), tm)
                write_triplets_csv(files.path(f"measured_{view}.csv"), tm)
            files.write_text("summary.json", json.dumps(s, indent=2) + "\n")
        remove_files(p for p in earlier_files(args.out, OUTPUT_NAMES) if p not in files.written)  # --force: no mix
    if args.json:
        json.dump(s, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    ranks = len(s["ranks_logged"])  # nccl-tests, DeepSpeed: one record for a whole group, no rank of its own
    print(f"{args.logdir}: {s['files']} file(s) ({', '.join(s['formats'])}), "
          f"{f'{ranks} rank(s)' if ranks else 'no per-rank records'}, "
          f"world size {s['world_size'] or 'unknown'}, {s['records']:,} records, {s['logical_ops']:,} ops")
    print_run_findings(s)
    print()
    print_table(("axis", "op", "count", "bytes", "group sizes"),
                [(row["axis"], row["op"], f"{row['count']:,}", format_bytes(row["bytes"]),
                  ", ".join(map(str, row["group_sizes"])) if isinstance(row["group_sizes"], list | tuple)
                  else row["group_sizes"]) for row in s["ops"]],
                left=("axis", "op", "group sizes"), wrap=("group sizes",), keys=2)
    print()
    print_table(("message size <=", "ops", "bytes"),
                [(format_bytes(row["le_bytes"]), f"{row['ops']:,}", format_bytes(row["bytes"]))
                 for row in s["size_histogram"]])
    if s["traffic"]["omitted"]:
        print(f"\ntraffic matrix omitted: {s['traffic']['omitted']}")
        return 0
    lt, wt = s["traffic"]["logical"], s["traffic"]["wire"]
    print(f"\ntraffic matrix (ring decomposition): logical {format_bytes(lt['total_bytes'])} over {lt['num_pairs']} pairs; "
          f"wire (as the backend ran it) {format_bytes(wt['total_bytes'])}")
    return 0


def load_run(path: Path, *, layout=None, jobs: int | None = None):
    """:func:`commscope.io.runs.read_run` for a command: what it cannot read becomes a one-line user error. With
    ``jobs``, the run's totals (:func:`commscope.io.runs.read_run_totals`), read by that many processes."""
    import os

    from commscope.errors import ConfigError
    from commscope.io.runs import read_run, read_run_totals

    cores = os.cpu_count() or 1
    if jobs is not None and not 1 <= jobs <= cores:
        raise ConfigError("jobs", jobs, f"expected 1 to {cores} (the cores of this machine)")
    try:
        return read_run(path, layout=layout) if jobs is None else read_run_totals(path, layout=layout, jobs=jobs)
    except ValueError as exc:
        text = str(exc)
        raise ConfigError("logdir", str(path), text.removeprefix(f"{path}: ")) from None


def print_run_findings(s: dict, *, command: str = "summarize", limit: int = 10) -> None:
    """What a reader found and assumed, as summarize, compare and report show it: the rank that failed first
    (``failure``, the launcher's marker) or unfinished ranks, partial steps and problems (the first ``limit``, then
    a count) on stderr, each line led by ``commscope <command>:``; the fields the format lacks and the notes
    (what was assumed) with the results on stdout."""
    failure = s.get("failure")
    said: list[str] = []
    if failure is not None and failure.get("rank") is None and failure.get("timed_out"):  # no first one to name
        said.append(f"failed: ranks {failure.get('stopped_after')} were still running at the launcher's timeout and "
                    "were killed")
    elif failure is not None and failure.get("rank") is None:  # `commscope record`: only the command's status is known
        unfinished = s.get("unfinished_ranks")
        said.append(f"failed: the recorded command {failure.get('how')}; "
                    + (f"ranks {unfinished} did not finish their logs" if unfinished else
                       "every rank closed its log, but what the job did after its failure may be missing"))
    elif failure is not None:
        stopped = [r for r in s.get("unfinished_ranks", []) if r != failure.get("rank")]
        said.append(f"failed: rank {failure.get('rank')} {failure.get('how')} first; "
                    f"{f'ranks {stopped} were stopped because of it' if stopped else 'no other rank was cut short'}")
    elif s.get("unfinished_ranks"):
        said.append(f"warning: ranks {s['unfinished_ranks']} did not finish (no completion marker): their logs may be "
                    "cut short")
    if s.get("partial_steps"):
        said.append("warning: partial steps (ranks that miss them or were cut short in them): "
                    + "; ".join(f"step {k}: {v}" for k, v in s["partial_steps"].items()))
    problems = s.get("problems", [])
    said += [f"problem: {p}" for p in problems[:limit]]
    if len(problems) > limit:
        said.append(f"problem: ... and {len(problems) - limit} more (--json lists them all)")
    for line in said:
        print(f"commscope {command}: {line}", file=sys.stderr)
    if s.get("missing_fields"):
        print(f"not in these records: {', '.join(s['missing_fields'])}")
    for note in s.get("notes", []):
        print(f"note: {note}")
