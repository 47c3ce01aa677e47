"""``commscope estimate``: iteration time, communication and bubble ratios."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commscope.cli.common import add_job_args, add_routing_args, estimate_job, resolve_job, v_label, warn
from commscope.estimate.iteration import METHODS
from commscope.pattern.traffic import ALGORITHMS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate", help="estimate iteration time, communication and bubble ratios",
                       description="Estimate the time of one training iteration: compute, TP, PP, DP, CP, EP "
                                   "communication and the pipeline bubble, with ratios and throughput.")
    add_job_args(p)
    add_routing_args(p)
    g = p.add_argument_group("estimate")
    g.add_argument("--method", choices=METHODS, default="refined",
                   help="refined (per-op, default) or seed (the talk's formulation, term by term)")
    g.add_argument("--gpu-util", type=float, default=None,
                   help="replace the GPU's compute model by FLOP / (u x peak) with this u (the seed method's default: the "
                        "cluster's u)")
    g.add_argument("--gpu", default=None, metavar="GPU",
                   help="the GPU whose compute model times compute: a preset (h100, h200, ...) or a GPU file, e.g. one "
                        "`commscope calibrate` fitted to this GPU's kernels (default: matched from the cluster's gpu; "
                        "the cluster's peak FLOP/s and memory bandwidth apply)")
    g.add_argument("--bandwidth", type=Path, default=None,
                   help="measured bandwidth: nccl-tests output (.txt/.log) or a table (.json/.toml/.csv with op, group_size, "
                        "size_bytes, busbw_GBps and intra_node: true for a group measured inside one node, false across "
                        "nodes, empty if not known: then it stands only for groups inside a node or of its own size); "
                        "ops and placements it lacks fall back to the cluster preset (noted)")
    g.add_argument("--algorithm", choices=ALGORITHMS, default="ring", help=argparse.SUPPRESS)
    g.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.api import predict
    from commscope.cli.moe_cmd import job_routing

    model, parallel, cluster = resolve_job(args)
    pred = predict(model, parallel, cluster, algorithm=args.algorithm, routing=job_routing(args, model, parallel))
    est = estimate_job(pred, args)
    memory = memory_check(model, parallel, cluster)
    warnings = job_warnings(memory, parallel, est)
    if args.json:
        from commscope.spec.files import parallel_to_mapping

        json.dump({"model": model.name, "cluster": cluster.name, "parallel": parallel_to_mapping(parallel),
                   **est.to_dict(), "memory": memory}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_estimate(est, title=f"{model.name} on {cluster.name}: {parallel.world_size} GPUs, tp={parallel.tp} "
                                         f"pp={parallel.pp}{v_label(parallel.virtual_pipeline_size)} dp={parallel.dp} cp={parallel.cp} ep={parallel.ep}, "
                                         f"{parallel.num_micro_batches} micro-batches"))
    for message in warnings:  # beside the numbers, on stderr
        warn(args, message)
    return 0


def job_warnings(memory: dict, parallel, est) -> list[str]:
    """What an estimate warns about beside its numbers: a job that does not fit in memory (``memory``:
    :func:`memory_check`), too few micro-batches for the pipeline."""
    return [message for message in (memory["message"], few_micro_batches(parallel, est)) if message]


def few_micro_batches(parallel, est) -> str:
    """A warning when the pipeline has fewer micro-batches than stages: most of such an iteration is bubble, and
    the fix (a smaller micro-batch) is one flag away."""
    m, p = parallel.num_micro_batches, parallel.pp
    if p == 1 or m >= p:
        return ""
    per_replica = parallel.global_batch_size // parallel.dp
    hint = (f"; --micro-batch-size 1 gives {per_replica}" if parallel.micro_batch_size > 1 and per_replica >= p
            else f"; a global batch of {p * parallel.micro_batch_size * parallel.dp} or more gives {p}")
    return (f"{m} micro-batch{'es' if m > 1 else ''} for pp={p}: the pipeline idles {est.bubble_ratio:.0%} of the "
            f"iteration (bubble); pipelines run with at least pp micro-batches{hint}")


def memory_check(model, parallel, cluster) -> dict:
    """Peak memory of the most loaded GPU against what ``plan`` allows (``USABLE_MEMORY_FRACTION`` of the GPU):
    an estimate of a configuration that cannot run says so beside its numbers."""
    from commscope.estimate.memory import USABLE_MEMORY_FRACTION, memory_per_gpu

    peak = memory_per_gpu(model, parallel)
    limit = USABLE_MEMORY_FRACTION * cluster.memory_bytes
    fits = peak.total_bytes <= limit
    message = "" if fits else (
        f"this configuration does not fit in memory: {peak.total_bytes / 2**30:.1f} GiB on the most loaded GPU "
        f"(pipeline stage {peak.stage}) > {USABLE_MEMORY_FRACTION:.0%} of {cluster.memory_bytes / 2**30:.0f} GiB; "
        "the estimate is of a job that cannot run (`commscope plan` lists ones that fit)")
    return {"peak_bytes": peak.total_bytes, "stage": peak.stage, "limit_bytes": limit, "fits": fits, "message": message}


def format_estimate(est, *, title: str) -> str:
    from commscope.cli.terminal import format_table

    total = est.iteration_time_s or 1.0
    hidden = est.hidden_s or {}
    rows = [("compute", est.compute_s, None), ("TP", est.tp_s, hidden.get("tp")), ("PP", est.pp_s, hidden.get("pp")),
            ("DP", est.dp_s, hidden.get("dp")), ("embedding sync", est.emb_s, None),
            ("CP", est.cp_s, hidden.get("cp")), ("EP", est.ep_s, None), ("optimizer step", est.optimizer_s, None),
            ("bubble", est.bubble_s, None)]
    if est.compute_model == "gpu":
        how = f"compute model of the GPU ({est.gpu_util:.0%} of {est.peak_flops / 1e12:.0f} TFLOP/s peak while computing)"
    else:
        how = f"u = {est.gpu_util:.2f} of {est.peak_flops / 1e12:.0f} TFLOP/s peak"
    cells = [(name, f"{value * 1e3:.1f} ms", f"{value / total:.1%}", f"{hid * 1e3:.1f} ms" if hid else "")
             for name, value, hid in rows]
    cells.append(("iteration", f"{est.iteration_time_s * 1e3:.1f} ms", "", ""))
    lines = [title, f"method: {est.method}, {how}", "",
             format_table(("term", "exposed", "share", "hidden"), cells, left=("term",)), ""]
    if est.compute_breakdown_s:
        b = est.compute_breakdown_s
        lines.append("compute of the critical stage: " + ", ".join(
            f"{label} {b[key] * 1e3:.1f} ms" for key, label in (("gemm_s", "GEMMs"), ("attention_s", "attention"),
                                                                 ("memory_bound_s", "memory-bound"),
                                                                 ("recompute_s", "recomputation")) if b.get(key)))
        effects = [(label, b[key]) for key, label in (("clock_s", "sustained clock"), ("comm_sms_s", "SMs of overlapped comm"),
                                                      ("overlap_chunks_s", "TP-overlap GEMM pieces"),
                                                      ("launch_gaps_s", "host launch gaps"), ("stack_s", "stack efficiency"))
                   if b.get(key, 0.0) > 0]
        if effects:
            lines.append("of which in-training effects: " + ", ".join(f"{label} +{v * 1e3:.1f} ms" for label, v in effects))
    lines += [f"communication ratio {est.comm_ratio:.1%} (exposed)   bubble ratio {est.bubble_ratio:.1%}",
              f"{est.tokens_per_s:,.0f} tokens/s   {est.tflops_per_gpu:.1f} TFLOP/s per GPU   MFU {est.mfu:.1%}"]
    if est.effective_bandwidth_bytes_per_s:
        eff = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in est.effective_bandwidth_bytes_per_s.items())
        lines.append(f"effective bus bandwidth (GB/s): {eff}")
    lines += [f"note: {n}" for n in est.notes]
    return "\n".join(lines)
