"""``commscope presets``: the built-in models, clusters, GPUs and software stacks, with their sources."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list the built-in models, clusters, GPUs and software stacks",
                       description="List the built-in model, cluster, GPU and software-stack presets with their "
                                   "sources (--json gives every number and source).")
    p.add_argument("kind", nargs="?", choices=("models", "clusters", "gpus", "stacks"), help="only this kind")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.cli.terminal import print_table
    from commscope.presets import list_presets

    table = list_presets()
    if args.kind:
        table = {args.kind: table[args.kind]}
    if args.json:
        json.dump(table, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for kind, rows in table.items():
        print_table((kind[:-1], "description"), [(row["name"], row.get("description", "")) for row in rows],
                    left=(kind[:-1], "description"))
        print()
    return 0
