"""``commscope summarize logs/``: what a recorded run communicated."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.cli.common import add_parallel_args
from commscope.units import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summarize", help="summarise recorded logs: ops by axis, message sizes, traffic matrix",
                       description="Summarise a recorded run. Give the job's parallelism flags (--tp, --pp, --dp, ...) "
                                   "to attribute ops to axes; without them ops are grouped by process group size.")
    p.add_argument("logdir", type=Path, help="directory of rank#####.jsonl logs")
    add_parallel_args(p)
    p.add_argument("--gpus-per-node", type=int, default=8, help="for link classes (default 8)")
    p.add_argument("--out", type=Path, default=None, help="write summary.json and the measured matrices (logical and wire)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.capture.analysis import logical_ops, measured_traffic, read_run, summary
    from commscope.cli.common import _given
    from commscope.errors import ConfigError

    if not args.logdir.is_dir():
        raise ConfigError("logdir", str(args.logdir), "is not a directory of rank#####.jsonl logs")
    try:
        run_log = read_run(args.logdir)
    except ValueError as exc:
        raise ConfigError("logdir", str(args.logdir), str(exc).split(": ", 1)[-1]) from None
    layout = None
    given = _given(args, "parallel")
    if given:
        from commscope.layout import Layout
        from commscope.spec.parallel import ParallelSpec

        values = {"global_batch_size": given.get("dp", 1) * given.get("micro_batch_size", 1), **given}
        layout = Layout(ParallelSpec(**values))
        if layout.world_size != run_log.world_size:
            raise ConfigError("tp x pp x dp x cp", layout.world_size, f"must equal the {run_log.world_size} ranks in the logs")
    s = summary(run_log, layout=layout, gpus_per_node=args.gpus_per_node)
    from commscope.capture.recorder import read_failure

    failure = read_failure(args.logdir)
    if failure is not None:
        s["failure"] = failure
    if args.out is not None:
        from commscope.cli.common import check_out_dir
        from commscope.io.matrix import write_npz, write_triplets_csv

        check_out_dir(args.out)
        args.out.mkdir(parents=True, exist_ok=True)
        ops = logical_ops(run_log)
        if layout is not None:
            from commscope.capture.analysis import attribute_axes

            ops = attribute_axes(ops, layout)
        for view in ("logical", "wire"):
            tm = measured_traffic(ops, run_log.world_size, args.gpus_per_node, view=view)
            write_npz(args.out / f"measured_{view}.npz", tm)
            write_triplets_csv(args.out / f"measured_{view}.csv", tm)
        (args.out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    if args.json:
        json.dump(s, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.logdir}: {len(s['ranks_logged'])} rank logs, world size {s['world_size']}, {s['records']:,} records, "
          f"{s['logical_ops']:,} ops")
    if failure is not None and failure.get("rank") is None:  # several ranks hung: no first one to name
        print(f"failed: ranks {failure.get('stopped_after')} were still running at the launcher's timeout and were killed")
    elif failure is not None:
        stopped = [r for r in s["unfinished_ranks"] if r != failure.get("rank")]
        print(f"failed: rank {failure.get('rank')} {failure.get('how')} first; "
              f"{f'ranks {stopped} were stopped because of it' if stopped else 'no other rank was cut short'}")
    elif s["unfinished_ranks"]:
        print(f"warning: ranks {s['unfinished_ranks']} did not finish (no completion marker): their logs may be cut short")
    for p in s["problems"][:10]:
        print(f"problem: {p}")
    print(f"\n{'axis':<7}{'op':<16}{'count':>9}{'bytes':>14}  group sizes")
    for row in s["ops"]:
        print(f"{row['axis']:<7}{row['op']:<16}{row['count']:>9,}{format_bytes(row['bytes']):>14}  {row['group_sizes']}")
    print(f"\n{'message size <=':>16}{'ops':>9}{'bytes':>14}")
    for row in s["size_histogram"]:
        print(f"{format_bytes(row['le_bytes']):>16}{row['ops']:>9,}{format_bytes(row['bytes']):>14}")
    lt, wt = s["traffic"]["logical"], s["traffic"]["wire"]
    print(f"\ntraffic matrix (ring decomposition): logical {format_bytes(lt['total_bytes'])} over {lt['num_pairs']} pairs; "
          f"wire (as the backend ran it) {format_bytes(wt['total_bytes'])}")
    return 0
