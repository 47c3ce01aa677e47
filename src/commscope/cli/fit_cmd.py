"""``commscope fit``: measured collective times -> the bandwidth model of ``estimate --bandwidth``.

    commscope fit bench.json --out mycluster.toml              # commscope bench's JSON (median times)
    commscope fit all_reduce_perf.log --out mycluster.toml     # nccl-tests / rccl-tests stdout (mean times)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="fit latency and bandwidth per op and group size from bench or nccl-tests output",
                       description="Fit t = alpha + size x f(op, n) / busbw per op and group size (piecewise in size "
                                   "where one line does not fit) from `commscope bench` JSON or nccl-tests stdout; "
                                   "print the fitted lines and their worst error (each row's with --rows); write a TOML "
                                   "model for `commscope estimate --bandwidth`.")
    p.add_argument("input", type=Path, help="bench JSON (commscope bench --out) or nccl-tests/rccl-tests output")
    p.add_argument("--out", type=Path, default=None, help="write the fitted model (TOML)")
    p.add_argument("--group-size", type=int, default=None,
                   help="ranks the measurements ran on, when the input does not say (nccl-tests output without device "
                        "lines); refused where the input says otherwise")
    p.add_argument("--op", default=None,
                   help="the collective of nccl-tests output whose header does not name the test (all_reduce, ...), "
                        "or the one to fit of a log of several collectives; refused where the input names another")
    p.add_argument("--dtype", default=None,
                   help="the element type to fit where the rows time several (nccl-tests -d all): float, half, ...")
    p.add_argument("--redop", default=None,
                   help="the reduction op to fit where the rows time several (nccl-tests -o all): sum, max, ...")
    p.add_argument("--root", type=int, default=None,
                   help="the root rank to fit where the rows of broadcast, reduce, gather or scatter time several "
                        "(nccl-tests -r -1, whose root column holds each root's rank): 0, 1, ...")
    p.add_argument("--run", default=None, metavar="N[,N...]",
                   help="the tables to fit of nccl-tests output that pastes several machines' outputs together (their "
                        "rows are never pooled): table numbers from 1 in file order, 1 or 1,3")
    p.add_argument("--tolerance", type=float, default=0.1,
                   help="largest relative error one piece may leave before the sizes are split (default 0.1)")
    p.add_argument("--max-pieces", type=int, default=3, help="most size ranges per op and group size (default 3)")
    p.add_argument("--rows", action="store_true",
                   help="also print every measured row beside its fitted time and error (the TOML's [fit] table)")
    p.add_argument("--json", action="store_true", help="print the fit as JSON instead of the table")
    p.add_argument("--force", action="store_true", help="replace the model of an earlier run at --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from commscope.cli.common import check_out_file
    from commscope.cli.outputs import claim_file

    check_out_file(args.out, "out")  # before the input is read and fitted
    with nullcontext() if args.out is None else claim_file(args, Path(args.out)):  # one run writes the model
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from commscope.measure.bench.fit import fit, load_rows, problem_lines, to_toml
    from commscope.cli.common import warn

    if args.group_size is not None and args.group_size < 2:
        raise ConfigError("group_size", args.group_size, "must be >= 2")
    points, info = load_rows(Path(args.input), group_size=args.group_size, op=args.op, dtype=args.dtype,
                             redop=args.redop, root=args.root, run=args.run)
    for line in info.get("notes", []):  # what was left out on purpose (other collectives, 1-rank rows)
        print(f"commscope fit: note: {line}", file=sys.stderr)
    for line in problem_lines(info.get("problems", [])):  # damaged rows skipped, and what else the input says wrong
        warn(args, line)
    # what was picked, so that the fitted model says which of the file's measurements it holds
    picked = [text for text in (args.run and f"table{'s' if ',' in args.run else ''} {args.run}",
                                args.op and f"op {args.op}", info.get("chosen")) if text]
    source = Path(args.input).name + (f" ({', '.join(picked)})" if picked else "")
    result = fit(points, source=source, time_kind=info["time_kind"], backend=info.get("backend"),
                 tolerance=args.tolerance, max_pieces=args.max_pieces)
    for line in result.merged:  # size ranges whose own line no link could have
        print(f"commscope fit: note: {line}", file=sys.stderr)
    for c in result.curves:
        why = result.why_unreliable(c)
        if why is not None:
            warn(args, f"{c.op} over {c.group_size} ranks: unreliable fit, left out of `estimate --bandwidth`: {why}")
    if args.out is not None:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        from commscope.io.atomic import write_text

        write_text(out, to_toml(result))
        print(f"commscope fit: wrote {out} (use: commscope estimate ... --bandwidth {out})", file=sys.stderr)
    if args.json:
        json.dump({"source": result.source, "time": result.time_kind,
                   "curves": [{"op": c.op, "group_size": c.group_size, "intra_node": c.intra_node,
                               "unreliable": result.why_unreliable(c), "noisy_rows": result.noisy_rows(c),
                               "max_rel_error": result.max_rel_error(c.op, c.group_size),
                               "segments": [{"size_min_bytes": s.size_min_bytes, "size_max_bytes": s.size_max_bytes,
                                             "alpha_s": s.alpha_s, "busbw_bytes_per_s": s.busbw_bytes_per_s
                                             if s.busbw_bytes_per_s != float("inf") else None}
                                            for s in c.segments]} for c in result.curves],
                   "rows": [{"op": r.op, "group_size": r.group_size, "size_bytes": r.size_bytes,
                             "measured_time_s": r.measured_time_s, "fitted_time_s": r.fitted_time_s,
                             "rel_error": r.rel_error} for r in result.residuals]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_fit(result, rows=args.rows))
    return 0


def format_fit(result, *, rows: bool = False, hint: bool = True) -> str:
    """The fitted lines per op and group size with their worst error, what is unreliable or noisy, and with
    ``rows`` every measured row against the fit (a summary by default, ``hint`` saying how to get them: a sweep
    has hundreds of rows)."""
    from commscope.cli.terminal import format_table
    from commscope.units import GB, US

    cells = []
    for c in result.curves:
        worst = result.max_rel_error(c.op, c.group_size)
        flag = "unreliable" if result.why_unreliable(c) else "noisy" if result.noisy_rows(c) else ""
        for i, s in enumerate(c.segments):
            first = i == 0
            cells.append((c.op if first else "", c.group_size if first else "",
                          f"{s.size_min_bytes:,}-{s.size_max_bytes:,}", f"{s.alpha_s / US:.2f}",
                          f"{s.busbw_bytes_per_s / GB:.4g}", f"{worst:.1%}" if first else "", flag if first else ""))
    lines = [f"fit of {result.source} ({result.time_kind} times): t = alpha + size x f / busbw, per op and group size", "",
             format_table(("op", "n", "sizes B", "alpha us", "busbw GB/s", "max |err|", "note"), cells,
                          left=("op", "sizes B", "note"))]
    lines += [f"unreliable: {c.op} over {c.group_size} ranks: {result.why_unreliable(c)}" for c in result.curves
              if result.why_unreliable(c)]
    lines += [f"noisy: {c.op} over {c.group_size} ranks fitted to {result.noisy_rows(c)} rows flagged noisy"
              for c in result.curves if result.noisy_rows(c)]
    if rows:
        lines += ["", format_table(("op", "n", "size B", "measured us", "fitted us", "rel err"),
                                   [(r.op, r.group_size, f"{r.size_bytes:,}", f"{r.measured_time_s / US:.2f}",
                                     f"{r.fitted_time_s / US:.2f}", f"{r.rel_error:+.1%}") for r in result.residuals],
                                   left=("op",), keys=3)]
    elif hint:
        lines.append(f"{len(result.residuals)} rows fitted; --rows prints each beside its fitted time")
    return "\n".join(lines)
