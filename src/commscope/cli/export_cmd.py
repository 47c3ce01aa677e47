"""``commscope export chakra``: the predicted iteration as Chakra execution traces for ASTRA-sim."""

from __future__ import annotations

import argparse
from pathlib import Path

from commscope.cli.common import add_job_args, estimate_job, resolve_job
from commscope.estimate import METHODS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="hand a prediction to other tools: Chakra execution traces (ASTRA-sim)",
                       description="Write the predicted iteration of a job in another tool's format. `chakra`: one "
                                   "Chakra execution trace per rank (<prefix>.<rank>.et) and comm_group.json, with "
                                   "communication nodes (collective type, size, process group) and compute nodes "
                                   "(durations from the estimate) in execution order. Needs mlc-chakra.")
    p.add_argument("target", choices=("chakra",), help="the format to write")
    add_job_args(p)
    g = p.add_argument_group("export")
    g.add_argument("--out", type=Path, required=True, help="directory to write into")
    g.add_argument("--prefix", default="commscope", help="file name prefix (default commscope: commscope.0.et, ...)")
    g.add_argument("--method", choices=METHODS, default="refined", help="estimate method for compute durations")
    g.add_argument("--gpu-util", type=float, default=None, help="achieved fraction of peak FLOP/s (as `estimate`)")
    g.add_argument("--bandwidth", type=Path, default=None, help="measured bandwidth table (as `estimate`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.api import predict
    from commscope.errors import ConfigError

    try:
        from commscope.io.chakra import _require_chakra, write_chakra

        _require_chakra()
    except ImportError as exc:
        raise ConfigError("target", "chakra", str(exc)) from None
    model, parallel, cluster = resolve_job(args)
    pred = predict(model, parallel, cluster)
    est = estimate_job(pred, args)
    paths = write_chakra(pred, est, args.out, prefix=args.prefix)
    print(f"wrote {len(paths) - 1} Chakra execution traces ({args.out / f'{args.prefix}.0.et'} ...) and "
          f"{paths[-1]}")
    return 0
