"""``commscope plan``: the fastest valid configurations of a model on N GPUs that fit in memory."""

from __future__ import annotations

import argparse
import json
import sys

from commscope.cli.common import (
    add_cluster_args, add_model_args, check_gpu_dtype, check_gpu_util, check_nodes, int_list, resolve_cluster,
    resolve_model, warn_compute_model_flags, attention_backend, ATTENTION_BACKEND_HELP, ATTENTION_BACKEND_METAVAR, STACK_HELP,
    FP8_FORMAT_HELP, GRADIENT_ACCUMULATION_FUSION_HELP,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank parallelism configurations by predicted iteration time",
                       description="Enumerate valid (tp, pp, dp, cp, ep, micro-batch, virtual pipeline, sequence "
                                   "parallelism, recomputation, ZeRO) for a model on N GPUs, drop those that do not fit "
                                   "in memory, and rank the rest by predicted iteration time.")
    add_model_args(p)
    add_cluster_args(p)
    g = p.add_argument_group("search")
    g.add_argument("--gpus", "--num-gpus", type=int, required=True, help="total GPUs")
    g.add_argument("--global-batch-size", type=int, default=None, help="sequences per iteration (default 512)")
    g.add_argument("--top", type=int, default=10, help="configurations to show (default 10)")
    g.add_argument("--micro-batch-sizes", type=int_list, default=(1, 2, 4, 8), help="candidates (default 1,2,4,8)")
    g.add_argument("--virtual-pipeline-sizes", type=int_list, default=(1, 2, 4), help="candidates (default 1,2,4)")
    g.add_argument("--cp-sizes", type=int_list, default=(1,), help="context-parallel candidates (default 1)")
    g.add_argument("--ep-sizes", type=int_list, default=None, help="expert-parallel candidates (default: divisors of num_experts)")
    g.add_argument("--max-tp", type=int, default=None, help="largest tp (default: GPUs per node)")
    g.add_argument("--refine", type=int, default=None,
                   help="estimate only the best N of the closed-form screen op by op (default: every one that fits)")
    g.add_argument("--gpu-util", type=float, default=None, help="achieved fraction of peak FLOP/s (default: the cluster's)")
    g.add_argument("--gradient-accumulation-fusion", action=argparse.BooleanOptionalAction, default=None,
                   help=f"not searched, the job's: {GRADIENT_ACCUMULATION_FUSION_HELP}, which favours fewer, larger "
                        "micro-batches")
    g.add_argument("--attention-backend", dest="attention", type=attention_backend, default="flash",
                   metavar=ATTENTION_BACKEND_METAVAR, help=f"not searched, the job's: {ATTENTION_BACKEND_HELP}")
    g.add_argument("--fp8-format", choices=("hybrid", "e4m3"), default=None,
                   help=f"not searched, the job's: {FP8_FORMAT_HELP}")
    g.add_argument("--stack", default=None, metavar="NAME", help=f"not searched, the job's: {STACK_HELP}")
    g.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


#: From this many GPUs on, the search takes seconds to minutes (each configuration is estimated over every rank):
#: plan says so in a line before it starts (measured on a 2-core VM: 131,072 GPUs ~4 CPU-s, 1,048,576 GPUs ~25 CPU-s;
#: benchmarks/bench_plan.py).
SLOW_PLAN_GPUS = 1 << 16


def check_plan_size(args: argparse.Namespace) -> None:
    """Refuse, before any work, a GPU count no cluster has and commscope does not plan for (it would search for
    minutes, saying nothing): beyond :data:`commscope.cli.common.MAX_PLAUSIBLE_GPUS`."""
    from commscope.cli.common import MAX_PLAUSIBLE_GPUS
    from commscope.errors import ConfigError

    if args.gpus < 1:
        raise ConfigError("gpus", args.gpus, "must be a positive integer")
    if args.gpus > MAX_PLAUSIBLE_GPUS:
        raise ConfigError("gpus", args.gpus, f"more GPUs than any cluster built or planned (the largest training "
                                             f"clusters hold ~10^5); plan searches up to {MAX_PLAUSIBLE_GPUS:,} GPUs "
                                             "(traffic and estimate take one configuration of any size)")


def run(args: argparse.Namespace) -> int:
    from commscope.errors import ConfigError
    from commscope.cli.terminal import Progress, print_table
    from commscope.estimate.plan import PlanSpace, plan
    from commscope.pattern.workload.stages import pipeline_split_label

    check_plan_size(args)
    model = resolve_model(args)
    cluster = resolve_cluster(args)
    check_gpu_dtype(model, cluster, args)
    if args.top < 1:
        raise ConfigError("top", args.top, "must be >= 1")
    check_gpu_util(args)
    fusion = args.gradient_accumulation_fusion
    warn_compute_model_flags(args, {} if fusion is None else {"gradient_accumulation_fusion": fusion}, cluster)
    if args.refine is not None and args.refine < 1:
        raise ConfigError("refine", args.refine, "must be >= 1 (leave it out to estimate every configuration that fits)")
    batch = 512 if args.global_batch_size is None else args.global_batch_size
    space = PlanSpace(micro_batch_sizes=args.micro_batch_sizes, virtual_pipeline_sizes=args.virtual_pipeline_sizes,
                      cp_sizes=args.cp_sizes, ep_sizes=args.ep_sizes, max_tp=args.max_tp)
    if args.gpus >= SLOW_PLAN_GPUS:  # said at once, before the search: a large world takes a while, bar or no bar
        print(f"commscope plan: planning {args.gpus:,} GPUs: every configuration that fits is estimated over all "
              f"{args.gpus:,} ranks, which takes up to a minute or two (--refine N estimates only the best N of the "
              "screen)", file=sys.stderr, flush=True)
    with Progress("estimating", quiet=args.json) as progress:
        result = plan(model, cluster, args.gpus, batch, top=args.top, space=space,
                      refine=args.refine, gpu_util=args.gpu_util, progress=progress,
                      gradient_accumulation_fusion=fusion is not False, attention=args.attention,
                      fp8_format=args.fp8_format, stack=args.stack)
    check_nodes(args, args.gpus, cluster)  # after the plan: when no configuration is valid, its error is the one line
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{model.name} on {args.gpus} x {cluster.gpu} ({cluster.name}), global batch {result.global_batch_size}: "
          f"{result.num_candidates:,} candidates, {result.num_valid:,} valid, {result.num_fit:,} fit in memory; "
          f"screened in {result.screen_s:.2f} s, {f'the best {args.refine} of the screen' if args.refine else 'all that fit'} "
          f"estimated op by op in {result.rank_s:.2f} s")
    print()
    columns = ("#", "tp", "pp", "dp", "cp", "ep", "mb", "v", "sp", "recomp", "zero", "iter s", "TFLOP/s", "MFU", "mem GiB",
               "why")
    rows = []
    for i, e in enumerate(result.entries, start=1):
        p, est = e.parallel, e.estimate
        zero = "dist" if p.distributed_optimizer else str(p.zero_stage)
        rows.append((i, p.tp, p.pp, p.dp, p.cp, p.ep, p.micro_batch_size, p.virtual_pipeline_size,
                     "y" if p.sequence_parallel else "n", p.recompute, zero, f"{est.iteration_time_s:.3f}",
                     f"{est.tflops_per_gpu:.1f}", f"{est.mfu:.1%}", f"{e.memory_bytes / 2**30:.1f}", e.reason))
    print_table(columns, rows, left=("why",))
    print("\nTFLOP/s: what each GPU executes, recomputation included; MFU: the model's FLOPs (without recomputation) "
          "over the peak")
    for i, e in enumerate(result.entries, start=1):
        label = pipeline_split_label(model, e.parallel)
        if label is not None:
            print(f"#{i}: {label}")
    for note in result.notes:
        print(f"note: {note}")
    return 0
